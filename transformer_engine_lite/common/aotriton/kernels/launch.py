"""Pure-Python launcher of the AOTriton kernels for torch tensors (bshd / sbhd / thd), used by the
tests under TRITON_INTERPRET=1 and usable on a GPU with Triton's JIT. It derives strides, flags and
grids the way the C++ glue does (common/fused_attn_rocm/) and packs each kernel's arguments by
name in variants.py's order, so both sides pass the same values to the same parameters.

Mask types and windows map to the kernels' flags as common/fused_attn/fused_attn.cpp does:
varlen for thd or a padding mask; causal masks force window_right = 0; only "causal" and
"padding_causal" are top-left aligned (bottom_right = 0).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import triton

from . import philox, variants

_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
FORMATS = ("bshd", "sbhd", "thd")
_I32_MAX = 2**31 - 1
MASKS = (
    "no_mask",
    "causal",
    "causal_bottom_right",
    "padding",
    "padding_causal",
    "padding_causal_bottom_right",
)


def dropout_threshold(p: float) -> int:
    """philox.h's dropout_threshold: round(float(p) * 2^32), saturated at 2^32 - 1."""
    t = float(np.float32(p)) * 4294967296.0 + 0.5
    return 0xFFFFFFFF if t >= 4294967295.0 else int(t)


def keep_scale(p: float) -> float:
    """1 / (1 - p) in fp32, as the CPU kernel computes it (flash_cpu_common.h dropout_tile)."""
    one = np.float32(1.0)
    return float(one / (one - np.float32(p)))


def _strides(t: torch.Tensor, fmt: str) -> tuple[int, int, int]:
    """(batch, head, token) strides in elements; thd has no batch stride (tokens from
    cu_seqlens)."""
    if t.stride(-1) != 1:
        raise ValueError(f"launch: expected a contiguous head dim, got strides {t.stride()}")
    if fmt == "bshd":
        return t.stride(0), t.stride(2), t.stride(1)
    if fmt == "sbhd":
        return t.stride(1), t.stride(2), t.stride(0)
    return 0, t.stride(1), t.stride(0)


class _Problem:
    """Sizes, flags and scalar values of one attention call, by ABI name."""

    def __init__(
        self,
        q,
        k,
        v,
        fmt,
        mask_type,
        window,
        cu_seqlens_q,
        cu_seqlens_kv,
        max_seqlen_q,
        max_seqlen_kv,
        sm_scale,
        dropout,
        rng_state,
    ):
        if fmt not in FORMATS:
            raise ValueError(f"launch: expected a format among {FORMATS}, got {fmt!r}")
        if mask_type not in MASKS:
            raise ValueError(f"launch: expected a mask type among {MASKS}, got {mask_type!r}")
        if q.dtype not in _DTYPE_NAMES or k.dtype != q.dtype or v.dtype != q.dtype:
            raise ValueError(
                f"launch: expected bf16/fp16 q, k, v of one dtype, got "
                f"{q.dtype}, {k.dtype}, {v.dtype}"
            )
        d = q.shape[-1]
        if k.shape[-1] != d or v.shape[-1] != d:
            raise ValueError(
                f"launch: expected one head dim for q, k, v, got {d}, {k.shape[-1]}, {v.shape[-1]}"
            )
        self.fmt, self.dtype, self.device = fmt, q.dtype, q.device
        self.block_d = variants.block_d_for(d)
        self.h, self.h_kv = q.shape[-2], k.shape[-2]
        if self.h % self.h_kv:
            raise ValueError(f"launch: q heads {self.h} not a multiple of kv heads {self.h_kv}")
        thd = fmt == "thd"
        varlen = thd or "padding" in mask_type
        if varlen and (cu_seqlens_q is None or cu_seqlens_kv is None):
            raise ValueError(f"launch: {fmt} / {mask_type} needs cu_seqlens_q and cu_seqlens_kv")
        if thd:
            self.b = cu_seqlens_q.numel() - 1
            self.s_q, self.s_kv = int(max_seqlen_q), int(max_seqlen_kv)
        else:
            bdim, sdim = (0, 1) if fmt == "bshd" else (1, 0)
            self.b, self.s_q, self.s_kv = q.shape[bdim], q.shape[sdim], k.shape[sdim]
        # The kernels take i32 windows: one past INT32_MAX is as unbounded as INT32_MAX itself
        # (longer than any sequence), so clamping keeps the mask.
        left, right = (min(int(w), _I32_MAX) for w in window)
        causal = "causal" in mask_type
        use_dropout = dropout > 0.0
        if use_dropout and rng_state is None:
            raise ValueError("launch: dropout > 0 needs rng_state = int64 [seed, offset]")
        dummy_i32 = torch.zeros(2, dtype=torch.int32, device=self.device)
        self.values = {
            "CuSeqlensQ": cu_seqlens_q if varlen else dummy_i32,
            "CuSeqlensKV": cu_seqlens_kv if varlen else dummy_i32,
            "RngState": rng_state
            if use_dropout
            else torch.zeros(2, dtype=torch.int64, device=self.device),
            "sm_scale": float(sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)),
            "keep_scale": keep_scale(dropout) if use_dropout else 1.0,
            "dropout_threshold": dropout_threshold(dropout) if use_dropout else 0,
            "num_heads": self.h,
            "num_heads_kv": self.h_kv,
            "max_seqlen_q": self.s_q,
            "max_seqlen_kv": self.s_kv,
            "head_dim": d,
            "varlen": int(varlen),
            "is_thd": int(thd),
            "window_left": left,
            "window_right": 0 if causal else right,
            "bottom_right": int(mask_type not in ("causal", "padding_causal")),
        }
        self.tensor("q", "Q", q)
        self.tensor("k", "K", k)
        self.tensor("v", "V", v)

    def tensor(self, short: str, name: str, t: torch.Tensor) -> None:
        self.values[name] = t
        sb, sh, ss = _strides(t, self.fmt)
        self.values.update(
            {f"stride_{short}_b": sb, f"stride_{short}_h": sh, f"stride_{short}_s": ss}
        )

    def launch(self, name: str, arch_family: str, blocks: dict | None) -> None:
        """kernel[grid](*args in variants.py's order, BLOCK_M=..., ...)."""
        spec = variants.kernel(name)
        cfg = variants.config(name, arch_family, _DTYPE_NAMES[self.dtype], self.block_d)
        cfg.update(blocks or {})
        args = [self.values[n] for n, _ in spec["params"]]
        axis0, axis1 = spec["grid"]
        grid = (
            triton.cdiv(self.s_q, cfg["BLOCK_M"])
            if axis0 == "q_blocks"
            else triton.cdiv(self.s_kv, cfg["BLOCK_N"]),
            self.b * (self.h if axis1 == "batch_heads" else self.h_kv),
            1,
        )
        if grid[0] == 0 or grid[1] == 0:
            return
        # Looked up per call (not bound at import): the test shim may swap the module attributes.
        variants.jit_function(name)[grid](
            *args,
            BLOCK_M=cfg["BLOCK_M"],
            BLOCK_N=cfg["BLOCK_N"],
            BLOCK_D=self.block_d,
            num_warps=cfg["num_warps"],
            num_stages=cfg["num_stages"],
        )

    def new_like(self, t: torch.Tensor) -> torch.Tensor:
        """An output shaped like t: zeros for thd (tokens past cu_seqlens[-1] stay 0, as the CPU
        op allocates them), else uninitialized (the kernels write every row)."""
        new = torch.zeros if self.fmt == "thd" else torch.empty
        return new(t.shape, dtype=t.dtype, device=t.device)


def run_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    fmt: str = "bshd",
    mask_type: str = "no_mask",
    window: tuple[int, int] = (-1, -1),
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_kv: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_kv: int | None = None,
    sm_scale: float | None = None,
    dropout: float = 0.0,
    rng_state: torch.Tensor | None = None,
    arch_family: str = "nvidia",
    blocks: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """attn_fwd: (O like q, LSE fp32 [b, h, max_seqlen_q]). blocks: BLOCK_M / BLOCK_N overrides
    of the arch family's config."""
    pr = _Problem(
        q,
        k,
        v,
        fmt,
        mask_type,
        window,
        cu_seqlens_q,
        cu_seqlens_kv,
        max_seqlen_q,
        max_seqlen_kv,
        sm_scale,
        dropout,
        rng_state,
    )
    out = pr.new_like(q)
    lse = torch.empty((pr.b, pr.h, pr.s_q), dtype=torch.float32, device=q.device)
    pr.tensor("o", "Out", out)
    pr.values["LSE"] = lse
    pr.launch("attn_fwd", arch_family, blocks)
    return out, lse


def run_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    dout: torch.Tensor,
    lse: torch.Tensor,
    *,
    fmt: str = "bshd",
    mask_type: str = "no_mask",
    window: tuple[int, int] = (-1, -1),
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_kv: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_kv: int | None = None,
    sm_scale: float | None = None,
    dropout: float = 0.0,
    rng_state: torch.Tensor | None = None,
    arch_family: str = "nvidia",
    blocks: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """attn_bwd_preprocess, attn_bwd_dkdv, attn_bwd_dq: (dQ, dK, dV) like q, k, v."""
    pr = _Problem(
        q,
        k,
        v,
        fmt,
        mask_type,
        window,
        cu_seqlens_q,
        cu_seqlens_kv,
        max_seqlen_q,
        max_seqlen_kv,
        sm_scale,
        dropout,
        rng_state,
    )
    if lse.shape != (pr.b, pr.h, pr.s_q) or lse.dtype != torch.float32:
        raise ValueError(
            f"launch: expected fp32 LSE [{pr.b}, {pr.h}, {pr.s_q}], got "
            f"{lse.dtype} {tuple(lse.shape)}"
        )
    dq, dk, dv = pr.new_like(q), pr.new_like(k), pr.new_like(v)
    pr.tensor("o", "Out", out)
    pr.tensor("do", "dO", dout)
    pr.tensor("dq", "dQ", dq)
    pr.tensor("dk", "dK", dk)
    pr.tensor("dv", "dV", dv)
    pr.values["LSE"] = lse.contiguous()
    pr.values["Delta"] = torch.empty((pr.b, pr.h, pr.s_q), dtype=torch.float32, device=q.device)
    for name in ("attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq"):
        pr.launch(name, arch_family, blocks)
    return dq, dk, dv


def dropout_mask(
    rng_state: torch.Tensor, b: int, h: int, s_q: int, s_kv: int, p: float, block: int = 32
) -> torch.Tensor:
    """uint8 keep mask [b, h, s_q, s_kv] of the attention kernels (attn_dropout_mask), for
    comparison with torch.ops.te_lite.fused_attn_dropout_mask."""
    mask = torch.empty((b, h, s_q, s_kv), dtype=torch.uint8, device=rng_state.device)
    if mask.numel():
        grid = (triton.cdiv(s_q, block), b * h)
        philox.attn_dropout_mask[grid](
            rng_state, mask, dropout_threshold(p), s_q, s_kv, BLOCK_M=block, BLOCK_N=block
        )
    return mask

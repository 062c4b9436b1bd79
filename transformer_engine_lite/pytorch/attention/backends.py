"""Attention backends of DotProductAttention and their selection.

- `select_backend`: the C selection (common/attention_selection.py, shared with JAX) plus
  NVTE_DEBUG logging: "Disabling <Backend> due to <reason>" (NVTE_DEBUG_LEVEL=2) and
  "Selected backend = <Backend>" (level >= 1) on the logger "transformer_engine_lite.attention",
  which gets a stderr handler when NVTE_DEBUG=1. Logged once per module and configuration.
- `FlashAttention`: this library's fused flash kernel (torch.ops.te_lite.fused_attn_fwd/bwd).
- `UnfusedDotProductAttention`: framework math: torch GEMMs, the core's fused softmax ops
  (te_lite.scaled_*softmax*), bias / ALiBi and dropout with the flash kernel's keep mask
  (te_lite.fused_attn_dropout_mask), so both backends drop the same logits. The reference backend.

Both backends take the problem in one canonical form (DotProductAttention normalizes TE's
arguments): q [.., h, d_qk], k [.., h_kv, d_qk], v [.., h_kv, d_v] in the format of `qkv_layout`;
cu_seqlens for thd and padding masks (int32 [b + 1]); mask names without commas; window (left,
right) with right = 0 for causal masks; rng_state int64 [2] = (seed, offset) when dropout > 0.
They return [s, b, h * d_v] (sbhd), [b, s, h * d_v] (bshd) or [t, h * d_v] (thd). Masking follows
fused_attn.h: causal / padding_causal are top-left aligned, the other masks' windows bottom-right;
a query row with no key kept (and every padded row) gets output 0.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch

from ...common import attention_selection as selection
from ...common import capi
from . import _canonical_math as canonical
from ._attention_gemm import attention_matmul, expand_heads, ordered_matmul

__all__ = [
    "BACKEND_NAMES",
    "_attention_backends",
    "FlashAttention",
    "UnfusedDotProductAttention",
    "draw_rng_state",
    "select_backend",
]

_ops = torch.ops.te_lite
LOGGER = selection.LOGGER
BACKEND_NAMES = selection.BACKEND_NAMES
qkv_format_of = selection.qkv_format_of
_DTYPES = {
    torch.float32: capi.DType.Float32,
    torch.float16: capi.DType.Float16,
    torch.bfloat16: capi.DType.BFloat16,
}


# TE's record of DotProductAttention's last selection (transformer_engine.pytorch.attention.
# dot_product_attention._attention_backends), kept by _select: the AttentionParams the selection
# saw (dot_product_attention.utils; the fields it reads), which of TE's three backend slots runs it
# (flash: this library's flash kernel; fused: the GPU fused kernels ck / aotriton; unfused) and the
# flash version / fused sub-backend as get_attention_backend returns them. Setting
# "backend_selection_requires_update" to True makes the next call ask the C selection again (and log
# again under NVTE_DEBUG) even for a cached configuration; env switches need no flag here: they are
# part of the cache key.
_attention_backends: dict[str, Any] = {
    "attention_params": None,
    "use_flash_attention": None,
    "flash_attention_backend": None,
    "use_fused_attention": None,
    "fused_attention_backend": None,
    "use_unfused_attention": None,
    "backend_selection_requires_update": False,
}


def _record(key: tuple, backend: str | None, reasons: tuple[str, ...]) -> None:
    from .dot_product_attention import utils  # noqa: PLC0415 (utils imports this module)

    record = utils.selection_answer(key, backend, reasons)
    _attention_backends["attention_params"] = utils.params_of_key(key)
    (
        _attention_backends["use_flash_attention"],
        _attention_backends["flash_attention_backend"],
        _attention_backends["use_fused_attention"],
        _attention_backends["fused_attention_backend"],
        _attention_backends["use_unfused_attention"],
        _,
    ) = record


@torch.compiler.assume_constant_result
def _select(owner: int, *key: Any) -> str:
    # Runs as plain Python even under torch.compile (its result is a trace-time constant), so
    # the ctypes call, the cache, the logging and the record stay out of the graph.
    refresh = bool(_attention_backends["backend_selection_requires_update"])
    backend, reasons = selection.select(owner, *key, refresh=refresh)
    _attention_backends["backend_selection_requires_update"] = False
    _record(key, backend, reasons)
    if backend is None:
        raise selection.no_backend_error("DotProductAttention", key, reasons)
    if backend == "ck":
        raise NotImplementedError(
            "DotProductAttention: backend 'ck' was selected but the PyTorch front end has no "
            "binding for it (it is not built in this project's builds)"
        )
    # AOTriton runs inside the core's fused call: nvte_fused_attn_fwd/bwd launch its images when
    # the same selection picks it (and the flash kernel otherwise), so the flash module is its
    # binding too; its backward workspace comes through the core's workspace query.
    return "flash" if backend == "aotriton" else backend


def _static(n: Any) -> int:
    """A Python int, even for a symbolic size under torch.compile: the list length forces
    dynamo to specialize (and guard on) the value, which the selection needs as a constant."""
    return len([None] * n) if torch.compiler.is_compiling() else int(n)


def select_backend(
    owner: object,
    q: torch.Tensor,
    qkv_layout: str,
    bias_type: str,
    mask_type: str,
    dropout: float,
    h: int,
    h_kv: int,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    d_qk: int,
    d_v: int,
    window: tuple[int, int],
) -> str:
    """'flash' or 'unfused' for this configuration (env switches applied); raises
    NotImplementedError listing every backend's reason when none can run it."""
    env = selection.env_key()
    sizes = (h, h_kv, max_seqlen_q, max_seqlen_kv, d_qk, d_v)
    return _select(
        id(owner),
        0 if q.device.type == "cpu" else 1,
        int(_DTYPES[q.dtype]),
        qkv_layout,
        bias_type,
        mask_type,
        float(dropout),
        *(_static(n) for n in sizes),
        window[0],
        window[1],
        env,
    )


def draw_rng_state(device: torch.device, ctx: Callable[[], Any] | None = None) -> torch.Tensor:
    """int64 [2] = (seed, offset) for the Philox dropout, drawn from torch's default generator of
    `device` (inside `ctx()`, e.g. an RNG tracker's fork, when given)."""
    with ctx() if ctx is not None else contextlib.nullcontext():
        return torch.randint(0, 2**62, (2,), dtype=torch.int64, device=device)


def _merge_heads(out: torch.Tensor) -> torch.Tensor:
    return out.reshape(*out.shape[:-2], out.shape[-2] * out.shape[-1])


# ------------------------------------------------------------------------------------ flash
class FlashAttention(torch.nn.Module):
    """This library's flash kernel (tiled, online softmax, O(S) memory; CPU, CUDA, ROCm)."""

    def __init__(self, softmax_scale: float, attention_dropout: float = 0.0) -> None:
        super().__init__()
        self.softmax_scale = softmax_scale
        self.attention_dropout = attention_dropout

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        qkv_layout: str,
        cu_seqlens_q: torch.Tensor | None,
        cu_seqlens_kv: torch.Tensor | None,
        max_seqlen_q: int,
        max_seqlen_kv: int,
        attn_mask_type: str,
        window_size: tuple[int, int],
        core_attention_bias_type: str = "no_bias",
        core_attention_bias: torch.Tensor | None = None,
        alibi_slopes: torch.Tensor | None = None,
        rng_state: torch.Tensor | None = None,
        softmax_type: str = "vanilla",
        softmax_offset: torch.Tensor | None = None,
    ) -> torch.Tensor:
        p = self.attention_dropout if self.training else 0.0
        if p > 0 and rng_state is None:
            rng_state = draw_rng_state(q.device)
        bias = alibi_slopes if core_attention_bias_type == "alibi" else core_attention_bias
        offset = softmax_offset if softmax_type == "learnable" else None
        grad = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (q, k, v, bias, offset)
        )
        out, _ = _ops.fused_attn_fwd(
            q,
            k,
            v,
            qkv_layout,
            bias,
            cu_seqlens_q,
            cu_seqlens_kv,
            max_seqlen_q,
            max_seqlen_kv,
            self.softmax_scale,
            p,
            rng_state if p > 0 else None,
            core_attention_bias_type,
            attn_mask_type,
            window_size[0],
            window_size[1],
            grad,
            softmax_type,
            offset,
        )
        return _merge_heads(out)


# ------------------------------------------------------------------------------------ unfused
def alibi_slopes_default(h: int) -> torch.Tensor:
    """TE's default ALiBi slopes (fp32 [h]): 2^(-8 (i+1) / m) for the largest power of two m <= h,
    then every other slope of 2m heads for the remaining h - m heads (fused_attn.h)."""
    m = 2 ** math.floor(math.log2(h))
    e = [8.0 * (i + 1) / m if i < m else 8.0 * (2 * (i - m) + 1) / (2 * m) for i in range(h)]
    return torch.tensor([2.0**-x for x in e], dtype=torch.float64).float()


def _to_bhsd(x: torch.Tensor, fmt: str) -> torch.Tensor:
    return x.permute(1, 2, 0, 3) if fmt == "sbhd" else x.transpose(1, 2)


def _thd_index(cu: torch.Tensor, tokens: int, max_s: int) -> torch.Tensor:
    """Row of each thd token in a padded [b * max_s (+1 spare), ...] buffer (tokens past cu[-1],
    in no sequence, map to the spare row b * max_s)."""
    cu = cu.long()
    b = cu.numel() - 1
    token = torch.arange(tokens, device=cu.device)
    seq = torch.searchsorted(cu[1:], token, right=True).clamp(max=max(b - 1, 0))
    inside = token < cu[-1]
    return torch.where(inside, seq * max_s + token - cu[seq], b * max_s)


def _pad_thd(x: torch.Tensor, row: torch.Tensor, b: int, max_s: int) -> torch.Tensor:
    buf = x.new_zeros((b * max_s + 1, *x.shape[1:])).index_copy(0, row, x)
    return buf[:-1].view(b, max_s, *x.shape[1:])


def _unpad_thd(y: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
    flat = y.reshape(-1, *y.shape[2:])
    flat = torch.cat((flat, flat.new_zeros((1, *flat.shape[1:]))))
    return flat.index_select(0, row)


def keep_mask(
    mask_type: str,
    window: tuple[int, int],
    sq: int,
    skv: int,
    lens_q: torch.Tensor | None,
    lens_kv: torch.Tensor | None,
    device: torch.device,
) -> torch.Tensor | None:
    """bool [b or 1, 1, sq, skv], True = key j kept for query i (fused_attn.h's rules), or None
    when nothing is masked."""
    left, right = window
    causal = "causal" in mask_type
    if causal:
        right = 0
    padded = lens_q is not None
    if not causal and not padded and left < 0 and right < 0:
        return None
    i = torch.arange(sq, device=device).view(1, 1, sq, 1)
    j = torch.arange(skv, device=device).view(1, 1, 1, skv)
    lq = lens_q.view(-1, 1, 1, 1) if padded else sq
    lkv = lens_kv.view(-1, 1, 1, 1) if padded else skv
    top_left = mask_type in ("causal", "padding_causal")
    off = 0 if top_left else lkv - lq
    keep = torch.ones((1, 1, sq, skv), dtype=torch.bool, device=device)
    if padded:
        keep = keep & (i < lq) & (j < lkv)
    if left >= 0:
        keep = keep & (j >= i + off - left)
    if right >= 0:
        keep = keep & (j <= i + off + right)
    return keep


def _alibi_bias(
    slopes: torch.Tensor | None,
    b: int,
    h: int,
    sq: int,
    skv: int,
    lens_q: torch.Tensor | None,
    lens_kv: torch.Tensor | None,
    device: torch.device,
) -> torch.Tensor:
    """fp32 [b or 1, h, sq, skv]: -slope * |i + skv_b - sq_b - j| (bottom-right aligned)."""
    if slopes is None:
        slopes = alibi_slopes_default(h).to(device)
    slopes = slopes.float().reshape(-1, h, 1, 1)  # [1 or b, h, 1, 1]
    i = torch.arange(sq, device=device).view(1, 1, sq, 1)
    j = torch.arange(skv, device=device).view(1, 1, 1, skv)
    shift = (lens_kv - lens_q).view(-1, 1, 1, 1) if lens_q is not None else skv - sq
    return -slopes * (i + shift - j).abs().float()


class UnfusedDotProductAttention(torch.nn.Module):
    """Attention as framework math (the reference backend; also the only one for pre_scale_bias
    and 'arbitrary' masks). Scores and P V are torch GEMMs in the input dtype; the softmax runs
    in fp32 through the core's fused softmax ops (the variant the mask allows); bias, masking of
    fully masked rows and dropout are applied in fp32 and P is rounded to the input dtype once."""

    def __init__(self, softmax_scale: float, attention_dropout: float = 0.0) -> None:
        super().__init__()
        self.softmax_scale = softmax_scale
        self.attention_dropout = attention_dropout

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        qkv_layout: str,
        cu_seqlens_q: torch.Tensor | None,
        cu_seqlens_kv: torch.Tensor | None,
        max_seqlen_q: int,
        max_seqlen_kv: int,
        attn_mask_type: str,
        window_size: tuple[int, int],
        core_attention_bias_type: str = "no_bias",
        core_attention_bias: torch.Tensor | None = None,
        alibi_slopes: torch.Tensor | None = None,
        rng_state: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        softmax_type: str = "vanilla",
        softmax_offset: torch.Tensor | None = None,
        fp8: Any = None,
    ) -> torch.Tensor:
        """fp8: an FP8AttentionPlan (dot_product_attention/fp8_attention.py) for FP8 attention,
        else None."""
        fmt = qkv_format_of(qkv_layout)
        p = self.attention_dropout if self.training else 0.0
        if p > 0 and rng_state is None:
            rng_state = draw_rng_state(q.device)
        lens_q = lens_kv = None
        if fmt == "thd" or "padding" in attn_mask_type:
            lens_q = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
            lens_kv = cu_seqlens_kv[1:] - cu_seqlens_kv[:-1]
        args = (
            attn_mask_type,
            window_size,
            core_attention_bias_type,
            core_attention_bias,
            alibi_slopes,
            attention_mask,
            p,
            rng_state,
            _sink_logits(softmax_type, softmax_offset, q.shape[-2], q.device),
            fp8,
        )
        if fmt != "thd":
            out = self._attend(
                _to_bhsd(q, fmt), _to_bhsd(k, fmt), _to_bhsd(v, fmt), lens_q, lens_kv, *args
            )
            out = out.permute(2, 0, 1, 3) if fmt == "sbhd" else out.transpose(1, 2)
            return _merge_heads(out)
        b = cu_seqlens_q.numel() - 1
        row_q = _thd_index(cu_seqlens_q, q.shape[0], max_seqlen_q)
        row_kv = _thd_index(cu_seqlens_kv, k.shape[0], max_seqlen_kv)
        qp = _pad_thd(q, row_q, b, max_seqlen_q).transpose(1, 2)
        kp = _pad_thd(k, row_kv, b, max_seqlen_kv).transpose(1, 2)
        vp = _pad_thd(v, row_kv, b, max_seqlen_kv).transpose(1, 2)
        out = self._attend(qp, kp, vp, lens_q, lens_kv, *args).transpose(1, 2)
        return _merge_heads(_unpad_thd(out, row_q))

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        lens_q: torch.Tensor | None,
        lens_kv: torch.Tensor | None,
        mask_type: str,
        window: tuple[int, int],
        bias_type: str,
        bias: torch.Tensor | None,
        slopes: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        p: float,
        rng_state: torch.Tensor | None,
        sink: torch.Tensor | None = None,
        fp8: Any = None,
    ) -> torch.Tensor:
        """q [b, h, sq, d], k / v [b, h_kv, skv, d] -> [b, h, sq, d_v]; sink: fp32 [1, h, 1, 1]
        sink logits (off-by-one / learnable softmax) or None; fp8: FP8 attention's plan (its
        quantization points are applied in TE's order: QKV / dQKV, dP, S, O / dO)."""
        b, h, sq, _ = q.shape
        out_dtype = q.dtype
        if fp8 is not None:
            q, k, v = fp8.inputs(q, k, v)  # FP8 values in fp32: the GEMMs below run in fp32
        h_kv, skv = k.shape[1], k.shape[2]
        if h_kv != h:  # GQA / MQA: each KV head serves h / h_kv query heads
            if fp8 is not None:  # the gradient summed in index order (fp8_attention.py)
                k, v = expand_heads(k, h // h_kv), expand_heads(v, h // h_kv)
            else:
                k = k.repeat_interleave(h // h_kv, dim=1)
                v = v.repeat_interleave(h // h_kv, dim=1)
        if fp8 is not None:  # the canonical-order GEMM, the same bytes on every device
            x = ordered_matmul(q, k, transb=True)  # [b, h, sq, skv]
        else:
            x = attention_matmul(q, k.transpose(-2, -1)).float()  # [b, h, sq, skv]
        scale = self.softmax_scale
        if fp8 is not None and bias_type in ("pre_scale_bias", "post_scale_bias"):
            # a learnable bias's gradient summed over its broadcast dims in index order
            bias = canonical.ordered_broadcast(bias.float(), x.shape)
        if bias_type == "pre_scale_bias":
            x = x + bias.float()
        elif bias_type in ("post_scale_bias", "alibi"):
            add = (
                bias.float()
                if bias_type == "post_scale_bias"
                else _alibi_bias(slopes, b, h, sq, skv, lens_q, lens_kv, q.device)
            )
            x, scale = x * scale + add, 1.0
        if fp8 is not None:
            # dP is the gradient of the scaled scores (TE's point): scale first, then softmax(x).
            if scale != 1.0:
                x, scale = x * scale, 1.0
            x = fp8.scores(x)
        variant = _softmax_variant(
            mask_type, window, sq, skv, lens_q is not None, attention_mask is not None
        )
        keep = None
        if variant == "masked" or sink is not None:
            keep = keep_mask(mask_type, window, sq, skv, lens_q, lens_kv, q.device)
            if attention_mask is not None:  # 'arbitrary': True = masked, [b|1, h|1, sq, skv]
                user = ~attention_mask.to(torch.bool)
                keep = user if keep is None else keep & user
        if sink is not None and fp8 is not None:  # exp and the sums in the canonical order
            probs = canonical.softmax_with_sink(x * scale, keep, sink)
        elif sink is not None:
            probs = _softmax_with_sink(x * scale, keep, sink)
        else:
            probs = _softmax(x.contiguous(), variant, keep, scale)
        if p > 0:
            kept = _ops.fused_attn_dropout_mask(rng_state, b, h, sq, skv, p)
            probs = probs * (kept.float() * (1.0 / (1.0 - p)))
        if fp8 is not None:
            return fp8.output(ordered_matmul(fp8.probs(probs), v), out_dtype)
        return attention_matmul(probs.to(q.dtype), v)


def _softmax_variant(
    mask_type: str, window: tuple[int, int], sq: int, skv: int, padded: bool, arbitrary: bool
) -> str:
    """The fused softmax op that implements the mask: 'scaled' (nothing masked), 'upper_triang'
    (causal, square), 'aligned_causal' (bottom-right causal), else 'masked' (a byte mask)."""
    if padded or arbitrary or window[0] >= 0:
        return "masked"
    if mask_type == "no_mask":
        return "scaled" if window[1] < 0 else "masked"
    if mask_type == "causal" and sq == skv:
        return "upper_triang"
    if mask_type == "causal_bottom_right":
        return "aligned_causal"
    return "masked"


def _softmax(
    x: torch.Tensor, variant: str, keep: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """softmax(scale * x) over the kept keys, 0 for rows with none kept; x fp32 [b, h, sq, skv]."""
    b, h, sq, skv = x.shape
    if variant == "scaled" or (variant == "masked" and keep is None):
        return _ops.scaled_softmax_fwd(x, scale)
    if variant == "upper_triang":
        y = _ops.scaled_upper_triang_masked_softmax_fwd(x.view(b * h, sq, skv), scale)
        return y.view(b, h, sq, skv)
    if variant == "aligned_causal":  # rows with no key kept come out 0
        return _ops.scaled_aligned_causal_masked_softmax_fwd(x, scale)
    assert keep is not None
    if keep.shape[1] == 1:
        masked = (~keep).to(torch.uint8).expand(keep.shape[0], 1, sq, skv).contiguous()
        y = _ops.scaled_masked_softmax_fwd(x, masked, scale)
    else:  # a per-head mask: fold the heads into the batch (the op broadcasts over heads)
        masked = (~keep).to(torch.uint8).expand(b, h, sq, skv).reshape(b * h, 1, sq, skv)
        y = _ops.scaled_masked_softmax_fwd(x.view(b * h, 1, sq, skv), masked, scale)
        y = y.view(b, h, sq, skv)
    # The masked op gives a fully masked row uniform weights (TE's convention); attention's
    # (fused_attn.h) is output 0 there, which also zeroes the row's gradient.
    return y * keep.any(dim=-1, keepdim=True).float()


def _sink_logits(
    softmax_type: str, offset: torch.Tensor | None, h: int, device: torch.device
) -> torch.Tensor | None:
    """The sink logit per head as fp32 [1, h, 1, 1]: None for 'vanilla', 0 for 'off-by-one',
    the (differentiable) softmax_offset for 'learnable'."""
    if softmax_type == "vanilla":
        return None
    if softmax_type == "off-by-one":
        return torch.zeros((1, h, 1, 1), dtype=torch.float32, device=device)
    return offset.float().reshape(1, h, 1, 1)


def _softmax_with_sink(
    x: torch.Tensor, keep: torch.Tensor | None, sink: torch.Tensor
) -> torch.Tensor:
    """Softmax of the scaled logits x (fp32 [b, h, sq, skv]) over the kept keys plus one sink
    logit per head that takes probability mass and has no value (fused_attn.h, attention sinks).
    Plain torch ops (autograd gives the sink's gradient); a row with no key kept puts all its
    mass on the sink, so its output is 0."""
    b, h, sq, skv = x.shape
    if keep is not None:
        x = x.masked_fill(~keep, float("-inf"))
    col = sink.expand(b, h, sq, 1)
    probs = torch.softmax(torch.cat((x, col), dim=-1), dim=-1)
    return probs[..., :skv]

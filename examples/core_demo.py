#!/usr/bin/env python
"""A tour of transformer_engine_lite's core library on the CPU, through its C API (ctypes):

1. build info;
2. an FP8 MLP block, LayerNorm -> FP8 GEMM -> GELU -> FP8 GEMM under current scaling, against the
   same block in torch fp32;
3. delayed scaling: the amax history and scale of a tensor whose range grows over a few steps,
   quantized by the fused LayerNorm with FP8 output;
4. MXFP8: per-block E8M0 scales and their error against one per-tensor FP8 scale.

Runs in a few seconds: python examples/core_demo.py
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from transformer_engine_lite.common import build_info, capi

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
LN_EPS = 1e-5
_NP_DTYPES = {
    capi.DType.Byte: np.uint8,
    capi.DType.Int32: np.int32,
    capi.DType.Int64: np.int64,
    capi.DType.Float32: np.float32,
}
torch.manual_seed(0)


def section(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 74 - len(title)))


def empty() -> capi.Tensor:
    """An NVTETensor with no buffers (an absent bias, pre-GELU output or workspace)."""
    return capi.Tensor()


def scalar(v: float = 0.0) -> torch.Tensor:
    return torch.tensor([v], dtype=torch.float32)


class PerTensorFP8:
    """An E4M3 tensor with its per-tensor scale, amax and scale_inv buffers, and its NVTETensor."""

    def __init__(
        self, shape, scale: torch.Tensor | None = None, amax: torch.Tensor | None = None
    ) -> None:
        self.data = torch.empty(shape, dtype=E4M3)
        self.scale = scalar(1.0) if scale is None else scale  # may be a recipe's scale buffer
        self.amax = scalar() if amax is None else amax  # may be a row of an amax history
        self.scale_inv = scalar()
        self.t = capi.Tensor(self.data, scale=self.scale, amax=self.amax, scale_inv=self.scale_inv)

    def dequantize(self) -> torch.Tensor:
        out = torch.empty(self.data.shape)
        capi.call("nvte_dequantize", self.t, capi.Tensor(out), None)
        return out


def quantize_current(x: torch.Tensor) -> PerTensorFP8:
    """Current scaling: amax of x now, scale = 448 / amax, then the cast (three C API calls)."""
    q = PerTensorFP8(x.shape)
    tx = capi.Tensor(x)
    capi.call("nvte_compute_amax", tx, q.t, None)
    capi.call("nvte_compute_scale_from_amax", q.t, None, None)
    capi.call("nvte_quantize", tx, q.t, None)
    return q


def layernorm(x, gamma, beta, z: capi.Tensor) -> None:
    rows = x.numel() // x.shape[-1]
    mu, rsigma = torch.empty(rows), torch.empty(rows)
    args = [
        capi.Tensor(x),
        capi.Tensor(gamma),
        capi.Tensor(beta),
        LN_EPS,
        z,
        capi.Tensor(mu),
        capi.Tensor(rsigma),
    ]
    query = empty()  # workspace protocol: a call with no workspace memory returns its size
    capi.call("nvte_layernorm_fwd", *args, query, 0, False, None)
    bt = query.param(capi.TensorParam.RowwiseData)
    shape = [bt.shape.data[i] for i in range(bt.shape.ndim)]
    numel = math.prod(shape)
    # A zero-size NumPy view keeps a real pointer, so the second call is never another query.
    ws = np.empty(max(numel, 1), _NP_DTYPES[capi.DType(bt.dtype)])[:numel].reshape(shape)
    capi.call(
        "nvte_layernorm_fwd", *args, capi.Tensor(ws, dtype=capi.DType(bt.dtype)), 0, False, None
    )


def linear(inp: capi.Tensor, weight: capi.Tensor, out: torch.Tensor) -> None:
    """out = inp @ weight^T: TE's Linear forward, nvte_cublas_gemm(weight, inp, transa=True)."""
    capi.call(
        "nvte_cublas_gemm",
        weight,
        inp,
        capi.Tensor(out),
        empty(),
        empty(),
        True,
        False,
        False,
        empty(),
        False,
        False,
        0,
        None,
    )


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> str:
    e = (x.float() - ref).norm() / ref.norm()
    m = (x.float() - ref).abs().max() / ref.abs().max()
    return f"rel. L2 error {e.item():.2e}, max error / max|ref| {m.item():.2e}"


# ------------------------------------------------------------------------------------ 1. build
def show_build_info() -> None:
    section("1. build")
    info = build_info()
    print(f"transformer_engine_lite {info['version']}  ({info['library_path']})")
    print(
        f"  device backends: {', '.join(info['device_backends'])};  CPU GEMM: "
        f"{info.get('gemm_cpu')};  OpenMP threads: {info.get('max_threads')}"
    )
    feats = info.get("cpu_features", {})
    print(
        f"  CPU features: {', '.join(k for k, v in feats.items() if v is True)}; kernel "
        f"clones: {', '.join(feats.get('kernel_clones', []))}"
    )
    print(f"  FP8 formats: {', '.join(info.get('cpu_fp8_formats', []))}")


# ---------------------------------------------------------------------------------- 2. FP8 MLP
def fp8_mlp() -> None:
    section("2. FP8 MLP block (current scaling) vs torch fp32")
    tokens, hidden, ffn = 256, 512, 2048
    x = torch.randn(tokens, hidden).to(torch.bfloat16)
    gamma = (1 + 0.1 * torch.randn(hidden)).to(torch.bfloat16)
    beta = (0.1 * torch.randn(hidden)).to(torch.bfloat16)
    w1 = (torch.randn(ffn, hidden) / math.sqrt(hidden)).to(torch.bfloat16)
    w2 = (torch.randn(hidden, ffn) / math.sqrt(ffn)).to(torch.bfloat16)

    # LayerNorm -> FP8. Current scaling needs the amax of this very output, so (as TE does) the norm
    # is written in bf16 and then quantized; section 3 shows the fused LN -> FP8 of delayed scaling.
    ln = torch.empty_like(x)
    layernorm(x, gamma, beta, capi.Tensor(ln))
    ln8, w1_8, w2_8 = quantize_current(ln), quantize_current(w1), quantize_current(w2)
    print(f"  LN out  -> E4M3: amax {ln8.amax.item():7.3f}  scale {ln8.scale.item():8.3f}")
    print(f"  W1      -> E4M3: amax {w1_8.amax.item():7.3f}  scale {w1_8.scale.item():8.3f}")
    print(f"  W2      -> E4M3: amax {w2_8.amax.item():7.3f}  scale {w2_8.scale.item():8.3f}")

    h = torch.empty(tokens, ffn, dtype=torch.bfloat16)
    linear(ln8.t, w1_8.t, h)  # E4M3 x E4M3 -> bf16, FP32 accumulation, scale_inv applied
    act = torch.empty_like(h)
    capi.call("nvte_gelu", capi.Tensor(h), capi.Tensor(act), None)
    act8 = quantize_current(act)
    y = torch.empty(tokens, hidden, dtype=torch.bfloat16)
    linear(act8.t, w2_8.t, y)
    print(f"  GELU    -> E4M3: amax {act8.amax.item():7.3f}  scale {act8.scale.item():8.3f}")

    def block(dtype):
        t = F.layer_norm(x.to(dtype), (hidden,), gamma.to(dtype), beta.to(dtype), LN_EPS)
        t = F.gelu(t @ w1.to(dtype).t(), approximate="tanh")
        return t @ w2.to(dtype).t()

    def fake_fp8(t):  # the same current-scaling E4M3 round trip, in torch
        scale = torch.full((), E4M3_MAX) / t.abs().amax().float()
        return (t.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).float() / scale

    emu = (fake_fp8(F.layer_norm(x, (hidden,), gamma, beta, LN_EPS)) @ fake_fp8(w1).t()).bfloat16()
    emu = F.gelu(emu.float(), approximate="tanh").bfloat16()
    emu = (fake_fp8(emu) @ fake_fp8(w2).t()).bfloat16()

    ref = block(torch.float32)
    print(f"  output {tuple(y.shape)} vs torch fp32:")
    print(f"    our FP8 block:                 {rel_err(y, ref)}")
    print(f"    torch emulation of the recipe: {rel_err(emu, ref)}")
    print(f"    torch bf16 block:              {rel_err(block(torch.bfloat16), ref)}")
    print("  The FP8 error is the E4M3 rounding of four operands (3 mantissa bits, ~2-3% each);")
    print(f"  ours vs the torch emulation: {rel_err(y, emu.float())}")


# ---------------------------------------------------------------------------- 3. delayed scaling
def delayed_scaling(steps: int = 8, history_len: int = 4) -> None:
    section("3. delayed scaling: amax history and scale updates")
    print(
        f"  LayerNorm with fused E4M3 output; gamma grows each step; history {history_len}, "
        "amax_compute_algo 'max', margin 0"
    )
    rows, hidden = 64, 256
    x = torch.randn(rows, hidden).to(torch.bfloat16)
    beta = torch.zeros(hidden, dtype=torch.bfloat16)
    history = torch.zeros(history_len, 1)  # TE layout: [history, num_scales]
    scale = scalar(1.0)
    # The output records its amax straight into row 0 of the history, as TE's modules do.
    out = PerTensorFP8((rows, hidden), scale=scale, amax=history[0])
    th, ts = capi.Tensor(history), capi.Tensor(scale)
    print(
        f"  {'step':>4} {'gamma':>6} {'scale used':>11} {'amax seen':>10} {'saturated':>9} "
        f"{'history after update':>34} {'next scale':>11}"
    )
    for step in range(steps):
        g = 2.0 ** (step * 2) if step < 4 else 1.0  # range grows 4x a step, then drops back
        gamma = torch.full((hidden,), g, dtype=torch.bfloat16)
        used = scale.item()
        layernorm(x, gamma, beta, out.t)
        seen = history[0, 0].item()
        ref = F.layer_norm(x.float(), (hidden,), gamma.float(), beta.float(), LN_EPS)
        saturated = (ref.abs() * used > E4M3_MAX).float().mean().item()
        capi.call(
            "nvte_delayed_scaling_recipe_amax_and_scale_update",
            th,
            ts,
            th,
            ts,
            b"max",
            int(capi.DType.Float8E4M3),
            0.0,
            None,
        )
        hist = ", ".join(f"{v:7.2f}" for v in history[:, 0].tolist())
        print(
            f"  {step:>4} {g:>6g} {used:>11.4g} {seen:>10.3f} {saturated:>8.1%} [{hist:>32}] "
            f"{scale.item():>11.4g}"
        )
    print(
        "  The scale lags the range by one step (saturation while the range grows) and keeps "
        "the\n  largest amax of the window, so it recovers only after the window has passed."
    )


# ------------------------------------------------------------------------------------- 4. MXFP8
def mxfp8() -> None:
    section("4. MXFP8 (E8M0 scale per 32 elements) vs one per-tensor FP8 scale")
    rows, cols = 64, 256
    # Rows spanning 8 orders of magnitude: one tensor-wide scale cannot serve them all.
    x = torch.randn(rows, cols) * torch.logspace(-4, 4, rows).unsqueeze(1)
    q = torch.empty(rows, cols, dtype=E4M3)
    s = torch.empty(rows, cols // 32, dtype=torch.uint8)  # E8M0 bytes: 2^(byte - 127)
    mx = capi.Tensor(q, scale_inv=s, scaling_mode=capi.ScalingMode.MXFP8_1D_SCALING)
    capi.call("nvte_quantize", capi.Tensor(x), mx, None)
    x_mx = torch.empty(rows, cols)
    capi.call("nvte_dequantize", mx, capi.Tensor(x_mx), None)
    pt = quantize_current(x)
    x_pt = pt.dequantize()

    print(f"  input {rows}x{cols} fp32, row magnitudes 1e-4 .. 1e4; {s.numel()} E8M0 scales")
    for r in (0, rows // 2, rows - 1):
        exps = [b - 127 for b in s[r].tolist()]
        print(f"  row {r:>2}: max|x| {x[r].abs().max().item():10.4g}, block scales 2^{exps}")
    print(f"  per-tensor: scale {pt.scale.item():.4g} (amax {pt.amax.item():.4g})")
    print(
        f"  {'rows':>12} {'MXFP8 rel. error':>17} {'per-tensor rel. error':>22} "
        f"{'per-tensor zeros':>17}"
    )
    for lo, hi in ((0, 16), (16, 32), (32, 48), (48, 64)):
        ref = x[lo:hi]
        e_mx = ((x_mx[lo:hi] - ref).norm() / ref.norm()).item()
        e_pt = ((x_pt[lo:hi] - ref).norm() / ref.norm()).item()
        zeros = (x_pt[lo:hi] == 0).float().mean().item()
        print(f"  {f'{lo}..{hi - 1}':>12} {e_mx:>17.2e} {e_pt:>22.2e} {zeros:>16.1%}")
    print(
        "  MXFP8 keeps ~3 significant bits everywhere; the per-tensor scale is set by the largest"
        "\n  rows and flushes the small ones to zero."
    )


def main() -> None:
    show_build_info()
    fp8_mlp()
    delayed_scaling()
    mxfp8()
    print("\ndone.")


if __name__ == "__main__":
    main()

"""Shared helpers of the PyTorch front-end tests: the one tolerance table, a verbose closeness check,
fp64 reference math and FP8 emulation in plain torch."""

from __future__ import annotations

import math

import pytest
import torch

import transformer_engine_lite.pytorch as te  # noqa: F401  (loads torch.ops.te_lite)

# (atol, rtol) per result kind, for module results compared with an fp64 reference. atol is
# relative to max(1, max|ref|) (weight gradients are sums over tokens). Low-precision dtypes get
# a few ulps at 1.0 (bf16 ulp 2^-7, fp16 2^-10) because modules chain several rounded ops.
# "fp8" is TE's module-test tolerance pair (E4M3: atol 0.0675, rtol 0.125), applied normwise:
# ||out - ref||_2 <= rtol * ||ref||_2 + atol * max|ref|. Elementwise it would fail on the odd
# element where a sum cancels to ~0 (FP8 errors are relative to the terms, not to the result).
# Measured normwise errors: 3.5-6% for one FP8 GEMM (E4M3 forward, E5M2 gradients), 7-13.5% for
# LayerNormMLP, whose second GEMM consumes the first one's FP8-rounded result: "fp8_2gemm".
TOLERANCES: dict[object, tuple[float, float]] = {
    torch.float32: (2e-5, 2e-5),
    torch.float16: (4e-3, 4e-3),
    torch.bfloat16: (3e-2, 3e-2),
    "fp8": (0.0675, 0.125),
    "fp8_2gemm": (0.0675, 0.2),
    # FP8 module vs the same math emulated in plain torch (identical quantization; only the
    # summation order differs): fp32-level agreement.
    "fp8_emulated": (1e-5, 1e-5),
    # compiled vs eager: same kernels, so the results must be identical.
    "compiled": (0.0, 0.0),
}

# Attention vs an fp64 reference (test_attention.py): max|out - ref| <= 2 * max|out_torch - ref| +
# floor * max(1, max|ref|), out_torch being the same math in plain torch in the low-precision dtype
# (flash-attention's test method). The floor covers results whose torch error is ~0 (e.g. a
# one-key softmax): a fraction of an ulp at 1.0 (bf16 2^-7, fp16 2^-10).
ATTENTION_FLOOR: dict[torch.dtype, float] = {
    torch.float32: 1e-6,
    torch.float16: 1e-4,
    torch.bfloat16: 1e-3,
}

# FP8 output vs the same quantization emulated in fp64 (test_fp8_attention.py): an element whose
# unquantized value lies within summation-order error of a rounding midpoint may round to the other
# neighbour, one FP8 step away. At most this fraction of a tensor may do so (measured: 0.1%).
FP8_FLIP_FRACTION = 0.01

NORMWISE = ("fp8", "fp8_2gemm")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def assert_close(out: torch.Tensor, ref: torch.Tensor, kind: object, what: str = "") -> None:
    """Elementwise |out - ref| <= atol * max(1, max|ref|) + rtol * |ref|, with the table's
    (atol, rtol) for `kind`; reports count, max error and the first offending indices."""
    atol, rtol = TOLERANCES[kind]
    if out.shape != ref.shape:
        pytest.fail(f"{what}: shape {tuple(out.shape)} != expected {tuple(ref.shape)}")
    o, r = out.detach().double(), ref.detach().double()
    if kind in NORMWISE:
        err = (o - r).norm().item()
        bound = rtol * r.norm().item() + atol * r.abs().max().item()
        if not err <= bound:
            pytest.fail(
                f"{what}: ||out - ref|| = {err:.4g} > {bound:.4g} (kind {kind}: rtol "
                f"{rtol} * ||ref|| {r.norm().item():.4g} + atol {atol} * max|ref|)"
            )
        return
    scale = max(1.0, r.abs().max().item()) if r.numel() else 1.0
    bad = (o - r).abs() > atol * scale + rtol * r.abs()
    bad |= o.isnan() != r.isnan()
    if bad.any():
        idx = bad.nonzero()[:4].tolist()
        err = (o - r).abs().nan_to_num(math.inf).max().item()
        pytest.fail(
            f"{what}: {int(bad.sum())}/{bad.numel()} elements off (kind {kind}: atol {atol}*"
            f"{scale:.3g}, rtol {rtol}); max abs err {err:.3g}; first at {idx}: got "
            f"{[o[tuple(i)].item() for i in idx]}, expected {[r[tuple(i)].item() for i in idx]}"
        )


def assert_fp8_close(out: torch.Tensor, ref: torch.Tensor, fp8_dtype: torch.dtype,
                     scale: float, what: str = "") -> None:
    """out and ref are FP8 values (times 1/scale) of the same tensor quantized after different
    summation orders: equal to fp32 level ("fp8_emulated") except at most FP8_FLIP_FRACTION of
    the elements, each one FP8 step apart (the step of the larger magnitude; subnormal spacing
    at the bottom of the format)."""
    atol, rtol = TOLERANCES["fp8_emulated"]
    o, r = out.detach().double(), ref.detach().double()
    far = (o - r).abs() > atol * max(1.0, r.abs().max().item()) + rtol * r.abs()
    if not far.any():
        return
    mant, min_exp = {torch.float8_e4m3fn: (3, -6), torch.float8_e5m2: (2, -14)}[fp8_dtype]
    big = torch.maximum(o.abs(), r.abs()) * scale
    exp = torch.floor(torch.log2(big.clamp_min(2.0**min_exp))).clamp_min(min_exp)
    step = torch.exp2(exp - mant) / scale
    # (1 + 1e-4): the two sides may use current scales that differ at fp32 level
    off = far & ((o - r).abs() > step * (1 + 1e-4))
    frac = far.sum().item() / far.numel()
    if off.any() or frac > FP8_FLIP_FRACTION:
        idx = (off if off.any() else far).nonzero()[:4].tolist()
        pytest.fail(
            f"{what}: {int(far.sum())}/{far.numel()} elements differ beyond fp32 level (allowed "
            f"fraction {FP8_FLIP_FRACTION}), {int(off.sum())} by more than one FP8 step; first "
            f"at {idx}: got {[o[tuple(i)].item() for i in idx]}, expected "
            f"{[r[tuple(i)].item() for i in idx]}"
        )


# ----------------------------------------------------------------------------- fp64 references
def ref_layernorm(x, w, b, eps, zero_centered=False):
    x = x.double()
    g = w.double() + (1.0 if zero_centered else 0.0)
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * g + b.double()


def ref_rmsnorm(x, w, eps, zero_centered=False):
    x = x.double()
    g = w.double() + (1.0 if zero_centered else 0.0)
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * g


def ref_norm(kind, x, w, b, eps, zero_centered=False):
    if kind == "LayerNorm":
        return ref_layernorm(x, w, b, eps, zero_centered)
    return ref_rmsnorm(x, w, eps, zero_centered)


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


_ACT = {
    "gelu": _gelu_tanh,
    "qgelu": lambda x: x * torch.sigmoid(1.702 * x),
    "relu": torch.relu,
    "srelu": lambda x: torch.relu(x) ** 2,
    "silu": lambda x: x * torch.sigmoid(x),
    "sigmoid": torch.sigmoid,
}
_GATED = {
    "geglu": "gelu",
    "qgeglu": "qgelu",
    "reglu": "relu",
    "sreglu": "srelu",
    "swiglu": "silu",
    "glu": "sigmoid",
}


def ref_activation(name, x, limit=7.0, alpha=1.702, offset=1.0):
    """TE's activations; gated ones: [..., 2H] = [act input | linear]. clamped_swiglu: GPT-OSS's
    min(a, limit) * sigmoid(alpha * min(a, limit)) * (clamp(b, -limit, limit) + offset)."""
    if name == "clamped_swiglu":
        a, lin = x.chunk(2, -1)
        a = a.clamp(max=limit)
        return a * torch.sigmoid(alpha * a) * (lin.clamp(-limit, limit) + offset)
    if name in _GATED:
        a, lin = x.chunk(2, -1)
        return _ACT[_GATED[name]](a) * lin
    return _ACT[name](x)


def ref_linear(x, w, b=None):
    y = x.double() @ w.double().t()
    return y + b.double() if b is not None else y


# ----------------------------------------------------------------------------- FP8 emulation
def emulate_cast(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor) -> torch.Tensor:
    """Per-tensor quantize-dequantize in plain torch: satfinite encode of x*scale, times 1/scale."""
    m = FP8_MAX[dtype]
    s = scale.float()
    q = (x.float() * s).clamp(-m, m).to(dtype)
    return q.double() * (1.0 / s).double()


def current_scale(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    amax = x.float().abs().amax()
    # one IEEE division, as the core (a python float / tensor multiplies by a reciprocal)
    return torch.where(amax > 0, torch.tensor(FP8_MAX[dtype]) / amax, torch.ones(()))


def emulate_mx(x2d: torch.Tensor, dtype: torch.dtype, columnwise: bool = False) -> torch.Tensor:
    """MXFP8 quantize-dequantize: 32-element blocks along dim 1 (dim 0 if columnwise), scale
    2^ceil(log2(block_amax / fp8_max)) (TE's round-up rule)."""
    x = x2d.float().t() if columnwise else x2d.float()
    r, c = x.shape
    nb = -(-c // 32)
    xp = torch.nn.functional.pad(x, (0, nb * 32 - c)).reshape(r, nb, 32)
    am = xp.abs().amax(-1, keepdim=True)
    e = torch.ceil(torch.log2(am / FP8_MAX[dtype]))
    e = torch.where(am > 0, e, torch.full_like(e, -127.0)).clamp(-127, 127)
    q = (xp / torch.exp2(e)).to(dtype).double() * torch.exp2(e).double()
    out = q.reshape(r, nb * 32)[:, :c]
    return out.t() if columnwise else out


def copy_params(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    with torch.no_grad():
        for (n1, p1), (n2, p2) in zip(dst.named_parameters(), src.named_parameters()):
            assert n1 == n2, (n1, n2)
            p1.copy_(p2)

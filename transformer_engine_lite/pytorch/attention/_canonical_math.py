"""Device-independent exp, log, row sums and broadcasts for FP8 attention's emulation (the sink
softmax, context parallelism's per-step softmax, LSE and LSE merge): the same bits on the CPU
and on CUDA/HIP, and autograd's backward the same.

torch's exp / log / logsumexp / logaddexp are libm's on the CPU (Sleef, glibc) and CUDA's
intrinsics on the GPU: their last bits differ, and a reduction (sum, a broadcast's backward)
runs in each backend's own order. Here:

- exp and log are our own definitions, written as a fixed sequence of IEEE fp32 operations that
  round alike on every device: add, sub, mul, div (correctly rounded per element on the CPU and
  on CUDA/HIP; torch compiles neither with fast-math, and separate ops are never contracted into
  an fma), round-half-even, compares, selects and integer bit operations. No fma is used (torch
  has no elementwise fma whose contraction is guaranteed on both), so every step is a plain
  IEEE rounding and tests/pytorch/test_fp8_cp_ordered.py re-implements them in NumPy fp32.
  Each is an opaque custom op (te_lite_py::canonical_exp / _log): a compiler sees no mul + add
  pair it could fuse into an fma.
  * exp(x): k = rne(x * log2(e)); r = (x - k * LN2_HI) - k * LN2_LO (LN2_HI has 15 significant
    bits, so k * LN2_HI is exact for |k| <= 2^8, and x - k * LN2_HI is exact by Sterbenz);
    exp(r) by the degree-7 Taylor polynomial in Horner form (|r| <= 0.347: truncation 5.6e-9
    relative); times 2^k as two exact power-of-two factors (2^floor(k/2), then 2^(k - floor(k/2)):
    the first product is exact, the second the only rounding of the scaling, subnormal results
    and overflow included). x is clamped to [-110, 100] for k only (exp is 0 / +inf there);
    NaN -> NaN. Max error (sweep of [-103, 88.7] vs fp64): 1.17 ulp (the test bounds it by 2).
  * log(x): x = 2^e m with m in [sqrt(1/2), sqrt(2)) from the bits (subnormals scaled by 2^24
    first); f = m - 1 (exact); z = f / (2 + f); log(m) = 2z + 2z * w P(w), w = z^2, P the atanh
    series to z^12 (|z| <= 0.1716: truncation 2e-13); log(x) = e * LN2_HI + (e * LN2_LO +
    log(m)). log(0) = -inf, log(+inf) = +inf, log(x < 0) and log(NaN) = NaN. Max error (sweep
    of (0, 1000], subnormals included, vs fp64): 1.92 ulp (the test bounds it by 2).
- A row sum is te_lite::ordered_bmm against a column of ones (an fmaf chain of exact products:
  the sequential fp32 sum in index order from +0); broadcasting a row value along the row is
  ordered_bmm against a row of ones (x * 1 + 0, exact), so its backward -- the sum of the
  gradients along the row -- is again an ordered sum. ordered_broadcast does the same for any
  broadcast (the sink logit over batch and query rows, a bias over the batch).

The backward of everything else here is autograd through add / sub / mul / div / where, which
round alike on every device; exp's backward is g * exp(x) (its saved output), log's g / x.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "exp",
    "log",
    "logsumexp",
    "merge",
    "ordered_broadcast",
    "ordered_matmul",
    "row_expand",
    "row_sum",
    "softmax_with_sink",
]

LOG2E = float.fromhex("0x1.715476p+0")  # fp32(1 / ln 2)
LN2_HI = float.fromhex("0x1.62e4p-1")  # ln 2 to 15 significant bits
LN2_LO = float.fromhex("0x1.7f7d1cp-20")  # fp32(ln 2 - LN2_HI)
SQRT2 = float.fromhex("0x1.6a09e6p+0")  # fp32(sqrt 2)
# Horner order, highest degree first: 1/7!, ..., 1/2!, 1, 1 (each rounded to fp32)
EXP_COEFFS = [1 / 5040, 1 / 720, 1 / 120, 1 / 24, 1 / 6, 1 / 2, 1.0, 1.0]
# atanh series of P(w): 1/13, 1/11, ..., 1/3
LOG_COEFFS = [1 / 13, 1 / 11, 1 / 9, 1 / 7, 1 / 5, 1 / 3]


def _f32(c: float) -> float:
    """c rounded to fp32 (every constant is an fp32 value, so no op sees a wider scalar)."""
    return torch.tensor(c, dtype=torch.float32).item()


EXP_COEFFS = [_f32(c) for c in EXP_COEFFS]
LOG_COEFFS = [_f32(c) for c in LOG_COEFFS]


def _pow2(k: torch.Tensor) -> torch.Tensor:
    """2^k as fp32 from its bits, k int32 in [-126, 127]."""
    return torch.bitwise_left_shift(k + 127, 23).view(torch.float32)


def _check(name: str, x: torch.Tensor) -> None:
    if x.dtype != torch.float32:
        raise ValueError(f"{name}: expected argument 'x' of dtype torch.float32, got {x.dtype}")


def _exp_impl(x: torch.Tensor) -> torch.Tensor:
    xc = x.clamp(-110.0, 100.0)
    k = torch.round(xc * LOG2E)
    r = (xc - k * LN2_HI) - k * LN2_LO
    p = torch.full_like(r, EXP_COEFFS[0])
    for c in EXP_COEFFS[1:]:
        p = p * r + c
    ki = torch.where(torch.isnan(k), torch.zeros_like(k), k).to(torch.int32)
    k1 = torch.bitwise_right_shift(ki, 1)  # floor(k / 2)
    return (p * _pow2(k1)) * _pow2(ki - k1)


def _log_impl(x: torch.Tensor) -> torch.Tensor:
    sub = x < float.fromhex("0x1p-126")
    t = torch.where(sub, x * float.fromhex("0x1p24"), x)  # exact
    bits = t.view(torch.int32)
    e = torch.bitwise_right_shift(bits, 23) - 127 - sub.to(torch.int32) * 24
    m = torch.bitwise_or(torch.bitwise_and(bits, 0x7FFFFF), 0x3F800000).view(torch.float32)
    big = m > SQRT2
    m = torch.where(big, m * 0.5, m)
    e = e + big.to(torch.int32)
    f = m - 1.0
    z = f / (f + 2.0)
    w = z * z
    s = torch.full_like(w, LOG_COEFFS[0])
    for c in LOG_COEFFS[1:]:
        s = s * w + c
    z2 = z + z
    lm = z2 + z2 * (w * s)
    ef = e.to(torch.float32)
    y = ef * LN2_HI + (ef * LN2_LO + lm)
    y = torch.where(x == 0, torch.full_like(y, float("-inf")), y)
    y = torch.where(x == float("inf"), x, y)
    return torch.where((x < 0) | torch.isnan(x), torch.full_like(y, float("nan")), y)


@torch.library.custom_op("te_lite_py::canonical_exp", mutates_args=())
def canonical_exp(x: torch.Tensor) -> torch.Tensor:
    """exp(x) for fp32 x by the definition in the module docstring."""
    _check("canonical_exp", x)
    return _exp_impl(x)


@canonical_exp.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _exp_setup(ctx: Any, inputs: tuple[torch.Tensor], output: torch.Tensor) -> None:
    ctx.save_for_backward(output)


def _exp_backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
    (y,) = ctx.saved_tensors
    return g * y


canonical_exp.register_autograd(_exp_backward, setup_context=_exp_setup)


@torch.library.custom_op("te_lite_py::canonical_log", mutates_args=())
def canonical_log(x: torch.Tensor) -> torch.Tensor:
    """log(x) for fp32 x by the definition in the module docstring."""
    _check("canonical_log", x)
    return _log_impl(x)


@canonical_log.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _log_setup(ctx: Any, inputs: tuple[torch.Tensor], output: torch.Tensor) -> None:
    ctx.save_for_backward(inputs[0])


def _log_backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
    (x,) = ctx.saved_tensors
    return g / x


canonical_log.register_autograd(_log_backward, setup_context=_log_setup)

# The primitives the helpers below call, looked up at call time (the oracle test swaps them).
exp = canonical_exp
log = canonical_log


def ordered_matmul(a: torch.Tensor, b: torch.Tensor, transb: bool = False) -> torch.Tensor:
    """a [..., m, K] . b [..., K, n] (transb: b [..., n, K]) in the canonical order
    (te_lite::ordered_bmm; _attention_gemm.ordered_matmul)."""
    return torch.ops.te_lite.ordered_bmm(a, b, False, transb)


def _ones(x: torch.Tensor, *tail: int) -> torch.Tensor:
    return x.new_ones((1,) * (x.dim() - 2) + tail).expand(*x.shape[:-2], *tail)


def row_sum(x: torch.Tensor) -> torch.Tensor:
    """x [..., n] summed over the last dim, in index order from +0 -> [...]."""
    x = x.float()
    if x.dim() == 1:
        return row_sum(x.unsqueeze(0)).squeeze(0)
    return ordered_matmul(x, _ones(x, x.shape[-1], 1)).squeeze(-1)


def row_expand(x: torch.Tensor, n: int) -> torch.Tensor:
    """x [...] repeated along a new last dim of size n; its backward sums in index order."""
    a = x.unsqueeze(-1)
    if a.dim() == 1:
        return row_expand(x.unsqueeze(0), n).squeeze(0)
    return ordered_matmul(a, _ones(a, 1, n))


class _OrderedBroadcast(torch.autograd.Function):
    """x broadcast to `shape` (torch.expand); the gradient summed over the broadcast dims in
    index order (row-major over those dims) by row_sum, not by a reduction kernel."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        ctx.in_shape = x.shape
        return x.expand(shape)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        in_shape = (1,) * (g.dim() - len(ctx.in_shape)) + tuple(ctx.in_shape)
        red = [i for i, (a, b) in enumerate(zip(in_shape, g.shape)) if a == 1 and b != 1]
        if not red:
            return g.reshape(ctx.in_shape), None
        keep = [i for i in range(g.dim()) if i not in red]
        gp = g.permute(*keep, *red)
        gp = gp.reshape(*gp.shape[: len(keep)], -1)
        return row_sum(gp).reshape(ctx.in_shape), None


def ordered_broadcast(x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """x.expand(shape), its gradient summed in index order (see _OrderedBroadcast)."""
    if tuple(x.shape) == tuple(shape):
        return x
    return _OrderedBroadcast.apply(x, tuple(shape))


def logsumexp(x: torch.Tensor) -> torch.Tensor:
    """log(sum(exp(x))) over the last dim (x fp32 [..., n], -inf for masked entries; every row
    keeps one finite entry): m + log(sum(exp(x - m))), m the row max. m is a constant to autograd
    (the LSE does not depend on it), so the gradient is exp(x - m) / sum, by exp's and log's
    backward and the ordered sum's."""
    m = x.detach().amax(-1)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    return m + log(row_sum(exp(x - m.unsqueeze(-1))))


def merge(
    out_acc: torch.Tensor, lse_acc: torch.Tensor, out: torch.Tensor, lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """cp_comm.merge in the canonical order: lse' = hi + log(1 + exp(lo - hi)) (hi, lo the larger
    and smaller LSE), out' = out_acc exp(lse_acc - lse') + out exp(lse - lse'), each scale
    broadcast over d_v by row_expand. A row no key reached yet (-inf on both sides) stays
    0 / -inf."""
    ge = lse_acc >= lse
    hi = torch.where(ge, lse_acc, lse)
    lo = torch.where(ge, lse, lse_acc)
    d = lo - hi
    d = torch.where(torch.isnan(d), torch.full_like(d, float("-inf")), d)  # -inf - -inf
    new = hi + log(1.0 + exp(d))
    safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    dv = out.shape[-1]
    a = row_expand(exp(lse_acc - safe), dv)
    b = row_expand(exp(lse - safe), dv)
    return out_acc * a + out.float() * b, new


def softmax_with_sink(
    x: torch.Tensor, keep: torch.Tensor | None, sink: torch.Tensor
) -> torch.Tensor:
    """backends._softmax_with_sink in the canonical order: softmax over the kept keys of x (fp32
    [b, h, sq, skv], already scaled) plus the per-head sink logit (fp32 [1, h, 1, 1]), which takes
    probability mass and has no value; the sink's gradient (a learnable softmax_offset) is summed
    over batch and query rows in index order."""
    b, h, sq, skv = x.shape
    if keep is not None:
        x = x.masked_fill(~keep, float("-inf"))
    z = torch.cat((x, ordered_broadcast(sink, (b, h, sq, 1))), dim=-1)
    m = z.detach().amax(-1, keepdim=True)  # finite: the sink column
    e = exp(z - m)
    p = e / row_expand(row_sum(e), skv + 1)
    return p[..., :skv]

"""torch.ops.te_lite: the core library's ops registered with the PyTorch dispatcher.

Loading this module loads the C++ extension (pytorch/_C*.so: schemas in csrc/registration.cpp, CPU
and, in GPU builds, CUDA implementations) and registers in Python a fake kernel for every op (so
torch.compile and FakeTensor tracing work) and autograd for the differentiable ones (norms,
activations, softmax, RoPE, transpose, high-precision gemm). Quantization, scale and statistics
ops are registered as not differentiable (csrc/cast.cpp: their outputs never require grad). Ops are
functional (new outputs) unless their name ends in "_".

Final op list (namespace te_lite). FP8 dtypes are torch.float8_e4m3fn / float8_e5m2 /
float8_e4m3fnuz / float8_e5m2fnuz; MXFP8 E8M0 scales are uint8. Per-tensor FP8 side outputs
(amax, scale_inv) are float32 [1] when the output is FP8, float32 [0] otherwise; outputs that do not
apply are float32 [0].

  quantize(Tensor x, Tensor scale, ScalarType fp8_dtype) -> (data, amax, scale_inv)
      data = encode(x * scale) (nearest even, satfinite); amax = max|x| (NaN propagates);
      scale_inv = 1/scale.
  quantize_mxfp8(Tensor x, ScalarType fp8_dtype, bool rowwise, bool columnwise)
      -> (row_data, row_scale_inv [rows, ceil(cols/32)], col_data, col_scale_inv [ceil(rows/32), cols])
      leading dims flattened into rows; copies not requested are [0].
  dequantize(Tensor data, Tensor scale_inv, ScalarType out_dtype) -> Tensor
  dequantize_mxfp8(Tensor data, Tensor scale_inv, bool columnwise, ScalarType out_dtype) -> Tensor
  quantize_fp8_block(Tensor x, ScalarType fp8_dtype, int block_scaling_dim, bool rowwise,
      bool columnwise, bool force_pow_2_scales, float amax_epsilon)
      -> (row_data, row_scale_inv, col_data [last dim, leading dims...], col_scale_inv)
      Float8BlockScaling (1x128 tiles for dim 1, 128x128 blocks for dim 2), fp32 scale grids in
      TE's GEMM_READY layout (core cast.h, nvte_quantize_v2); copies not requested are [0].
  dequantize_fp8_block(Tensor data, Tensor scale_inv, int block_scaling_dim, bool columnwise,
      ScalarType out_dtype) -> Tensor                            (of data's stored shape)
  block_gemm_accumulate_(Tensor(a!) y, Tensor p, Tensor first, Tensor second) -> ()
      y = fp32(fp64(y) + fp64(fp32(p * first)) * fp64(second)) in place: one K block of the
      block-scaled GEMM's accumulation (cpp_extensions/block_gemm.py; CPU only)
  nvfp4_block_gemm(Tensor b_data, Tensor b_scale, Tensor a_data, Tensor a_scale) -> Tensor
      fp32 [b rows, a rows]: sum, in K order, of the exact 16-block terms of two NVFP4 copies with
      blocks along K (packed E2M1 [rows, K/2], E4M3 grids): core nvte_nvfp4_block_gemm (CPU)
  ordered_bmm(Tensor a, Tensor b, bool transa, bool transb) -> Tensor
      fp32 [..., m, n] = op(a) . op(b) (a [..., m, K] or, transa, [..., K, m]; b [..., K, n] or,
      transb, [..., n, K]; equal leading dims): every output an fmaf chain over K in index order
      from +0, the same bits on the CPU and CUDA/HIP (core nvte_ordered_batched_gemm); FP8
      attention's GEMMs. Differentiable: its backward is this op again.
  quantize_nvfp4(Tensor x, bool rowwise, bool columnwise, bool two_d, bool rht, int rht_sign_mask,
      bool stochastic_rounding, int seed, int offset, bool row_scaled=False, int four_over_six=0,
      int e4m3_max=448, bool err_fast_math=False, Tensor? row_amax_in=None,
      Tensor? col_amax_in=None)
      -> (row_data [..., n/2] uint8, row_scale_inv uint8 E4M3, row_amax [1] ([rows] row-scaled),
          col_data [last dim, leading dims...] halved, col_scale_inv, col_amax)   (NVFP4)
      row_amax_in / col_amax_in: the per-tensor amaxes to scale with (float32 [1] each for the
      copies requested; a reduced amax), returned as the amaxes; None: x's own.
  dequantize_nvfp4(Tensor data, Tensor scale_inv, Tensor amax, ScalarType out_dtype,
      bool row_scaled=False, int e4m3_max=448) -> Tensor
  compute_amax(Tensor x) -> Tensor [1]
  compute_scale_from_amax(Tensor amax, ScalarType fp8_dtype, float epsilon, bool force_pow_2_scales)
      -> (scale, scale_inv)                                      (current scaling)
  delayed_scaling_update(Tensor amax_history, Tensor scale, str amax_compute_algo,
      ScalarType fp8_dtype, float margin) -> (new_history, new_scale)
  delayed_scaling_update_(Tensor(a!) amax_history, Tensor(b!) scale, str amax_compute_algo,
      ScalarType fp8_dtype, float margin) -> ()                  (in place)
  transpose(Tensor x) -> Tensor                                  (2-D, any dtype)
  cast_transpose(Tensor x, Tensor scale, ScalarType fp8_dtype) -> (data, data_t, amax, scale_inv)
  layernorm_fwd(Tensor x, Tensor gamma, Tensor beta, float eps, bool zero_centered_gamma,
      ScalarType? out_dtype=None, Tensor? scale=None) -> (z, mu, rsigma, amax, scale_inv)
      out_dtype None = x's dtype; an FP8 out_dtype requires scale, any other refuses it.
  layernorm_bwd(Tensor dz, Tensor x, Tensor mu, Tensor rsigma, Tensor gamma,
      bool zero_centered_gamma) -> (dx [x's dtype], dgamma, dbeta [gamma's dtype])
  rmsnorm_fwd(Tensor x, Tensor gamma, float eps, bool zero_centered_gamma,
      ScalarType? out_dtype=None, Tensor? scale=None) -> (z, rsigma, amax, scale_inv)
  rmsnorm_bwd(Tensor dz, Tensor x, Tensor rsigma, Tensor gamma, bool zero_centered_gamma)
      -> (dx, dgamma)
  rmsnorm_bwd_add(Tensor dz, Tensor x, Tensor add, Tensor rsigma, Tensor gamma,
      bool zero_centered_gamma) -> (dx, dgamma)   dx = rmsnorm_bwd's + add, one rounding
  activation_fwd(Tensor x, str activation, ScalarType? out_dtype=None, Tensor? scale=None)
      -> (y, amax, scale_inv)             activation in ACTIVATIONS; gated ones halve the last dim
  activation_bwd(Tensor grad, Tensor x, str activation) -> Tensor [x's shape and dtype]
  clamped_swiglu_fwd(Tensor x, float limit, float alpha, ScalarType? out_dtype=None,
      Tensor? scale=None, float glu_linear_offset=1.0) -> (y, amax, scale_inv)
      TE's clamped SwiGLU, [..., 2H] -> [..., H] (nvte_clamped_swiglu_v2)
  clamped_swiglu_bwd(Tensor grad, Tensor x, float limit, float alpha,
      float glu_linear_offset=1.0) -> Tensor [x's shape]
  gemm(Tensor A, Tensor? A_scale_inv, bool transa, Tensor B, Tensor? B_scale_inv, bool transb,
      ScalarType out_dtype, Tensor? bias=None, bool gelu=False, bool grad=False,
      Tensor? gelu_input=None, Tensor? out_scale=None, float alpha=1.0)
      -> (D, pre_gelu_out, bias_grad, amax, scale_inv)
      TE's nvte_cublas_gemm_scaled (beta = 0): D = alpha * op(B) @ op(A) in row-major terms,
      op(A) = A^T if transa ([k, m]), op(B) = B^T if transb ([n, k]); D is [*B.shape[:-1], m] if
      not transb, else [n, m]. alpha scales the product before bias and GELU (and the dGELU bias
      gradient with it; not the bias gradient of op(B)); autograd scales dA and dB by it.
      A_scale_inv / B_scale_inv: given exactly for FP8 operands. out_scale: exactly for FP8 out.
      grad=False: bias [m] is added; gelu=True returns pre_gelu_out (the biased product, dtype
        bias's, else out_dtype if not FP8, else A's if not FP8, else bfloat16) and D = gelu(it).
      grad=True: gelu=True needs gelu_input ([n, m]) and gives D = product * gelu'(gelu_input);
        a given bias (only its shape and dtype are used) requests bias_grad: the column sums of D's
        pre-output ([m]) with gelu, else the bias gradient of op(B) ([n]).
  gemm_accumulate_(Tensor(a!) D, Tensor A, Tensor? A_scale_inv, bool transa, Tensor B,
      Tensor? B_scale_inv, bool transb, Tensor? bias=None, float alpha=1.0, float beta=1.0) -> ()
      D = beta * D + alpha * op(B) @ op(A) + bias (bias [m], high precision; D high precision;
      beta = 0 does not read D)
  scaled_softmax_fwd(Tensor x, float scale) -> Tensor                      x [b, h, sq, sk]
  scaled_masked_softmax_fwd(Tensor x, Tensor mask, float scale) -> Tensor  mask bool/uint8
      [b or 1, 1, sq, sk], nonzero = masked
  scaled_upper_triang_masked_softmax_fwd(Tensor x, float scale) -> Tensor  x [b*h, sq, sq]
  scaled_aligned_causal_masked_softmax_fwd(Tensor x, float scale) -> Tensor
  <variant>_bwd(Tensor dy, Tensor y, float scale) -> Tensor               for each variant
  fused_rope_fwd(Tensor t, Tensor freqs, str tensor_format, bool interleaved,
      Tensor? cu_seqlens=None, Tensor? start_positions=None, int cp_size=1, int cp_rank=0)
      -> Tensor
      rotary position embedding: t [s, b, h, d] ("sbhd"), [b, s, h, d] ("bshd") or [t, h, d]
      ("thd", cu_seqlens int32 [b + 1] required, positions restart per sequence, tokens past
      cu_seqlens[-1] / cp_size copied); freqs float32 [s_max, 1, 1, d2], d2 even <= d;
      start_positions int32 [b]: sequence i starts at row start_positions[i] of freqs; cp_size /
      cp_rank: TE's dual-chunk context-parallel rows (fused_rope.h). The first d2 features
      of each head become x * cos(f) + rotate_half(x) * sin(f) (interleaved: adjacent pairs), in
      fp32; the rest is copied. Differentiable w.r.t. t (not freqs).
  fused_rope_bwd(<the same arguments, grad for t>) -> Tensor      the transpose of fused_rope_fwd
  fused_attn_fwd / fused_attn_bwd / fused_attn_dropout_mask: the flash attention backend and its
      dropout keep mask (schemas, fake kernels and autograd documented in attention_ops.py)
  fused_topk_with_score_function_fwd/bwd, fused_score_for_moe_aux_loss_fwd/bwd,
  fused_moe_aux_loss_fwd/bwd: the MoE router (TE's tex names; fused_router.h gives the math,
      pytorch/router.py the autograd Functions; score_function 0 sigmoid, 1 softmax, 2 sqrtsoftplus)

Errors: invalid arguments raise RuntimeError "te_lite::<op>: argument '<name>': expected ..., got
..."; requests the build or device cannot do raise NotImplementedError.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch

from transformer_engine_lite.common import get_lib

__all__ = ["ACTIVATIONS", "FP8_DTYPES", "GATED_ACTIVATIONS", "OPS", "extension_path"]

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
GATED_ACTIVATIONS = ("geglu", "qgeglu", "reglu", "sreglu", "swiglu", "glu")
ACTIVATIONS = ("gelu", "qgelu", "relu", "srelu", "silu", *GATED_ACTIVATIONS)
SOFTMAX_VARIANTS = (
    "scaled",
    "scaled_masked",
    "scaled_upper_triang_masked",
    "scaled_aligned_causal_masked",
)
MX_BLOCK = 32  # MXFP8: one E8M0 scale per 32 consecutive elements


def extension_path() -> Path:
    """The built extension (the newest _C*.so beside this file)."""
    here = Path(__file__).resolve().parent
    found = sorted(here.glob("_C*.so"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise ImportError(
            f"transformer_engine_lite.pytorch: the C++ extension (_C*.so) is not built in {here}; "
            "build it with `pip install --no-build-isolation -e .` in an environment where torch "
            "is importable (NVTE_FRAMEWORK unset, or naming pytorch)"
        )
    return found[-1]


# The core library first: it honours NVTE_LIB_PATH and the build-folder fallback, and the
# extension's dependency on libtransformer_engine_lite.so then resolves to that very library.
get_lib()
torch.ops.load_library(str(extension_path()))

_ops = torch.ops.te_lite
# Names of every registered te_lite op (tests check each has a fake kernel and an opcheck case).
OPS = tuple(
    sorted(
        s.name.split("::", 1)[1]
        for s in torch._C._jit_get_all_schemas()
        if s.name.startswith("te_lite::")
    )
)


# ------------------------------------------------------------------------------------ helpers
def _f32(like: torch.Tensor, n: int) -> torch.Tensor:
    return like.new_empty((n,), dtype=torch.float32)


def _side(like: torch.Tensor, fp8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(amax, scale_inv) of an output: float32 [1] when it is FP8, else [0]."""
    n = 1 if fp8 else 0
    return _f32(like, n), _f32(like, n)


def _rows(t: torch.Tensor) -> int:
    return math.prod(t.shape[:-1])


def _ceil_div(a, b: int):
    return (a + b - 1) // b


def _out_dtype(x: torch.Tensor, out_dtype: torch.dtype | None) -> torch.dtype:
    return x.dtype if out_dtype is None else out_dtype


# ------------------------------------------------------------------------------------ cast
@torch.library.register_fake("te_lite::quantize")
def _(x, scale, fp8_dtype):
    return (x.new_empty(x.shape, dtype=fp8_dtype), *_side(x, True))


@torch.library.register_fake("te_lite::quantize_mxfp8")
def _(x, fp8_dtype, rowwise, columnwise):
    torch._check(rowwise or columnwise, lambda: "quantize_mxfp8: rowwise or columnwise required")
    rows, cols = _rows(x), x.shape[-1]
    empty = (0,)
    return (
        x.new_empty(x.shape if rowwise else empty, dtype=fp8_dtype),
        x.new_empty((rows, _ceil_div(cols, MX_BLOCK)) if rowwise else empty, dtype=torch.uint8),
        x.new_empty(x.shape if columnwise else empty, dtype=fp8_dtype),
        x.new_empty((_ceil_div(rows, MX_BLOCK), cols) if columnwise else empty, dtype=torch.uint8),
    )


@torch.library.register_fake("te_lite::dequantize")
def _(data, scale_inv, out_dtype):
    return data.new_empty(data.shape, dtype=out_dtype)


@torch.library.register_fake("te_lite::dequantize_mxfp8")
def _(data, scale_inv, columnwise, out_dtype):
    return data.new_empty(data.shape, dtype=out_dtype)


def _block_scale_shape(rows, cols, dim, columnwise):
    n = 128
    if dim == 2:
        if columnwise:
            return (_ceil_div(cols, n), _ceil_div(_ceil_div(rows, n), 4) * 4)
        return (_ceil_div(rows, n), _ceil_div(_ceil_div(cols, n), 4) * 4)
    if columnwise:
        return (_ceil_div(rows, n), _ceil_div(cols, 4) * 4)
    return (_ceil_div(cols, n), _ceil_div(rows, 4) * 4)


@torch.library.register_fake("te_lite::quantize_fp8_block")
def _(x, fp8_dtype, block_scaling_dim, rowwise, columnwise, force_pow_2_scales, amax_epsilon):
    torch._check(rowwise or columnwise, lambda: "quantize_fp8_block: rowwise or columnwise required")
    rows, cols = _rows(x), x.shape[-1]
    empty = (0,)
    tshape = (x.shape[-1], *x.shape[:-1])
    return (
        x.new_empty(x.shape if rowwise else empty, dtype=fp8_dtype),
        x.new_empty(
            _block_scale_shape(rows, cols, block_scaling_dim, False) if rowwise else empty,
            dtype=torch.float32,
        ),
        x.new_empty(tshape if columnwise else empty, dtype=fp8_dtype),
        x.new_empty(
            _block_scale_shape(rows, cols, block_scaling_dim, True) if columnwise else empty,
            dtype=torch.float32,
        ),
    )


@torch.library.register_fake("te_lite::dequantize_fp8_block")
def _(data, scale_inv, block_scaling_dim, columnwise, out_dtype):
    return data.new_empty(data.shape, dtype=out_dtype)


@torch.library.register_fake("te_lite::block_gemm_accumulate_")
def _(y, p, first, second):
    return None


@torch.library.register_fake("te_lite::nvfp4_block_gemm")
def _(b_data, b_scale, a_data, a_scale):
    return b_data.new_empty((b_data.shape[0], a_data.shape[0]), dtype=torch.float32)


@torch.library.register_fake("te_lite::ordered_bmm")
def _(a, b, transa, transb):
    nd = a.dim()
    torch._check(nd >= 2 and b.dim() == nd and a.shape[:-2] == b.shape[:-2],
                 lambda: f"ordered_bmm: expected a and b with the same leading dims, got "
                 f"{tuple(a.shape)} and {tuple(b.shape)}")
    m = a.shape[-1] if transa else a.shape[-2]
    n = b.shape[-2] if transb else b.shape[-1]
    return a.new_empty((*a.shape[:-2], m, n), dtype=torch.float32)


def _ordered_bmm_setup(ctx, inputs, output):
    a, b, transa, transb = inputs
    ctx.save_for_backward(a, b)
    ctx.trans = (transa, transb)


def _ordered_bmm_backward(ctx, dy):
    # y = op(a) op(b): d op(a) = dy op(b)^T, d op(b) = op(a)^T dy, each this op again (so the
    # backward keeps the canonical order on every device), transposed back to a's / b's layout
    # by choosing the operand order and flags (no copies).
    a, b = ctx.saved_tensors
    ta, tb = ctx.trans
    da = db = None
    if ctx.needs_input_grad[0]:
        # op(a) = a: da = dy . op(b)^T; op(a) = a^T: da = (dy . op(b)^T)^T = op(b) . dy^T
        da = _ops.ordered_bmm(dy, b, False, not tb) if not ta else _ops.ordered_bmm(b, dy, tb, True)
    if ctx.needs_input_grad[1]:
        # op(b) = b: db = op(a)^T . dy; op(b) = b^T: db = dy^T . op(a)
        db = _ops.ordered_bmm(a, dy, not ta, False) if not tb else _ops.ordered_bmm(dy, a, True, ta)
    return da, db, None, None


torch.library.register_autograd(
    "te_lite::ordered_bmm", _ordered_bmm_backward, setup_context=_ordered_bmm_setup
)


@torch.library.register_fake("te_lite::compute_amax")
def _(x):
    return _f32(x, 1)


@torch.library.register_fake("te_lite::compute_scale_from_amax")
def _(amax, fp8_dtype, epsilon, force_pow_2_scales):
    return _f32(amax, 1), _f32(amax, 1)


@torch.library.register_fake("te_lite::delayed_scaling_update")
def _(amax_history, scale, amax_compute_algo, fp8_dtype, margin):
    return amax_history.new_empty(amax_history.shape), scale.new_empty(scale.shape)


@torch.library.register_fake("te_lite::delayed_scaling_update_")
def _(amax_history, scale, amax_compute_algo, fp8_dtype, margin):
    return None


@torch.library.register_fake("te_lite::transpose")
def _(x):
    torch._check(x.dim() == 2, lambda: f"transpose: expected a 2-D x, got shape {tuple(x.shape)}")
    return x.new_empty((x.shape[1], x.shape[0]))


def _transpose_setup(ctx, inputs, output):
    pass


def _transpose_backward(ctx, dy):
    return _ops.transpose(dy)


torch.library.register_autograd(
    "te_lite::transpose", _transpose_backward, setup_context=_transpose_setup
)


@torch.library.register_fake("te_lite::cast_transpose")
def _(x, scale, fp8_dtype):
    torch._check(x.dim() == 2, lambda: f"cast_transpose: expected a 2-D x, got {tuple(x.shape)}")
    return (
        x.new_empty(x.shape, dtype=fp8_dtype),
        x.new_empty((x.shape[1], x.shape[0]), dtype=fp8_dtype),
        *_side(x, True),
    )


# ------------------------------------------------------------------------------------ norms
@torch.library.register_fake("te_lite::layernorm_fwd")
def _(x, gamma, beta, eps, zero_centered_gamma, out_dtype=None, scale=None):
    out = _out_dtype(x, out_dtype)
    rows = _rows(x)
    return (
        x.new_empty(x.shape, dtype=out),
        _f32(x, rows),
        _f32(x, rows),
        *_side(x, out in FP8_DTYPES),
    )


@torch.library.register_fake("te_lite::layernorm_bwd")
def _(dz, x, mu, rsigma, gamma, zero_centered_gamma):
    return x.new_empty(x.shape), gamma.new_empty(gamma.shape), gamma.new_empty(gamma.shape)


@torch.library.register_fake("te_lite::rmsnorm_fwd")
def _(x, gamma, eps, zero_centered_gamma, out_dtype=None, scale=None):
    out = _out_dtype(x, out_dtype)
    return (x.new_empty(x.shape, dtype=out), _f32(x, _rows(x)), *_side(x, out in FP8_DTYPES))


@torch.library.register_fake("te_lite::rmsnorm_bwd")
def _(dz, x, rsigma, gamma, zero_centered_gamma):
    return x.new_empty(x.shape), gamma.new_empty(gamma.shape)


@torch.library.register_fake("te_lite::rmsnorm_bwd_add")
def _(dz, x, add, rsigma, gamma, zero_centered_gamma):
    return x.new_empty(x.shape), gamma.new_empty(gamma.shape)


def _norm_setup(ctx, x, gamma, stats, zero_centered_gamma, z, side):
    ctx.save_for_backward(x, gamma, *stats)
    ctx.zero_centered_gamma = zero_centered_gamma
    # mu / rsigma are saved statistics (no gradient flows into them, as in TE); an FP8 z is not
    # differentiable.
    ctx.mark_non_differentiable(*stats, *side, *((z,) if z.dtype in FP8_DTYPES else ()))


def _layernorm_setup(ctx, inputs, output):
    x, gamma, _beta, _eps, zero_centered_gamma = inputs[:5]
    z, mu, rsigma, amax, scale_inv = output
    _norm_setup(ctx, x, gamma, (mu, rsigma), zero_centered_gamma, z, (amax, scale_inv))


def _layernorm_backward(ctx, dz, *_):
    x, gamma, mu, rsigma = ctx.saved_tensors
    dx, dgamma, dbeta = _ops.layernorm_bwd(dz, x, mu, rsigma, gamma, ctx.zero_centered_gamma)
    return dx, dgamma, dbeta, None, None, None, None


def _rmsnorm_setup(ctx, inputs, output):
    x, gamma, _eps, zero_centered_gamma = inputs[:4]
    z, rsigma, amax, scale_inv = output
    _norm_setup(ctx, x, gamma, (rsigma,), zero_centered_gamma, z, (amax, scale_inv))


def _rmsnorm_backward(ctx, dz, *_):
    x, gamma, rsigma = ctx.saved_tensors
    # grad_add: set on this node by the op fuser's BackwardAddRMSNorm (the residual gradient,
    # added to dx inside the kernel)
    add = getattr(ctx, "grad_add", None)
    if add is not None:
        dx, dgamma = _ops.rmsnorm_bwd_add(dz, x, add, rsigma, gamma, ctx.zero_centered_gamma)
        return dx, dgamma, None, None, None, None
    dx, dgamma = _ops.rmsnorm_bwd(dz, x, rsigma, gamma, ctx.zero_centered_gamma)
    return dx, dgamma, None, None, None, None


torch.library.register_autograd(
    "te_lite::layernorm_fwd", _layernorm_backward, setup_context=_layernorm_setup
)
torch.library.register_autograd(
    "te_lite::rmsnorm_fwd", _rmsnorm_backward, setup_context=_rmsnorm_setup
)


# ------------------------------------------------------------------------------------ activations
def _activation_out_shape(x: torch.Tensor, activation: str) -> Sequence[int]:
    if activation not in GATED_ACTIVATIONS:
        return x.shape
    torch._check(
        x.shape[-1] % 2 == 0,
        lambda: (
            f"activation_fwd: gated '{activation}' needs an even last dim, got {tuple(x.shape)}"
        ),
    )
    return (*x.shape[:-1], x.shape[-1] // 2)


@torch.library.register_fake("te_lite::activation_fwd")
def _(x, activation, out_dtype=None, scale=None):
    out = _out_dtype(x, out_dtype)
    y = x.new_empty(_activation_out_shape(x, activation), dtype=out)
    return (y, *_side(x, out in FP8_DTYPES))


@torch.library.register_fake("te_lite::activation_bwd")
def _(grad, x, activation):
    return x.new_empty(x.shape)


def _activation_setup(ctx, inputs, output):
    x, activation = inputs[:2]
    y, amax, scale_inv = output
    ctx.save_for_backward(x)
    ctx.activation = activation
    ctx.mark_non_differentiable(amax, scale_inv, *((y,) if y.dtype in FP8_DTYPES else ()))


def _activation_backward(ctx, dy, *_):
    (x,) = ctx.saved_tensors
    return _ops.activation_bwd(dy.to(x.dtype), x, ctx.activation), None, None, None


torch.library.register_autograd(
    "te_lite::activation_fwd", _activation_backward, setup_context=_activation_setup
)


@torch.library.register_fake("te_lite::clamped_swiglu_fwd")
def _(x, limit, alpha, out_dtype=None, scale=None, glu_linear_offset=1.0):
    out = _out_dtype(x, out_dtype)
    y = x.new_empty(_activation_out_shape(x, "glu"), dtype=out)
    return (y, *_side(x, out in FP8_DTYPES))


@torch.library.register_fake("te_lite::clamped_swiglu_bwd")
def _(grad, x, limit, alpha, glu_linear_offset=1.0):
    return x.new_empty(x.shape)


def _clamped_setup(ctx, inputs, output):
    x, limit, alpha = inputs[:3]
    offset = inputs[5] if len(inputs) > 5 else 1.0
    y, amax, scale_inv = output
    ctx.save_for_backward(x)
    ctx.params = (limit, alpha, offset)
    ctx.mark_non_differentiable(amax, scale_inv, *((y,) if y.dtype in FP8_DTYPES else ()))


def _clamped_backward(ctx, dy, *_):
    (x,) = ctx.saved_tensors
    return _ops.clamped_swiglu_bwd(dy.to(x.dtype), x, *ctx.params), None, None, None, None, None


torch.library.register_autograd(
    "te_lite::clamped_swiglu_fwd", _clamped_backward, setup_context=_clamped_setup
)


# ------------------------------------------------------------------------------------ GEMM
# Defined in gemm_ops.py (file size); registered from here, the schema's python module.
from . import gemm_ops

torch.library.register_fake("te_lite::gemm", gemm_ops.gemm_fake)
torch.library.register_autograd("te_lite::gemm", gemm_ops.gemm_backward,
                                setup_context=gemm_ops.gemm_setup)
torch.library.register_fake("te_lite::gemm_accumulate_", gemm_ops.gemm_accumulate_fake)


# ------------------------------------------------------------------------------------ softmax, RoPE, router
# Defined in misc_ops.py (file size); registered from here, the schema's python module.
from . import misc_ops

for _variant in SOFTMAX_VARIANTS:
    _fwd, _bwd = f"te_lite::{_variant}_softmax_fwd", f"te_lite::{_variant}_softmax_bwd"
    _fake_fwd, _fake_bwd, _setup, _backward = misc_ops.softmax_kernels(_variant)
    torch.library.register_fake(_fwd, _fake_fwd)
    torch.library.register_fake(_bwd, _fake_bwd)
    torch.library.register_autograd(_fwd, _backward, setup_context=_setup)
for _op, _adjoint in (("fused_rope_fwd", "fused_rope_bwd"), ("fused_rope_bwd", "fused_rope_fwd")):
    _fake, _setup, _backward = misc_ops.rope_kernels(_adjoint)
    torch.library.register_fake(f"te_lite::{_op}", _fake)
    torch.library.register_autograd(f"te_lite::{_op}", _backward, setup_context=_setup)
for _name, _fake in {**misc_ops.ROUTER_FAKE_KERNELS, **misc_ops.NVFP4_FAKE_KERNELS}.items():
    torch.library.register_fake(f"te_lite::{_name}", _fake)


# ------------------------------------------------------------------------------------ attention
# Defined in attention_ops.py (file size); registered from here, the schema's python module.
from . import attention_ops

for _name, _fake in attention_ops.FAKE_KERNELS.items():
    torch.library.register_fake(f"te_lite::{_name}", _fake)
torch.library.register_autograd(
    "te_lite::fused_attn_fwd",
    attention_ops.fused_attn_fwd_backward,
    setup_context=attention_ops.fused_attn_fwd_setup,
)

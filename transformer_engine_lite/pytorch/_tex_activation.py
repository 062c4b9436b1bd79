"""TE's tex activation functions (transformer_engine_torch: gelu(input, quantizer),
dgelu(grad, fwd_input, quantizer), ..., clamped_swiglu / clamped_dswiglu, and dbias_dgelu /
dsilu / drelu / dqgelu / dsrelu returning [bias gradient, dact]) over the core's activation kernels
(te_lite::activation_fwd / activation_bwd / clamped_swiglu_fwd / _bwd).

Gated functions take [..., 2H] = [act input | linear] and return [..., H]; their backward returns
the input's shape. The output's (nominal) dtype is the input's. quantizer None gives that
high-precision tensor; a quantizer gives its quantized tensor, computed as TE's
activation_helper / dactivation_helper does (the bytes depend on it):
- Float8Quantizer, MXFP8Quantizer: fused, the fp32 activation values are quantized directly (no
  rounding to the input dtype first); Float8Quantizer's amax takes their maximum.
- Float8CurrentScalingQuantizer: the values rounded to the input dtype are quantized with the
  scale of the fp32 values' amax (TE's kernel takes the amax before rounding).
- any other (Float8BlockQuantizer, ...): the values rounded to the input dtype, then quantized.
- NVFP4Quantizer: TE computes the amax as for current scaling; the core's NVFP4 cast takes no
  external amax, so that case is refused for a bfloat16 / float16 input (NotImplementedError) and
  exact for float32 (where rounding is the identity), and for row-scaled NVFP4 or a post-RHT amax
  (TE's unfused path)."""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..common.capi import NVTEInvalidArgument, Status
from .quantization import ops

__all__ = ["ACTIVATION_FUNCTIONS"]

_HP = (torch.float32, torch.bfloat16, torch.float16)
_GATED = ("geglu", "qgeglu", "reglu", "sreglu", "swiglu", "glu")


def _check_input(owner: str, name: str, t: Any) -> torch.Tensor:
    from .tensor import QuantizedTensor

    if not isinstance(t, torch.Tensor) or isinstance(t, QuantizedTensor):
        raise TypeError(f"{owner}: {name}: expected a high-precision torch.Tensor, got "
                        f"{type(t).__name__}")
    if t.dtype not in _HP:
        raise ValueError(f"{owner}: {name}: expected dtype float32, bfloat16 or float16, got "
                         f"{t.dtype}")
    return t.contiguous()


def _quantized(owner: str, kernel: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...],
               quantizer: Any) -> Any:
    """kernel(*inputs) (all of one dtype, output in it) finished with `quantizer` as TE's
    helpers do (module docstring)."""
    from .tensor import (
        Float8CurrentScalingQuantizer,
        Float8Quantizer,
        MXFP8Quantizer,
        NVFP4Quantizer,
        Quantizer,
    )
    from .tensor.float8_tensor import _wrap
    from .tensor.quantized_tensor import fp8_torch_dtype

    dtype = inputs[-1].dtype
    if quantizer is None:
        return kernel(*inputs)
    if not isinstance(quantizer, Quantizer):
        raise TypeError(f"{owner}: quantizer: expected None or a Quantizer, got "
                        f"{type(quantizer).__name__}")
    if isinstance(quantizer, (Float8Quantizer, MXFP8Quantizer)):
        y32 = kernel(*(t.float() for t in inputs))  # the kernel's fp32 values, unrounded
        out = quantizer.make_empty(y32.shape, dtype=dtype, device=y32.device)
        return quantizer.update_quantized(y32, out)
    if isinstance(quantizer, Float8CurrentScalingQuantizer):
        te = ops()
        fp8 = fp8_torch_dtype(owner, quantizer.dtype)
        y32 = kernel(*(t.float() for t in inputs))
        amax = te.compute_amax(y32.reshape(-1))
        if (quantizer.with_amax_reduction and torch.distributed.is_available()
                and torch.distributed.is_initialized()):
            torch.distributed.all_reduce(amax, op=torch.distributed.ReduceOp.MAX,
                                         group=getattr(quantizer, "amax_reduction_group", None))
        scale, _ = te.compute_scale_from_amax(amax, fp8, quantizer.amax_epsilon,
                                              quantizer.force_pow_2_scales)
        y = y32.to(dtype)
        data, _, scale_inv = te.quantize(y.reshape(-1), scale, fp8)
        return _wrap(y, data, scale_inv, fp8, quantizer)
    if isinstance(quantizer, NVFP4Quantizer):
        unfused = quantizer.row_scaled_nvfp4 or (quantizer.with_rht
                                                 and quantizer.with_post_rht_amax)
        if not unfused and dtype != torch.float32:
            raise NotImplementedError(
                f"{owner}: quantizer: an NVFP4Quantizer (without row scaling or a post-RHT amax) "
                f"on a {dtype} input is not supported by transformer_engine_lite: TE scales by the "
                f"amax of the fp32 activation values, and the NVFP4 cast here takes no external "
                f"amax (pass a float32 input, or quantize the high-precision output)")
    return quantizer(kernel(*inputs))


def _forward(name: str) -> Callable[..., Any]:
    gated = name in _GATED

    def fn(input: torch.Tensor, quantizer: Any) -> Any:  # noqa: A002  (TE's argument name)
        owner = f"tex.{name}"
        x = _check_input(owner, "input", input)
        if gated and (x.dim() < 1 or x.shape[-1] % 2):
            raise ValueError(f"{owner}: input: expected an even last dim ([act input | linear] "
                             f"halves), got shape {tuple(x.shape)}")
        return _quantized(owner, lambda t: ops().activation_fwd(t, name)[0], (x,), quantizer)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"TE's tex.{name}(input, quantizer): the core's '{name}' activation"
                  + (" of [..., 2H] -> [..., H]" if gated else "")
                  + "; quantizer None: the input's dtype, else quantized (module docstring).")
    return fn


def _check_pair(owner: str, grad: Any, fwd_input: Any) -> tuple[torch.Tensor, torch.Tensor]:
    g = _check_input(owner, "grad", grad)
    x = _check_input(owner, "fwd_input", fwd_input)
    if g.dtype != x.dtype:
        raise NVTEInvalidArgument(
            Status.INVALID_ARGUMENT,
            f"{owner}: grad: Types of both inputs must match (expected fwd_input's dtype "
            f"{x.dtype}, got {g.dtype})")
    return g, x


def _backward(name: str) -> Callable[..., Any]:
    def fn(grad: torch.Tensor, fwd_input: torch.Tensor, quantizer: Any) -> Any:
        owner = f"tex.d{name}"
        g, x = _check_pair(owner, grad, fwd_input)
        return _quantized(owner, lambda gg, xx: ops().activation_bwd(gg, xx, name), (g, x),
                          quantizer)

    fn.__name__ = fn.__qualname__ = f"d{name}"
    fn.__doc__ = (f"TE's tex.d{name}(grad, fwd_input, quantizer): grad through '{name}' at "
                  f"fwd_input, fwd_input's shape and dtype (grad must share the dtype); "
                  f"quantizer as tex.{name}'s.")
    return fn


def _check_clamp(owner: str, limit: float, alpha: float) -> None:
    if not limit > 0:
        raise ValueError(f"{owner}: limit: expected > 0, got {limit!r}")
    if not alpha == alpha:  # NaN
        raise ValueError(f"{owner}: alpha: expected a number, got {alpha!r}")


def clamped_swiglu(input: torch.Tensor, quantizer: Any, limit: float = 7.0,  # noqa: A002
                   alpha: float = 1.702, glu_linear_offset: float = 1.0) -> Any:
    """TE's tex.clamped_swiglu (GPT-OSS): [..., 2H] = [a | b] -> min(a, limit) *
    sigmoid(alpha * min(a, limit)) * (clamp(b, -limit, limit) + glu_linear_offset)."""
    owner = "tex.clamped_swiglu"
    x = _check_input(owner, "input", input)
    _check_clamp(owner, float(limit), float(alpha))
    if x.dim() < 1 or x.shape[-1] % 2:
        raise ValueError(f"{owner}: input: expected an even last dim, got shape {tuple(x.shape)}")
    params = (float(limit), float(alpha))
    off = float(glu_linear_offset)
    return _quantized(
        owner, lambda t: ops().clamped_swiglu_fwd(t, *params, glu_linear_offset=off)[0], (x,),
        quantizer)


def clamped_dswiglu(grad: torch.Tensor, fwd_input: torch.Tensor, quantizer: Any,
                    limit: float = 7.0, alpha: float = 1.702,
                    glu_linear_offset: float = 1.0) -> Any:
    """TE's tex.clamped_dswiglu: the gradient of clamped_swiglu at fwd_input."""
    owner = "tex.clamped_dswiglu"
    g, x = _check_pair(owner, grad, fwd_input)
    _check_clamp(owner, float(limit), float(alpha))
    params = (float(limit), float(alpha))
    off = float(glu_linear_offset)
    return _quantized(
        owner, lambda gg, xx: ops().clamped_swiglu_bwd(gg, xx, *params, glu_linear_offset=off),
        (g, x), quantizer)


def _dbias(name: str) -> Callable[..., Any]:
    def fn(grad: torch.Tensor, fwd_input: torch.Tensor, quantizer: Any) -> list[Any]:
        owner = f"tex.dbias_d{name}"
        g, x = _check_pair(owner, grad, fwd_input)
        if x.dim() < 1:
            raise ValueError(f"{owner}: fwd_input: expected at least 1 dim, got a scalar")
        from .tensor import Float8Quantizer, MXFP8Quantizer

        def kernel(gg: torch.Tensor, xx: torch.Tensor) -> torch.Tensor:
            return ops().activation_bwd(gg, xx, name)

        # TE's dact_dbias: the fused kernels (Float8Quantizer / MXFP8Quantizer) reduce the fp32
        # gradient; the other paths sum the input-dtype one (at::sum_out, as torch.sum here).
        if isinstance(quantizer, (Float8Quantizer, MXFP8Quantizer)):
            dbias = kernel(g.float(), x.float()).reshape(-1, x.shape[-1]).sum(0).to(x.dtype)
        else:
            dbias = kernel(g, x).reshape(-1, x.shape[-1]).sum(0)
        return [dbias, _quantized(owner, kernel, (g, x), quantizer)]

    fn.__name__ = fn.__qualname__ = f"dbias_d{name}"
    fn.__doc__ = (f"TE's tex.dbias_d{name}(grad, fwd_input, quantizer): [the bias gradient (the "
                  f"column sums of tex.d{name}'s output, fwd_input's last dim, its dtype), "
                  f"tex.d{name}(grad, fwd_input, quantizer)].")
    return fn


_NAMES = ("gelu", "geglu", "qgelu", "qgeglu", "relu", "reglu", "srelu", "sreglu", "silu",
          "swiglu", "glu")
_DBIAS_NAMES = ("gelu", "silu", "relu", "qgelu", "srelu")  # TE's dbias_d* set
ACTIVATION_FUNCTIONS: dict[str, Callable[..., Any]] = {
    **{n: _forward(n) for n in _NAMES},
    **{f"d{n}": _backward(n) for n in _NAMES},
    **{f"dbias_d{n}": _dbias(n) for n in _DBIAS_NAMES},
    "clamped_swiglu": clamped_swiglu,
    "clamped_dswiglu": clamped_dswiglu,
}

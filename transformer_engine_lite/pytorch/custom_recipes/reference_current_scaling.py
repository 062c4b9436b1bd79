"""Reference per-tensor current scaling and FP8 GEMM in plain torch (TE's
custom_recipes.reference_current_scaling): the oracle the native kernels are compared against.

Written from the definitions, sharing no code with the kernels:
- amax = max |x| over the tensor, in fp32; amax = max(amax, eps).
- scale = fp8_max / amax (one fp32 division); amax 0, Inf or NaN -> scale 1 (nothing to learn);
  an infinite quotient (tiny amax) -> FLT_MAX; power-of-two scales round down to 2^floor(log2).
  These are TE's kernel rules (compute_scale_from_amax).
- data = fp8(x_fp32 * scale): one fp32 product, round-to-nearest-even, saturated to +-fp8_max
  (TE's cast saturates finite values).
- scale_inv = 1 / scale (fp32).
- qgemm: y = (sum_k qx[m, k] * qw[n, k]) * sx * sw. Each product of two FP8 values is exact in
  fp64 and so is the sum (E4M3/E5M2 products span < 2^36 of range with 8-bit significands: any
  K < 2^17 sums without rounding), so the reference is the exact result rounded once to out_dtype.
  The native GEMM accumulates in FP32 in its own order: bf16/fp16 outputs match it bit for bit in
  practice, fp32 outputs agree to the FP32 accumulation error (about K * 2^-24 relative).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..tensor.quantized_tensor import QuantizedTensorStorage, Quantizer
from . import gemm

__all__ = [
    "CurrentScalingQuantizerRef",
    "CurrentScalingTensorRef",
    "current_scaling_ref_factory",
]

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_HP = (torch.float32, torch.float16, torch.bfloat16)
_FLT_MAX = torch.finfo(torch.float32).max


def current_scaling_ref_factory(role: Any) -> CurrentScalingQuantizerRef:
    """Reference quantizers of Float8CurrentScaling's defaults: E5M2 for gradients, E4M3 else."""
    grad = role is not None and getattr(role, "tensor_type", "") == "grad_output"
    return CurrentScalingQuantizerRef(torch.float8_e5m2 if grad else torch.float8_e4m3fn)


@dataclasses.dataclass
class CurrentScalingTensorRef(QuantizedTensorStorage):
    """A reference-quantized tensor: data [M, N] (row-wise FP8) and its scale_inv ([1] fp32);
    data_t [N, M] / scale_t: the column-wise (transposed) copy. Either may be None per usage.
    _quantizer: the quantizer that made it (custom_gemm runs its qgemm)."""

    data: torch.Tensor | None
    scale: torch.Tensor | None
    data_t: torch.Tensor | None
    scale_t: torch.Tensor | None
    dtype: torch.dtype
    quant_dtype: torch.dtype
    original_shape: torch.Size
    _quantizer: Any = None

    @property
    def custom(self) -> bool:
        """Custom tensors go to custom_gemm (the quantizer's qgemm) in general_gemm."""
        return True

    @property
    def _data(self) -> torch.Tensor | None:
        return self.data

    @property
    def _scale_inv(self) -> torch.Tensor | None:
        return self.scale

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        if self.data is not None:
            out = self.data.to(torch.float32) * self.scale
        elif self.data_t is not None:
            out = (self.data_t.to(torch.float32) * self.scale_t).t()
        else:
            raise ValueError("CurrentScalingTensorRef: no row-wise or column-wise data to dequantize")
        return out.reshape(self.original_shape).to(dtype or self.dtype)


class CurrentScalingQuantizerRef(Quantizer):
    """dtype: torch.float8_e4m3fn or torch.float8_e5m2. rowwise / columnwise: which copies
    quantize() makes. pow_2_scales, eps: the recipe's power_2_scale and amax_epsilon."""

    def __init__(
        self,
        dtype: torch.dtype,
        rowwise: bool = True,
        columnwise: bool = True,
        pow_2_scales: bool = False,
        eps: float = 0.0,
        with_amax_reduction: bool = False,
        amax_reduction_group: Any = None,
    ) -> None:
        if dtype not in _FP8:
            raise ValueError(f"CurrentScalingQuantizerRef: dtype: expected torch.float8_e4m3fn or "
                             f"torch.float8_e5m2, got {dtype!r}")
        if not (rowwise or columnwise):
            raise ValueError("CurrentScalingQuantizerRef: expected rowwise or columnwise usage, "
                             "got neither")
        if not (isinstance(eps, (int, float)) and eps >= 0.0):
            raise ValueError(f"CurrentScalingQuantizerRef: eps: expected a number >= 0, got {eps!r}")
        if with_amax_reduction and amax_reduction_group is None:
            raise ValueError("CurrentScalingQuantizerRef: amax_reduction_group: expected a process "
                             "group with with_amax_reduction=True, got None")
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.dtype = dtype
        self.rowwise_usage = bool(rowwise)
        self.columnwise_usage = bool(columnwise)
        self.pow_2_scales = bool(pow_2_scales)
        self.eps = float(eps)
        self.with_amax_reduction = bool(with_amax_reduction)
        self.amax_reduction_group = amax_reduction_group

    @property
    def custom(self) -> bool:
        """Custom quantizers' tensors go to custom_gemm (this qgemm) in general_gemm."""
        return True

    # ------------------------------------------------------------------ scaling
    def compute_scale(self, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(scale, scale_inv), both [1] fp32, from an amax [1] fp32."""
        amax = amax.to(torch.float32).reshape(1)
        amax = torch.where(amax < self.eps, torch.full_like(amax, self.eps), amax)
        fp8_max = torch.finfo(self.dtype).max
        useless = ~(amax > 0) | torch.isinf(amax)  # 0, NaN (comparisons are False), Inf
        scale = torch.full_like(amax, fp8_max) / torch.where(useless, torch.ones_like(amax), amax)
        scale = torch.where(torch.isinf(scale), torch.full_like(scale, _FLT_MAX), scale)
        if self.pow_2_scales:
            mant, exp = torch.frexp(scale)  # scale = mant * 2^exp, mant in [0.5, 1)
            scale = torch.ldexp(torch.ones_like(scale), exp - 1)
        scale = torch.where(useless, torch.ones_like(scale), scale)
        return scale, torch.reciprocal(scale)

    def _amax(self, x: torch.Tensor) -> torch.Tensor:
        amax = (x.to(torch.float32).abs().amax().reshape(1) if x.numel()
                else torch.zeros(1, dtype=torch.float32, device=x.device))
        if self.with_amax_reduction:
            torch.distributed.all_reduce(amax, torch.distributed.ReduceOp.MAX,
                                         group=self.amax_reduction_group)
        return amax

    def _cast(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        fp8_max = torch.finfo(self.dtype).max
        y = x.to(torch.float32) * scale
        return y.clamp(-fp8_max, fp8_max).to(self.dtype)  # clamp keeps NaN: NaN stays NaN

    def quantize(self, tensor: torch.Tensor, **kwargs: Any) -> CurrentScalingTensorRef:
        if not isinstance(tensor, torch.Tensor) or tensor.dtype not in _HP:
            got = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise TypeError(f"CurrentScalingQuantizerRef.quantize: tensor: expected float32, "
                            f"float16 or bfloat16, got {got}")
        shape = tensor.shape
        x2 = tensor.reshape(-1, shape[-1]) if tensor.dim() != 2 else tensor
        scale, scale_inv = self.compute_scale(self._amax(x2))
        q = self._cast(x2, scale)
        return CurrentScalingTensorRef(
            data=q if self.rowwise_usage else None,
            scale=scale_inv if self.rowwise_usage else None,
            data_t=q.t().contiguous() if self.columnwise_usage else None,
            scale_t=scale_inv if self.columnwise_usage else None,
            dtype=tensor.dtype,
            quant_dtype=self.dtype,
            original_shape=shape,
            _quantizer=self,
        )

    __call__ = quantize

    def dequantize(self, tensor: torch.Tensor, scale: torch.Tensor,
                   dtype: torch.dtype | None = None) -> torch.Tensor:
        out = tensor.to(torch.float32) * scale
        return out if dtype is None else out.to(dtype)

    # ------------------------------------------------------------------ GEMM
    def qgemm(
        self,
        qx: torch.Tensor,
        qw: torch.Tensor,
        m_params: gemm.MMParams,
        out_dtype: torch.dtype,
        sx: torch.Tensor,
        sw: torch.Tensor,
        bias: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
        accumulate: bool = False,
        gemm_type: gemm.GEMMType | None = gemm.GEMMType.FPROP,
        qresult_x: Any = None,
        qresult_w: Any = None,
    ) -> torch.Tensor:
        """y[M, N] = (qx[M, K] @ qw[N, K]^T) * sx * sw (+ bias) (+ out when accumulate): the exact
        sum of FP8 products scaled in fp64 and rounded once to out_dtype; accumulate adds it to
        out in out's dtype (in place, returned), as TE's reference does."""
        if not isinstance(m_params, gemm.MMParams):
            raise TypeError(f"qgemm: m_params: expected an MMParams, got {type(m_params).__name__}")
        for name, t in (("qx", qx), ("qw", qw)):
            if t.dtype not in _FP8 or t.dim() != 2:
                raise ValueError(f"qgemm: {name}: expected a 2-D FP8 tensor, got {t.dtype} "
                                 f"{tuple(t.shape)}")
        if qx.shape[1] != qw.shape[1]:
            raise ValueError(f"qgemm: qx {tuple(qx.shape)} and qw {tuple(qw.shape)}: expected "
                             "the same K (last dim)")
        if accumulate and out is None:
            raise ValueError("qgemm: out: expected a tensor with accumulate=True, got None")
        if not accumulate and out is not None:
            raise ValueError("qgemm: out: expected None with accumulate=False, got a tensor")
        acc = qx.to(torch.float64) @ qw.to(torch.float64).t()  # exact (see the module docstring)
        y = acc * (sx.to(torch.float64) * sw.to(torch.float64))
        if bias is not None and bias.numel():
            y = y + bias.to(torch.float64)
        y = y.to(out_dtype)
        if accumulate:
            out.add_(y)
            return out
        return y

"""The custom-quantizer GEMM (TE's custom_recipes.gemm): GEMMType / MMParams, the options a
quantizer's qgemm receives, and custom_gemm, which general_gemm calls when an operand is a custom
tensor (tensor.utils.is_custom: the reference quantizers' tensors) and which runs the GEMM as the
operands' quantizer's qgemm."""

from __future__ import annotations

import dataclasses
from enum import Enum

from typing import Any

import torch

__all__ = ["GEMMType", "MMParams", "custom_gemm"]


class GEMMType(Enum):
    """Which of a linear layer's three GEMMs a call is (the reference GEMM does not depend on it)."""

    FPROP = "fprop"
    DGRAD = "dgrad"
    WGRAD = "wgrad"


@dataclasses.dataclass
class MMParams:
    """out_dtype: the GEMM's output dtype (None: the caller's). use_split_accumulator: a GPU FP8
    option (cuBLAS promotes partial sums to FP32 every few steps); the reference GEMM sums exactly,
    so it is checked and recorded, not used."""

    out_dtype: torch.dtype | None = None
    use_split_accumulator: bool = True

    def __post_init__(self) -> None:
        if self.out_dtype is not None and not isinstance(self.out_dtype, torch.dtype):
            raise TypeError(f"MMParams: out_dtype: expected a torch.dtype or None, got "
                            f"{self.out_dtype!r}")
        if not isinstance(self.use_split_accumulator, bool):
            raise TypeError(f"MMParams: use_split_accumulator: expected a bool, got "
                            f"{self.use_split_accumulator!r}")


# general_gemm's layouts (TE's column-major naming, D = op(B) @ op(A)) of a linear layer's GEMMs
_LAYOUT_GEMM = {"TN": GEMMType.FPROP, "NN": GEMMType.DGRAD, "NT": GEMMType.WGRAD}


def _need(what: str, t: Any, field: str, desc: str) -> Any:
    v = getattr(t, field, None)
    if v is None:
        raise ValueError(f"{what} GEMM: {desc} ({field}) is None")
    return v


def custom_gemm(
    A: Any,
    B: Any,
    workspace: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    quantization_params: Any = None,
    gelu: bool = False,
    gelu_in: torch.Tensor | None = None,
    accumulate: bool = False,
    layout: str = "TN",
    out: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    use_split_accumulator: bool = False,
    grad: bool = False,
) -> tuple[torch.Tensor, None, None, None]:
    """general_gemm(A, B, ...) of two custom tensors (A the weight-side operand, B the
    input-side one, as general_gemm names them) through the quantizer's qgemm:

    - layout "TN" (FPROP): y = x @ W^T from B's and A's row-wise copies;
    - "NN" (DGRAD): dx = dy @ W from B's row-wise copy (dy) and A's column-wise copy (W^T);
    - "NT" (WGRAD): dW = dy^T @ x from B's and A's column-wise copies (dy^T, x^T).

    The qgemm called is that of B's quantizer (A's if B has none), as TE's. TE picks the GEMM from
    `grad` and the layout; here the layout decides (the two agree for a linear layer's calls, and
    an FPROP of "NN" operands would compute the wrong product). out_dtype: default B's nominal
    dtype. accumulate / out reach qgemm (TE drops them); out without accumulate receives the
    result. bias: FPROP only (a quantizer may refuse it: NVFP4QuantizerRef does, as TE's).
    Returns (D, None, None, None) as general_gemm."""
    from ..tensor.utils import is_custom

    if not (is_custom(A) and is_custom(B)):
        raise TypeError(f"custom_gemm: A and B: expected two custom tensors, got "
                        f"{type(A).__name__} and {type(B).__name__}")
    if layout not in _LAYOUT_GEMM:
        raise ValueError(f"custom_gemm: layout: expected 'TN' (FPROP), 'NN' (DGRAD) or 'NT' "
                         f"(WGRAD), got {layout!r}")
    if gelu or gelu_in is not None:
        raise NotImplementedError("custom_gemm: the GELU epilogue (gelu, gelu_in) is not "
                                  "implemented for custom quantizers' GEMMs")
    if quantization_params is not None:
        raise NotImplementedError("custom_gemm: quantization_params (a quantized GEMM output) is "
                                  "not implemented for custom quantizers' GEMMs")
    if accumulate and out is None:
        raise ValueError("custom_gemm: out: expected a tensor to accumulate into, got None")
    gemm_type = _LAYOUT_GEMM[layout]
    if bias is not None and gemm_type != GEMMType.FPROP:
        raise NotImplementedError(f"custom_gemm: bias with layout {layout!r} ({gemm_type.name}, "
                                  "a bias-gradient epilogue) is not implemented for custom "
                                  "quantizers' GEMMs")
    x, w = B, A  # qgemm's (x, w): the input-side operand first
    quantizer = getattr(x, "_quantizer", None) or getattr(w, "_quantizer", None)
    if quantizer is None:
        raise ValueError("custom_gemm: no quantizer found in the custom tensors (_quantizer)")
    params = MMParams(out_dtype=out_dtype, use_split_accumulator=bool(use_split_accumulator))
    dtype = out_dtype if out_dtype is not None else x.dtype
    name = gemm_type.name
    if gemm_type == GEMMType.FPROP:
        qx, sx = _need(name, x, "data", "x data"), _need(name, x, "scale", "x scale")
        qw, sw = _need(name, w, "data", "w data"), _need(name, w, "scale", "w scale")
    elif gemm_type == GEMMType.DGRAD:
        qx, sx = _need(name, x, "data", "dy data"), _need(name, x, "scale", "dy scale")
        qw, sw = (_need(name, w, "data_t", "transposed w data"),
                  _need(name, w, "scale_t", "transposed w scale"))
    else:
        qx, sx = (_need(name, x, "data_t", "transposed dy data"),
                  _need(name, x, "scale_t", "transposed dy scale"))
        qw, sw = (_need(name, w, "data_t", "transposed x data"),
                  _need(name, w, "scale_t", "transposed x scale"))
    acc = None
    if accumulate:
        acc = out.reshape(-1, out.shape[-1])
    y = quantizer.qgemm(qx, qw, params, dtype, sx, sw, bias, out=acc, accumulate=accumulate,
                        gemm_type=gemm_type, qresult_x=x, qresult_w=w)
    shape = getattr(x, "original_shape", None)
    if gemm_type == GEMMType.FPROP and shape is not None and len(shape) != 2:
        y = y.reshape(*shape[:-1], y.shape[-1])
    if out is not None:
        if out.numel() != y.numel():
            raise ValueError(f"custom_gemm: out: expected {y.numel()} elements (shape "
                             f"{tuple(y.shape)}), got shape {tuple(out.shape)}")
        if y.data_ptr() != out.data_ptr():  # a qgemm returning a new tensor (NVFP4QuantizerRef)
            out.copy_(y.reshape(out.shape))
        y = out
    return y, None, None, None

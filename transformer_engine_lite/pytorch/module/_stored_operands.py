"""The weight and input operands a GEMM can take as they are stored (FP8 parameters from
quantized_model_init, a Float8Tensor input such as FP8 attention's output): their bytes, or their
exact dequantized copies, in the format the GemmConfig casts to; None when the stored form does not
match and the operand must be quantized from its values (module/_autograd.py's linear)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..quantization import Operand, QuantSpec, ops
from ..tensor import Float8BlockwiseQTensor, Float8Tensor, MXFP8Tensor, NVFP4Tensor
from ..tensor.quantized_tensor import to_dtype_enum

if TYPE_CHECKING:
    from ._autograd import GemmConfig


def stored_input(inp: torch.Tensor, cfg: GemmConfig) -> Operand | None:
    """The FP8 bytes ([tokens, k]) and scale_inv of a Float8Tensor input in the format cfg casts
    inputs to (else None: the input is quantized from its values)."""
    if isinstance(inp, Float8Tensor) and inp._fp8_dtype == to_dtype_enum(cfg.inp.dtype):
        data = inp._data.reshape(-1, inp.shape[-1]).contiguous()
        return Operand(data.view(cfg.inp.dtype), inp._scale_inv)
    return None


def stored_per_tensor(weight: torch.Tensor, cfg: GemmConfig) -> Operand | None:
    """The FP8 bytes and scale_inv of a Float8Tensor weight in the format cfg casts weights to."""
    if isinstance(weight, Float8Tensor) and weight._fp8_dtype == to_dtype_enum(cfg.weight.dtype):
        return Operand(weight._data.view(cfg.weight.dtype), weight._scale_inv)
    return None


def stored_mxfp8(
    weight: torch.Tensor, cfg: GemmConfig, columnwise: bool
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """An MXFP8Tensor weight's block copies (the column-wise one when asked for), each
    dequantized to bf16 for the GEMM (exact, as mx_dequantized): the same operands as quantizing
    the weight in the forward."""
    if not isinstance(weight, MXFP8Tensor) or weight._fp8_dtype != to_dtype_enum(cfg.inp.dtype):
        return None
    if weight._rowwise_data is None or (columnwise and weight._columnwise_data is None):
        return None
    te, dt = ops(), cfg.inp.dtype
    r = te.dequantize_mxfp8(
        weight._rowwise_data.view(dt), weight._scale_grid(False), False, torch.bfloat16
    )
    if not columnwise:
        return r, None
    c = te.dequantize_mxfp8(
        weight._columnwise_data.view(dt), weight._scale_grid(True), True, torch.bfloat16
    )
    return r, c


def stored_block(
    weight: torch.Tensor, cfg: GemmConfig, columnwise: bool
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """A Float8BlockwiseQTensor weight in the format and tiling cfg casts weights to, its copies
    dequantized to fp32 (as block_dequantized): the operands the forward would make from it. With
    128x128 blocks both copies hold the same values (square blocks, same scales)."""
    spec = cfg.weight
    if spec.mode == "nvfp4":
        return stored_nvfp4(weight, spec, columnwise)
    if (not isinstance(weight, Float8BlockwiseQTensor)
            or weight._fp8_dtype != to_dtype_enum(spec.dtype)
            or weight._is_2D_scaled != (spec.block_dim == 2)
            or weight._rowwise_data is None
            or (columnwise and not weight._is_2D_scaled and weight._columnwise_data is None)):
        return None
    r = weight.dequantize(dtype=torch.float32).reshape(-1, weight.shape[-1])
    if not columnwise:
        return r, None
    if weight._is_2D_scaled:
        return r, r
    te = ops()
    c = te.dequantize_fp8_block(weight._columnwise_data.view(spec.dtype),
                                weight._columnwise_scale_inv, 1, True, torch.float32)
    return r, c.reshape(weight.shape[-1], -1).t().contiguous()


def stored_nvfp4(
    weight: torch.Tensor, spec: QuantSpec, columnwise: bool
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """An NVFP4Tensor weight quantized as spec casts weights (same 1x16 / 16x16 blocks, RHT and
    rounding), its copies dequantized to fp32: the operands the forward would make from it (the
    column-wise one made from the row-wise copy for 16x16 blocks, as TE's update_usage)."""
    q = getattr(weight, "_quantizer", None)
    if (not isinstance(weight, NVFP4Tensor) or q is None or weight._rowwise_data is None
            or q.with_2d_quantization != (spec.block_dim == 2) or q.with_rht != spec.rht
            or q.nvfp4_use_4over6 != spec.four_over_six or q.nvfp4_e4m3_max != spec.e4m3_max):
        return None
    if columnwise and weight._columnwise_data is None and not q.with_2d_quantization:
        return None
    view = weight._shallow_copy()
    view.update_usage(rowwise_usage=True, columnwise_usage=columnwise)
    from ..cpp_extensions.nvfp4_gemm import tag_nvfp4_source

    # tagged with their source (as quantization.nvfp4_dequantized's) for the GEMMs' order
    r = view._dequantize_copy(False, torch.float32).reshape(-1, weight.shape[-1])
    r = tag_nvfp4_source(r, view, False)
    if not columnwise:
        return r, None
    c = view._dequantize_copy(True, torch.float32).reshape(-1, weight.shape[-1])
    return r, tag_nvfp4_source(c, view, True)

"""TE's `transformer_engine.pytorch.quantized_tensor` (where TE >= 2.9 keeps these names): the
classes (they live in tensor/quantized_tensor.py) and the helpers for what an autograd node saved
for its backward.

save_for_backward takes plain tensors only, so a node saving a quantized operand saves its
pieces (FP8 bytes, scale_inv) and keeps, in `ctx.tensor_objects`, one entry per operand: None
for a plain tensor (one saved tensor), or a template that rebuilds the quantized tensor from the
next saved pieces. restore_from_saved(tensor_objects, saved_tensors) pairs them up again, so the
backward (or a test) sees the operands as the forward saved them.
"""
from __future__ import annotations

from typing import Any

import torch

from .tensor import Float8Tensor
from .tensor.quantized_tensor import QuantizedTensor, QuantizedTensorStorage, Quantizer

__all__ = [
    "Float8BlockSavedOperand",
    "Float8SavedOperand",
    "MXFP8SavedOperand",
    "NVFP4SavedOperand",
    "QuantizedTensor",
    "QuantizedTensorStorage",
    "Quantizer",
    "SavedFloat8",
    "SavedFloat8Block",
    "SavedMXFP8",
    "SavedNVFP4",
    "prepare_for_saving",
    "restore_from_func_ctx",
    "restore_from_saved",
]


class Float8SavedOperand:
    """A per-tensor FP8 operand as a backward node saved it (TE's Float8TensorStorage role: not
    a torch.Tensor, so it is not mistaken for a high-precision tensor): the row-wise bytes
    `_data` (uint8), `_scale_inv` ([1] fp32) and no column-wise copy (`_transpose` None)."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, data: torch.Tensor,
                 scale_inv: torch.Tensor, fp8_dtype: Any) -> None:
        self._f8 = Float8Tensor(shape=shape, dtype=dtype, data=data, fp8_scale_inv=scale_inv,
                                fp8_dtype=fp8_dtype)
        self._data, self._scale_inv, self._transpose = self._f8._data, scale_inv, None
        self.shape, self.dtype = self._f8.shape, dtype

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def dequantize(self, *, dtype: torch.dtype | None = None) -> torch.Tensor:
        return self._f8.dequantize(dtype=dtype or self.dtype)


class SavedFloat8:
    """Template of a per-tensor FP8 operand saved as (bytes, scale_inv): the rebuilt
    operand has only the row-wise (as-quantized) layout, as the forward made it."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, fp8_dtype: Any) -> None:
        self.shape, self.dtype, self.fp8_dtype = tuple(shape), dtype, fp8_dtype

    def prepare_for_saving(self, t: Float8Tensor) -> list[torch.Tensor]:
        return [t._data, t._scale_inv]

    def restore_from_saved(self, saved: list[torch.Tensor | None]) -> tuple[Float8SavedOperand,
                                                                            list]:
        if len(saved) < 2:
            raise ValueError(f"restore_from_saved: a saved FP8 operand needs 2 tensors (bytes, "
                             f"scale_inv), got {len(saved)}")
        data, scale_inv = saved[0], saved[1]
        return Float8SavedOperand(self.shape, self.dtype, data, scale_inv, self.fp8_dtype), saved[2:]


class MXFP8SavedOperand:
    """A row-wise MXFP8 operand as a backward node saved it (TE's MXFP8TensorStorage role):
    `_rowwise_data` (FP8 bytes), `_rowwise_scale_inv` (E8M0 per 32-block), no column-wise copy."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, data: torch.Tensor,
                 scale_inv: torch.Tensor) -> None:
        self._rowwise_data, self._rowwise_scale_inv = data, scale_inv
        self._columnwise_data = self._columnwise_scale_inv = None
        self.shape, self.dtype = torch.Size(shape), dtype

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def dequantize(self, *, dtype: torch.dtype | None = None) -> torch.Tensor:
        from .quantization import ops

        out = ops().dequantize_mxfp8(self._rowwise_data, self._rowwise_scale_inv, False,
                                     dtype or self.dtype)
        return out.reshape(self.shape)


class SavedMXFP8(SavedFloat8):
    """Template of a row-wise MXFP8 operand saved as (bytes, block scales)."""

    def restore_from_saved(self, saved: list[torch.Tensor | None]) -> tuple[MXFP8SavedOperand,
                                                                            list]:
        if len(saved) < 2:
            raise ValueError(f"restore_from_saved: a saved MXFP8 operand needs 2 tensors (bytes, "
                             f"scale_inv), got {len(saved)}")
        return MXFP8SavedOperand(self.shape, self.dtype, saved[0], saved[1]), saved[2:]

class Float8BlockSavedOperand(MXFP8SavedOperand):
    """A row-wise Float8BlockScaling operand as a backward node saved it (TE's
    Float8BlockwiseQTensorStorage role under backward_override="dequantized"): `_rowwise_data`
    (FP8 bytes), `_rowwise_scale_inv` (fp32 per 1x128 tile or 128x128 block, block_dim 1 or 2),
    no column-wise copy. dequantize() gives the fp32 values the forward GEMM used, then `dtype`."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, data: torch.Tensor,
                 scale_inv: torch.Tensor, block_dim: int) -> None:
        super().__init__(shape, dtype, data, scale_inv)
        self.block_dim = block_dim

    def dequantize(self, *, dtype: torch.dtype | None = None) -> torch.Tensor:
        from .quantization import ops

        out = ops().dequantize_fp8_block(self._rowwise_data, self._rowwise_scale_inv,
                                         self.block_dim, False, torch.float32)
        return out.reshape(self.shape).to(dtype or self.dtype)


class SavedFloat8Block(SavedFloat8):
    """Template of a row-wise Float8BlockScaling operand saved as (bytes, block scales)."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, fp8_dtype: Any,
                 block_dim: int) -> None:
        super().__init__(shape, dtype, fp8_dtype)
        self.block_dim = block_dim

    def restore_from_saved(self, saved: list[torch.Tensor | None]) -> tuple[
            Float8BlockSavedOperand, list]:
        if len(saved) < 2:
            raise ValueError(f"restore_from_saved: a saved Float8Block operand needs 2 tensors "
                             f"(bytes, scale_inv), got {len(saved)}")
        return (Float8BlockSavedOperand(self.shape, self.dtype, saved[0], saved[1],
                                        self.block_dim), saved[2:])


class NVFP4SavedOperand(MXFP8SavedOperand):
    """A row-wise NVFP4 operand as a backward node saved it under backward_override=
    "dequantized" (TE's NVFP4TensorStorage role): `_rowwise_data` (E2M1, two per byte),
    `_rowwise_scale_inv` (E4M3 per 1x16 or 16x16 block), `_amax_rowwise` (fp32, the per-tensor
    amax the block scales are relative to), no column-wise copy (no Hadamard transform)."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, data: torch.Tensor,
                 scale_inv: torch.Tensor, amax: torch.Tensor, row_scaled: bool = False,
                 e4m3_max: int = 448) -> None:
        super().__init__(shape, dtype, data, scale_inv)
        self._amax_rowwise = amax  # one fp32, or one per row when row_scaled
        self._row_scaled_nvfp4, self._nvfp4_e4m3_max = row_scaled, e4m3_max

    def dequantize(self, *, dtype: torch.dtype | None = None) -> torch.Tensor:
        from .quantization import ops

        out = ops().dequantize_nvfp4(self._rowwise_data, self._rowwise_scale_inv,
                                     self._amax_rowwise, torch.float32, self._row_scaled_nvfp4,
                                     self._nvfp4_e4m3_max)
        return out.reshape(self.shape).to(dtype or self.dtype)


class SavedNVFP4(SavedFloat8):
    """Template of a row-wise NVFP4 operand saved as (bytes, block scales); the per-tensor amax
    (one fp32) rides on the template, so the node's saved-tensor pairs stay (bytes, scales)."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, amax: torch.Tensor,
                 row_scaled: bool = False, e4m3_max: int = 448) -> None:
        super().__init__(shape, dtype, None)
        self.amax, self.row_scaled, self.e4m3_max = amax, row_scaled, e4m3_max

    def restore_from_saved(self, saved: list[torch.Tensor | None]) -> tuple[NVFP4SavedOperand,
                                                                            list]:
        if len(saved) < 2:
            raise ValueError(f"restore_from_saved: a saved NVFP4 operand needs 2 tensors (bytes, "
                             f"scale_inv), got {len(saved)}")
        return (NVFP4SavedOperand(self.shape, self.dtype, saved[0], saved[1], self.amax,
                                  self.row_scaled, self.e4m3_max), saved[2:])


def prepare_for_saving(
    *tensors: torch.Tensor | None,
) -> tuple[list[torch.Tensor | None], list[SavedFloat8 | None]]:
    """(tensors to save_for_backward, tensor_objects): a Float8Tensor becomes its bytes and
    scale_inv plus a template; plain tensors and None pass through with a None entry."""
    flat: list[torch.Tensor | None] = []
    objects: list[SavedFloat8 | None] = []
    for t in tensors:
        if isinstance(t, Float8SavedOperand):
            t = t._f8
        if isinstance(t, Float8Tensor):
            obj = SavedFloat8(t.shape, t.dtype, t._fp8_dtype)
            flat.extend(obj.prepare_for_saving(t))
            objects.append(obj)
        elif t is None or (isinstance(t, torch.Tensor) and not isinstance(t, QuantizedTensor)):
            flat.append(t)
            objects.append(None)
        else:
            raise NotImplementedError(
                f"prepare_for_saving: {type(t).__name__} operands are not supported by "
                "transformer_engine_lite (Float8Tensor and plain tensors are)")
    return flat, objects


def restore_from_saved(
    tensors: list[Any],
    saved_tensors: list[torch.Tensor | None],
    return_saved_tensors: bool = False,
) -> list[Any] | tuple[list[Any], list[torch.Tensor | None]]:
    """The operands again from tensor_objects and the node's saved tensors (see the module
    docstring); return_saved_tensors=True also returns the saved tensors left over."""
    if not isinstance(tensors, (list, tuple)) or not isinstance(saved_tensors, (list, tuple)):
        raise TypeError("restore_from_saved: tensors and saved_tensors: expected lists, got "
                        f"{type(tensors).__name__} and {type(saved_tensors).__name__}")
    rest = list(saved_tensors)
    out: list[Any] = []
    for obj in tensors:
        if obj is None:
            if not rest:
                raise ValueError("restore_from_saved: more tensor_objects than saved tensors")
            out.append(rest.pop(0))
        else:
            t, rest = obj.restore_from_saved(rest)
            out.append(t)
    return (out, rest) if return_saved_tensors else out


def restore_from_func_ctx(ctx: Any, return_saved_tensors: bool = False) -> Any:
    """TE's restore_from_saved for an autograd ctx: rebuilds from ctx.tensor_objects and
    ctx.saved_tensors, then drops ctx.tensor_objects (they are consumed once, as in TE)."""
    if getattr(ctx, "tensor_objects", None) is None:
        raise AttributeError("restore_from_func_ctx: ctx must have .tensor_objects to restore "
                             "saved tensors")
    out = restore_from_saved(ctx.tensor_objects, list(ctx.saved_tensors),
                             return_saved_tensors=return_saved_tensors)
    ctx.tensor_objects = None
    return out

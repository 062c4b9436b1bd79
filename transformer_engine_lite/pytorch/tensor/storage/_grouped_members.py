"""Quantized members of a GroupedTensorStorage: views of its flat buffers as this library's
quantized tensors (layout: see grouped_tensor_storage.py), and the per-member statistics
quantize() records."""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["quantized_member", "record_member_stats"]


def _view(buf: torch.Tensor | None, start: int, shape: tuple) -> torch.Tensor | None:
    if buf is None:
        return None
    return buf[start:start + math.prod(shape)].view(shape)


def quantized_member(grouped: Any, kind: str, i: int, shape: tuple, offset: int) -> Any:
    """Member i (of `shape`, data starting at element `offset`) as a quantized tensor whose
    buffers are views of the grouped ones."""
    from .grouped_tensor_storage import _member_specs

    q = grouped.quantizer
    specs = _member_specs(q, shape)
    shape = tuple(shape)
    if kind in ("delayed", "current"):
        from ..float8_tensor import Float8Tensor

        scale_inv = grouped.scale_inv[i:i + 1] if grouped.scale_inv is not None else None
        if scale_inv is None:
            raise RuntimeError("GroupedTensor: a per-tensor FP8 grouped tensor without scale_inv")
        return Float8Tensor(shape=shape, dtype=grouped.fake_dtype,
                            data=_view(grouped.rowwise_data, offset, shape),
                            fp8_scale_inv=scale_inv, fp8_dtype=q.dtype, quantizer=q)
    fields = {}
    for fld, offs in (("scale_inv", grouped.scale_inv_offsets),
                      ("columnwise_scale_inv", grouped.columnwise_scale_inv_offsets)):
        buf = getattr(grouped, fld)
        fields[fld] = None
        if buf is not None and fld in specs:
            if offs is None:
                raise RuntimeError(f"GroupedTensor: {fld} without {fld}_offsets")
            fields[fld] = _view(buf, offs[i], specs[fld][0])
    if kind == "nvfp4":
        offset //= 2  # two E2M1 values per byte: member i's bytes start at half its elements
    row = _view(grouped.rowwise_data, offset, specs["rowwise_data"][0]) \
        if "rowwise_data" in specs else None
    col = _view(grouped.columnwise_data, offset, specs["columnwise_data"][0]) \
        if "columnwise_data" in specs else None
    if kind == "nvfp4":
        from ..nvfp4_tensor import NVFP4Tensor

        amax = {f: None if getattr(grouped, f) is None or f not in specs
                else getattr(grouped, f)[i:i + 1] for f in ("amax", "columnwise_amax")}
        return NVFP4Tensor(shape=shape, dtype=grouped.fake_dtype, rowwise_data=row,
                           rowwise_scale_inv=fields["scale_inv"], columnwise_data=col,
                           columnwise_scale_inv=fields["columnwise_scale_inv"],
                           amax_rowwise=amax["amax"], amax_columnwise=amax["columnwise_amax"],
                           quantizer=q,
                           with_gemm_swizzled_scales=grouped._with_gemm_swizzled_scales)
    common = dict(shape=shape, dtype=grouped.fake_dtype, rowwise_data=row,
                  rowwise_scale_inv=fields["scale_inv"], columnwise_data=col,
                  columnwise_scale_inv=fields["columnwise_scale_inv"], fp8_dtype=q.dtype,
                  quantizer=q)
    if kind == "mxfp8":
        from ..mxfp8_tensor import MXFP8Tensor

        return MXFP8Tensor(**common)
    from ..float8_blockwise_tensor import Float8BlockwiseQTensor

    return Float8BlockwiseQTensor(**common, is_2D_scaled=q.block_scaling_dim == 2)


@torch.no_grad()
def record_member_stats(grouped: Any, i: int, src: torch.Tensor, dst: Any) -> None:
    """Per-tensor recipes keep each member's amax (TE's grouped amax [n]) and, for current
    scaling, its scale (TE's grouped scale [n], the reciprocal of the member's scale_inv).
    NVFP4 members hold views of amax / columnwise_amax: quantizing wrote them already."""
    if type(grouped.quantizer).__name__ == "NVFP4Quantizer":
        return
    if grouped.amax is not None and grouped.amax.numel() == grouped.num_tensors:
        x = src.detach()
        amax = x.abs().max().float() if x.numel() else x.new_zeros((), dtype=torch.float32)
        grouped.amax[i].copy_(amax)
    if grouped.scale is not None and grouped.scale.numel() == grouped.num_tensors:
        grouped.scale[i].copy_(1.0 / dst._scale_inv.reshape(()).float())

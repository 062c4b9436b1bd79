"""GroupedTensorStorage: TE's grouped tensor without the torch.Tensor wrapper.

A grouped tensor is num_tensors 2-D (or 1-D) members of one dtype and one quantizer, packed back
to back in flat buffers (TE main's tensor.storage.grouped_tensor_storage):
  - logical_shape (TE's): the 2-D view of the packing: [n*M, N] when all members are [M, N],
    [sum M_i, N] when only the first dim varies, [M, sum N_i] when only the last does, [1, total]
    when both vary.
  - first_dims / last_dims: int64 tensors [n], None where that dim is the same for every member.
  - tensor_offsets: int64 tensor [n+1] of element offsets (CSR), set where a dim varies; offsets
    is the same as a host list (a list for the uniform case too).
  - rowwise_data / columnwise_data / scale_inv / columnwise_scale_inv / amax / scale: flat buffers.

Quantized layout (this library's quantizers): every member's buffers are those its quantizer's
`inner_tensor_specs(shape)` names (the buffers quantizer(x) makes), packed in member order, and
scale_inv_offsets / columnwise_scale_inv_offsets give each member's first scale element. So a
member from split_into_quantized_tensors() is a view and update_quantized writes the grouped
buffers. Per recipe:
  - delayed / current scaling: one uint8 copy of the values (rowwise_data; the CPU GEMM takes any
    layout, utils.is_non_tn_fp8_gemm_supported(), so TE's column-wise transpose is not kept, as TE
    does on such hardware), scale_inv [n]; amax [n] (and scale [n] for current scaling) hold each
    member's amax (and scale) after quantize().
  - MXFP8: uint8 data per usage ([rows, cols] each), E8M0 scales [rows, ceil(cols/32)] row-wise,
    [ceil(rows/32), cols] column-wise (compact: TE's GEMM-swizzled grouped layout is not
    implemented, so a quantizer's optimize_for_gemm gives compact scales here, unlike
    MXFP8Quantizer's own output).
  - Float8BlockScaling: row-wise data [rows, cols] and column-wise (transposed) data, fp32 scales
    in the quantizer's GEMM-ready grid (Float8BlockQuantizer.get_scale_shape).
  - NVFP4: packed uint8 data per usage (member i's bytes from offsets[i] / 2: [rows, cols / 2]
    row-wise, [cols, rows / 2] column-wise), its E4M3 grids (the quantizer's padded shapes;
    GEMM-swizzled per member with optimize_for_gemm, _with_gemm_swizzled_scales), amax /
    columnwise_amax [n] (each member's). Row-scaled / 4over6 quantizers: NotImplementedError.
"""

from __future__ import annotations

import math
from typing import Any, List, Optional, Tuple, Union

import torch

from ..quantized_tensor import QuantizedTensorStorage, Quantizer

__all__ = ["GroupedTensorStorage"]

# TE's grouped field <- this library's member buffer name (inner_tensor_specs).
_FIELD_OF = {
    "_data": "rowwise_data",
    "_rowwise_data": "rowwise_data",
    "_columnwise_data": "columnwise_data",
    "_scale_inv": "scale_inv",
    "_rowwise_scale_inv": "scale_inv",
    "_columnwise_scale_inv": "columnwise_scale_inv",
    "_amax_rowwise": "amax",
    "_amax_columnwise": "columnwise_amax",
}
_SAVED = ("rowwise_data", "columnwise_data", "scale_inv", "columnwise_scale_inv", "amax",
          "columnwise_amax", "scale", "first_dims", "last_dims", "tensor_offsets")


def _recipe_kind(owner: str, quantizer: Any) -> str:
    """'delayed' / 'current' / 'mxfp8' / 'block' for a quantizer this module lays out."""
    from ..float8_tensor import Float8CurrentScalingQuantizer, Float8Quantizer
    from ..mxfp8_tensor import MXFP8Quantizer
    from ..float8_blockwise_tensor import Float8BlockQuantizer

    for cls, kind in ((Float8Quantizer, "delayed"), (Float8CurrentScalingQuantizer, "current"),
                      (MXFP8Quantizer, "mxfp8"), (Float8BlockQuantizer, "block")):
        if isinstance(quantizer, cls):
            return kind
    if type(quantizer).__name__ == "NVFP4Quantizer":
        if quantizer.row_scaled_nvfp4 or quantizer.nvfp4_use_4over6:
            raise NotImplementedError(
                f"{owner}: quantizer: NVFP4Quantizer with row_scaled_nvfp4 / nvfp4_use_4over6: "
                "grouped storage of those is not implemented in transformer_engine_lite")
        return "nvfp4"
    if type(quantizer).__name__ in ("IdentityQuantizer", "HybridQuantizer"):
        raise NotImplementedError(
            f"{owner}: quantizer: {type(quantizer).__name__} grouped storage is not implemented in "
            "transformer_engine_lite (supported: Float8Quantizer, Float8CurrentScalingQuantizer, "
            "MXFP8Quantizer, Float8BlockQuantizer, NVFP4Quantizer)")
    raise ValueError(f"{owner}: quantizer: expected None or a Float8Quantizer, "
                     f"Float8CurrentScalingQuantizer, MXFP8Quantizer, Float8BlockQuantizer or "
                     f"NVFP4Quantizer, got {type(quantizer).__name__}")


def _compact_layout(quantizer: Any) -> Any:
    """The quantizer members are written with: grouped buffers keep compact scales (the grouped
    GEMMs read them so; see the module docstring), so optimize_for_gemm is turned off in a copy.
    NVFP4 members keep theirs (each member's grid swizzled on its own, as TE's group quantize)."""
    if not getattr(quantizer, "optimize_for_gemm", False) \
            or type(quantizer).__name__ == "NVFP4Quantizer":
        return quantizer
    q = quantizer.copy()
    q.optimize_for_gemm = False
    return q


def _member_specs(quantizer: Any, shape: Tuple[int, ...]) -> dict:
    """TE field -> (shape, dtype) of one member's buffers under `quantizer`."""
    specs = _compact_layout(quantizer).inner_tensor_specs(tuple(shape))
    return {_FIELD_OF[k]: v for k, v in specs.items()}


class GroupedTensorStorage:
    """See the module docstring. Constructor arguments are TE's (keywords after shape, dtype)."""

    def __new__(cls, shape: Tuple[int, int], dtype: torch.dtype, **kwargs: Any):
        instance = object.__new__(cls)
        cls._initialize_storage_fields(instance, shape, dtype, **kwargs)
        return instance

    @staticmethod
    def _initialize_storage_fields(
        instance: "GroupedTensorStorage",
        shape: Tuple[int, int],
        dtype: torch.dtype,
        num_tensors: int,
        shapes: Optional[List[Tuple[int, ...]]] = None,
        quantizer: Optional[Quantizer] = None,
        data: Optional[torch.Tensor] = None,
        columnwise_data: Optional[torch.Tensor] = None,
        scale_inv: Optional[torch.Tensor] = None,
        columnwise_scale_inv: Optional[torch.Tensor] = None,
        amax: Optional[torch.Tensor] = None,
        columnwise_amax: Optional[torch.Tensor] = None,
        scale: Optional[torch.Tensor] = None,
        first_dims: Optional[torch.Tensor] = None,
        last_dims: Optional[torch.Tensor] = None,
        tensor_offsets: Optional[torch.Tensor] = None,
        offsets: Optional[List[int]] = None,
        scale_inv_offsets: Optional[List[int]] = None,
        columnwise_scale_inv_offsets: Optional[List[int]] = None,
        requires_grad: bool = False,
        stride: Optional[List[int]] = None,
        with_gemm_swizzled_scales: bool = False,
        row_scaled_nvfp4: bool = False,
        nvfp4_use_4over6: bool = False,
        nvfp4_e4m3_max: int = 448,
    ) -> None:
        owner = "GroupedTensor"
        # requires_grad / stride belong to the wrapper (GroupedTensor); storage has neither (TE).
        del requires_grad, stride
        if not isinstance(num_tensors, int) or isinstance(num_tensors, bool) or num_tensors < 0:
            raise ValueError(f"{owner}: num_tensors: expected an int >= 0, got {num_tensors!r}")
        if len(tuple(shape)) != 2:
            raise ValueError(f"{owner}: shape: expected a 2-D logical shape, got {tuple(shape)}")
        kind = None if quantizer is None else _recipe_kind(owner, quantizer)
        if with_gemm_swizzled_scales and kind != "nvfp4":
            raise NotImplementedError(
                f"{owner}: with_gemm_swizzled_scales=True is not implemented in "
                "transformer_engine_lite for this format (its grouped GEMMs take compact scales; "
                "NVFP4 members may be swizzled)")
        if row_scaled_nvfp4 or nvfp4_use_4over6 or nvfp4_e4m3_max != 448:
            raise NotImplementedError(f"{owner}: NVFP4 options (row_scaled_nvfp4, "
                                      "nvfp4_use_4over6, nvfp4_e4m3_max) are not implemented in "
                                      "transformer_engine_lite's grouped storage")
        instance.num_tensors = num_tensors
        instance.quantizer = quantizer
        instance.tensor_shapes = None if shapes is None else [tuple(s) for s in shapes]
        instance.fake_dtype = dtype
        instance.rowwise_data = data
        instance.columnwise_data = columnwise_data
        instance.scale_inv = scale_inv
        instance.columnwise_scale_inv = columnwise_scale_inv
        instance.amax = amax
        instance.columnwise_amax = columnwise_amax
        instance.scale = scale
        instance.scale_inv_offsets = scale_inv_offsets
        instance.columnwise_scale_inv_offsets = columnwise_scale_inv_offsets
        instance.first_dims = first_dims
        instance.last_dims = last_dims
        instance.tensor_offsets = tensor_offsets
        instance.offsets = offsets
        instance.logical_shape = tuple(shape)
        instance.quantized_tensors = None
        instance._with_gemm_swizzled_scales = bool(with_gemm_swizzled_scales)
        instance.row_scaled_nvfp4 = False
        instance.nvfp4_use_4over6 = False
        instance.nvfp4_e4m3_max = 448

    # ------------------------------------------------------------------ TE's predicates
    def has_data(self) -> bool:
        return self.rowwise_data is not None

    def has_columnwise_data(self) -> bool:
        return self.columnwise_data is not None

    def all_same_first_dim(self) -> bool:
        return self.first_dims is None

    def all_same_last_dim(self) -> bool:
        return self.last_dims is None

    def all_same_shape(self) -> bool:
        return self.first_dims is None and self.last_dims is None

    def varying_both_dims(self) -> bool:
        return self.first_dims is not None and self.last_dims is not None

    def get_common_first_dim(self) -> int:
        if not self.all_same_first_dim():
            raise RuntimeError(
                "GroupedTensor.get_common_first_dim: first dim varies across tensors")
        if self.all_same_shape():
            return self.logical_shape[0] // max(1, self.num_tensors)
        return self.logical_shape[0]

    def get_common_last_dim(self) -> int:
        if not self.all_same_last_dim():
            raise RuntimeError("GroupedTensor.get_common_last_dim: last dim varies across tensors")
        return self.logical_shape[1]

    def get_dtype(self) -> torch.dtype:
        return self.fake_dtype

    # ------------------------------------------------------------------ saving / clearing
    def prepare_for_saving(self) -> Tuple[list, "GroupedTensorStorage"]:
        """TE's: the buffers (to save for backward) and this object, emptied of them."""
        tensors = [getattr(self, f) for f in _SAVED]
        for f in _SAVED:
            setattr(self, f, None)
        self.quantized_tensors = None
        return tensors, self

    def restore_from_saved(self, tensors: list) -> list:
        for f, t in zip(_SAVED, tensors):
            setattr(self, f, t)
        return tensors[len(_SAVED):]

    def get_data_tensors(self) -> tuple:
        return tuple(getattr(self, f) for f in _SAVED)

    def clear(self) -> None:
        for f in _SAVED:
            setattr(self, f, None)
        self.logical_shape, self.num_tensors, self.quantizer = (0, 0), 0, None
        self.quantized_tensors = self.offsets = None
        self.scale_inv_offsets = self.columnwise_scale_inv_offsets = None
        self.tensor_shapes, self.fake_dtype = [], torch.float32

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_tensors={self.num_tensors}, "
                f"shapes={self.tensor_shapes}, logical_shape={self.logical_shape}, "
                f"quantizer={self.quantizer}, dtype={self.get_dtype()})")

    def copy(self) -> "GroupedTensorStorage":
        """TE's: a storage object sharing every buffer with this one (metadata may then change)."""
        return GroupedTensorStorage(
            self.logical_shape, self.fake_dtype, num_tensors=self.num_tensors,
            shapes=self.tensor_shapes, quantizer=self.quantizer, data=self.rowwise_data,
            columnwise_data=self.columnwise_data, scale_inv=self.scale_inv,
            columnwise_scale_inv=self.columnwise_scale_inv, amax=self.amax,
            columnwise_amax=self.columnwise_amax, scale=self.scale, first_dims=self.first_dims,
            last_dims=self.last_dims, tensor_offsets=self.tensor_offsets, offsets=self.offsets,
            scale_inv_offsets=self.scale_inv_offsets,
            columnwise_scale_inv_offsets=self.columnwise_scale_inv_offsets)

    # ------------------------------------------------------------------ construction
    @staticmethod
    def make_tensor_offsets(split_dims: torch.Tensor, common_dim: int) -> torch.Tensor:
        """[0, cumsum(split_dims * common_dim)]: element offsets of members with one varying dim."""
        zero = torch.zeros(1, device=split_dims.device, dtype=split_dims.dtype)
        return torch.cat([zero, torch.cumsum(split_dims * common_dim, dim=0)])

    @staticmethod
    def make_grouped_tensor_with_shapes(
        num_tensors: int,
        shapes: List[Tuple[int, int]],
        quantizer: Optional[Quantizer] = None,
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> "GroupedTensorStorage":
        """A grouped tensor of members with these 2-D shapes (first / last dims derived)."""
        if len(shapes) != num_tensors or any(len(tuple(s)) != 2 for s in shapes):
            raise ValueError(f"GroupedTensor.make_grouped_tensor_with_shapes: shapes: expected "
                             f"{num_tensors} 2-D shapes, got {shapes!r}")
        firsts, lasts = [int(s[0]) for s in shapes], [int(s[1]) for s in shapes]
        same_first, same_last = len(set(firsts)) <= 1, len(set(lasts)) <= 1
        first_dims = None if same_first else torch.tensor(firsts, dtype=torch.int64, device=device)
        last_dims = None if same_last else torch.tensor(lasts, dtype=torch.int64, device=device)
        if not same_first and not same_last:
            logical = (1, sum(f * l for f, l in zip(firsts, lasts)))
        elif same_first and not same_last:
            logical = (firsts[0], sum(lasts))
        else:
            logical = (sum(firsts), lasts[0])
        return GroupedTensorStorage.make_grouped_tensor(
            num_tensors, first_dims, last_dims, logical[0], logical[1], quantizer, device, dtype)

    @staticmethod
    def make_grouped_tensor_from_rowwise_data(
        *,
        num_tensors: int,
        tensor_shape: Tuple[int, ...],
        rowwise_data: torch.Tensor,
        dtype: Optional[torch.dtype] = None,
        internal: bool = False,
    ) -> "GroupedTensorStorage":
        """Unquantized grouped metadata over an existing packed buffer of num_tensors members of
        `tensor_shape` ((rows, cols), or (n,): logical shape (num_tensors * n, 1)); no copy."""
        owner = "GroupedTensor.make_grouped_tensor_from_rowwise_data"
        if not isinstance(num_tensors, int) or num_tensors <= 0:
            raise ValueError(f"{owner}: num_tensors: expected a positive int, got {num_tensors!r}")
        if rowwise_data is None:
            raise ValueError(f"{owner}: rowwise_data: expected a tensor, got None")
        tensor_shape = tuple(int(d) for d in tensor_shape)
        if len(tensor_shape) == 2:
            logical = (num_tensors * tensor_shape[0], tensor_shape[1])
        elif len(tensor_shape) == 1:
            logical = (num_tensors * tensor_shape[0], 1)
        else:
            raise ValueError(f"{owner}: tensor_shape: expected (n,) or (rows, cols), got "
                             f"{tensor_shape!r}")
        expected = num_tensors * math.prod(tensor_shape)
        if rowwise_data.numel() != expected:
            raise ValueError(f"{owner}: rowwise_data: expected {expected} elements for "
                             f"{num_tensors} x {tensor_shape}, got {rowwise_data.numel()}")
        cls = GroupedTensorStorage
        if not internal:
            from ..grouped_tensor import GroupedTensor as cls  # noqa: N813
        return cls(logical, rowwise_data.dtype if dtype is None else dtype,
                   num_tensors=num_tensors, shapes=[tensor_shape] * num_tensors,
                   data=rowwise_data.contiguous().view(-1))

    @staticmethod
    def make_grouped_tensor(
        num_tensors: int,
        first_dims: Optional[torch.Tensor],
        last_dims: Optional[torch.Tensor],
        logical_first_dim: int,
        logical_last_dim: int,
        quantizer: Optional[Quantizer] = None,
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> "GroupedTensorStorage":
        """TE's allocator: buffers for num_tensors members (see the module docstring for the
        layout), uninitialised. The GroupedTensor wrapper unless quantizer.internal."""
        owner = "GroupedTensor.make_grouped_tensor"
        if not isinstance(num_tensors, int) or isinstance(num_tensors, bool) or num_tensors < 1:
            raise ValueError(f"{owner}: num_tensors: expected an int >= 1, got {num_tensors!r}")
        if logical_first_dim < 0 or logical_last_dim <= 0:
            raise ValueError(f"{owner}: expected logical_first_dim >= 0 and logical_last_dim > 0, "
                             f"got {logical_first_dim} and {logical_last_dim}")
        for name, dims in (("first_dims", first_dims), ("last_dims", last_dims)):
            if dims is not None and (not isinstance(dims, torch.Tensor) or dims.dim() != 1
                                     or dims.numel() != num_tensors or dims.is_floating_point()):
                got = (f"{dims.dtype} of shape {tuple(dims.shape)}"
                       if isinstance(dims, torch.Tensor) else type(dims).__name__)
                raise ValueError(f"{owner}: {name}: expected None or a 1-D integer tensor of "
                                 f"{num_tensors} entries, got {got}")
        if device is None:
            ref = first_dims if first_dims is not None else last_dims
            device = ref.device if ref is not None else torch.device("cpu")
        if quantizer is None and dtype is None:
            raise ValueError(f"{owner}: dtype: expected a dtype for an unquantized grouped "
                             "tensor, got None")
        kind = None if quantizer is None else _recipe_kind(owner, quantizer)
        tensor_offsets, offsets = None, None
        if first_dims is None and last_dims is None:
            if logical_first_dim % num_tensors:
                raise ValueError(f"{owner}: logical_first_dim: expected a multiple of num_tensors "
                                 f"({num_tensors}) for same-shape members, got {logical_first_dim}")
            rows = logical_first_dim // num_tensors
            shapes = [(rows, logical_last_dim)] * num_tensors
            per = rows * logical_last_dim
            offsets = [i * per for i in range(num_tensors + 1)]
        else:
            # Varying dims: the member shapes come to the host (TE: not CUDA-graph safe either).
            f = first_dims.tolist() if first_dims is not None else None
            l = last_dims.tolist() if last_dims is not None else None
            if f is not None and l is not None:
                shapes = list(zip(f, l))
                sizes = first_dims.to(torch.int64) * last_dims.to(torch.int64)
                tensor_offsets = GroupedTensorStorage.make_tensor_offsets(sizes, 1)
                total = sum(a * b for a, b in shapes)
                if logical_first_dim * logical_last_dim != total:
                    raise ValueError(f"{owner}: expected a logical shape of {total} elements (the "
                                     f"members'), got ({logical_first_dim}, {logical_last_dim})")
            elif f is not None:
                shapes = [(a, logical_last_dim) for a in f]
                tensor_offsets = GroupedTensorStorage.make_tensor_offsets(
                    first_dims.to(torch.int64), logical_last_dim)
            else:
                shapes = [(logical_first_dim, b) for b in l]
                tensor_offsets = GroupedTensorStorage.make_tensor_offsets(
                    last_dims.to(torch.int64), logical_first_dim)
            if any(a < 0 for s in shapes for a in s):
                raise ValueError(f"{owner}: expected non-negative member dims, got {shapes}")
            offsets = tensor_offsets.tolist()
            # TE allows the buffer to be larger than the members (tokens padded at the end).
            if offsets[-1] > logical_first_dim * logical_last_dim:
                raise ValueError(f"{owner}: the members need {offsets[-1]} elements, more than the "
                                 f"logical shape ({logical_first_dim}, {logical_last_dim}) holds")
        total = logical_first_dim * logical_last_dim
        bufs: dict = {}
        sio = csio = None
        if quantizer is None:
            bufs["data"] = torch.empty(total, dtype=dtype, device=device)
        else:
            if not (quantizer.rowwise_usage or quantizer.columnwise_usage):
                raise ValueError(f"{owner}: quantizer: expected rowwise or columnwise usage, got "
                                 "neither")
            per_member = [_member_specs(quantizer, s) for s in shapes]
            fields = per_member[0].keys() if per_member else ()
            for fld in fields:
                dt = per_member[0][fld][1]
                counts = [math.prod(m[fld][0]) for m in per_member]
                if fld in ("amax", "columnwise_amax"):  # NVFP4: one amax per member and copy
                    bufs[fld] = torch.zeros(sum(counts), dtype=dt, device=device)
                    continue
                if fld in ("rowwise_data", "columnwise_data"):
                    # the logical shape may carry padding; NVFP4 packs two values per byte
                    size = max(total // (2 if kind == "nvfp4" else 1), sum(counts))
                else:
                    size = sum(counts)
                    cum = [0]
                    for c in counts:
                        cum.append(cum[-1] + c)
                    if fld == "scale_inv":
                        sio = cum
                    else:
                        csio = cum
                bufs["columnwise_data" if fld == "columnwise_data" else
                     "data" if fld == "rowwise_data" else fld] = torch.empty(
                         size, dtype=dt, device=device)
            if kind in ("delayed", "current"):
                bufs["amax"] = torch.zeros(num_tensors, dtype=torch.float32, device=device)
            if kind == "current":
                bufs["scale"] = torch.ones(num_tensors, dtype=torch.float32, device=device)
        internal = quantizer is not None and bool(getattr(quantizer, "internal", False))
        cls = GroupedTensorStorage
        if not internal:
            from ..grouped_tensor import GroupedTensor as cls  # noqa: N813
        out = cls((logical_first_dim, logical_last_dim),
                  dtype if dtype is not None else torch.float32, num_tensors=num_tensors,
                  shapes=shapes, quantizer=quantizer, first_dims=first_dims, last_dims=last_dims,
                  tensor_offsets=tensor_offsets, offsets=offsets, scale_inv_offsets=sio,
                  columnwise_scale_inv_offsets=csio,
                  with_gemm_swizzled_scales=kind == "nvfp4" and quantizer.optimize_for_gemm,
                  **bufs)
        out.quantized_tensors = out.split_into_quantized_tensors()
        return out

    # ------------------------------------------------------------------ members
    def _shapes_and_offsets(self) -> Tuple[list, list]:
        """Member shapes and element offsets (from the device dims where not kept on the host)."""
        shapes = self.tensor_shapes
        if shapes is None:
            n = self.num_tensors
            if self.first_dims is None:
                first = ([self.logical_shape[0] // max(1, n)] if self.last_dims is None
                         else [self.logical_shape[0]]) * n
            else:
                first = self.first_dims.tolist()
            last = ([self.logical_shape[1]] * n if self.last_dims is None
                    else self.last_dims.tolist())
            shapes = list(zip(first, last))
            self.tensor_shapes = shapes
        offsets = self.offsets
        if offsets is None and self.tensor_offsets is not None:
            offsets = self.offsets = self.tensor_offsets.tolist()
        if offsets is None:
            offsets = [0]
            for s in shapes:
                offsets.append(offsets[-1] + math.prod(s))
        return shapes, offsets

    def split_into_quantized_tensors(self) -> List[Union[QuantizedTensorStorage, torch.Tensor]]:
        """The members as views of the grouped buffers: plain tensors without a quantizer,
        otherwise quantized tensors of the quantizer's class (TE's *Storage class when the
        quantizer is internal is the same class here: this library's quantized tensors are the
        storage too). Writing a member writes the grouped tensor."""
        shapes, offsets = self._shapes_and_offsets()
        if self.quantizer is None:
            src = self.rowwise_data if self.rowwise_data is not None else self.columnwise_data
            if src is None:
                raise RuntimeError("GroupedTensor.split_into_quantized_tensors: the grouped "
                                   "tensor holds no data")
            return [src[offsets[i]:offsets[i] + math.prod(s)].view(s)
                    for i, s in enumerate(shapes)]
        from ._grouped_members import quantized_member

        kind = _recipe_kind("GroupedTensor", self.quantizer)
        return [quantized_member(self, kind, i, s, offsets[i]) for i, s in enumerate(shapes)]

    def quantize(self, tensors: List[torch.Tensor],
                 noop_flag: Optional[torch.Tensor] = None) -> list:
        """TE's in-place group quantization: member i <- quantizer(tensors[i]), written into the
        grouped buffers; amax (and, for current scaling, scale) get each member's value."""
        owner = "GroupedTensor.quantize"
        if self.quantizer is None:
            raise ValueError(f"{owner}: expected a quantized grouped tensor (quantizer set), got "
                             "quantizer=None")
        if len(tensors) != self.num_tensors:
            raise ValueError(f"{owner}: tensors: expected {self.num_tensors} tensors, got "
                             f"{len(tensors)}")
        members = self.split_into_quantized_tensors()
        from ._grouped_members import record_member_stats

        quantizer = _compact_layout(self.quantizer)
        for i, (src, dst) in enumerate(zip(tensors, members)):
            if tuple(src.shape) != tuple(dst.shape):
                raise ValueError(f"{owner}: tensors[{i}]: expected shape {tuple(dst.shape)}, "
                                 f"got {tuple(src.shape)}")
            quantizer.update_quantized(src, dst, noop_flag=noop_flag)
            if noop_flag is None or float(noop_flag.reshape(-1)[0]) != 1.0:
                record_member_stats(self, i, src, dst)
        self.quantized_tensors = members
        return members

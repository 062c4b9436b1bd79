"""NVFP4Tensor (TE's NVFP4BlockScaling tensor: E2M1 values two per byte, one E4M3 scale per 16
values times a per-tensor fp32 amax, row-wise and transposed column-wise copies) and
NVFP4Quantizer (1x16 or 16x16 blocks, random Hadamard transform of the column-wise copy,
stochastic rounding, 4over6 block scale selection, row-scaled amaxes), over torch.ops.te_lite.quantize_nvfp4 / dequantize_nvfp4.

Stochastic rounding draws its (seed, offset) pair from torch's default CPU generator at every
quantize (two int64 values from torch.randint), so torch.manual_seed makes a run reproducible and
two quantizations of one tensor draw independently; the per-element stream is the core's
(README, "NVFP4").
"""

from __future__ import annotations

import functools
import math
from typing import Any, Iterable

import torch

from ...common import config
from ..constants import NVFP4_BLOCK_SCALING_SIZE
from ..dynamo.quantizer_opaque import register_value_opaque_quantizer
from ..quantization import ops
from ..tex import DType
from ._quantizer_value import flatten_context, unflatten_kwargs
from .quantized_tensor import QuantizedTensor, Quantizer
from .storage.nvfp4_tensor_storage import _INNER, NVFP4TensorStorage

__all__ = ["NVFP4Quantizer", "NVFP4Tensor", "NVFP4TensorStorage"]

# TE's hard-coded wgrad RHT signs (transformer_engine/pytorch/tensor/nvfp4_tensor.py).
_WGRAD_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)


def get_wgrad_sign_vector(device: Any = None) -> torch.Tensor:
    """TE's fixed sign vector of the random Hadamard transform."""
    return torch.tensor(_WGRAD_SIGNS, dtype=torch.float32, device=device)


def get_sign_from_vector(vector: torch.Tensor) -> int:
    """Sign vector -> bit mask (bit i set where sign i is -1)."""
    return sum(1 << i for i, v in enumerate(vector.tolist()) if v == -1)


def get_hadamard_matrix(hadamard_dimension: int, device: Any = None) -> torch.Tensor:
    """The Sylvester Hadamard matrix of size 16, scaled by 1/4."""
    if hadamard_dimension != 16:
        raise ValueError(f"get_hadamard_matrix: hadamard_dimension: expected 16, got "
                         f"{hadamard_dimension}")
    i = torch.arange(16)
    parity = torch.zeros(16, 16, dtype=torch.int64)
    for b in range(4):
        parity ^= ((i[:, None] >> b) & (i[None, :] >> b)) & 1
    return ((1 - 2 * parity).to(torch.float32) / 4.0).to(device)


@functools.lru_cache(maxsize=None)
def get_random_sign_mask_for_rht(with_random_sign_mask: bool, device: Any = None) -> int:
    return get_sign_from_vector(get_wgrad_sign_vector()) if with_random_sign_mask else 0


def get_rht_matrix(with_random_sign_mask: bool, device: Any = None) -> torch.Tensor:
    """diag(signs) @ H / 4 in bf16 (TE's)."""
    signs = get_wgrad_sign_vector(device) if with_random_sign_mask else torch.ones(16, device=device)
    return (torch.diag(signs) @ get_hadamard_matrix(16, device)).to(torch.bfloat16)


class NVFP4Tensor(QuantizedTensor, NVFP4TensorStorage):
    """See storage/nvfp4_tensor_storage.py for the layout. Operations other than view / reshape
    keeping the last dim run on the dequantized values."""

    @staticmethod
    def __new__(
        cls,
        *,
        shape: Any,
        dtype: torch.dtype,
        rowwise_data: torch.Tensor | None,
        rowwise_scale_inv: torch.Tensor | None,
        columnwise_data: torch.Tensor | None,
        columnwise_scale_inv: torch.Tensor | None,
        amax_rowwise: torch.Tensor | None,
        amax_columnwise: torch.Tensor | None,
        fp4_dtype: Any = DType.kFloat4E2M1,
        quantizer: Quantizer | None = None,
        with_gemm_swizzled_scales: bool = False,
        requires_grad: bool = False,
        **kwargs: Any,
    ) -> NVFP4Tensor:
        ref = rowwise_data if rowwise_data is not None else columnwise_data
        if ref is None:
            raise ValueError("NVFP4Tensor: expected rowwise_data or columnwise_data, got neither")
        self = super().__new__(cls, shape, dtype, device=ref.device, requires_grad=requires_grad)
        kwargs.pop("fake_dtype", None)
        self._set_nvfp4_fields("NVFP4Tensor", rowwise_data, rowwise_scale_inv, columnwise_data,
                               columnwise_scale_inv, amax_rowwise, amax_columnwise, fp4_dtype,
                               quantizer, with_gemm_swizzled_scales, **kwargs)
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass  # __new__ set everything

    size = torch.Tensor.size  # the wrapper's shape

    def _logical_shape(self) -> torch.Size:
        return torch.Size(self.shape)

    def _get_quantizer(self) -> Quantizer:
        """TE's: this tensor's quantizer, or a default NVFP4 one."""
        if self._quantizer is not None:
            return self._quantizer
        return NVFP4Quantizer()

    def _dequantize(self, dtype: torch.dtype | None) -> torch.Tensor:
        dtype = dtype or self.dtype
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            dtype = torch.float32
        return self._dequantize_nd(dtype)

    def _assign_from(self, other: QuantizedTensor) -> None:
        assert isinstance(other, NVFP4Tensor)
        for name in _INNER:
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine is not None and theirs is not None and mine.shape == theirs.shape:
                mine.copy_(theirs)
            else:
                setattr(self, name, theirs)
        self._with_gemm_swizzled_scales = other._with_gemm_swizzled_scales  # the bytes' layout

    def _quantized_op(self, func: Any, args: Any, kwargs: Any) -> Any:
        aten = torch.ops.aten
        if func is aten.as_strided.default:
            # TE's no-op handler (FSDP2 calls it on the gathered parameter): the tensor's own
            # size, contiguous strides and offset 0 keep it quantized; anything else dequantizes.
            size, stride = list(args[1]), list(args[2])
            offset = args[3] if len(args) > 3 else kwargs.get("storage_offset", 0)
            if size == list(self.shape) and stride == list(self.stride()) and not offset:
                return self._shallow_copy()
            return NotImplemented
        if func is aten.slice.Tensor:
            # TE's no-op handler: a slice covering a whole dim with step 1.
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            start = args[2] if len(args) > 2 else kwargs.get("start", None)
            end = args[3] if len(args) > 3 else kwargs.get("end", None)
            step = args[4] if len(args) > 4 else kwargs.get("step", 1)
            n = self.shape[dim]
            if (start in (None, 0) and (end is None or end >= n) and step == 1):
                return self._shallow_copy()
            return NotImplemented
        if func in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
            # Blocks run along the last dim and over the flattened leading dims: any shape that
            # keeps the last dim (and, for a column-wise copy, an even last leading dim) keeps
            # every buffer.
            shape = list(args[1])
            if -1 in shape:
                known = math.prod(d for d in shape if d != -1)
                shape[shape.index(-1)] = self.numel() // max(known, 1)
            if not shape or shape[-1] != self.shape[-1] or math.prod(shape) != self.numel():
                return NotImplemented
            rd = None if self._rowwise_data is None else self._rowwise_data.view(
                *shape[:-1], shape[-1] // 2)
            cd = None
            if self._columnwise_data is not None:
                if len(shape) < 2 or shape[-2] % 2:
                    return NotImplemented
                cd = self._columnwise_data.view(shape[-1], *shape[:-2], shape[-2] // 2)
            return self._like(shape, rd, self._rowwise_scale_inv, cd, self._columnwise_scale_inv,
                              self._amax_rowwise, self._amax_columnwise)
        return NotImplemented

    # ----------------------------------------------------------------- FSDP2 (TE's hooks)
    def fsdp_pre_all_gather(self, mesh: Any, orig_size: Any, contiguous_orig_stride: Any,
                            module: Any, mp_policy: Any) -> tuple[tuple[torch.Tensor, ...], Any]:
        """TE's: the shard's row-wise data and its scale rows (padding cut off, so the gathered
        rows line up) are all-gathered; the column-wise copy is rebuilt from them afterwards
        (16x16 blocks only, where it is the row-wise codes transposed)."""
        owner = "NVFP4Tensor.fsdp_pre_all_gather"
        if self._with_gemm_swizzled_scales:
            raise NotImplementedError(f"{owner}: FSDP2 is not supported for NVFP4Tensors with "
                                      "GEMM-swizzled scales")
        shard_m = math.prod(self.shape[:-1])
        if shard_m % NVFP4_BLOCK_SCALING_SIZE:
            raise ValueError(f"{owner}: expected the shard's rows ({shard_m}) to be a multiple "
                             f"of {NVFP4_BLOCK_SCALING_SIZE} (the NVFP4 block)")
        if self._rowwise_data is None:
            raise ValueError(f"{owner}: expected row-wise data (a quantizer with rowwise=True), "
                             "got a tensor without it")
        q = self._quantizer
        columnwise = bool(q is not None and q.columnwise_usage)
        if columnwise and not q.with_2d_quantization:
            raise ValueError(f"{owner}: column-wise usage under FSDP2 expects 2D quantization "
                             "(with_2d_quantization=True), got 1x16 blocks")
        sharded = (self._rowwise_data, self._rowwise_scale_inv[:shard_m, :])
        meta = (columnwise, self._amax_rowwise, self._amax_columnwise, self._format_fields(),
                self.shape[-1])
        return sharded, meta

    def fsdp_post_all_gather(self, all_gather_outputs: tuple[torch.Tensor, ...], metadata: Any,
                             param_dtype: torch.dtype, *, out: NVFP4Tensor | None = None
                             ) -> tuple[NVFP4Tensor, tuple[torch.Tensor, ...]]:
        """TE's: the gathered rows as one NVFP4Tensor (scale rows padded back to 128), its
        column-wise copy rebuilt locally; `out` (a previous result) is updated in place."""
        columnwise, amax_row, amax_col, fields, cols = metadata
        data, scale = all_gather_outputs[:2]
        rows = data.shape[0]
        pad = -(-rows // 128) * 128 - scale.shape[0]
        if pad > 0:
            scale = torch.nn.functional.pad(scale, (0, 0, 0, pad))
        if out is not None:
            out._rowwise_data, out._rowwise_scale_inv = data, scale
            out._amax_rowwise, out._amax_columnwise = amax_row, amax_col
            out._columnwise_data = out._columnwise_scale_inv = None
        else:
            out = NVFP4Tensor(shape=(rows, cols), dtype=param_dtype, rowwise_data=data,
                              rowwise_scale_inv=scale, columnwise_data=None,
                              columnwise_scale_inv=None, amax_rowwise=amax_row,
                              amax_columnwise=amax_col, **fields)
        if columnwise:
            out._create_columnwise()
        if out._quantizer is not None:
            out._quantizer.set_usage(rowwise=True, columnwise=columnwise)
        return out, all_gather_outputs

    def _like(self, shape: Any, *inner: Any) -> NVFP4Tensor:
        return type(self)(shape=shape, dtype=self.dtype, **{n[1:]: t for n, t in zip(_INNER, inner)},
                          **self._format_fields())

    def _inner_names(self) -> list[str]:
        return list(_INNER)

    def _with_inner(self, inner: dict[str, torch.Tensor | None]) -> NVFP4Tensor:
        return self._like(self.shape, *(inner[n] for n in _INNER))

    def _shallow_copy(self) -> NVFP4Tensor:
        return self._like(self.shape, *(getattr(self, n) for n in _INNER))

    def __tensor_flatten__(self) -> tuple[list[str], dict[str, Any]]:
        names = [n for n in _INNER if getattr(self, n) is not None]
        q = self._quantizer
        kwargs = {"fp4_dtype": self._fp4_dtype, "fake_dtype": self.dtype,
                  "quantizer": None if q is None else q._context_quantizer(),
                  "with_gemm_swizzled_scales": self._with_gemm_swizzled_scales}
        return names, flatten_context(self, kwargs)

    @staticmethod
    def __tensor_unflatten__(
        inner: dict[str, torch.Tensor], ctx: dict[str, Any], outer_size: Any, outer_stride: Any
    ) -> NVFP4Tensor:
        cls, kw, requires_grad = unflatten_kwargs("NVFP4Tensor", ctx)
        return cls(shape=outer_size, dtype=kw["fake_dtype"], **{n[1:]: inner.get(n) for n in _INNER},
                   quantizer=kw.get("quantizer"), requires_grad=requires_grad,
                   with_gemm_swizzled_scales=kw.get("with_gemm_swizzled_scales", False))

    def __reduce_ex__(self, protocol: int) -> Any:
        q = self._quantizer
        return (rebuild_nvfp4_tensor, ({n: getattr(self, n) for n in _INNER}, tuple(self.shape),
                                       self.dtype, None if q is None else q.state(),
                                       self._with_gemm_swizzled_scales))


def rebuild_nvfp4_tensor(inner: dict[str, torch.Tensor | None], shape: tuple[int, ...],
                         dtype: torch.dtype, quantizer_state: dict[str, Any] | None,
                         with_gemm_swizzled_scales: bool = False) -> NVFP4Tensor:
    """Unpickling target of NVFP4Tensor (see __reduce_ex__)."""
    q = None
    if quantizer_state is not None:
        st = dict(quantizer_state)
        st.pop("kind", None)
        st.pop("fp8_dtype", None)
        q = NVFP4Quantizer(**st)
    return NVFP4Tensor(shape=shape, dtype=dtype, **{n[1:]: inner.get(n) for n in _INNER},
                       quantizer=q, with_gemm_swizzled_scales=with_gemm_swizzled_scales)


class NVFP4Quantizer(Quantizer):
    """TE's NVFP4 quantizer (see the module docstring). A torch.compile value quantizer."""

    dtype: DType
    with_rht: bool
    with_post_rht_amax: bool
    with_amax_reduction: bool
    with_2d_quantization: bool
    stochastic_rounding: bool
    row_scaled_nvfp4: bool
    nvfp4_use_4over6: bool
    nvfp4_e4m3_max: int
    nvfp4_4over6_err_mode: str
    rht_matrix_random_sign_mask_t: int

    def __init__(
        self,
        fp4_dtype: Any = DType.kFloat4E2M1,
        rowwise: bool = True,
        columnwise: bool = True,
        with_amax_reduction: bool = False,
        amax_reduction_group: Any = None,
        with_rht: bool = False,
        with_post_rht_amax: bool = False,
        with_2d_quantization: bool = False,
        stochastic_rounding: bool = False,
        row_scaled_nvfp4: bool = False,
        nvfp4_use_4over6: bool = False,
        nvfp4_e4m3_max: int = 448,
        nvfp4_4over6_err_mode: str = "MAE",
        with_random_sign_mask: bool = True,
    ) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        if DType(fp4_dtype) != DType.kFloat4E2M1:
            raise ValueError(f"NVFP4Quantizer: fp4_dtype: expected DType.kFloat4E2M1, got "
                             f"{fp4_dtype!r}")
        self.dtype = DType.kFloat4E2M1
        self.with_rht = bool(with_rht)
        self.with_post_rht_amax = bool(with_post_rht_amax)
        self.with_amax_reduction = bool(with_amax_reduction)
        self.amax_reduction_group = amax_reduction_group
        self.with_2d_quantization = bool(with_2d_quantization)
        self.stochastic_rounding = bool(stochastic_rounding)
        self.row_scaled_nvfp4 = bool(row_scaled_nvfp4)
        self.nvfp4_use_4over6 = bool(nvfp4_use_4over6)
        self.nvfp4_e4m3_max = int(nvfp4_e4m3_max) if nvfp4_use_4over6 else 448
        if self.nvfp4_e4m3_max not in (448, 256):
            raise ValueError("nvfp4_e4m3_max must be 448 or 256.")
        self.nvfp4_4over6_err_mode = str(nvfp4_4over6_err_mode).upper()
        if self.nvfp4_4over6_err_mode not in ("MAE", "MSE"):
            raise ValueError("nvfp4_4over6_err_mode must be 'MAE' or 'MSE'.")
        self.rht_matrix_random_sign_mask_t = get_random_sign_mask_for_rht(bool(with_random_sign_mask))
        self.rht_matrix = get_rht_matrix(self.rht_matrix_random_sign_mask_t != 0)

    def _rebuild_derived_state(self) -> None:
        # Rebuilt from a value key (__fx_repr__, torch.compile): the attributes outside the value.
        self.amax_reduction_group = None
        self.rht_matrix = get_rht_matrix(self.rht_matrix_random_sign_mask_t != 0)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["amax_reduction_group"] = None
        return state

    def state(self) -> dict[str, Any]:
        return {"kind": "nvfp4", "rowwise": self.rowwise_usage,
                "columnwise": self.columnwise_usage, "with_rht": self.with_rht,
                "with_post_rht_amax": self.with_post_rht_amax,
                "with_2d_quantization": self.with_2d_quantization,
                "stochastic_rounding": self.stochastic_rounding,
                "with_random_sign_mask": self.rht_matrix_random_sign_mask_t != 0,
                "row_scaled_nvfp4": self.row_scaled_nvfp4,
                "nvfp4_use_4over6": self.nvfp4_use_4over6,
                "nvfp4_e4m3_max": self.nvfp4_e4m3_max,
                "nvfp4_4over6_err_mode": self.nvfp4_4over6_err_mode}

    def copy(self) -> NVFP4Quantizer:
        new = NVFP4Quantizer(
            rowwise=self.rowwise_usage, columnwise=self.columnwise_usage,
            with_amax_reduction=self.with_amax_reduction,
            amax_reduction_group=getattr(self, "amax_reduction_group", None),
            with_rht=self.with_rht, with_post_rht_amax=self.with_post_rht_amax,
            with_2d_quantization=self.with_2d_quantization,
            stochastic_rounding=self.stochastic_rounding, row_scaled_nvfp4=self.row_scaled_nvfp4,
            nvfp4_use_4over6=self.nvfp4_use_4over6, nvfp4_e4m3_max=self.nvfp4_e4m3_max,
            nvfp4_4over6_err_mode=self.nvfp4_4over6_err_mode,
            with_random_sign_mask=self.rht_matrix_random_sign_mask_t != 0,
        )
        new.internal, new.optimize_for_gemm = self.internal, self.optimize_for_gemm
        return new

    def _check_supported(self) -> None:
        # TE's own refusals (its reference quantizer and kernels): ValueError.
        if self.row_scaled_nvfp4 and not self.rowwise_usage:
            raise ValueError("NVFP4Quantizer: row_scaled_nvfp4=True expects rowwise usage, got "
                             "rowwise=False")
        if self.row_scaled_nvfp4 and self.with_2d_quantization:
            raise ValueError("NVFP4Quantizer: row_scaled_nvfp4=True expects 1x16 blocks, got "
                             "with_2d_quantization=True")
        if self.nvfp4_use_4over6 and self.stochastic_rounding:
            raise ValueError("NVFP4Quantizer: nvfp4_use_4over6=True does not support "
                             "stochastic_rounding=True")
        if self.with_rht and self.columnwise_usage and not self.with_post_rht_amax:
            raise NotImplementedError(
                "NVFP4Quantizer: with_rht=True with with_post_rht_amax=False (the column-wise copy "
                "scaled by the pre-transform amax) is not implemented; the column-wise copy is "
                "scaled by the amax after the transform (with_post_rht_amax=True, TE's recipe)")
        if self._reduces_amax() and self.row_scaled_nvfp4:
            raise NotImplementedError("NVFP4Quantizer: with_amax_reduction=True with "
                                      "row_scaled_nvfp4=True (per-row amaxes) is not implemented")

    def _reduces_amax(self) -> bool:
        """TE: with_amax_reduction all-reduces (MAX) the per-tensor amaxes over
        amax_reduction_group before the cast; a group of one rank (or no process group) has
        nothing to reduce."""
        return bool(self.with_amax_reduction and torch.distributed.is_available()
                    and torch.distributed.is_initialized()
                    and torch.distributed.get_world_size(self.amax_reduction_group) > 1)

    def _quantize(self, tensor: torch.Tensor) -> NVFP4Tensor:
        if not (self.rowwise_usage or self.columnwise_usage):
            raise ValueError("NVFP4Quantizer: expected rowwise or columnwise usage, got neither")
        self._check_supported()
        if tensor.dim() == 0 or tensor.shape[-1] % 2:
            raise ValueError(f"NVFP4Quantizer: expected a tensor whose last dim is even (two E2M1 "
                             f"values per byte), got shape {tuple(tensor.shape)}")
        seed = offset = 0
        if self.stochastic_rounding:
            seed, offset = torch.randint(-(2**62), 2**62, (2,), dtype=torch.int64).tolist()
        four_over_six = 0
        fast = False
        if self.nvfp4_use_4over6:
            four_over_six = 1 if self.nvfp4_4over6_err_mode == "MAE" else 2
            # TE reads the switch from the environment at each quantize (docs/envvars.rst).
            fast = config.get("NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH").strip() != "0"
        args = (tensor.contiguous(), self.rowwise_usage, self.columnwise_usage,
                self.with_2d_quantization, self.with_rht, self.rht_matrix_random_sign_mask_t,
                self.stochastic_rounding, seed, offset, self.row_scaled_nvfp4, four_over_six,
                self.nvfp4_e4m3_max, fast)
        r, rs, ra, c, cs, ca = ops().quantize_nvfp4(*args)
        row, col = self.rowwise_usage, self.columnwise_usage
        if self._reduces_amax():
            # TE: the amaxes (x's, and the column-wise copy's after the RHT) all-reduced with MAX
            # over amax_reduction_group, then the cast scaled by them: the core's own amaxes from
            # a first pass, one all-reduce of both, a second pass with the reduced ones.
            both = torch.cat([ra if row else ca, ca if col else ra]).float()
            torch.distributed.all_reduce(both, op=torch.distributed.ReduceOp.MAX,
                                         group=self.amax_reduction_group)
            r, rs, ra, c, cs, ca = ops().quantize_nvfp4(
                *args, row_amax_in=both[:1] if row else None,
                col_amax_in=both[1:] if col else None)
        out = NVFP4Tensor(
            shape=tensor.shape, dtype=tensor.dtype,
            rowwise_data=r if row else None, rowwise_scale_inv=rs if row else None,
            columnwise_data=c if col else None, columnwise_scale_inv=cs if col else None,
            amax_rowwise=ra if row else None, amax_columnwise=ca if col else None,
            quantizer=self,
        )
        if self.optimize_for_gemm:
            # TE: the scales come out GEMM-swizzled whatever the shape (written so by the fused
            # kernels on eligible shapes, by a swizzle pass after the cast otherwise): same bytes.
            out._swizzle_scales_for_gemm()
        return out

    def emits_swizzled_scales_in_kernel(self, shape: Iterable[int]) -> bool:
        """TE's create_tensor gate (nvfp4_emits_gemm_swizzled_scales): whether a tensor of
        `shape` is allocated with GEMM-swizzled scales, i.e. TE's fused kernels would write them
        so: the RHT cast fusion (rows % 64, cols % 128) or the plain 2D quantize (rows and cols %
        128, not row-scaled, no 4over6), with optimize_for_gemm. TE also needs SM 100-110 there;
        the NVFP4 recipe is emulated here as on those GPUs (is_nvfp4_available)."""
        if not self.optimize_for_gemm:
            return False
        shape = tuple(int(d) for d in shape)
        cols = shape[-1] if shape else 1
        rows = math.prod(shape[:-1])
        if self.with_rht:
            return rows % 64 == 0 and cols % 128 == 0
        return (self.with_2d_quantization and not self.row_scaled_nvfp4
                and not self.nvfp4_use_4over6 and rows % 128 == 0 and cols % 128 == 0)

    def update_quantized(self, src: torch.Tensor, dst: QuantizedTensor, *,
                         noop_flag: torch.Tensor | None = None) -> QuantizedTensor:
        if not isinstance(dst, NVFP4Tensor):
            raise ValueError(f"NVFP4Quantizer.update_quantized: dst: expected an NVFP4Tensor, "
                             f"got {type(dst).__name__}")
        return super().update_quantized(src, dst, noop_flag=noop_flag)

    def make_empty(self, shape: Any, *, dtype: torch.dtype = torch.float32, device: Any = None,
                   requires_grad: bool = False, pin_memory: bool = False) -> NVFP4Tensor:
        """A tensor of `shape` with zeroed buffers (TE's: allocated, not quantized; dtype is the
        nominal dtype only)."""
        shape = tuple(int(d) for d in shape)
        buf = {n: torch.zeros(s, dtype=dt, device=device)
               for n, (s, dt) in self.inner_tensor_specs(shape).items()}
        # Zeroed grids are the same bytes in either layout: only the flag differs.
        return NVFP4Tensor(shape=shape, dtype=dtype, **{n[1:]: buf.get(n) for n in _INNER},
                           quantizer=self, requires_grad=requires_grad,
                           with_gemm_swizzled_scales=self.emits_swizzled_scales_in_kernel(shape))

    def get_scale_shape(self, shape: Iterable[int], columnwise: bool) -> tuple[int, int]:
        """TE's: [roundup(M, 128), roundup(ceil(K / 16), 4)] row-wise; K and M swapped
        column-wise (M: leading dims flattened, K: last dim)."""
        shape = tuple(int(d) for d in shape)
        m, k = math.prod(shape[:-1]), shape[-1]
        if columnwise:
            m, k = k, m
        up = lambda v, n: (v + n - 1) // n * n  # noqa: E731
        return (up(m, 128), up(math.ceil(k / NVFP4_BLOCK_SCALING_SIZE), 4))

    @staticmethod
    def get_columnwise_shape(shape: Iterable[int]) -> tuple[int, ...]:
        shape = tuple(int(d) for d in shape)
        return (shape[-1], *shape[:-1]) if shape else ()

    @staticmethod
    def convert_shape_for_fp4(shape: Iterable[int]) -> tuple[int, ...]:
        shape = list(shape)
        shape[-1] = shape[-1] // 2
        return tuple(shape)

    def is_quantizable(self, inp: torch.Tensor) -> bool:
        """TE's: 2+ dims, both dims of the 2-D view a multiple of 16."""
        if self.row_scaled_nvfp4 or inp.ndim < 2:
            return False
        return (inp.shape[-1] % NVFP4_BLOCK_SCALING_SIZE == 0
                and math.prod(inp.shape[:-1]) % NVFP4_BLOCK_SCALING_SIZE == 0)

    def is_requantization_safe(self) -> bool:
        return not self.stochastic_rounding

    def calibrate(self, tensor: torch.Tensor) -> None:
        """Stateless: nothing to record."""

    def _get_compatible_recipe(self) -> Any:
        from ...common.recipe import NVFP4BlockScaling

        return NVFP4BlockScaling

    def inner_tensor_specs(self, shape: tuple[int, ...]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        shape = tuple(shape)
        specs: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        if self.rowwise_usage:
            specs["_rowwise_data"] = (self.convert_shape_for_fp4(shape), torch.uint8)
            specs["_rowwise_scale_inv"] = (self.get_scale_shape(shape, False), torch.uint8)
        if self.columnwise_usage:
            specs["_columnwise_data"] = (
                self.convert_shape_for_fp4(self.get_columnwise_shape(shape)), torch.uint8)
            specs["_columnwise_scale_inv"] = (self.get_scale_shape(shape, True), torch.uint8)
        # Row-scaled: one amax per row of each copy (the column-wise copy's rows are the columns).
        rs = self.row_scaled_nvfp4
        if self.rowwise_usage:
            specs["_amax_rowwise"] = ((math.prod(shape[:-1]) if rs else 1,), torch.float32)
        if self.columnwise_usage:
            specs["_amax_columnwise"] = ((shape[-1] if rs and shape else 1,), torch.float32)
        return specs

    def storage_metadata(self, fake_dtype: torch.dtype) -> dict[str, Any]:
        return {"cls": NVFP4Tensor,
                "nontensor_kwargs": {"fp4_dtype": self.dtype, "fake_dtype": fake_dtype,
                                     "quantizer": self._context_quantizer(),
                                     "with_gemm_swizzled_scales": self.optimize_for_gemm}}


register_value_opaque_quantizer(NVFP4Quantizer)

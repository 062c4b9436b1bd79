"""TE's `transformer_engine_torch` names that Python code uses: the DType enum (same values as the
C API's NVTEDType), its torch dtype mapping, and the multi_tensor_* functions (same signatures:
chunk_size, noop_flag, tensor_lists, *scalars)."""

from __future__ import annotations

import math
from enum import IntEnum
from typing import Any

import torch

from ..common.te_dtype import DType as _TEDType

# TE's extension exposes these as module functions; ours live in optimizers._ops and are looked up
# lazily (module __getattr__) because optimizers imports this module's package at import time.
_MULTI_TENSOR = (
    "multi_tensor_adam",
    "multi_tensor_adam_capturable",
    "multi_tensor_adam_capturable_master",
    "multi_tensor_adam_fp8",
    "multi_tensor_adam_param_remainder",
    "multi_tensor_compute_scale_and_scale_inv",
    "multi_tensor_l2norm",
    "multi_tensor_scale",
    "multi_tensor_sgd",
    "multi_tensor_unscale_l2norm",
)
# TE's activation functions (gelu(input, quantizer), dgelu(grad, fwd_input, quantizer),
# dbias_dgelu(grad, fwd_input, quantizer), ...):
# _tex_activation.py, looked up lazily as the multi_tensor_* ones (it imports the tensor package).
_ACTIVATIONS = tuple(
    f"{d}{n}" for n in ("gelu", "geglu", "qgelu", "qgeglu", "relu", "reglu", "srelu", "sreglu",
                        "silu", "swiglu", "glu") for d in ("", "d")
) + tuple(f"dbias_d{n}" for n in ("gelu", "silu", "relu", "qgelu", "srelu")) + (
    "clamped_swiglu", "clamped_dswiglu")
__all__ = [
    *_ACTIVATIONS,
    "DType",
    "FP8TensorMeta",
    "dtype_to_torch",
    "fused_amax_and_scale_update_after_reduction",
    "quantize",
    "split_quantize",
    "swizzle_scales_for_gemm_",
    "multi_tensor_swizzle_scales_for_gemm_",
    "multi_tensor_swizzle_scales_for_gemm_unchecked_",
    "thd_get_partitioned_indices",
    "torch_to_dtype",
    *_MULTI_TENSOR,
]


DType = _TEDType  # TE's enum, shared with the JAX front end (common/te_dtype.py)


class FP8FwdTensors(IntEnum):
    """TE's forward FP8 meta / quantizer slots: GEMM g (1-based) owns 3*(g-1) + {input, weight,
    output} (module.quantizers["scaling_fwd"], the forward amax history's columns)."""

    GEMM1_INPUT = 0
    GEMM1_WEIGHT = 1
    GEMM1_OUTPUT = 2
    GEMM2_INPUT = 3
    GEMM2_WEIGHT = 4
    GEMM2_OUTPUT = 5
    GEMM3_INPUT = 6
    GEMM3_WEIGHT = 7
    GEMM3_OUTPUT = 8


class FP8BwdTensors(IntEnum):
    """TE's backward slots: GEMM g owns 2*(g-1) + {grad_output, grad_input}."""

    GRAD_OUTPUT1 = 0
    GRAD_INPUT1 = 1
    GRAD_OUTPUT2 = 2
    GRAD_INPUT2 = 3
    GRAD_OUTPUT3 = 4
    GRAD_INPUT3 = 5


_TO_TORCH = {
    DType.kByte: torch.uint8,
    DType.kInt16: torch.int16,
    DType.kInt32: torch.int32,
    DType.kInt64: torch.int64,
    DType.kFloat32: torch.float32,
    DType.kFloat16: torch.float16,
    DType.kBFloat16: torch.bfloat16,
    DType.kFloat8E4M3: torch.float8_e4m3fn,
    DType.kFloat8E5M2: torch.float8_e5m2,
    DType.kFloat8E8M0: torch.uint8,
}
_FROM_TORCH = {v: k for k, v in _TO_TORCH.items() if k is not DType.kFloat8E8M0}


def dtype_to_torch(dtype: DType | torch.dtype, what: str = "fp8_dtype") -> torch.dtype:
    """torch dtype of a DType (a torch dtype passes through)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == DType.kFloat4E2M1:  # NVFP4 data: two E2M1 values per uint8 (TE's storage)
        return torch.uint8
    try:
        return _TO_TORCH[DType(dtype)]
    except (ValueError, KeyError):
        raise ValueError(f"{what}: expected a DType or torch.dtype, got {dtype!r}") from None


def torch_to_dtype(dtype: torch.dtype) -> DType:
    try:
        return _FROM_TORCH[dtype]
    except KeyError:
        raise ValueError(f"dtype: {dtype} has no transformer_engine DType") from None


class FP8TensorMeta:
    """TE's FP8TensorMeta: a holder of scale [n], scale_inv [n] and amax_history [L, n]
    (attributes, assigned by the caller; TE 2.x keeps it for code that builds its own meta)."""

    def __init__(self) -> None:
        self.scale: torch.Tensor | None = None
        self.scale_inv: torch.Tensor | None = None
        self.amax_history: torch.Tensor | None = None


def fused_amax_and_scale_update_after_reduction(
    amax_reduction_buffer: torch.Tensor,
    amax_histories: list[torch.Tensor],
    scales: list[torch.Tensor],
    amax_compute_algo: str,
    fp8_dtype: DType | torch.dtype,
    margin: float,
) -> None:
    """TE's batched delayed-scaling step after the amax all-reduce, in place: history i
    ([L, n_i]) takes its slice of the reduced buffer (the n_i amaxes, concatenated in order) as
    its newest amax where that value is non-zero (TE's rule: 0 means "not reduced", keep the
    history's own row 0), then the modules' fused update (roll, amax by algorithm, scale rule)
    on every slot whose newest amax is non-zero; the others stay as they are (TE's kernel)."""
    if amax_compute_algo not in ("max", "most_recent"):
        raise ValueError(
            f"fused_amax_and_scale_update_after_reduction: amax_compute_algo: expected 'max' or "
            f"'most_recent', got {amax_compute_algo!r}"
        )
    if len(amax_histories) != len(scales):
        raise ValueError(
            f"fused_amax_and_scale_update_after_reduction: expected as many scales as amax "
            f"histories, got {len(scales)} and {len(amax_histories)}"
        )
    dtype = dtype_to_torch(fp8_dtype)
    total = sum(s.numel() for s in scales)
    buf = amax_reduction_buffer.reshape(-1)
    if buf.numel() != total:
        raise ValueError(
            f"fused_amax_and_scale_update_after_reduction: amax_reduction_buffer: expected "
            f"{total} amaxes (sum of the scales' sizes), got {buf.numel()}"
        )
    off = 0
    with torch.no_grad():
        for hist, scale in zip(amax_histories, scales):
            n = scale.numel()
            reduced = buf[off : off + n].to(hist.device, torch.float32)
            hist[0].copy_(torch.where(reduced != 0, reduced, hist[0]))
            new_hist, new_scale = torch.ops.te_lite.delayed_scaling_update(
                hist, scale, amax_compute_algo, dtype, float(margin))
            seen = hist[0] != 0  # TE: a slot whose newest amax is 0 is left as it is (no roll)
            hist.copy_(torch.where(seen, new_hist, hist))
            scale.copy_(torch.where(seen, new_scale, scale))
            off += n


def quantize(tensor: torch.Tensor, quantizer: Any, output: Any = None, noop: Any = None) -> Any:
    """TE's tex.quantize: tensor cast by quantizer, into output when given (in place; the same
    kernel as quantizer(tensor)). noop: a one-element tensor; nonzero skips the cast (output is
    returned as it is, TE's noop flag)."""
    if noop is not None:
        if not isinstance(noop, torch.Tensor) or noop.numel() != 1:
            got = f"{noop.numel()} elements" if isinstance(noop, torch.Tensor) else type(noop)
            raise ValueError(f"tex.quantize: noop: expected a one-element tensor, got {got}")
        if bool(noop.reshape(-1)[0] != 0):
            if output is None:
                raise ValueError("tex.quantize: noop: a set noop flag needs an output to return")
            return output
    if output is None:
        return quantizer(tensor)
    return quantizer.update_quantized(tensor, output)


def split_quantize(tensor: torch.Tensor, split_sections: Any, quantizers: Any) -> list[Any]:
    """TE's tex.split_quantize: tensor split along dim 0 into split_sections rows, each part
    cast by its quantizer (the same bytes as quantizing the parts one by one)."""
    sections = [int(s) for s in split_sections]
    quantizers = list(quantizers)
    if len(sections) != len(quantizers):
        raise ValueError(f"tex.split_quantize: expected one quantizer per split section "
                         f"({len(sections)}), got {len(quantizers)}")
    if sum(sections) != tensor.shape[0]:
        raise ValueError(f"tex.split_quantize: split_sections: expected sizes summing to "
                         f"{tensor.shape[0]} (dim 0), got {sections}")
    return [q(part) for q, part in zip(quantizers, torch.split(tensor, sections))]


def _block_scaled(tensor: Any) -> bool:
    """Whether TE's swizzle touches this tensor: MXFP8 / NVFP4 (other formats' GEMMs read their
    scales as they are, so TE returns without doing anything)."""
    from .tensor.storage.mxfp8_tensor_storage import MXFP8TensorStorage
    from .tensor.storage.nvfp4_tensor_storage import NVFP4TensorStorage

    return isinstance(tensor, (MXFP8TensorStorage, NVFP4TensorStorage))


def swizzle_scales_for_gemm_(tensor: Any) -> None:
    """TE's tex.swizzle_scales_for_gemm_: an MXFP8 / NVFP4 tensor's scale grids (each kept copy)
    into the GEMM-swizzled layout, in place (new scale buffers, _with_gemm_swizzled_scales set);
    a tensor already swizzled or of another format is left as it is."""
    if _block_scaled(tensor):
        tensor._swizzle_scales_for_gemm()


def multi_tensor_swizzle_scales_for_gemm_(tensors: Any, rowwise: bool, columnwise: bool) -> None:
    """TE's tex.multi_tensor_swizzle_scales_for_gemm_: the row-wise or the column-wise grid
    (exactly one of the two) of each not-yet-swizzled MXFP8 / NVFP4 tensor, in place. As TE's, it
    leaves _with_gemm_swizzled_scales to the caller, who sets it once both copies are done."""
    if bool(rowwise) == bool(columnwise):
        raise ValueError("tex.multi_tensor_swizzle_scales_for_gemm_: expected exactly one of "
                         f"rowwise / columnwise, got rowwise={rowwise}, columnwise={columnwise}")
    tensors = list(tensors)
    if not tensors or not _block_scaled(tensors[0]):
        return  # TE decides the format from the first tensor
    for t in tensors:
        if not _block_scaled(t):
            raise ValueError(f"tex.multi_tensor_swizzle_scales_for_gemm_: tensors: expected "
                             f"MXFP8 / NVFP4 tensors throughout, got {type(t).__name__}")
        if not t._with_gemm_swizzled_scales:
            t._swizzle_grid_of(bool(columnwise))


multi_tensor_swizzle_scales_for_gemm_unchecked_ = multi_tensor_swizzle_scales_for_gemm_


def generic_gemm(*args, **kwargs):  # noqa: ANN002, ANN003, ANN201
    """TE's tex.generic_gemm (see cpp_extensions.gemm.generic_gemm)."""
    from .cpp_extensions.gemm import generic_gemm as _impl

    return _impl(*args, **kwargs)


def __getattr__(name: str):  # noqa: ANN202  (PEP 562)
    if name in _ACTIVATIONS:
        from ._tex_activation import ACTIVATION_FUNCTIONS

        return ACTIVATION_FUNCTIONS[name]
    if name in _MULTI_TENSOR:
        from .optimizers import _ops

        return getattr(_ops, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_fused_attn_backend(*args, **kwargs):  # noqa: ANN002, ANN003, ANN201
    """TE's tex.get_fused_attn_backend: the sub-backend of the FusedAttention slot
    (cpp_extensions/fused_attn.py; imported at the call: cpp_extensions imports this module)."""
    from .cpp_extensions.fused_attn import get_fused_attn_backend as impl

    return impl(*args, **kwargs)


def get_cublasLt_version() -> int:  # noqa: N802  (TE's name)
    """TE's tex.get_cublasLt_version (cublasLtGetVersion()): 0, no cuBLASLt is linked into the
    PyTorch extension (its GEMMs run on the CPU), as utils.get_cudnn_version() is (0, 0, 0)."""
    return 0


def group_quantize(tensor: torch.Tensor, quantizer: Any, num_tensors: int,
                   first_dims: torch.Tensor | None, last_dims: torch.Tensor | None = None,
                   tensor_offsets: torch.Tensor | None = None,
                   noop_flag: torch.Tensor | None = None, output: Any = None) -> Any:
    """TE's tex.group_quantize: the rows of `tensor` [rows, cols] split into num_tensors members
    (first_dims [n] rows each; None: rows / n each), quantized into a new GroupedTensor (or into
    `output`, a GroupedTensor of that layout). last_dims / tensor_offsets (members differing in
    columns) are not supported: a 2-D tensor's members share its columns."""
    from .tensor.storage.grouped_tensor_storage import GroupedTensorStorage

    owner = "tex.group_quantize"
    if last_dims is not None or tensor_offsets is not None:
        raise NotImplementedError(f"{owner}: last_dims / tensor_offsets are not supported by "
                                  "transformer_engine_lite (members split along rows only)")
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 2:
        got = f"shape {tuple(tensor.shape)}" if isinstance(tensor, torch.Tensor) else type(tensor)
        raise ValueError(f"{owner}: tensor: expected a 2-D tensor, got {got}")
    if quantizer is None:
        raise ValueError(f"{owner}: quantizer: expected a quantizer, got None")
    rows = [int(r) for r in first_dims.tolist()] if first_dims is not None else None
    if rows is None:
        if num_tensors < 1 or tensor.shape[0] % num_tensors:
            raise ValueError(f"{owner}: expected rows ({tensor.shape[0]}) divisible by "
                             f"num_tensors ({num_tensors}) without first_dims")
        rows = [tensor.shape[0] // num_tensors] * num_tensors
    # Members may cover fewer rows than the tensor has (TE's paged stashing: the rows after them
    # are padding, left unquantized), never more.
    if len(rows) != num_tensors or sum(rows) > tensor.shape[0] or min(rows, default=0) < 0:
        raise ValueError(f"{owner}: first_dims: expected {num_tensors} non-negative entries "
                         f"summing to at most {tensor.shape[0]} rows, got {rows}")
    if output is None:
        output = GroupedTensorStorage.make_grouped_tensor(
            num_tensors, first_dims, None, tensor.shape[0], tensor.shape[1], quantizer,
            tensor.device, tensor.dtype)
    output.quantize(list(torch.split(tensor[:sum(rows)], rows, 0)), noop_flag=noop_flag)
    return output


class _GroupedMLPExperimental:
    """TE's tex.grouped_mlp_experimental (helpers feeding cuDNN's grouped-GEMM MLP kernel)."""

    @staticmethod
    def swizzle_scales_and_pack_ptrs_for_discrete_weights(
        data_tensors: list, scale_tensors: list, swizzle_type: str, device: Any
    ) -> Any:
        """TE's: (the experts' data pointers [N] int64, the pointers of their scales in the
        buffer [N] int64, one uint8 buffer holding each expert's compact scale grid swizzled into
        the GEMM layout (tensor/_gemm_swizzle.py), at a 16-byte-aligned stride). All experts
        share the first one's data and scale shapes, as in TE (a grouped weight's experts).
        The stride is TE's (the compact grid's bytes) where the compact grid is padded to whole
        128x4 tiles, as TE's always are and NVFP4's are here; MXFP8's compact grids here are
        unpadded ([rows, ceil(cols / 32)]), so the stride grows to the swizzled grid's bytes."""
        from .tensor._gemm_swizzle import swizzle_grid, swizzle_mxfp8_columnwise

        owner = "tex.grouped_mlp_experimental.swizzle_scales_and_pack_ptrs_for_discrete_weights"
        if swizzle_type not in ("mxfp8_rowwise", "mxfp8_columnwise", "nvfp4"):
            raise ValueError(f"{owner}: swizzle_type: expected 'mxfp8_rowwise', "
                             f"'mxfp8_columnwise' or 'nvfp4', got {swizzle_type!r}")
        if len(data_tensors) != len(scale_tensors):
            raise ValueError(f"{owner}: expected as many scale tensors as data tensors, got "
                             f"{len(scale_tensors)} and {len(data_tensors)}")
        n = len(data_tensors)
        if n == 0:
            ptrs = torch.empty(0, dtype=torch.int64, device=device)
            return ptrs, ptrs.clone(), torch.empty(0, dtype=torch.uint8, device=device)
        shape, sshape = tuple(data_tensors[0].shape), tuple(scale_tensors[0].shape)
        for i, (d, sc) in enumerate(zip(data_tensors, scale_tensors)):
            if tuple(d.shape) != shape or tuple(sc.shape) != sshape:
                raise ValueError(f"{owner}: expert {i}: expected data {shape} and scales "
                                 f"{sshape} (expert 0's), got {tuple(d.shape)} and "
                                 f"{tuple(sc.shape)}")
        if len(shape) < 1 or len(sshape) != 2:
            raise ValueError(f"{owner}: expected N-D data and 2-D scales, got {shape} and "
                             f"{sshape}")
        cols = shape[-1] * (2 if swizzle_type == "nvfp4" else 1)  # NVFP4: two values a byte
        rows = math.prod(shape[:-1])
        blocks = -(-cols // (16 if swizzle_type == "nvfp4" else 32))
        if swizzle_type == "mxfp8_columnwise":  # [row blocks, cols], swizzled transposed
            swizzled = [swizzle_mxfp8_columnwise(sc, rows, cols) for sc in scale_tensors]
        else:
            swizzled = [swizzle_grid(sc, rows, blocks) for sc in scale_tensors]
        sw_bytes = swizzled[0].numel()
        stride = -(-max(sshape[0] * sshape[1], sw_bytes) // 16) * 16
        buf = torch.zeros(stride * n, dtype=torch.uint8, device=device)
        for i, sw in enumerate(swizzled):
            buf[i * stride:i * stride + sw_bytes] = sw.reshape(-1).view(torch.uint8)
        ptrs = [d.data_ptr() for d in data_tensors]
        ptrs += [buf.data_ptr() + i * stride for i in range(n)]
        packed = torch.tensor(ptrs, dtype=torch.int64, device=device)
        return packed[:n], packed[n:], buf


grouped_mlp_experimental = _GroupedMLPExperimental()
def thd_get_partitioned_indices(
    cu_seqlens: torch.Tensor, total_tokens: int, world_size: int, rank: int
) -> torch.Tensor:
    """TE's tex.thd_get_partitioned_indices: int32 indices of the tokens of a packed (thd) batch
    that CP rank `rank` of `world_size` holds: chunks rank and 2 world_size - 1 - rank of every
    sequence (cu_seqlens: padded offsets, each length a multiple of 2 world_size; total_tokens:
    the batch's token count, >= cu_seqlens[-1])."""
    from .attention.dot_product_attention.context_parallel import cp_rank_indices

    if not 0 <= rank < world_size:
        raise ValueError(f"thd_get_partitioned_indices: rank {rank}: expected [0, {world_size})")
    if int(cu_seqlens[-1]) > total_tokens:
        raise ValueError(
            f"thd_get_partitioned_indices: total_tokens {total_tokens}: expected >= "
            f"cu_seqlens[-1] = {int(cu_seqlens[-1])}"
        )
    idx = cp_rank_indices(cu_seqlens, world_size, rank)
    return idx.to(device=cu_seqlens.device, dtype=torch.int32)

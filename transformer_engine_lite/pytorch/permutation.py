"""MoE token permutation (TE's ``transformer_engine.pytorch.permutation``), over the core's
``nvte_permute_*`` / chunk-sort kernels (``torch.ops.te_lite.moe_*``; contracts in
``permutation.h``).

Semantics (TE's mask-map path): permuted rows are grouped by expert (expert 0 first), tokens in
ascending order within an expert; ``num_out_tokens`` rows are kept (later routes dropped; -1: all
routes). ``row_id_map`` is TE's int32 ``[num_tokens, 2 * num_experts + 1]`` layout. With probs, a
route whose prob is exactly 0 gives a row of zeros (TE's padding slots). Unpermute sums the routes
in fp32. ``Float8Tensor`` inputs are permuted byte for byte and keep their ``scale_inv``;
``MXFP8Tensor`` inputs have their row-wise bytes and row-wise scale rows moved with their tokens
(the result is row-wise only, as TE's: the column-wise copy cannot be permuted by rows).

Index map (``map_type="index"``, TE's): ``routing_map`` is int32 ``[num_tokens, topK]`` expert
indices; the permuted rows are the routes sorted stably by expert, the first ``num_out_tokens``
kept; ``row_id_map`` is TE's int32 ``[topK * num_tokens]`` (route (t, k) at ``k * num_tokens + t``:
its row, -1 dropped). ``moe_unpermute(map_type="index")`` takes fp32 ``probs [num_tokens, topK]``
(others are cast, with TE's warning); without probs it is TE's topK = 1 inverse (one output row per
``row_id_map`` entry). Unpermute sums the routes in fp32 (TE: in the data dtype).

Not implemented (``NotImplementedError``): blockwise FP8 tensors (``Float8BlockwiseQTensor``
inputs: their 1x128 / 128x128 scale grids are not permuted), FP8 into ``moe_unpermute``'s forward (TE refuses it too), FP8 with the index map.
"""

from __future__ import annotations

from typing import Optional, Tuple

import warnings

import torch

from . import te_lite_ops  # noqa: F401  (loads the extension: torch.ops.te_lite.*)
from .tensor import Float8Tensor, MXFP8Tensor, QuantizedTensor
from ._permutation_index import permute_index as _permute_index
from ._permutation_index import unpermute_index as _unpermute_index

__all__ = [
    "moe_permute",
    "moe_permute_with_probs",
    "moe_unpermute",
    "moe_sort_chunks_by_index",
    "moe_sort_chunks_by_index_with_probs",
]

_ops = torch.ops.te_lite
_HP = (torch.float32, torch.float16, torch.bfloat16)
_MAP_DTYPES = (torch.bool, torch.uint8, torch.int32, torch.int64)


# ------------------------------------------------------------------------------ fake kernels
@torch.library.register_fake("te_lite::moe_make_row_id_map")
def _(routing_map, num_out_tokens):
    return routing_map.new_empty(
        (routing_map.shape[0], 2 * routing_map.shape[1] + 1), dtype=torch.int32
    )


def _no_probs(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty((0,), dtype=torch.float32)


@torch.library.register_fake("te_lite::moe_permute_with_mask_map")
def _(inp, row_id_map, probs, num_out_tokens):
    pp = probs.new_empty((num_out_tokens,)) if probs is not None else _no_probs(inp)
    return inp.new_empty((num_out_tokens, inp.shape[1])), pp


@torch.library.register_fake("te_lite::moe_unpermute_with_mask_map")
def _(inp, row_id_map, merging_probs, permuted_probs, num_tokens):
    experts = (row_id_map.shape[1] - 1) // 2
    up = (
        permuted_probs.new_empty((num_tokens, experts))
        if permuted_probs is not None
        else _no_probs(inp)
    )
    return inp.new_empty((num_tokens, inp.shape[1])), up


@torch.library.register_fake("te_lite::moe_unpermute_with_mask_map_bwd_with_merging_probs")
def _(fwd_output_grad, row_id_map, fwd_input, merging_probs):
    return (
        fwd_input.new_empty(fwd_input.shape, dtype=fwd_output_grad.dtype),
        merging_probs.new_empty(merging_probs.shape),
    )


@torch.library.register_fake("te_lite::moe_index_make_row_id_map")
def _(indices, num_out_tokens):
    return indices.new_empty((indices.numel(),), dtype=torch.int32)


@torch.library.register_fake("te_lite::moe_permute_with_index_map")
def _(inp, row_id_map, num_out_tokens):
    return inp.new_empty((num_out_tokens, inp.shape[1]))


@torch.library.register_fake("te_lite::moe_unpermute_with_index_map")
def _(inp, row_id_map, probs, num_tokens):
    return inp.new_empty((num_tokens, inp.shape[1]))


@torch.library.register_fake("te_lite::moe_unpermute_with_index_map_bwd")
def _(grad, row_id_map, fwd_input, probs):
    return fwd_input.new_empty(fwd_input.shape, dtype=grad.dtype), probs.new_empty(probs.shape)


@torch.library.register_fake("te_lite::moe_make_chunk_sort_map")
def _(split_sizes, sorted_index, num_tokens):
    return split_sizes.new_empty((num_tokens,), dtype=torch.int32)


@torch.library.register_fake("te_lite::moe_sort_chunks_by_map")
def _(inp, row_id_map, probs, is_forward):
    pp = probs.new_empty(probs.shape) if probs is not None else _no_probs(inp)
    return inp.new_empty(inp.shape), pp


# ------------------------------------------------------------------------------ checks
def _check_tensor(name: str, t: object, dtypes: Optional[tuple] = None, ndim: int = 0) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name}: expected dtype in {{{names}}}, got {t.dtype}")
    if ndim and t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dims, got shape {tuple(t.shape)}")


def _check_int(name: str, v: object, low: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    if v < low:
        raise ValueError(f"{name}: expected >= {low}, got {v}")
    return v


def _check_data(name: str, t: object, mxfp8: bool = False) -> None:
    """High precision, a Float8Tensor, or (mxfp8) a row-wise MXFP8Tensor; other quantized tensors
    are not implemented."""
    if isinstance(t, MXFP8Tensor) and mxfp8:
        if t._rowwise_data is None:
            raise ValueError(
                f"{name}: expected an MXFP8Tensor with row-wise data, got column-wise only"
            )
    elif isinstance(t, QuantizedTensor) and not isinstance(t, Float8Tensor):
        raise NotImplementedError(
            f"{name}: {type(t).__name__} is not implemented here (FP8 inputs: Float8Tensor"
            + (", MXFP8Tensor)" if mxfp8 else ")")
        )
    if not isinstance(t, QuantizedTensor):
        _check_tensor(name, t, _HP)
    if t.dim() != 2:
        raise ValueError(f"{name}: expected [num_tokens, hidden_size], got shape {tuple(t.shape)}")


def _check_map_type(map_type: object) -> None:
    if map_type not in ("mask", "index"):
        raise ValueError(f"map_type: expected 'mask' or 'index', got {map_type!r}")


def _bytes_of(t: torch.Tensor) -> Tuple[torch.Tensor, Optional[QuantizedTensor]]:
    if isinstance(t, Float8Tensor):
        return t._data, t
    if isinstance(t, MXFP8Tensor):
        return t._rowwise_data, t
    return t, None


def _permute_rows(data, row_id_map, probs, num_out, like):
    """Mask-map permute of data (and of an MXFP8Tensor's row-wise scale rows, as uint8 rows:
    scales move with their token whatever the prob, TE's), wrapped like ``like``."""
    out, permuted_probs = _ops.moe_permute_with_mask_map(data, row_id_map, probs, num_out)
    scale = None
    if isinstance(like, MXFP8Tensor):
        scale, _ = _ops.moe_permute_with_mask_map(
            like._scale_grid(False).contiguous(), row_id_map, None, num_out
        )
    return _wrap(out, like, scale), permuted_probs


def _wrap(
    data: torch.Tensor, like: Optional[QuantizedTensor], scale: Optional[torch.Tensor] = None
) -> torch.Tensor:
    if like is None:
        return data
    if isinstance(like, MXFP8Tensor):
        return MXFP8Tensor(
            shape=data.shape,
            dtype=like.dtype,
            fp8_dtype=like._fp8_dtype,
            rowwise_data=data,
            rowwise_scale_inv=scale,
            columnwise_data=None,
            columnwise_scale_inv=None,
            quantizer=None,
            requires_grad=data.requires_grad,
        )
    return Float8Tensor(
        data=data,
        fp8_dtype=like._fp8_dtype,
        fp8_scale_inv=like._scale_inv,
        shape=data.shape,
        dtype=like.dtype,
    )


# ------------------------------------------------------------------------------ autograd
class _moe_permute_mask_map(torch.autograd.Function):
    """Permute with a mask routing map (and probs)."""

    @staticmethod
    def forward(ctx, inp, routing_map, num_out_tokens, probs):
        data, fp8 = _bytes_of(inp)
        row_id_map = _ops.moe_make_row_id_map(routing_map, num_out_tokens)
        out, permuted_probs = _permute_rows(data, row_id_map, probs, num_out_tokens, fp8)
        ctx.save_for_backward(row_id_map)
        ctx.num_tokens = inp.shape[0]
        ctx.mark_non_differentiable(row_id_map)
        return out, row_id_map, permuted_probs if probs is not None else None

    @staticmethod
    def backward(ctx, grad, _, permuted_probs_grad):
        (row_id_map,) = ctx.saved_tensors
        if isinstance(grad, QuantizedTensor):
            raise NotImplementedError("moe_permute: an FP8 gradient is not implemented (TE's)")
        act_grad = probs_grad = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[3]:
            if ctx.needs_input_grad[3] and permuted_probs_grad is None:
                permuted_probs_grad = grad.new_zeros((grad.shape[0],), dtype=torch.float32)
            pg = permuted_probs_grad if ctx.needs_input_grad[3] else None
            act_grad, probs_grad = _ops.moe_unpermute_with_mask_map(
                grad, row_id_map, None, pg, ctx.num_tokens
            )
        return (
            act_grad if ctx.needs_input_grad[0] else None,
            None,
            None,
            probs_grad if ctx.needs_input_grad[3] else None,
        )


class _moe_unpermute_mask_map(torch.autograd.Function):
    """Unpermute with a mask row_id_map, optionally merging with probs."""

    @staticmethod
    def forward(ctx, inp, row_id_map, merging_probs, num_tokens):
        out, _ = _ops.moe_unpermute_with_mask_map(inp, row_id_map, merging_probs, None, num_tokens)
        ctx.with_probs = merging_probs is not None
        ctx.save_for_backward(inp, row_id_map, merging_probs)
        ctx.num_permuted = inp.shape[0]
        return out

    @staticmethod
    def backward(ctx, grad):
        inp, row_id_map, merging_probs = ctx.saved_tensors
        act_grad = probs_grad = None
        if ctx.with_probs:
            if isinstance(grad, QuantizedTensor):
                raise NotImplementedError(
                    "moe_unpermute: an FP8 gradient with merging_probs is not implemented (TE's)"
                )
            act_grad, probs_grad = _ops.moe_unpermute_with_mask_map_bwd_with_merging_probs(
                grad.contiguous(), row_id_map, inp, merging_probs
            )
        elif ctx.needs_input_grad[0]:
            _check_data("moe_unpermute's gradient", grad, mxfp8=True)
            data, fp8 = _bytes_of(grad)
            act_grad, _ = _permute_rows(data, row_id_map, None, ctx.num_permuted, fp8)
        return (
            act_grad if ctx.needs_input_grad[0] else None,
            None,
            probs_grad if ctx.needs_input_grad[2] else None,
            None,
        )


class _moe_chunk_sort(torch.autograd.Function):
    """Split the rows into chunks of split_sizes and reorder the chunks by sorted_index."""

    @staticmethod
    def forward(ctx, inp, split_sizes, sorted_index, probs):
        data, fp8 = _bytes_of(inp)
        dev = data.device
        row_id_map = _ops.moe_make_chunk_sort_map(
            split_sizes.to(dev), sorted_index.to(dev), data.shape[0]
        )
        out, permuted_probs = _ops.moe_sort_chunks_by_map(data, row_id_map, probs, True)
        ctx.save_for_backward(row_id_map)
        return _wrap(out, fp8), permuted_probs if probs is not None else None

    @staticmethod
    def backward(ctx, grad, permuted_probs_grad):
        (row_id_map,) = ctx.saved_tensors
        if isinstance(grad, QuantizedTensor) and not isinstance(grad, Float8Tensor):
            raise NotImplementedError(f"moe_sort_chunks_by_index: {type(grad).__name__} gradients")
        data, fp8 = _bytes_of(grad)
        pg = permuted_probs_grad if ctx.needs_input_grad[3] else None
        if ctx.needs_input_grad[3] and pg is None:
            pg = data.new_zeros((data.shape[0],), dtype=torch.float32)
        act_grad, probs_grad = _ops.moe_sort_chunks_by_map(data, row_id_map, pg, False)
        return (
            _wrap(act_grad, fp8) if ctx.needs_input_grad[0] else None,
            None,
            None,
            probs_grad if ctx.needs_input_grad[3] else None,
        )


# ------------------------------------------------------------------------------ API
def _permute(inp, routing_map, num_out_tokens, probs):
    _check_data("inp", inp, mxfp8=True)
    _check_tensor("routing_map", routing_map, _MAP_DTYPES, ndim=2)
    if routing_map.shape[0] != inp.shape[0]:
        raise ValueError(
            f"routing_map: expected {inp.shape[0]} rows (inp's tokens), got {routing_map.shape[0]}"
        )
    if routing_map.shape[1] < 1:
        raise ValueError("routing_map: expected at least one expert column, got 0")
    _check_int("num_out_tokens", num_out_tokens, -1)
    if probs is not None:
        _check_tensor("probs", probs, _HP)
        if tuple(probs.shape) != tuple(routing_map.shape):
            raise ValueError(
                f"probs: expected shape {tuple(routing_map.shape)} (routing_map's), "
                f"got {tuple(probs.shape)}"
            )
    if num_out_tokens < 0:
        num_out_tokens = int(torch.count_nonzero(routing_map))
    return _moe_permute_mask_map.apply(inp, routing_map, num_out_tokens, probs)


def moe_permute(
    inp: torch.Tensor,
    routing_map: torch.Tensor,
    num_out_tokens: int = -1,
    max_token_num: int = -1,
    map_type: str = "mask",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Permute the rows of ``inp`` [num_tokens, hidden] by expert (``routing_map`` [num_tokens,
    num_experts], nonzero = routed); returns (permuted [num_out_tokens, hidden], row_id_map).
    With ``map_type="index"``, ``routing_map`` is [num_tokens, topK] expert indices and row_id_map
    TE's [topK * num_tokens] (module docstring). ``max_token_num`` is TE's workspace hint (our
    sort sizes its buffer per call): checked, otherwise unused."""
    _check_map_type(map_type)
    _check_int("max_token_num", max_token_num, -1)
    if map_type == "index":
        return _permute_index(inp, routing_map, num_out_tokens)
    out, row_id_map, _ = _permute(inp, routing_map, num_out_tokens, None)
    return out, row_id_map


def moe_permute_with_probs(
    inp: torch.Tensor,
    probs: torch.Tensor,
    routing_map: torch.Tensor,
    num_out_tokens: int = -1,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """moe_permute, also permuting ``probs`` [num_tokens, num_experts]; returns (permuted,
    permuted_probs [num_out_tokens], row_id_map)."""
    _check_tensor("probs", probs)
    out, row_id_map, permuted_probs = _permute(inp, routing_map, num_out_tokens, probs)
    return out, permuted_probs, row_id_map


def moe_unpermute(
    inp: torch.Tensor,
    row_id_map: torch.Tensor,
    merging_probs: Optional[torch.Tensor] = None,
    restore_shape: Optional[torch.Size] = None,
    map_type: str = "mask",
    probs: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Gather the permuted rows back per token, summed (weighted by ``merging_probs`` [num_tokens,
    num_experts] when given); ``restore_shape`` (num_tokens, hidden) defaults to ``inp.shape``.
    ``probs`` is TE's deprecated name of ``merging_probs``."""
    if probs is not None:
        if merging_probs is not None:
            raise ValueError("probs: both merging_probs and probs given (probs is deprecated)")
        merging_probs = probs
    _check_map_type(map_type)
    if isinstance(inp, QuantizedTensor):
        raise NotImplementedError("inp: FP8 input to moe_unpermute is not implemented (TE's)")
    if map_type == "index":
        return _unpermute_index(inp, row_id_map, merging_probs)
    _check_data("inp", inp)
    _check_tensor("row_id_map", row_id_map, (torch.int32,), ndim=2)
    num_tokens, hidden = tuple(inp.shape) if restore_shape is None else tuple(restore_shape)
    if hidden != inp.shape[1]:
        raise ValueError(f"restore_shape: expected hidden size {inp.shape[1]}, got {hidden}")
    if row_id_map.shape[0] != num_tokens or row_id_map.shape[1] % 2 != 1:
        raise ValueError(
            f"row_id_map: expected [{num_tokens}, 2 * num_experts + 1], got "
            f"{tuple(row_id_map.shape)}"
        )
    if merging_probs is not None:
        _check_tensor("merging_probs", merging_probs, _HP)
        experts = (row_id_map.shape[1] - 1) // 2
        if tuple(merging_probs.shape) != (num_tokens, experts):
            raise ValueError(
                f"merging_probs: expected shape {(num_tokens, experts)}, "
                f"got {tuple(merging_probs.shape)}"
            )
    return _moe_unpermute_mask_map.apply(inp, row_id_map, merging_probs, num_tokens)


def _sort_chunks(inp, split_sizes, sorted_index, probs):
    _check_data("inp", inp)
    _check_tensor("split_sizes", split_sizes, (torch.int32, torch.int64), ndim=1)
    _check_tensor("sorted_index", sorted_index, (torch.int32, torch.int64), ndim=1)
    if sorted_index.shape != split_sizes.shape:
        raise ValueError(
            f"sorted_index: expected {split_sizes.shape[0]} entries (split_sizes'), "
            f"got {sorted_index.shape[0]}"
        )
    if probs is not None:
        _check_tensor("probs", probs, _HP, ndim=1)
        if probs.shape[0] != inp.shape[0]:
            raise ValueError(f"probs: expected [{inp.shape[0]}], got {tuple(probs.shape)}")
    return _moe_chunk_sort.apply(inp, split_sizes, sorted_index, probs)


def moe_sort_chunks_by_index(
    inp: torch.Tensor, split_sizes: torch.Tensor, sorted_index: torch.Tensor
) -> torch.Tensor:
    """Split ``inp``'s rows into chunks of ``split_sizes`` and concatenate them in the order of
    ``sorted_index``."""
    out, _ = _sort_chunks(inp, split_sizes, sorted_index, None)
    return out


def moe_sort_chunks_by_index_with_probs(
    inp: torch.Tensor,
    probs: torch.Tensor,
    split_sizes: torch.Tensor,
    sorted_index: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """moe_sort_chunks_by_index, also reordering ``probs`` [num_tokens]."""
    _check_tensor("probs", probs)
    return _sort_chunks(inp, split_sizes, sorted_index, probs)

"""Index-map permutation (TE's ``map_type="index"``) for pytorch/permutation.py: autograd over
``torch.ops.te_lite.moe_*_index_map`` (contracts in permutation.h). row_id_map is TE's int32
``[topK * num_tokens]``."""

from __future__ import annotations

import warnings
from typing import Optional, Tuple

import torch

from .tensor import QuantizedTensor

_ops = torch.ops.te_lite
_HP = (torch.float32, torch.float16, torch.bfloat16)


def _as_int32(name: str, t: torch.Tensor, op: str) -> torch.Tensor:
    """TE's behaviour: another integer dtype is converted with a warning."""
    if t.dtype == torch.int32:
        return t
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"{name}: expected an integer dtype (int32 recommended), got {t.dtype}")
    warnings.warn(f"The data type of the input `{name}` of {op} is {t.dtype}! "
                  "The recommended type is torch.int32.")
    return t.to(torch.int32)


def _check_hp(name: str, t: object) -> None:
    if isinstance(t, QuantizedTensor):
        raise NotImplementedError(f"{name}: FP8 tensors with map_type='index' are not implemented")
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _HP:
        raise TypeError(f"{name}: expected dtype in {{float32, float16, bfloat16}}, got {t.dtype}")
    if t.dim() != 2:
        raise ValueError(f"{name}: expected [num_tokens, hidden_size], got shape {tuple(t.shape)}")


class _moe_permute_index_map(torch.autograd.Function):
    """Permute with top-k expert indices."""

    @staticmethod
    def forward(ctx, inp, index, num_out_tokens):
        row_id_map = _ops.moe_index_make_row_id_map(index, num_out_tokens)
        out = _ops.moe_permute_with_index_map(inp, row_id_map, num_out_tokens)
        ctx.save_for_backward(row_id_map)
        ctx.num_tokens = inp.shape[0]
        ctx.mark_non_differentiable(row_id_map)
        return out, row_id_map

    @staticmethod
    def backward(ctx, grad, _):
        (row_id_map,) = ctx.saved_tensors
        act_grad = None
        if ctx.needs_input_grad[0]:
            # Each token's gradient: the sum of its kept routes' rows.
            act_grad = _ops.moe_unpermute_with_index_map(
                grad.contiguous(), row_id_map, None, ctx.num_tokens
            )
        return act_grad, None, None


class _moe_unpermute_index_map(torch.autograd.Function):
    """Unpermute with an index row_id_map, merging the routes with fp32 probs when given."""

    @staticmethod
    def forward(ctx, inp, row_id_map, probs32, probs_dtype, num_tokens):
        out = _ops.moe_unpermute_with_index_map(inp, row_id_map, probs32, num_tokens)
        ctx.save_for_backward(inp, row_id_map, probs32)
        ctx.probs_dtype = probs_dtype
        return out

    @staticmethod
    def backward(ctx, grad):
        inp, row_id_map, probs32 = ctx.saved_tensors
        grad = grad.contiguous()
        act_grad = probs_grad = None
        if probs32 is not None:
            act_grad, probs_grad = _ops.moe_unpermute_with_index_map_bwd(
                grad, row_id_map, inp, probs32
            )
            probs_grad = probs_grad.to(ctx.probs_dtype)
        elif ctx.needs_input_grad[0]:
            # topK = 1: each permuted row takes its token's gradient.
            act_grad = _ops.moe_permute_with_index_map(grad, row_id_map, inp.shape[0])
        return (
            act_grad if ctx.needs_input_grad[0] else None,
            None,
            probs_grad if ctx.needs_input_grad[2] else None,
            None,
            None,
        )


def permute_index(inp, index, num_out_tokens: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """moe_permute(map_type="index")."""
    if isinstance(inp, torch.Tensor) and not isinstance(inp, QuantizedTensor) and not inp.numel():
        return inp, torch.tensor([], device=inp.device)  # TE's empty-input result
    _check_hp("inp", inp)
    if not isinstance(index, torch.Tensor):
        raise TypeError(f"routing_map: expected a torch.Tensor, got {type(index).__name__}")
    if index.dim() != 2 or index.shape[0] != inp.shape[0] or index.shape[1] < 1:
        raise ValueError(
            f"routing_map: expected [{inp.shape[0]}, topK >= 1] expert indices "
            f"(map_type='index'), got shape {tuple(index.shape)}"
        )
    index = _as_int32("index", index, "Permute")
    routes = index.numel()
    # TE: num_out_tokens <= 0 keeps every route.
    num_out = num_out_tokens if num_out_tokens > 0 else routes
    return _moe_permute_index_map.apply(inp, index, num_out)


def unpermute_index(inp, row_id_map, probs: Optional[torch.Tensor]) -> torch.Tensor:
    """moe_unpermute(map_type="index")."""
    if isinstance(inp, torch.Tensor) and not isinstance(inp, QuantizedTensor) and not inp.numel():
        return inp  # TE's empty-input result
    _check_hp("inp", inp)
    if not isinstance(row_id_map, torch.Tensor) or row_id_map.dim() != 1:
        raise ValueError(
            "row_id_map: expected moe_permute(map_type='index')'s [topK * num_tokens] map, got "
            + (f"shape {tuple(row_id_map.shape)}" if isinstance(row_id_map, torch.Tensor)
               else type(row_id_map).__name__)
        )
    row_id_map = _as_int32("row_id_map", row_id_map, "Unpermute")
    probs32, probs_dtype = None, None
    if probs is not None:
        if not isinstance(probs, torch.Tensor) or probs.dim() != 2:
            raise ValueError(f"merging_probs: expected [num_tokens, topK], got {probs!r:.60}")
        if probs.dtype not in _HP:
            raise TypeError(f"merging_probs: expected a float dtype, got {probs.dtype}")
        if probs.numel() != row_id_map.numel():
            raise ValueError(
                f"merging_probs: expected num_tokens * topK = {row_id_map.numel()} entries "
                f"(row_id_map's), got shape {tuple(probs.shape)}"
            )
        if probs.dtype != torch.float32:
            warnings.warn(f"The data type of the input `probs` of Unpermute is {probs.dtype}! "
                          "The recommended type is torch.float32.")
        probs_dtype = probs.dtype
        probs32 = probs.to(torch.float32)
        num_tokens = probs.shape[0]
    else:
        num_tokens = row_id_map.numel()  # TE: topK = 1 without probs
    return _moe_unpermute_index_map.apply(inp, row_id_map, probs32, probs_dtype, num_tokens)

"""Vocab-parallel cross entropy (TE's ``transformer_engine.pytorch.cross_entropy``), over the
core's ``nvte_cross_entropy_*`` kernels (``torch.ops.te_lite.cross_entropy_*``; formulas in
``cross_entropy.h``).

Semantics (TE 2.8's): logits ``(B, SQ, V)`` or ``(SQ, B, V)`` in fp32 / fp16 / bf16, target with
``B * SQ`` token ids; the loss is fp32 per token, shaped ``(B, SQ)`` (the first two dims of the
logits), or with ``reduce_loss`` its sum divided by ``B * SQ`` — ignored tokens count in that
denominator (TE's rule; ``torch.nn.CrossEntropyLoss`` divides by the non-ignored count).
``label_smoothing`` spreads ``label_smoothing`` of the target's weight uniformly over the vocab.
Tokens whose target is ``ignore_idx`` get loss 0 and gradient 0.

With ``dist_process_group`` (tensor parallelism over the vocab) each rank holds the equal,
contiguous vocab shard ``[rank * V, (rank + 1) * V)``; the per-row statistics (max, sum of exp,
target logit, sum of logits minus the max) are all-gathered and combined, so every rank gets the
loss of the full vocab and the gradient of its shard. Unlike TE, the label-smoothing term sums the
logits of the whole vocab, not of the local shard only: the loss equals the one-process loss on
every rank.

The gradient is computed in the forward (as TE) into a buffer of the logits' dtype; unlike TE the
logits tensor itself is not overwritten (TE reuses its storage, which its tests and Megatron never
read back). The backward scales it by ``grad_output``; ``is_cg_capturable=False`` skips that when
``grad_output`` is exactly 1 (a host sync, as TE), ``True`` always scales (no sync).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from . import te_lite_ops  # noqa: F401  (loads the extension: torch.ops.te_lite.*)

__all__ = ["parallel_cross_entropy"]

_ops = torch.ops.te_lite
_HP = (torch.float32, torch.float16, torch.bfloat16)
_NUM_STATS = 4  # cross_entropy.h: {max, sum of exp, target logit, sum of (x - max)}


# ------------------------------------------------------------------------------ fake kernels
@torch.library.register_fake("te_lite::cross_entropy_row_stats")
def _(logits, target, rank, world_size, ignore_idx):
    return logits.new_empty((target.numel(), _NUM_STATS), dtype=torch.float32)


@torch.library.register_fake("te_lite::cross_entropy_fwd")
def _(logits, target, stats, rank, ignore_idx, label_smoothing, reduce_loss):
    return logits.new_empty(target.shape, dtype=torch.float32), logits.new_empty(logits.shape)


@torch.library.register_fake("te_lite::cross_entropy_bwd")
def _(grad, grad_output):
    return grad.new_empty(grad.shape)


# ------------------------------------------------------------------------------ checks
def _check_args(
    inp: torch.Tensor, target: torch.Tensor, label_smoothing: float
) -> torch.Tensor:
    """Validates the arguments; returns the target as int32 / int64."""
    name = "parallel_cross_entropy"
    if not isinstance(inp, torch.Tensor) or inp.dim() != 3:
        got = f"shape {tuple(inp.shape)}" if isinstance(inp, torch.Tensor) else type(inp).__name__
        raise ValueError(
            f"{name}: argument '_input': expected a 3-D tensor (B, SQ, V) or (SQ, B, V), got {got}"
        )
    if inp.dtype not in _HP:
        raise ValueError(
            f"{name}: argument '_input': expected dtype float32, float16 or bfloat16, "
            f"got {inp.dtype}"
        )
    if not isinstance(target, torch.Tensor) or target.dtype.is_floating_point or (
        target.dtype in (torch.bool, torch.complex64, torch.complex128)
    ):
        got = target.dtype if isinstance(target, torch.Tensor) else type(target).__name__
        raise ValueError(f"{name}: argument 'target': expected an integer tensor, got {got}")
    rows = inp.shape[0] * inp.shape[1]
    if target.numel() != rows:
        raise ValueError(
            f"{name}: argument 'target': expected {rows} token ids (one per row of _input "
            f"{tuple(inp.shape)}), got shape {tuple(target.shape)}"
        )
    if target.device != inp.device:
        raise ValueError(
            f"{name}: argument 'target': expected device {inp.device} (_input's), "
            f"got {target.device}"
        )
    if not 0.0 <= float(label_smoothing) <= 1.0:
        raise ValueError(
            f"{name}: argument 'label_smoothing': expected a value in [0, 1], got {label_smoothing}"
        )
    if target.dtype not in (torch.int32, torch.int64):
        target = target.to(torch.int64)
    return target


def _group_rank_size(group: Optional[dist.ProcessGroup]) -> tuple[int, int]:
    if group is None:
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _gather_stats(stats: torch.Tensor, group: dist.ProcessGroup, world_size: int) -> torch.Tensor:
    """[world_size, rows, 4], rank order. all_gather into the rows of one buffer (every backend
    has it; gloo has no all_gather_into_tensor)."""
    gathered = stats.new_empty((world_size, *stats.shape))
    dist.all_gather(list(gathered.unbind(0)), stats.contiguous(), group=group)
    return gathered


# ------------------------------------------------------------------------------ autograd
class CrossEntropyFunction(torch.autograd.Function):
    """TE's autograd Function: fp32 loss, gradient in the input's dtype (see the module doc)."""

    @staticmethod
    def forward(
        ctx,
        _input: torch.Tensor,
        target: torch.Tensor,
        label_smoothing: float = 0.0,
        reduce_loss: bool = False,
        dist_process_group: Optional[dist.ProcessGroup] = None,
        ignore_idx: int = -100,
        is_cg_capturable: bool = False,
    ) -> torch.Tensor:
        target = _check_args(_input, target, label_smoothing)
        rank, world_size = _group_rank_size(dist_process_group)
        b, sq = _input.shape[0], _input.shape[1]
        stats = _ops.cross_entropy_row_stats(_input, target, rank, world_size, int(ignore_idx))
        if world_size > 1:
            stats = _gather_stats(stats, dist_process_group, world_size)
        loss, grad = _ops.cross_entropy_fwd(
            _input,
            target,
            stats,
            rank,
            int(ignore_idx),
            float(label_smoothing),
            bool(reduce_loss),
        )
        loss = loss.reshape(b, sq)
        if reduce_loss:
            loss = torch.sum(loss) / (b * sq)
        ctx.save_for_backward(grad)
        ctx.is_cg_capturable = is_cg_capturable
        return loss

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (grad,) = ctx.saved_tensors
        # The last layer's grad_output is exactly 1: the saved gradient is the answer (autograd
        # copies it before accumulating, since the saved tensor still refers to it). The check is
        # a host sync; graph capture (is_cg_capturable) and torch.compile (a data-dependent
        # branch) always scale instead, with the same result.
        if not ctx.is_cg_capturable and not torch.compiler.is_compiling() and torch.equal(
            grad_output, torch.tensor(1.0, device=grad_output.device, dtype=grad_output.dtype)
        ):
            dx = grad
        else:
            dx = _ops.cross_entropy_bwd(grad, grad_output.to(torch.float32))
        return dx, None, None, None, None, None, None


def parallel_cross_entropy(
    _input: torch.Tensor,
    target: torch.Tensor,
    label_smoothing: float = 0.0,
    reduce_loss: bool = False,
    dist_process_group: Optional[dist.ProcessGroup] = None,
    ignore_idx: int = -100,
    is_cg_capturable: bool = False,
) -> torch.Tensor:
    """TE's ``parallel_cross_entropy``: the cross entropy of ``_input`` (B, SQ, V) or (SQ, B, V)
    against ``target`` (B * SQ token ids), per token (fp32, the first two dims of ``_input``) or
    reduced (``reduce_loss``: the sum over all tokens / B * SQ). See the module docstring."""
    return CrossEntropyFunction.apply(
        _input,
        target,
        label_smoothing,
        reduce_loss,
        dist_process_group,
        ignore_idx,
        is_cg_capturable,
    )

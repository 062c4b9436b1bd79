"""L2Normalization op: y = x / sqrt(sum(x^2) + eps) over the last dim (TE's ops.L2Normalization).

Forward and backward are the pytorch.jit functions (torch.compile'd on first use, fp32 inside):
training saves x and the per-row rsqrt only, and the backward recomputes sum(x^2) from x, as TE
does, instead of letting autograd keep every intermediate of the forward.
"""

from __future__ import annotations

import torch

from ...jit import (
    compile_enabled,
    l2normalization_backward_fused,
    l2normalization_fused,
    l2normalization_fwd_fused,
    warmup_jit_l2normalization_all_dtypes,
)
from ..op import BasicOperation, OperationContext

__all__ = ["L2Normalization"]

# TE's warm-up sizes: the hidden size is only known at the first forward, and for QK
# normalization it is the head dim, commonly one of these.
_WARMUP_HEAD_DIMS = (32, 64, 80, 96, 128, 256)


class L2Normalization(BasicOperation):
    """Parameter-free L2 normalization over the last dim (used for QK normalization).

    eps: added to sum(x^2) under the square root. seq_length and micro_batch_size (TE's JIT
    warm-up): when both are given and compilation is on (NVTE_TORCH_COMPILE), the fused functions
    are compiled at construction for [seq_length * micro_batch_size, d] in fp32/bf16/fp16, for
    TE's common head dims d, so the first training step does not pay for it.
    """

    def __init__(
        self,
        *,
        eps: float = 1e-6,
        seq_length: int | None = None,
        micro_batch_size: int | None = None,
    ) -> None:
        super().__init__()
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
            raise ValueError(f"L2Normalization: eps: expected a float >= 0, got {eps!r}")
        for name, v in (("seq_length", seq_length), ("micro_batch_size", micro_batch_size)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ValueError(
                    f"L2Normalization: {name}: expected None or an int >= 0, got {v!r}"
                )
        self.eps = float(eps)
        self.seq_length, self.micro_batch_size = seq_length, micro_batch_size
        if seq_length and micro_batch_size and compile_enabled():
            for d in _WARMUP_HEAD_DIMS:
                warmup_jit_l2normalization_all_dtypes(d, seq_length, micro_batch_size)

    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        _check_input(input_)
        if torch.is_grad_enabled() and input_.requires_grad:
            return _L2NormFunction.apply(input_, self.eps), ()
        return l2normalization_fused(input_, self.eps), ()

    # TE's op interface, for code that drives a basic op by hand; the fuser uses fuser_forward
    # (a plain autograd.Function of tensors, which torch.compile traces with fullgraph=True).
    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        prev_op_grad_output_quantizer: object,
        next_op_input_quantizer: object,
    ) -> torch.Tensor:
        _check_input(input_)
        if not ctx.requires_grad:
            return l2normalization_fused(input_, self.eps)
        y, rsqrt_norm = l2normalization_fwd_fused(input_, self.eps)
        ctx.save_for_backward(input_, rsqrt_norm)
        return y

    def op_backward(
        self, ctx: OperationContext, grad_output: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[()]]:
        x, rsqrt_norm = ctx.saved_tensors
        return l2normalization_backward_fused(grad_output, x, rsqrt_norm, self.eps), ()


def _check_input(x: torch.Tensor) -> None:
    if not x.is_floating_point():
        raise TypeError(f"L2Normalization: input: expected a floating-point tensor, got {x.dtype}")
    if x.dim() == 0:
        raise ValueError("L2Normalization: input: expected at least 1 dim, got a scalar")


class _L2NormFunction(torch.autograd.Function):
    """Training path: saves x and the fp32 per-row rsqrt; dx recomputes sum(x^2) from x."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, eps: float) -> torch.Tensor:  # type: ignore[override]
        y, rsqrt_norm = l2normalization_fwd_fused(x, eps)
        ctx.save_for_backward(x, rsqrt_norm)
        ctx.eps = eps
        return y

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):  # type: ignore[override]
        x, rsqrt_norm = ctx.saved_tensors
        return l2normalization_backward_fused(grad_output, x, rsqrt_norm, ctx.eps), None

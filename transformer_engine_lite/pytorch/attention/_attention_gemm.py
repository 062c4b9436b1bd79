"""The unfused attention backend's two GEMMs (Q K^T and P V) as one opaque torch op; and FP8
attention's GEMMs in the canonical order (ordered_matmul) with its GQA head expansion.

Under torch.compile, inductor lowers a CPU bmm whose M or N is 1 (every KV-cache decoding step:
one query row) to its own multiply + sum reduction: the sum runs in another order and the bf16
rounding of the scores between the GEMM and the fp32 softmax is dropped, so a compiled decoding
step differed from eager by a bf16 ulp of the output and more (a rounded score moves the softmax).
Behind an opaque op both paths run the same torch.matmul on the same tensors, so the compiled
unfused backend computes what eager does, bit for bit; inductor still fuses everything around it.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["attention_matmul", "expand_heads", "ordered_matmul"]


@torch.library.custom_op("te_lite_py::attention_matmul", mutates_args=())
def attention_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [..., m, k] @ b [..., k, n] with equal batch dims (torch.matmul's result)."""
    if a.dim() != b.dim() or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"attention_matmul: expected a [..., m, k] and b [..., k, n] with the same batch "
            f"dims, got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    return torch.matmul(a, b)


@attention_matmul.register_fake
def _attention_matmul_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a, b)


def _setup_context(ctx: Any, inputs: tuple[torch.Tensor, torch.Tensor], output: Any) -> None:
    a, b = inputs
    ctx.save_for_backward(a, b)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    # The same op again, so the backward also runs one set of kernels compiled or not.
    a, b = ctx.saved_tensors
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_a = attention_matmul(grad, b.transpose(-2, -1))
    if ctx.needs_input_grad[1]:
        grad_b = attention_matmul(a.transpose(-2, -1), grad)
    return grad_a, grad_b


attention_matmul.register_autograd(_backward, setup_context=_setup_context)


def ordered_matmul(a: torch.Tensor, b: torch.Tensor, transb: bool = False) -> torch.Tensor:
    """a [..., m, K] . b [..., K, n] (transb: b [..., n, K], b^T used), fp32, in the canonical
    order (te_lite::ordered_bmm); differentiable, its backward the same op."""
    return torch.ops.te_lite.ordered_bmm(a, b, False, transb)


class _ExpandHeads(torch.autograd.Function):
    """GQA / MQA: x [b, h_kv, s, d] -> [b, h_kv * group, s, d], each KV head repeated for its
    group of query heads (repeat_interleave). The gradient of a KV head is the sum of its group's,
    folded in index order (g0 + g1 + g2 ...) with elementwise adds: every device rounds alike,
    where a reduction kernel's order is its own."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: int) -> torch.Tensor:
        ctx.group = group
        return x.repeat_interleave(group, dim=1)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        b, h, s, d = g.shape
        g = g.reshape(b, h // ctx.group, ctx.group, s, d)
        acc = g[:, :, 0]
        for i in range(1, ctx.group):
            acc = acc + g[:, :, i]
        return acc.contiguous(), None


def expand_heads(x: torch.Tensor, group: int) -> torch.Tensor:
    """x's KV heads repeated `group` times (dim 1), gradients summed in index order."""
    return _ExpandHeads.apply(x, group)

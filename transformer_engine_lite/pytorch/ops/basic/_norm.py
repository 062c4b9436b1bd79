"""Shared body of the LayerNorm and RMSNorm ops (TE's normalized_shape, zero_centered_gamma)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from ...module._autograd import NormConfig, norm
from .._common import check_positive_int, compute_dtype, param_device, param_dtype
from ..op import BasicOperation


class NormOp(BasicOperation):
    """Normalize over the trailing `normalized_shape` dims with the core's norm kernels (fp32
    statistics; backward by the kernels' registered autograd)."""

    _kind = ""  # "LayerNorm" or "RMSNorm"
    _has_bias = False

    def __init__(
        self,
        normalized_shape: Iterable[int] | int,
        *,
        eps: float,
        device: torch.device | str | None,
        dtype: torch.dtype | None,
        zero_centered_gamma: bool,
        sm_margin: int | dict[str, int],
    ) -> None:
        super().__init__()
        owner = self._kind
        shape = (
            (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        )
        if not shape:
            raise ValueError(f"{owner}: normalized_shape: expected at least one dim")
        for d in shape:
            check_positive_int(owner, "normalized_shape", d)
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
            raise ValueError(f"{owner}: eps: expected a float >= 0, got {eps!r}")
        if not isinstance(sm_margin, (int, dict)):
            raise TypeError(f"{owner}: sm_margin: expected an int or a dict, got {sm_margin!r}")
        # sm_margin (SMs left free for overlapped communication) only shapes a GPU launch: kept
        # for TE's signature, no effect on the values.
        self.sm_margin = sm_margin
        self.normalized_shape = shape
        self.eps = float(eps)
        self.zero_centered_gamma = bool(zero_centered_gamma)
        dev = param_device(device)
        dtype = param_dtype(owner, dtype)
        self.weight = torch.nn.Parameter(torch.empty(shape, dtype=dtype, device=dev))
        if self._has_bias:
            self.bias = torch.nn.Parameter(torch.empty(shape, dtype=dtype, device=dev))
        if dev.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """weight = 1 (0 with zero_centered_gamma: the kernel uses 1 + weight), bias = 0."""
        for name in ("weight", "bias") if self._has_bias else ("weight",):
            p = getattr(self, name)
            if p.device.type == "meta":
                p = torch.nn.Parameter(
                    torch.empty(p.shape, dtype=p.dtype, device=param_device(None)),
                    requires_grad=p.requires_grad,
                )
            with torch.no_grad():
                p.fill_(1.0 if name == "weight" and not self.zero_centered_gamma else 0.0)
            setattr(self, name, p)

    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        owner = self._kind
        dtype = compute_dtype(owner, input_, self.weight)
        n = len(self.normalized_shape)
        if tuple(input_.shape[input_.dim() - n :]) != self.normalized_shape or input_.dim() < n:
            raise ValueError(
                f"{owner}: input: expected trailing dims {self.normalized_shape}, got shape "
                f"{tuple(input_.shape)}"
            )
        inner = math.prod(self.normalized_shape)
        x = input_.to(dtype).reshape(-1, inner)
        w = self.weight.to(dtype).reshape(inner)
        b = self.bias.to(dtype).reshape(inner) if self._has_bias else None
        y = norm(x, w, b, NormConfig(owner, self.eps, self.zero_centered_gamma))
        return y.reshape(input_.shape), ()

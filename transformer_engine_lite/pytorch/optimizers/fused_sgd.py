"""TE's FusedSGD: torch.optim.SGD's update (momentum, dampening, nesterov, weight decay before or
after the momentum) for all parameters of a dtype in one multi_tensor_sgd call."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any, Callable, Optional

import torch
from torch.optim.optimizer import required  # type: ignore[attr-defined]

from ._ops import multi_tensor_sgd
from .multi_tensor_apply import multi_tensor_applier


class FusedSGD(torch.optim.Optimizer):
    """Stochastic gradient descent, fused (TE's signature). fp32 / fp16 / bf16 parameters; the
    momentum buffers have the parameters' dtype; math in fp32."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter | dict],
        lr: float | Any = required,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        wd_after_momentum: bool = False,
        materialize_master_grads: bool = True,
        set_grad_none: Optional[bool] = None,  # deprecated
    ) -> None:
        if lr is not required and lr < 0.0:
            raise ValueError(f"FusedSGD: lr: expected >= 0, got {lr}")
        if momentum < 0.0:
            raise ValueError(f"FusedSGD: momentum: expected >= 0, got {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"FusedSGD: weight_decay: expected >= 0, got {weight_decay}")
        if nesterov and (momentum <= 0.0 or dampening != 0.0):
            raise ValueError("FusedSGD: nesterov: requires a momentum and zero dampening")
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening,
                    "weight_decay": weight_decay, "nesterov": nesterov}
        super().__init__(params, defaults)
        self.wd_after_momentum = wd_after_momentum
        self.materialize_master_grads = materialize_master_grads
        self.most_recent_scale = 1.0
        self.scale_set_by_backward = False
        self._dummy_overflow_buf = torch.zeros(
            1, dtype=torch.int, device=self.param_groups[0]["params"][0].device
        )
        self.multi_tensor_sgd = multi_tensor_sgd
        self.set_grad_none = set_grad_none
        if set_grad_none is not None:
            warnings.warn("set_grad_none kwarg in FusedSGD constructor is deprecated. "
                          "Use set_to_none kwarg in zero_grad instead.", DeprecationWarning)

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        """Reset gradients (set_to_none default True; the deprecated set_grad_none must agree)."""
        if self.set_grad_none is not None:
            if set_to_none is not None and set_to_none != self.set_grad_none:
                raise ValueError(f"FusedSGD: zero_grad: set_to_none={set_to_none}, but FusedSGD "
                                 f"was initialized with set_grad_none={self.set_grad_none}")
            set_to_none = self.set_grad_none
        super().zero_grad(set_to_none=True if set_to_none is None else set_to_none)

    def get_momentums(self, params: list[torch.Tensor]) -> tuple[list[torch.Tensor], bool]:
        """Momentum buffers of `params` (created as zeros when missing) and whether this is the
        first run (a buffer was missing)."""
        momentums, first_run = [], False
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                first_run = True
                state["momentum_buffer"] = torch.zeros_like(p.data)
            momentums.append(state["momentum_buffer"])
        return momentums, first_run

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One SGD step over every parameter with a gradient."""
        loss = closure() if closure is not None else None
        scale = 1.0 / self.most_recent_scale
        for group in self.param_groups:
            by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("FusedSGD does not support sparse gradients")
                if p.dtype not in (torch.float32, torch.float16, torch.bfloat16):
                    raise TypeError(f"FusedSGD: params: expected float32, float16 or bfloat16 "
                                    f"parameters, got {p.dtype}")
                by_dtype.setdefault(p.dtype, []).append(p)
            for params in by_dtype.values():
                momentums, first_run = self.get_momentums(params)
                multi_tensor_applier(
                    self.multi_tensor_sgd, self._dummy_overflow_buf,
                    [[p.grad for p in params], [p.data for p in params], momentums],
                    group["weight_decay"], group["momentum"], group["dampening"], group["lr"],
                    group["nesterov"], first_run, self.wd_after_momentum, scale)
        self.most_recent_scale = 1.0
        self.scale_set_by_backward = False
        return loss

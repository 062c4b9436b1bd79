"""Bias: y = x + b, with TE's tensor-parallel split of b."""

from __future__ import annotations

from typing import Any

import torch

from ...distributed import set_tensor_model_parallel_attributes, split_size
from .._common import check_positive_int, compute_dtype, group_size, param_device, param_dtype
from .._common import resolve_group
from ..op import BasicOperation

__all__ = ["Bias"]


class Bias(BasicOperation):
    """Add a learned bias along the last dim (TE's ops.Bias). tensor_parallel=True: this rank holds
    size / world_size entries (the bias of a column-parallel linear). Starts at zero."""

    def __init__(
        self,
        size: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        tensor_parallel: bool = False,
        tensor_parallel_group: Any = None,
    ) -> None:
        super().__init__()
        check_positive_int("Bias", "size", size)
        dev = param_device(device)
        dtype = param_dtype("Bias", dtype)
        self.tensor_parallel = bool(tensor_parallel)
        self.tensor_parallel_group = resolve_group(self.tensor_parallel, tensor_parallel_group)
        self.tensor_parallel_size = group_size(self.tensor_parallel_group) if tensor_parallel else 1
        self.local_size = split_size("Bias", "size", size, self.tensor_parallel_size)
        self.bias = torch.nn.Parameter(torch.empty(self.local_size, dtype=dtype, device=dev))
        if dev.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Zero the bias (allocating it on the default device if it is on "meta")."""
        b = self.bias
        if b.device.type == "meta":
            b = torch.nn.Parameter(
                torch.empty(b.shape, dtype=b.dtype, device=param_device(None)),
                requires_grad=b.requires_grad,
            )
        with torch.no_grad():
            b.zero_()
        self.bias = b
        set_tensor_model_parallel_attributes(self.bias, self.tensor_parallel, 0, 1)

    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        dtype = compute_dtype("Bias", input_, self.bias)
        if input_.shape[-1:] != self.bias.shape:
            raise ValueError(
                f"Bias: input: expected last dim {self.bias.shape[0]}, got shape "
                f"{tuple(input_.shape)}"
            )
        return input_.to(dtype) + self.bias.to(dtype), ()

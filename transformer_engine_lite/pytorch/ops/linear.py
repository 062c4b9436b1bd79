"""ops.Linear: BasicLinear + Bias as one fused op, with TE's parameter names `weight` and `bias`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .basic import BasicLinear, Bias
from .op import FusedOperation

__all__ = ["Linear"]


class Linear(FusedOperation):
    """y = x W^T + b (TE's transformer_engine.pytorch.ops.Linear), arguments as BasicLinear plus
    `bias`. The parameters live in the basic ops; this op registers the same tensors as `weight`
    and `bias`, and assigning either (op.weight = p) hands it to the basic op as well."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        tensor_parallel_mode: str | None = None,
        tensor_parallel_group: Any = None,
        sequence_parallel: bool = False,
        rng_state_tracker_function: Callable[[], Any] | None = None,
        accumulate_into_main_grad: bool = False,
    ) -> None:
        linear = BasicLinear(
            in_features, out_features, device=device, dtype=dtype,
            tensor_parallel_mode=tensor_parallel_mode, tensor_parallel_group=tensor_parallel_group,
            sequence_parallel=sequence_parallel,
            rng_state_tracker_function=rng_state_tracker_function,
            accumulate_into_main_grad=accumulate_into_main_grad,
        )
        ops: list[Any] = [linear]
        if bias:
            # column-parallel: this rank's slice; row-parallel: the whole bias, added after the
            # reduction
            ops.append(Bias(
                out_features, device=device, dtype=dtype,
                tensor_parallel=tensor_parallel_mode == "column",
                tensor_parallel_group=linear.tensor_parallel_group,
            ))
        super().__init__(ops)
        self._sync_params()

    def _sync_params(self) -> None:
        super().register_parameter("weight", self.basic_ops[0].weight)
        bias = self.basic_ops[1].bias if len(self.basic_ops) > 1 else None
        super().register_parameter("bias", bias)

    def register_parameter(self, name: str, param: torch.nn.Parameter | None) -> None:
        if "basic_ops" in self.__dict__:
            if name == "weight":
                self.basic_ops[0].weight = param
            elif name == "bias" and len(self.basic_ops) > 1:
                self.basic_ops[1].bias = param
        super().register_parameter(name, param)

    # The FP8 state (delayed scaling's amax histories and scales) lives in the BasicLinear, which
    # is not a submodule: checkpoints carry it as this op's extra state.
    def get_extra_state(self) -> Any:
        return self.basic_ops[0].get_extra_state()

    def set_extra_state(self, state: Any) -> None:
        self.basic_ops[0].set_extra_state(state)

    def reset_parameters(self) -> None:
        for op in self.basic_ops:
            op.reset_parameters()
        self._sync_params()

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> Linear:
        # .to() / .cuda(): the basic ops own the parameters (and BasicLinear its FP8 state)
        for op in self.basic_ops:
            op._apply(fn, recurse)
        self._sync_params()
        return self

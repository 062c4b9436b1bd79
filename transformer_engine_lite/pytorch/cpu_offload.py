"""TE's activation offloading (`transformer_engine.pytorch.cpu_offload`): the tensors the autograd
graph saves during forward go to host memory and come back for the backward.

get_cpu_offload_context(enabled, num_layers, model_layers, offload_activations, offload_weights,
double_buffering) returns (context, synchronizer) as TE 2.8: run each layer's forward inside the
context and pass its output through the synchronizer. Saved tensors that live on an accelerator
are copied to (pinned, when CUDA is up) host memory at save time and copied back at unpack time;
tensors already in host memory (every tensor of the CPU backend) stay where they are, which is
what offloading to the CPU means for them. TE's stream-level double buffering and layer-group
scheduling (num_layers of model_layers offloaded, prefetch) exist to overlap copies with GPU work:
here copies are synchronous and every layer run inside the context is offloaded.
offload_weights is deprecated in TE and has no effect, as there.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["get_cpu_offload_context", "is_cpu_offload_enabled", "mark_activation_offload"]

CPUOffloadEnabled = False


def is_cpu_offload_enabled() -> bool:
    return CPUOffloadEnabled


def mark_activation_offload(*tensors: Any) -> None:
    """TE's marker of tensors to offload; every saved accelerator tensor is offloaded here, so the
    mark is recorded (activation_offloading = True) for code that reads it and changes nothing."""
    for t in tensors:
        if isinstance(t, torch.Tensor):
            t.activation_offloading = True


def _pack(t: torch.Tensor) -> Any:
    if t.device.type in ("cpu", "meta"):
        return t
    host = torch.empty(t.shape, dtype=t.dtype, layout=t.layout,
                       pin_memory=torch.cuda.is_available())
    host.copy_(t)
    return (t.device, host)


def _unpack(packed: Any) -> torch.Tensor:
    if isinstance(packed, torch.Tensor):
        return packed
    device, host = packed
    return host.to(device)


@contextlib.contextmanager
def _offload_context() -> Iterator[None]:
    global CPUOffloadEnabled
    saved = CPUOffloadEnabled
    CPUOffloadEnabled = True
    try:
        with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
            yield
    finally:
        CPUOffloadEnabled = saved


def get_cpu_offload_context(
    enabled: bool = False,
    num_layers: int = 1,
    model_layers: int = 1,
    offload_activations: bool = True,
    offload_weights: bool = False,
    double_buffering: bool = False,
) -> tuple[Any, Callable[[Any], Any]]:
    """(context, synchronizer): see the module docstring."""
    for name, v in (("num_layers", num_layers), ("model_layers", model_layers)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"get_cpu_offload_context: {name}: expected an int >= 0, got {v!r}")
    if not offload_weights and not offload_activations:
        raise ValueError(
            "get_cpu_offload_context: CPU offloading is enabled while it is not said what to "
            "offload (offload_activations and offload_weights are both False)"
        )
    if offload_weights:
        warnings.warn("get_cpu_offload_context: offload_weights is deprecated and has no effect "
                      "(as in TE)", DeprecationWarning, stacklevel=2)
        if not offload_activations:
            return contextlib.nullcontext(), lambda x: x
    del double_buffering  # copies are synchronous here (module docstring)

    def synchronizer(tensor: Any) -> Any:
        return tensor  # the copies completed at save / unpack time

    return (_offload_context() if enabled else contextlib.nullcontext()), synchronizer

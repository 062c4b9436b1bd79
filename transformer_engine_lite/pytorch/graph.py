"""te.make_graphed_callables: CUDA graph capture of modules (TE's API). A CUDA graph records GPU
kernel launches; with no CUDA device there is nothing to record, and this build does not capture
graphs on a GPU either, so the call raises NotImplementedError naming the reason.

The helpers TE's graph module gives clients that capture graphs themselves (Megatron-Core's
CudaGraphManager) keep their meaning without a graph: set_capture_start / set_capture_end /
is_graph_capturing track a capture region, and save_fp8_tensors / restore_fp8_tensors snapshot
and restore the delayed-scaling state (amax histories, scales) of modules around warm-up steps.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = [
    "is_graph_capturing",
    "make_graphed_callables",
    "restore_fp8_tensors",
    "save_fp8_tensors",
    "set_capture_end",
    "set_capture_start",
]

_IS_GRAPH_CAPTURING = False


def set_capture_start() -> None:
    """Marks the start of a capture region (TE's make_graphed_callables bookkeeping)."""
    global _IS_GRAPH_CAPTURING
    _IS_GRAPH_CAPTURING = True


def set_capture_end() -> None:
    global _IS_GRAPH_CAPTURING
    _IS_GRAPH_CAPTURING = False


def is_graph_capturing() -> bool:
    return _IS_GRAPH_CAPTURING


def save_fp8_tensors(modules: Iterable[torch.nn.Module], fp8_recipe: Any) -> list[Any] | None:
    """Copies of every sub-module's FP8 meta buffers (one entry per module in `.modules()` order,
    None for modules without FP8 state); None unless fp8_recipe is DelayedScaling (the only
    recipe with state between steps), as TE."""
    from ..common.recipe import DelayedScaling
    from .module.base import TransformerEngineBaseModule

    if not isinstance(fp8_recipe, DelayedScaling):
        return None
    saved: list[Any] = []
    for module in modules:
        for m in module.modules():
            if isinstance(m, TransformerEngineBaseModule):
                saved.append({n: getattr(m, n).detach().clone() for n in m._FP8_META_BUFFERS})
            else:
                saved.append(None)
    return saved


def restore_fp8_tensors(modules: Iterable[torch.nn.Module], fp8_tensors: list[Any] | None) -> None:
    """Puts back what save_fp8_tensors returned (same modules, same order)."""
    if fp8_tensors is None:
        return
    fp8_tensors = list(fp8_tensors)
    for module in modules:
        for m in module.modules():
            if not fp8_tensors:
                raise ValueError("restore_fp8_tensors: fp8_tensors: fewer entries than modules "
                                 "(expected the list save_fp8_tensors returned for them)")
            entry = fp8_tensors.pop(0)
            if entry is None:
                continue
            with torch.no_grad():
                for name, value in entry.items():
                    buf = getattr(m, name)
                    if buf.shape != value.shape:  # a recipe change resized the amax history
                        setattr(m, name, value.to(buf.device).clone())
                    else:
                        buf.copy_(value)
    if fp8_tensors:
        raise ValueError(f"restore_fp8_tensors: fp8_tensors: {len(fp8_tensors)} entries left over "
                         "(expected the list save_fp8_tensors returned for these modules)")


def make_graphed_callables(modules: Any, sample_args: Any, *args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError(
        "make_graphed_callables: CUDA graph capture is not supported by transformer_engine_lite "
        "(GPU-only: it records CUDA kernel launches); call the modules directly"
    )

"""te.make_graphed_callables: CUDA graph capture of modules (TE's API). A CUDA graph records GPU
kernel launches; with no CUDA device there is nothing to record, and this build does not capture
graphs on a GPU either, so the call raises NotImplementedError naming the reason."""

from __future__ import annotations

from typing import Any

__all__ = ["make_graphed_callables"]


def make_graphed_callables(modules: Any, sample_args: Any, *args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError(
        "make_graphed_callables: CUDA graph capture is not supported by transformer_engine_lite "
        "(GPU-only: it records CUDA kernel launches); call the modules directly"
    )

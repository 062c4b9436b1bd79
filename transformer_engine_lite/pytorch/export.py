"""TE's ONNX-export switch (`transformer_engine.pytorch.onnx_export`). TE's modules trace to ONNX
through its translation table of custom ops; this library's ops (torch.ops.te_lite.*) have no
ONNX translation, so enabling export raises NotImplementedError naming it. onnx_export(False),
TE's default and the form clients use to make sure export mode is off, is a no-op context."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["is_in_onnx_export_mode", "onnx_export"]


def is_in_onnx_export_mode() -> bool:
    """TE's query: never true here (export mode cannot be entered)."""
    return False


@contextlib.contextmanager
def onnx_export(enabled: bool = False) -> Iterator[None]:
    """TE's context manager (see the module docstring)."""
    if not isinstance(enabled, bool):
        raise ValueError(f"onnx_export: enabled: expected a bool, got {enabled!r}")
    if enabled:
        raise NotImplementedError(
            "onnx_export: enabled=True: ONNX export is not implemented by transformer_engine_lite "
            "(its torch.ops.te_lite kernels have no ONNX translation)"
        )
    yield

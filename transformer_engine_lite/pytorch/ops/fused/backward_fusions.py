"""TE's fused ops that are named here but not implemented: each needs a core kernel we do not
have yet (a GEMM with alpha: nvte_cublas_gemm_scaled; an activation backward fused with the bias
gradient and the cast). The fusion passes
never produce them; constructing one says so."""

from __future__ import annotations

from typing import Any

from ..op import FusedOperation

__all__ = [
    "BackwardActivationBias",
]


def _not_implemented(name: str, what: str) -> type:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(f"ops.fused.{name}: {what} is not implemented")

    return type(name, (FusedOperation,), {"__init__": __init__, "__doc__": f"TE's {name}: {what}."})


BackwardActivationBias = _not_implemented(
    "BackwardActivationBias", "the activation backward fused with the bias gradient")

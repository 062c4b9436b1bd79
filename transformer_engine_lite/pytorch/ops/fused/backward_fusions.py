"""TE's backward-pass fused ops, by name. Not implemented: our op fuser runs each op's own
backward through autograd in reverse order (OperationFuser._backward_ops lists them), so there
is no pass that could substitute these. Each needs a GEMM with alpha / beta (a scaled product
added into an existing gradient: nvte_cublas_gemm_scaled) or a norm backward that adds the
residual gradient, neither of which the core has yet. Constructing one says so."""

from __future__ import annotations

from typing import Any

from ..op import FusedOperation

__all__ = [
    "BackwardActivationBias",
    "BackwardAddRMSNorm",
    "BackwardLinearAdd",
    "BackwardLinearScale",
    "ForwardLinearScaleAdd",
]


def _not_implemented(name: str, what: str) -> type:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(f"ops.fused.{name}: {what} is not implemented")

    return type(name, (FusedOperation,), {"__init__": __init__, "__doc__": f"TE's {name}: {what}."})


BackwardActivationBias = _not_implemented(
    "BackwardActivationBias", "the activation backward fused with the bias gradient")
BackwardAddRMSNorm = _not_implemented(
    "BackwardAddRMSNorm", "RMSNorm's backward adding the residual gradient")
BackwardLinearAdd = _not_implemented(
    "BackwardLinearAdd", "the dgrad GEMM accumulating into the extra output's gradient")
BackwardLinearScale = _not_implemented(
    "BackwardLinearScale", "the backward GEMMs scaled by ConstantScale (GEMM alpha)")
ForwardLinearScaleAdd = _not_implemented(
    "ForwardLinearScaleAdd", "the forward GEMM scaled by ConstantScale into the extra input")

"""Fused optimizers and multi-tensor kernels (TE's transformer_engine.pytorch.optimizers)."""

from ._ops import (
    multi_tensor_adam,
    multi_tensor_adam_capturable,
    multi_tensor_adam_capturable_master,
    multi_tensor_adam_fp8,
    multi_tensor_adam_param_remainder,
    multi_tensor_compute_scale_and_scale_inv,
    multi_tensor_l2norm,
    multi_tensor_scale,
    multi_tensor_sgd,
    multi_tensor_unscale_l2norm,
)
from .fused_adam import FusedAdam
from .fused_sgd import FusedSGD
from .multi_tensor_apply import MultiTensorApply, multi_tensor_applier

__all__ = [
    "FusedAdam",
    "FusedSGD",
    "MultiTensorApply",
    "multi_tensor_adam",
    "multi_tensor_adam_capturable",
    "multi_tensor_adam_capturable_master",
    "multi_tensor_adam_fp8",
    "multi_tensor_adam_param_remainder",
    "multi_tensor_applier",
    "multi_tensor_compute_scale_and_scale_inv",
    "multi_tensor_l2norm",
    "multi_tensor_scale",
    "multi_tensor_sgd",
    "multi_tensor_unscale_l2norm",
]

"""TE's Userbuffers entry points (`transformer_engine.pytorch.initialize_ub` / `destroy_ub` /
`UserBufferQuantizationMode`): communication buffers that overlap tensor-parallel all-gather /
reduce-scatter with the GEMMs through CUDA IPC and NVLink. This library does not implement that
overlap on any device (the modules' ub_* flags raise NotImplementedError); these names exist so
that TE code can import them, and initialize_ub says so when called."""

from __future__ import annotations

from enum import Enum
from typing import Any

__all__ = ["UserBufferQuantizationMode", "destroy_ub", "initialize_ub"]


class UserBufferQuantizationMode(Enum):
    """TE's quantization mode of a Userbuffers buffer."""

    NONE = "none"
    FP8 = "fp8"


def initialize_ub(shape: list, tp_size: int, use_fp8: bool = False, quantization_modes: Any = None,
                  dtype: Any = None, ub_cfgs: Any = None, bootstrap_backend: Any = None) -> None:
    """TE's Userbuffers initialization: NotImplementedError (see the module docstring); clients
    that guard it (Megatron's tp_comm_overlap) keep the overlap off."""
    del shape, tp_size, use_fp8, quantization_modes, dtype, ub_cfgs, bootstrap_backend
    raise NotImplementedError(
        "initialize_ub: Userbuffers (tensor-parallel communication / GEMM overlap through CUDA "
        "IPC) are not implemented by transformer_engine_lite; run without tp_comm_overlap"
    )


def destroy_ub() -> None:
    """TE's teardown of the Userbuffers communicators: none are ever created here."""

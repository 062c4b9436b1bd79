"""Helpers shared by the fusible ops: argument checks, compute dtype, device, TP group."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..module.base import default_device

_HP_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_positive_int(owner: str, name: str, value: Any) -> int:
    """`value` as an int >= 1, else ValueError naming the argument (TypeError for non-ints)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}: {name}: expected an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{owner}: {name}: expected an int >= 1, got {value}")
    return value


def param_device(device: Any) -> torch.device:
    """TE's canonicalize_device: None -> the default device (CUDA when present, else CPU)."""
    return torch.device(device) if device is not None else default_device()


def param_dtype(owner: str, dtype: torch.dtype | None) -> torch.dtype:
    dtype = dtype if dtype is not None else torch.get_default_dtype()
    if not isinstance(dtype, torch.dtype) or dtype not in _HP_DTYPES:
        raise TypeError(f"{owner}: dtype: expected float32, float16 or bfloat16, got {dtype!r}")
    return dtype


def compute_dtype(owner: str, x: torch.Tensor, param: torch.Tensor | None) -> torch.dtype:
    """TE's rule for the ops: torch.autocast's dtype when it is on, else the op's parameter dtype
    (the input is cast to it), else the input's own dtype (parameter-free ops)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{owner}: input: expected a torch.Tensor, got {type(x).__name__}")
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    dtype = param.dtype if param is not None else x.dtype
    if dtype not in _HP_DTYPES:
        raise TypeError(f"{owner}: input: expected float32, float16 or bfloat16, got {dtype}")
    return dtype


def resolve_group(mode_set: bool, group: Any) -> Any:
    """TE: a parallel op without a group uses the world group (when torch.distributed is up)."""
    if group is None and mode_set and dist.is_available() and dist.is_initialized():
        return dist.group.WORLD
    return group


def group_size(group: Any) -> int:
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)

"""Activation recomputation: TE's `checkpoint` and its FP8 recompute rules.

`checkpoint(fn, *args, **kwargs)` runs fn without keeping its activations and runs it again in the
backward (torch.utils.checkpoint, reentrant or not). With FP8 the second run must produce the same
values as the first, although the delayed-scaling scales may have been updated in between (the
autocast exited) and the backward may run outside any autocast:
- the recompute runs under the FP8 state (enabled, recipe, group) the forward saw;
- a module running delayed scaling stashes a copy of its forward scales in the forward
  (`stash_scales`) and quantizes with that copy in the recompute (`recompute_scales`), which also
  records no amax and marks nothing "ran" (the step was already counted);
- autocasts opened inside the recompute restore state without running delayed-scaling updates.
`is_fp8_activation_recompute_enabled()` is true inside a checkpointed callable while FP8 is on;
`in_fp8_activation_recompute_phase()` additionally only during the recompute.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils.checkpoint as torch_checkpoint

from .fp8 import FP8GlobalStateManager

__all__ = [
    "checkpoint",
    "in_fp8_activation_recompute_phase",
    "is_fp8_activation_recompute_enabled",
]


@dataclass
class _Region:
    recompute: bool = False
    stash: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    cursor: dict[int, int] = field(default_factory=dict)


_regions: list[_Region] = []


def is_fp8_activation_recompute_enabled() -> bool:
    """Inside a checkpointed callable with FP8 enabled (forward or recompute)."""
    return bool(_regions) and FP8GlobalStateManager.is_fp8_enabled()


def in_fp8_activation_recompute_phase() -> bool:
    """Inside the backward's recompute of a checkpointed callable, with FP8 enabled."""
    return bool(_regions) and _regions[-1].recompute and FP8GlobalStateManager.is_fp8_enabled()


def stash_scales(module: Any, scale: torch.Tensor) -> torch.Tensor:
    """Forward-time scales of a delayed-scaling GEMM: in a checkpointed forward, a copy is kept
    for the recompute; in the recompute, the copy is returned instead (see module docstring)."""
    if not _regions:
        return scale
    region = _regions[-1]
    key = id(module)
    if region.recompute:
        stashed = region.stash.get(key, [])
        i = region.cursor.get(key, 0)
        if i >= len(stashed):
            raise RuntimeError(
                f"checkpoint: recompute of {type(module).__name__} ran more FP8 GEMMs than its "
                "forward (the checkpointed callable must run the same modules both times)"
            )
        region.cursor[key] = i + 1
        return stashed[i]
    region.stash.setdefault(key, []).append(scale.detach().clone())
    return scale


def recomputing() -> bool:
    """In the recompute phase of a checkpointed callable (FP8 or not): no amax is recorded."""
    return bool(_regions) and _regions[-1].recompute


@contextlib.contextmanager
def _enter(region: _Region, fp8_state: Any) -> Iterator[None]:
    _regions.append(region)
    restore = None
    if region.recompute:
        region.cursor = {}
        restore = FP8GlobalStateManager.enter_recompute(fp8_state)
    try:
        yield
    finally:
        if restore is not None:
            FP8GlobalStateManager.exit_recompute(restore)
        _regions.pop()


def checkpoint(
    function: Callable[..., Any],
    *args: Any,
    distribute_saved_activations: bool = False,
    get_rng_state_tracker: Callable[[], Any] | None = None,
    tp_group: Any = None,
    use_reentrant: bool = True,
    **kwargs: Any,
) -> Any:
    """TE's activation checkpoint: `function(*args, **kwargs)` with its activations recomputed in
    the backward instead of saved, FP8-aware (module docstring). The CPU RNG state is restored for
    the recompute (dropout masks repeat); a Megatron-style `get_rng_state_tracker` has its states
    saved and restored too. distribute_saved_activations (split saved inputs over tp_group) is
    not supported."""
    if distribute_saved_activations:
        raise NotImplementedError(
            "checkpoint: distribute_saved_activations=True is not supported by "
            "transformer_engine_lite; leave it False"
        )
    if not callable(function):
        raise TypeError(f"checkpoint: function: expected a callable, got {type(function).__name__}")
    del tp_group  # only used by distribute_saved_activations
    tracker_states = None
    if get_rng_state_tracker is not None:
        tracker_states = get_rng_state_tracker().get_states()
    fp8_state = FP8GlobalStateManager.snapshot()
    region = _Region()
    calls = 0

    def run(*a: Any) -> Any:
        nonlocal calls
        region.recompute = calls > 0
        calls += 1
        if region.recompute and tracker_states is not None:
            get_rng_state_tracker().set_states(tracker_states)
        with _enter(region, fp8_state):
            return function(*a, **kwargs)

    return torch_checkpoint.checkpoint(run, *args, use_reentrant=use_reentrant)

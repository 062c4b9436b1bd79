"""Activation recomputation: TE's `checkpoint` and its FP8 recompute rules.

`checkpoint(fn, *args, **kwargs)` runs fn without keeping its activations and runs it again in the
backward (torch.utils.checkpoint, reentrant or not). With FP8 the second run must produce the same
values as the first, although the delayed-scaling scales may have been updated in between (the
autocast exited) and the backward may run outside any autocast:
- the recompute runs under the FP8 state (enabled, recipe, group) the forward saw;
- a module running delayed scaling stashes a copy of its forward scales in the forward
  (`stash_scales`) and quantizes with that copy in the recompute (`recompute_scales`), which also
  records no amax and marks nothing "ran" (the step was already counted);
- autocasts opened inside the recompute restore state without running delayed-scaling updates;
- checkpoints nest (DotProductAttention's checkpoint_core_attention inside te.checkpoint): an inner
  forward that runs inside an outer recompute takes the outer forward's scales and records nothing.
FP8 attention's delayed-scaling points follow the same rules (fp8_attention.py).
`is_fp8_activation_recompute_enabled()` is true inside a checkpointed callable while FP8 is on;
`in_fp8_activation_recompute_phase()` additionally only during the recompute.

`activation_recompute_forward(activation_recompute, recompute_phase)` is TE's lower-level form for
clients that checkpoint on their own (Megatron-Core's CheckpointWithoutOutput): they run the
forward inside (True, False) and the recompute inside (True, True), each a separate context, and
open their own fp8_autocast for the recompute. The stash then cannot live in one checkpoint call:
each module keeps a FIFO of forward scales (TE keeps one per module too), which recomputes consume
in the order the forwards ran.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils.checkpoint as torch_checkpoint

from .fp8 import FP8GlobalStateManager

__all__ = [
    "activation_recompute_forward",
    "checkpoint",
    "in_fp8_activation_recompute_phase",
    "is_fp8_activation_recompute_enabled",
]


@dataclass
class _Region:
    recompute: bool = False
    stash: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    cursor: dict[int, int] = field(default_factory=dict)
    fifo: bool = False  # an activation_recompute_forward context: scales go through _fifos


_regions: list[_Region] = []
# activation_recompute_forward: per module, the forward scales its recomputes have yet to use.
_fifos: weakref.WeakKeyDictionary[Any, deque[torch.Tensor]] = weakref.WeakKeyDictionary()


def is_fp8_activation_recompute_enabled() -> bool:
    """Inside a checkpointed callable with FP8 enabled (forward or recompute)."""
    return bool(_regions) and FP8GlobalStateManager.is_fp8_enabled()


def in_fp8_activation_recompute_phase() -> bool:
    """Inside the backward's recompute of a checkpointed callable, with FP8 enabled."""
    return bool(_regions) and _regions[-1].recompute and FP8GlobalStateManager.is_fp8_enabled()


def stash_scales(module: Any, scale: torch.Tensor) -> torch.Tensor:
    """Forward-time scales of a delayed-scaling GEMM (or FP8 attention point): in a checkpointed
    forward, a copy is kept for the recompute; in the recompute, the copy is returned instead
    (see module docstring)."""
    return _stash(len(_regions) - 1, module, scale)


def _stash(level: int, module: Any, scale: torch.Tensor) -> torch.Tensor:
    """stash_scales for the region at `level` of the stack. A region's forward keeps (and uses)
    the scales its enclosing regions give: a checkpoint nested in another's recompute (e.g.
    checkpoint_core_attention inside te.checkpoint) runs its forward in that recompute, with the
    outer forward's scales, which its own recompute must then see again."""
    if level < 0:
        return scale
    region = _regions[level]
    if region.fifo:
        queue = _fifos.setdefault(module, deque())
        if not region.recompute:
            scale = _stash(level - 1, module, scale)
            queue.append(scale.detach().clone())
            return scale
        if not queue:
            raise RuntimeError(
                f"activation_recompute_forward: recompute of {type(module).__name__} has no "
                "forward scales left (each recompute phase must follow a forward that ran "
                "inside activation_recompute_forward(activation_recompute=True))"
            )
        return queue.popleft()
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
    scale = _stash(level - 1, module, scale)
    region.stash.setdefault(key, []).append(scale.detach().clone())
    return scale


def recomputing() -> bool:
    """In the recompute phase of a checkpointed callable (FP8 or not), or in a checkpointed
    forward nested in one: no forward amax is recorded (the forward already did)."""
    return any(region.recompute for region in _regions)


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


@contextlib.contextmanager
def activation_recompute_forward(
    activation_recompute: bool = False, recompute_phase: bool = False
) -> Iterator[None]:
    """TE's context for a client's own activation checkpointing (module docstring): the forward
    runs inside (activation_recompute=True, recompute_phase=False), the recompute inside (True,
    True). With activation_recompute=False it does nothing."""
    if not isinstance(activation_recompute, bool) or not isinstance(recompute_phase, bool):
        raise TypeError(
            "activation_recompute_forward: activation_recompute and recompute_phase: expected "
            f"bools, got {type(activation_recompute).__name__} and {type(recompute_phase).__name__}"
        )
    if not activation_recompute:
        yield
        return
    region = _Region(recompute=recompute_phase, fifo=True)
    with _enter(region, FP8GlobalStateManager.snapshot()):
        yield


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

"""Tensor and sequence parallelism over torch.distributed (gloo on the CPU), TE/Megatron semantics.

- column parallel: weight split on the output dim; the input is replicated. Forward: identity (or,
  with sequence parallelism, all-gather of the sequence dim 0); backward: all-reduce of the input
  gradient (or reduce-scatter on dim 0). The output stays split (TE has no gather_output).
- row parallel: weight split on the input dim; the input is split on its last dim. Forward:
  all-reduce of the partial outputs (or reduce-scatter on dim 0 with sequence parallelism); the
  bias, which is not split, is added after the reduction; backward: identity (or all-gather).
- Sequence-parallel LayerNorm parameters get `param.sequence_parallel = True`: their gradients are
  partial sums per rank, to be all-reduced over the TP group by the caller (as Megatron does).
The collectives are eager (not traced by torch.compile).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "allreduce_sequence_parallel_grads",
    "copy_to_tp_region",
    "gather_along_first_dim",
    "get_distributed_rank",
    "get_distributed_world_size",
    "reduce_from_tp_region",
    "reduce_scatter_along_first_dim",
    "split_size",
]


def _initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_distributed_world_size(group: Any = None) -> int:
    return dist.get_world_size(group) if _initialized() else 1


def get_distributed_rank(group: Any = None) -> int:
    return dist.get_rank(group) if _initialized() else 0


def set_tensor_model_parallel_attributes(
    tensor: torch.Tensor, is_parallel: bool, dim: int, stride: int
) -> None:
    """TE's tags on a parameter for Megatron-style tensor parallelism: `tensor_model_parallel`
    (sharded over the TP group, so every rank's copy counts in a grad norm), `partition_dim`,
    `partition_stride`. The modules set them in reset_parameters, as TE's do."""
    tensor.tensor_model_parallel = is_parallel  # type: ignore[attr-defined]
    tensor.partition_dim = dim  # type: ignore[attr-defined]
    tensor.partition_stride = stride  # type: ignore[attr-defined]


def split_size(owner: str, what: str, size: int, parts: int) -> int:
    if size % parts:
        raise ValueError(f"{owner}: {what} ({size}) must be divisible by tp_size ({parts})")
    return size // parts


def _all_reduce(x: torch.Tensor, group: Any) -> torch.Tensor:
    if get_distributed_world_size(group) == 1:
        return x
    x = x.contiguous().clone()
    dist.all_reduce(x, group=group)
    return x


def _gather0(x: torch.Tensor, group: Any) -> torch.Tensor:
    world = get_distributed_world_size(group)
    if world == 1:
        return x
    x = x.contiguous()
    out = torch.empty((world * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    # torch >= 2.13 names it all_gather_single (all_gather_into_tensor is deprecated there)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, x, group=group)
    return out


def _reduce_scatter0(x: torch.Tensor, group: Any) -> torch.Tensor:
    world = get_distributed_world_size(group)
    if world == 1:
        return x
    if x.shape[0] % world:
        raise ValueError(
            f"sequence parallel: dim 0 ({x.shape[0]}) must be divisible by the TP size ({world})"
        )
    x = x.contiguous()
    out = torch.empty((x.shape[0] // world, *x.shape[1:]), dtype=x.dtype, device=x.device)
    if x.device.type == "cpu":
        # gloo has no reduce_scatter: all-reduce, then keep this rank's chunk.
        full = x.clone()
        dist.all_reduce(full, group=group)
        out.copy_(full.chunk(world, 0)[get_distributed_rank(group)])
    else:
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        scatter(out, x, group=group)
    return out


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):  # type: ignore[override]
        return _all_reduce(g, ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):  # type: ignore[override]
        return g, None


class _GatherFirstDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return _gather0(x, group)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):  # type: ignore[override]
        return _reduce_scatter0(g, ctx.group), None


class _ReduceScatterFirstDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return _reduce_scatter0(x, group)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):  # type: ignore[override]
        return _gather0(g, ctx.group), None


def copy_to_tp_region(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Forward identity, backward all-reduce (input of a column-parallel GEMM)."""
    return _CopyToTP.apply(x, group) if get_distributed_world_size(group) > 1 else x


def reduce_from_tp_region(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Forward all-reduce, backward identity (output of a row-parallel GEMM)."""
    return _ReduceFromTP.apply(x, group) if get_distributed_world_size(group) > 1 else x


def gather_along_first_dim(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Forward all-gather on dim 0, backward reduce-scatter (sequence parallel -> column)."""
    return _GatherFirstDim.apply(x, group) if get_distributed_world_size(group) > 1 else x


def reduce_scatter_along_first_dim(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Forward reduce-scatter on dim 0, backward all-gather (row -> sequence parallel)."""
    return _ReduceScatterFirstDim.apply(x, group) if get_distributed_world_size(group) > 1 else x


def allreduce_sequence_parallel_grads(module: torch.nn.Module, group: Any = None) -> None:
    """All-reduce (sum) the gradients of parameters flagged `sequence_parallel` over the TP group."""
    if get_distributed_world_size(group) == 1:
        return
    for p in module.parameters():
        if getattr(p, "sequence_parallel", False) and p.grad is not None:
            dist.all_reduce(p.grad, group=group)


class TPConfig:
    """Resolved parallel settings of one module (TE: tp_group wins over tp_size)."""

    def __init__(
        self,
        owner: str,
        parallel_mode: str | None,
        tp_group: Any,
        tp_size: int,
        sequence_parallel: bool,
    ) -> None:
        if parallel_mode not in (None, "column", "row"):
            raise ValueError(
                f"{owner}: parallel_mode: expected None, 'column' or 'row', got {parallel_mode!r}"
            )
        if not isinstance(tp_size, int) or tp_size < 1:
            raise ValueError(f"{owner}: tp_size: expected an int >= 1, got {tp_size!r}")
        self.owner = owner
        self.parallel_mode = parallel_mode
        self.group = tp_group
        self.size = get_distributed_world_size(tp_group) if tp_group is not None else tp_size
        if tp_group is None and tp_size > 1 and _initialized() and tp_size != dist.get_world_size():
            raise ValueError(
                f"{owner}: tp_size={tp_size} without tp_group needs a world of that size "
                f"(got {dist.get_world_size()}); pass tp_group"
            )
        self.sequence_parallel = bool(sequence_parallel) and self.size > 1
        if sequence_parallel and parallel_mode is None and self.size > 1:
            raise ValueError(f"{owner}: sequence_parallel needs parallel_mode 'column' or 'row'")


# Every state the trackers hold, by name (TE's registry of "active" RNG states, which CUDA-graph
# capture registers with the graph; here the latest state tensor of each name).
_ALL_ACTIVE_RNG_STATES: dict[str, torch.Tensor] = {}


def get_all_rng_states() -> dict[str, torch.Tensor]:
    """The RNG states of every CudaRNGStatesTracker name (TE's registry)."""
    return _ALL_ACTIVE_RNG_STATES


def set_all_rng_states(states: dict[str, torch.Tensor]) -> None:
    global _ALL_ACTIVE_RNG_STATES
    if not isinstance(states, dict):
        raise TypeError(f"set_all_rng_states: states: expected a dict, got {type(states).__name__}")
    _ALL_ACTIVE_RNG_STATES = states


class CudaRNGStatesTracker:
    """TE's / Megatron's RNG tracker: named RNG states forked around model-parallel regions (e.g.
    dropout inside tensor-parallel attention draws differently per rank), on the default device's
    generator (CUDA when available, else the CPU's).

    add(name, seed): a new state seeded with `seed`; fork(name): a context manager running its body
    with that state and saving the advanced state at exit; get_states / set_states: checkpoint and
    restore (activation recompute); reset(): forget all states."""

    def __init__(self) -> None:
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()

    @staticmethod
    def _get() -> torch.Tensor:
        return torch.cuda.get_rng_state() if torch.cuda.is_available() else torch.get_rng_state()

    @staticmethod
    def _set(state: torch.Tensor) -> None:
        if torch.cuda.is_available():
            torch.cuda.set_rng_state(state)
        else:
            torch.set_rng_state(state)

    def is_initialized(self) -> bool:
        return bool(self.states_)

    def reset(self) -> None:
        self.states_, self.seeds_ = {}, set()

    def get_states(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.states_.items()}

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self.states_ = {k: v.clone() for k, v in states.items()}

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_:
            raise ValueError(f"CudaRNGStatesTracker.add: seed {seed} already exists")
        if name in self.states_:
            raise ValueError(f"CudaRNGStatesTracker.add: state {name!r} already exists")
        self.seeds_.add(seed)
        orig = self._get()
        torch.manual_seed(seed) if not torch.cuda.is_available() else torch.cuda.manual_seed(seed)
        self.states_[name] = self._get()
        _ALL_ACTIVE_RNG_STATES[name] = self.states_[name]
        self._set(orig)

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        if name not in self.states_:
            raise KeyError(f"CudaRNGStatesTracker.fork: state {name!r} is not added "
                           f"(have {sorted(self.states_)})")
        orig = self._get()
        self._set(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = self._get()
            _ALL_ACTIVE_RNG_STATES[name] = self.states_[name]
            self._set(orig)


def _get_module_fsdp_state(module: torch.nn.Module) -> Any:
    """TE's: the FSDP2 state of `module` (fully_shard applied to it) or of its closest FSDP2
    ancestor (the one with the fewest submodules holding it), cached on the module; RuntimeError
    when neither exists. Modules read it through TransformerEngineBaseModule.is_fsdp2."""
    if hasattr(module, "_get_fsdp_state"):
        return module._get_fsdp_state()
    cached = module.__dict__.get("_te_cached_parent_fsdp_state")
    if cached is not None:
        return cached
    from torch.distributed._composable_state import _module_state_mapping

    best, best_size = None, None
    for owner in list(_module_state_mapping.keys()):
        if not hasattr(owner, "_get_fsdp_state"):  # other composable APIs (replicate, ...)
            continue
        subs = list(owner.modules())
        if any(m is module for m in subs) and (best_size is None or len(subs) < best_size):
            best, best_size = owner, len(subs)
    if best is None:
        raise RuntimeError(
            "Module is not FSDP-wrapped and does not have any FSDP-wrapped parent modules.")
    state = best._get_fsdp_state()
    module.__dict__["_te_cached_parent_fsdp_state"] = state
    return state


# TE exports the activation-recompute queries from pytorch.distributed (they live in checkpoint.py).
from .checkpoint import (  # noqa: E402
    activation_recompute_forward,
    checkpoint,
    in_fp8_activation_recompute_phase,
    is_fp8_activation_recompute_enabled,
)

__all__ += [
    "get_all_rng_states",
    "set_all_rng_states",
    "set_tensor_model_parallel_attributes",
    "CudaRNGStatesTracker",
    "activation_recompute_forward",
    "checkpoint",
    "in_fp8_activation_recompute_phase",
    "is_fp8_activation_recompute_enabled",
]

"""te.make_graphed_callables (TE's API). A CUDA graph records GPU kernel launches; without one,
the returned callables run each module's forward again under the captured autocast, with TE's
warm-up, FP8 state bookkeeping and gradient-buffer semantics (make_graphed_callables' docstring
lists what is reproduced and what cannot be; _graphed.py holds the replay node).

The helpers TE's graph module gives clients that capture graphs themselves (Megatron-Core's
CudaGraphManager) keep their meaning without a graph: set_capture_start / set_capture_end /
is_graph_capturing track a capture region, and save_fp8_tensors / restore_fp8_tensors snapshot
and restore the delayed-scaling state (amax histories, scales) of modules around warm-up steps.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten

__all__ = [
    "is_graph_capturing",
    "make_graphed_callables",
    "restore_fp8_tensors",
    "save_fp8_tensors",
    "set_capture_end",
    "set_capture_start",
]

_IS_GRAPH_CAPTURING = False


def set_capture_start() -> None:
    """Marks the start of a capture region (TE's make_graphed_callables bookkeeping)."""
    global _IS_GRAPH_CAPTURING
    _IS_GRAPH_CAPTURING = True


def set_capture_end() -> None:
    global _IS_GRAPH_CAPTURING
    _IS_GRAPH_CAPTURING = False


def is_graph_capturing() -> bool:
    return _IS_GRAPH_CAPTURING


def save_fp8_tensors(modules: Iterable[torch.nn.Module], fp8_recipe: Any) -> list[Any] | None:
    """Copies of every sub-module's FP8 meta buffers (one entry per module in `.modules()` order,
    None for modules without FP8 state); None unless fp8_recipe is DelayedScaling (the only
    recipe with state between steps), as TE."""
    from ..common.recipe import DelayedScaling
    from .module.base import TransformerEngineBaseModule

    if not isinstance(fp8_recipe, DelayedScaling):
        return None
    saved: list[Any] = []
    for module in modules:
        for m in module.modules():
            if isinstance(m, TransformerEngineBaseModule):
                saved.append({n: getattr(m, n).detach().clone() for n in m._FP8_META_BUFFERS})
            else:
                saved.append(None)
    return saved


def restore_fp8_tensors(modules: Iterable[torch.nn.Module], fp8_tensors: list[Any] | None) -> None:
    """Puts back what save_fp8_tensors returned (same modules, same order)."""
    if fp8_tensors is None:
        return
    fp8_tensors = list(fp8_tensors)
    for module in modules:
        for m in module.modules():
            if not fp8_tensors:
                raise ValueError("restore_fp8_tensors: fp8_tensors: fewer entries than modules "
                                 "(expected the list save_fp8_tensors returned for them)")
            entry = fp8_tensors.pop(0)
            if entry is None:
                continue
            with torch.no_grad():
                for name, value in entry.items():
                    buf = getattr(m, name)
                    if buf.shape != value.shape:  # a recipe change resized the amax history
                        setattr(m, name, value.to(buf.device).clone())
                    else:
                        buf.copy_(value)
    if fp8_tensors:
        raise ValueError(f"restore_fp8_tensors: fp8_tensors: {len(fp8_tensors)} entries left over "
                         "(expected the list save_fp8_tensors returned for these modules)")


def _deprecated(old_name: str, old: Any, new_name: str, new: Any) -> Any:
    """TE's handling of the fp8_* spellings: the old one wins with a DeprecationWarning; both set
    is a ValueError."""
    if old is None:
        return new
    if new is not None:
        raise ValueError(f"make_graphed_callables has deprecated `{old_name}` kwarg in favor of "
                         f"`{new_name}`, but both kwargs are set.")
    warnings.warn(f"make_graphed_callables has deprecated `{old_name}` kwarg in favor of "
                  f"`{new_name}`. `{old_name}` will be removed in a future release.",
                  category=DeprecationWarning, stacklevel=3)
    return old


def _forward_schedule(
    n_callables: int, n_samples: int, order: list[int] | None, layers_per_chunk: Any
) -> tuple[list[tuple[int, int]], list[list[int]]]:
    """(forward index, callable index) of every captured forward pass in warm-up order, and the
    warm-up steps: lists of forward indices, negative entries (-1 - idx) meaning that pass's
    backward. Without _order: all forwards, then all backwards in reverse (TE's warm-up)."""
    if order is None:
        if n_samples != n_callables:
            raise ValueError("Expected sample_args to have the same length as callables, "
                             f"but got {n_samples} sample_args for {n_callables} callables")
        fwd = [(i, i) for i in range(n_callables)]
        return fwd, [[i for i, _ in fwd] + [-1 - i for i, _ in reversed(fwd)]]
    if any(int(c) != c for c in order):
        raise NotImplementedError("make_graphed_callables: _order: fractional entries (delayed "
                                  "wgrad passes) are not implemented by transformer_engine_lite")
    order = [int(c) for c in order]
    if not order or 0 in order:
        raise ValueError(
            f"make_graphed_callables: _order: expected non-zero chunk ids, got {order}")
    chunks = max(order)
    micro = len(order) // chunks // 2
    if chunks * micro * 2 != len(order):
        raise ValueError(f"Pipeline-parallel order dimension mismatch: num_model_chunks ({chunks})"
                         f" * num_microbatches ({micro}) * 2 = {chunks * micro * 2}, but "
                         f"len(_order_without_wgrad) = {len(order)}")
    if layers_per_chunk is None:
        if not (n_samples * 2 >= len(order) and n_samples * 2 % len(order) == 0):
            raise ValueError(
                f"{n_samples} * 2 >= {len(order)} and {n_samples} * 2 % {len(order)} == 0")
        layers_per_chunk = [n_samples // chunks // micro] * chunks
    elif isinstance(layers_per_chunk, int):
        layers_per_chunk = [layers_per_chunk] * chunks
    elif len(layers_per_chunk) != chunks:
        raise ValueError("If _num_layers_per_chunk is provided, it must be an integer or a list of"
                         f" {chunks} integers, but got {layers_per_chunk}.")
    total = sum(layers_per_chunk)
    if n_callables != total:
        raise ValueError(f"Callables should have ({total}) entries when order input is provided "
                         f"but got {n_callables}.")
    if n_samples != total * micro:
        raise ValueError(f"Expected {total * micro} args tuple, but got {n_samples}.")
    prefix = [0]
    for n in layers_per_chunk:
        prefix.append(prefix[-1] + n)
    # Sample layout (Megatron-Core's): chunk-major, then microbatch, then layer.
    fwd: list[tuple[int, int]] = []
    for c in range(chunks):
        for mb in range(micro):
            for layer in range(layers_per_chunk[c]):
                sample = prefix[c] * micro + mb * layers_per_chunk[c] + layer
                fwd.append((sample, prefix[c] + layer))
    fwd.sort()
    steps: list[list[int]] = []
    fwd_mb, bwd_mb = [0] * chunks, [0] * chunks
    for c_id in order:
        c = abs(c_id) - 1
        base = prefix[c] * micro
        if c_id > 0:
            mb, fwd_mb[c] = fwd_mb[c], fwd_mb[c] + 1
            steps.append([base + mb * layers_per_chunk[c] + l for l in range(layers_per_chunk[c])])
        else:
            mb, bwd_mb[c] = bwd_mb[c], bwd_mb[c] + 1
            steps.append([-1 - (base + mb * layers_per_chunk[c] + l)
                          for l in reversed(range(layers_per_chunk[c]))])
    return fwd, steps


def _run_hooks(hooks: list[dict[str, dict]], idx: int, kind: str, module: torch.nn.Module) -> None:
    for fn in hooks[idx].get(kind, {}).values():
        if fn(module) is not None:
            raise RuntimeError(f"make_graphed_callables: capture_time_hooks: a {kind} hook "
                               "returned a value; hooks must return None")


def make_graphed_callables(
    modules: Any,
    sample_args: Any,
    num_warmup_iters: int = 3,
    allow_unused_input: bool = False,
    sample_kwargs: Any = None,
    fp8_enabled: Any = None,
    fp8_calibrating: bool | None = None,
    fp8_recipe: Any = None,
    fp8_group: Any = None,
    fp8_weight_caching: bool | None = None,
    enabled: Any = None,
    calibrating: bool | None = None,
    recipe: Any = None,
    amax_reduction_group: Any = None,
    cache_quantized_params: bool | None = None,
    _order: list[int] | None = None,
    _num_layers_per_chunk: Any = None,
    pool: Any = None,
    retain_graph_in_backward: bool = False,
    _reuse_graph_input_output_buffers: bool = False,
    clone_param_grads_on_return: bool = True,
    pre_warmup_hook: Callable[[], Any] | None = None,
    post_warmup_hook: Callable[[], Any] | None = None,
    capture_time_hooks: list[dict[str, dict] | None] | None = None,
) -> Any:
    """TE's make_graphed_callables on a backend without CUDA graphs.

    Reproduced as TE: argument checks and the deprecated fp8_* spellings; the warm-up
    (num_warmup_iters forward + backward passes, plus the capture's own pass, on the sample inputs
    in TE's order, or the pipeline order `_order` / `_num_layers_per_chunk`, with pre/post warm-up
    hooks and capture_time_hooks, parameter .grad left untouched, unused inputs rejected unless
    allow_unused_input) and its lazy-initialization side effects; FP8 state bookkeeping (the
    delayed-scaling amax histories and scales, and the RNG states, are restored after warm-up); each
    module's forward replaced by a graphed one (original forward when the module's training state
    differs from capture) that runs under the captured autocast (enabled / recipe / calibrating /
    amax_reduction_group) whatever autocast surrounds the call; one autograd node per call whose
    backward writes static gradient buffers and returns clones of the parameter gradients (the
    buffers themselves with clone_param_grads_on_return=False or for parameters marked
    skip_backward_post_hook, the policy fixed at capture); retain_graph_in_backward;
    cache_quantized_params requiring a bool is_first_microbatch; backward_dw / reset attributes.
    Tensor sample kwargs are graph inputs a call must pass; other sample kwargs take the call's
    value when given; kwargs the graph was not captured with are not passed on (as TE's replay).

    Not reproducible without a graph: launch savings (each call runs the module's Python and kernels
    again), memory pools (`pool`, `_reuse_graph_input_output_buffers` only change memory reuse on a
    GPU and do not change any value here), cuda_graph_stream / cuda_graph_event (accepted and
    dropped: CPU work runs in program order). Outputs are fresh tensors each call, where TE returns
    static buffers the next replay overwrites (code that clones outputs, as TE advises, behaves the
    same). Delayed-scaling scales are updated as in an eager step, where a TE graph replayed outside
    an enabled autocast skips the update.
    """
    from ..common.recipe import Recipe
    from ._graphed import GraphSpec, attach_attributes, make_graphed_forward
    from .fp8 import autocast, get_default_fp8_recipe

    enabled = _deprecated("fp8_enabled", fp8_enabled, "enabled", enabled)
    enabled = False if enabled is None else enabled
    calibrating = _deprecated("fp8_calibrating", fp8_calibrating, "calibrating", calibrating)
    calibrating = bool(calibrating)
    recipe = _deprecated("fp8_recipe", fp8_recipe, "recipe", recipe)
    amax_reduction_group = _deprecated("fp8_group", fp8_group, "amax_reduction_group",
                                       amax_reduction_group)
    cache_quantized_params = bool(_deprecated("fp8_weight_caching", fp8_weight_caching,
                                              "cache_quantized_params", cache_quantized_params))
    if recipe is not None and not isinstance(recipe, Recipe):
        raise TypeError(
            f"make_graphed_callables: recipe: expected a Recipe, got {type(recipe).__name__}")
    if not isinstance(num_warmup_iters, int) or num_warmup_iters < 0:
        raise ValueError(f"make_graphed_callables: num_warmup_iters: expected an int >= 0, got "
                         f"{num_warmup_iters!r}")
    if torch.is_autocast_enabled() and torch.is_autocast_cache_enabled():
        raise RuntimeError("make_graphed_callables does not support the autocast caching. Please "
                           "set `cache_enabled=False`.")

    just_one = not isinstance(modules, tuple)
    if just_one:
        modules = (modules,)
        sample_args = (sample_args,)
        sample_kwargs = ({} if sample_kwargs is None else sample_kwargs,)
    elif sample_kwargs is None:
        sample_kwargs = tuple({} for _ in range(len(sample_args)))
    if not isinstance(enabled, tuple):
        if not isinstance(enabled, bool):
            raise TypeError(
                f"enabled must be a bool or a tuple of bools, but got {type(enabled).__name__}")
        enabled = (enabled,) * len(modules)
    elif len(enabled) != len(modules):
        raise ValueError(
            f"enabled length ({len(enabled)}) must match modules length ({len(modules)})")
    if any(enabled) and recipe is None:
        recipe = get_default_fp8_recipe()
    elif not any(enabled):
        recipe = None
    for m in modules:
        if not isinstance(m, torch.nn.Module):
            raise TypeError(f"Graphing for {type(m)} is not supported.")
    is_training = all(m.training for m in modules)
    if not is_training and any(m.training for m in modules):
        raise RuntimeError("make_graphed_callables only supports when modules are all in training "
                           "or all in inference mode.")
    if len(sample_kwargs) != len(sample_args):
        raise ValueError("Expected sample_kwargs to have the same length as callables, "
                         f"but got {len(sample_kwargs)} sample_kwargs for {len(sample_args)} "
                         "callables")
    if _reuse_graph_input_output_buffers:
        if _order is None:
            raise ValueError(
                "`_order` must be provided when `_reuse_graph_input_output_buffers` is True.")
        if not is_training:
            raise RuntimeError(
                "`_reuse_graph_input_output_buffers` is only available in training mode.")
    fwd_passes, steps = _forward_schedule(len(modules), len(sample_args), _order,
                                          _num_layers_per_chunk)
    if capture_time_hooks is None:
        capture_time_hooks = [None] * len(modules)
    if len(capture_time_hooks) != len(modules):
        raise ValueError(f"make_graphed_callables: capture_time_hooks: expected {len(modules)} "
                         f"entries (one per callable), got {len(capture_time_hooks)}")
    hooks = [h or {} for h in capture_time_hooks]
    for h in hooks:
        bad = set(h) - {"forward_pre_hooks", "forward_hooks", "backward_pre_hooks",
                        "backward_hooks"}
        if bad:
            raise ValueError(
                f"make_graphed_callables: capture_time_hooks: unknown keys {sorted(bad)}")
    for m in modules:
        if m._backward_hooks or m._backward_pre_hooks or m._forward_hooks or m._forward_pre_hooks:
            raise RuntimeError("Modules must not have hooks registered at the time they are "
                               "passed. However, registering hooks on modules after passing "
                               "them through make_graphed_callables is allowed.")
        if any(b.requires_grad for b in m.buffers()):
            raise RuntimeError("In any :class:`~torch.nn.Module` passed to :func:`~make_graphed_"
                               "callables`, only parameters may be trainable. All buffers must "
                               "have ``requires_grad=False``.")
    flat_samples, tensor_keys = [], []
    for args, kwargs in zip(sample_args, sample_kwargs):
        flat_a, _ = tree_flatten(args)
        # Tensor-valued kwargs are graph inputs; the rest (flags such as is_first_microbatch) are
        # read from each call.
        keys = [k for k in kwargs
                if all(isinstance(t, torch.Tensor) for t in tree_flatten(kwargs[k])[0])]
        tensor_keys.append(keys)
        flat_k, _ = tree_flatten([kwargs[k] for k in keys])
        if not all(isinstance(a, torch.Tensor) for a in flat_a):
            raise TypeError("In the beta API, sample_args for each callable must contain only "
                            "Tensors. Other types are not allowed.")
        flat_samples.append((flat_a, flat_k))

    from .distributed import get_all_rng_states, set_all_rng_states

    set_capture_start()
    saved_fp8 = save_fp8_tensors(modules, recipe)
    rng_state = torch.get_rng_state()
    tracker_states = {k: v.clone() for k, v in get_all_rng_states().items()}
    uses_fp8 = {id(m): e for m, e in zip(modules, enabled)}
    ac_args = {id(m): dict(enabled=uses_fp8[id(m)], calibrating=calibrating, recipe=recipe,
                           amax_reduction_group=amax_reduction_group) for m in modules}
    params_of = {f: tuple(modules[c].parameters()) for f, c in fwd_passes}
    callable_of = dict(fwd_passes)
    try:
        if pre_warmup_hook is not None:
            pre_warmup_hook()
        # The last pass stands for the capture: TE's capture runs the Python forward and backward
        # once more (recording instead of executing kernels), with the capture-time hooks.
        for it in range(num_warmup_iters + 1):
            if it == num_warmup_iters and post_warmup_hook is not None:
                post_warmup_hook()
            outputs: dict[int, list[torch.Tensor]] = {}
            for step in steps:
                for f in step:
                    if f >= 0:
                        m = modules[callable_of[f]]
                        _run_hooks(hooks, callable_of[f], "forward_pre_hooks", m)
                        with autocast(**ac_args[id(m)]):
                            out = m(*sample_args[f], **sample_kwargs[f])
                        _run_hooks(hooks, callable_of[f], "forward_hooks", m)
                        outputs[f] = [o for o in tree_flatten(out)[0]
                                      if isinstance(o, torch.Tensor) and o.requires_grad]
                    elif is_training:
                        f = -1 - f
                        m = modules[callable_of[f]]
                        inputs = [t for t in flat_samples[f][0] + flat_samples[f][1]
                                  if isinstance(t, torch.Tensor) and t.requires_grad]
                        n_user = len(inputs)
                        inputs += [p for p in params_of[f] if p.requires_grad]
                        _run_hooks(hooks, callable_of[f], "backward_pre_hooks", m)
                        grads = [None] * len(inputs)
                        if outputs[f] and inputs:
                            grads = torch.autograd.grad(
                                outputs[f], inputs, [torch.ones_like(o) for o in outputs[f]],
                                allow_unused=True)
                        _run_hooks(hooks, callable_of[f], "backward_hooks", m)
                        if not allow_unused_input and any(g is None for g in grads[:n_user]):
                            raise RuntimeError("The input tensor requires grad, but the grad is "
                                               "None after the backward pass.")
                        # Parameters the pass never reaches are no graph inputs (TE drops them
                        # after the first warm-up iteration so their hooks never fire).
                        if it == 0:
                            params_of[f] = tuple(p for p, g in zip(inputs[n_user:], grads[n_user:])
                                                 if g is not None)
                        for mod in set(m.modules()):
                            if getattr(mod, "need_backward_dw", None) and mod.need_backward_dw():
                                mod.backward_dw()
    finally:
        torch.set_rng_state(rng_state)
        set_all_rng_states(tracker_states)
        restore_fp8_tensors(modules, saved_fp8)
        set_capture_end()

    ret = []
    for f, c in fwd_passes:
        m = modules[c]
        flat_a, flat_k = flat_samples[f]
        spec = GraphSpec(
            module=m, kwargs_keys=tensor_keys[f],
            static_kwargs={k: v for k, v in sample_kwargs[f].items() if k not in tensor_keys[f]},
            num_user_args=len(flat_a) + len(flat_k), params=params_of[f],
            user_requires_grad=tuple(isinstance(t, torch.Tensor) and t.requires_grad
                                     for t in flat_a + flat_k),
            autocast_args=ac_args[id(m)], cache_quantized_params=cache_quantized_params,
            clone_param_grads=clone_param_grads_on_return, retain_graph=retain_graph_in_backward,
            allow_unused_input=allow_unused_input)
        fwd = make_graphed_forward(spec, m.training)
        if _order is None:
            m.forward = fwd
            ret.append(m)
        else:
            ret.append(fwd)
        attach_attributes(ret[-1], spec)
    return ret[0] if just_one else tuple(ret)

"""The replay side of te.make_graphed_callables (graph.py holds the entry point and validation).

A CUDA graph replays recorded kernels on static buffers. Without a graph, each "replay" here
runs the module's own forward again, under the autocast the graph was captured with, inside an
autograd Function shaped like TE's `Graphed`: one node whose backward computes the gradients of
the user inputs and parameters in one go, writes them into per-callable static gradient buffers
and returns clones (or the buffers themselves, TE's clone policy) to autograd.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from .fp8 import FP8GlobalStateManager, autocast


class GraphSpec:
    """What one captured forward pass fixed: its module, the autocast it ran under, which flat
    inputs (user args + kwargs + parameters) take gradients, and the gradient clone policy."""

    def __init__(
        self,
        module: torch.nn.Module,
        kwargs_keys: list[str],
        static_kwargs: dict[str, Any],
        num_user_args: int,
        params: tuple[torch.nn.Parameter, ...],
        user_requires_grad: tuple[bool, ...],
        autocast_args: dict[str, Any],
        cache_quantized_params: bool,
        clone_param_grads: bool,
        retain_graph: bool,
        allow_unused_input: bool,
    ) -> None:
        self.module = module
        self.kwargs_keys = kwargs_keys
        self.static_kwargs = static_kwargs
        self.num_user_args = num_user_args
        self.params = params
        self.user_requires_grad = user_requires_grad
        self.autocast_args = autocast_args
        self.cache_quantized_params = cache_quantized_params
        self.retain_graph = retain_graph
        self.allow_unused_input = allow_unused_input
        # TE's _returned_param_grad_clone_slots, fixed at capture (later attribute changes on the
        # parameters do not change it): a parameter's gradient is cloned unless the policy is
        # off or the parameter's lifetime is managed by delayed wgrad (skip_backward_post_hook).
        self.clone_slots = tuple(
            [False] * num_user_args
            + [clone_param_grads and not getattr(p, "skip_backward_post_hook", False)
               for p in params]
        )
        # allocated by the first backward
        self.static_grads: list[torch.Tensor | None] | None = None
        self.orig_forward: Callable[..., Any] = module.forward
        self.was_reset = False

    def run_forward(self, *args: Any, **kwargs: Any) -> Any:
        """The module's forward under the captured autocast (TE wraps the class's __call__ the
        same way while capturing)."""
        with autocast(**self.autocast_args):
            return self.orig_forward(*args, **kwargs)


class _Graphed(torch.autograd.Function):
    """TE's Graphed node. Inputs: the spec, a holder for the non-differentiable call pieces, then
    the flat tensors (user args + tensor kwargs + parameters) so autograd routes their grads."""

    @staticmethod
    def forward(ctx: Any, spec: GraphSpec, call: dict[str, Any], *flat: torch.Tensor) -> Any:
        ctx.spec = spec
        n = spec.num_user_args
        grad_mode = call["grad_enabled"]
        # Leaves for the inner graph: user inputs take gradients exactly when the sample inputs
        # did (TE captures the backward w.r.t. the sample's requires_grad pattern).
        leaves = []
        for t, req in zip(flat[:n], spec.user_requires_grad):
            leaf = t.detach()
            if isinstance(t, torch.Tensor) and req and grad_mode:
                leaf.requires_grad_(True)
            leaves.append(leaf)
        args = tree_unflatten(leaves[: call["num_args"]], call["args_spec"])
        kwargs = dict(call["other_kwargs"])
        kw_values = tree_unflatten(leaves[call["num_args"] :], call["kwargs_spec"])
        kwargs.update(zip(spec.kwargs_keys, kw_values))
        with torch.set_grad_enabled(grad_mode):
            out = spec.run_forward(*args, **kwargs)
        flat_out, out_spec = tree_flatten(out)
        call["out_spec"] = out_spec
        ctx.leaves = leaves
        ctx.graph_outputs = [
            o if isinstance(o, torch.Tensor) and o.requires_grad else None for o in flat_out
        ]
        return tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in flat_out)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        spec: GraphSpec = ctx.spec
        outs, grad_outs = [], []
        for o, g in zip(ctx.graph_outputs, grads):
            if o is not None:
                outs.append(o)
                grad_outs.append(g if g is not None else torch.zeros_like(o))
        targets = [(i, leaf) for i, leaf in enumerate(ctx.leaves) if leaf.requires_grad]
        targets += [(spec.num_user_args + j, p) for j, p in enumerate(spec.params)
                    if p.requires_grad]
        computed: list[torch.Tensor | None] = [None] * len(targets)
        if outs and targets:
            # The parameters are leaves of the inner graph too: their tensor hooks would fire here
            # and again when this node returns their grads. TE's graph replay fires them once
            # (on return), so they are held back while the inner gradients are computed.
            held = []
            for p in spec.params:
                hooks = getattr(p, "_backward_hooks", None)
                if hooks:
                    held.append((hooks, dict(hooks)))
                    hooks.clear()
            try:
                computed = list(torch.autograd.grad(
                    outs, [t for _, t in targets], grad_outs,
                    retain_graph=spec.retain_graph, allow_unused=True,
                ))
            finally:
                for hooks, saved in held:
                    hooks.update(saved)
        if not spec.retain_graph:
            ctx.graph_outputs = []
        # Static gradient buffers: TE's backward graph writes into the same tensors every replay;
        # returned gradients are clones of them or (clone policy off) the buffers themselves.
        n_slots = spec.num_user_args + len(spec.params)
        if spec.static_grads is None:
            spec.static_grads = [None] * n_slots
        result: list[torch.Tensor | None] = [None] * n_slots
        for (slot, _), g in zip(targets, computed):
            if g is None:
                if slot < spec.num_user_args and not spec.allow_unused_input:
                    raise RuntimeError("make_graphed_callables: an input requires grad, but its "
                                       "grad is None after the backward pass (pass "
                                       "allow_unused_input=True)")
                continue
            buf = spec.static_grads[slot]
            if buf is None or buf.shape != g.shape or buf.dtype != g.dtype:
                buf = spec.static_grads[slot] = torch.empty_like(g)
            buf.copy_(g)
            result[slot] = buf.detach().clone() if spec.clone_slots[slot] else buf.detach()
        return (None, None, *result)


def make_graphed_forward(spec: GraphSpec, training: bool) -> Callable[..., Any]:
    """The replacement forward: the graphed node while the module is in the training state it was
    captured in, its original forward otherwise (TE's new_fwd)."""

    def graphed(*user_args: Any, **user_kwargs: Any) -> Any:
        if spec.was_reset:
            raise RuntimeError("make_graphed_callables: the graph of this callable was reset; "
                               "build a new graphed callable")
        first = user_kwargs.get("is_first_microbatch")
        if spec.cache_quantized_params and not isinstance(first, bool):
            raise ValueError("`is_first_microbatch` boolean kwarg must be provided for FP8 weight "
                             "caching.")
        # Streams and events order replays on a GPU; CPU work runs in program order.
        user_kwargs.pop("cuda_graph_stream", None)
        user_kwargs.pop("cuda_graph_event", None)
        for key in spec.kwargs_keys:
            if key not in user_kwargs:
                raise TypeError(f"Graphed callable was initialized with kwarg {key} ,"
                                "but it was not provided in graph replay")
        flat_args, args_spec = tree_flatten(user_args)
        flat_kwargs, kwargs_spec = tree_flatten([user_kwargs[k] for k in spec.kwargs_keys])
        flat = flat_args + flat_kwargs
        if len(flat) != spec.num_user_args:
            raise ValueError(f"make_graphed_callables: replay got {len(flat)} tensor inputs, the "
                             f"graph was captured with {spec.num_user_args}")
        for i, t in enumerate(flat):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"make_graphed_callables: replay input {i}: expected a Tensor, got "
                                f"{type(t).__name__}")
        call = {
            "grad_enabled": torch.is_grad_enabled(),
            "num_args": len(flat_args),
            "args_spec": args_spec,
            "kwargs_spec": kwargs_spec,
            # As TE: a graph sees only the kwargs it was captured with (non-tensor ones take the
            # call's value when given); is_first_microbatch drives the weight-cast flag instead.
            "other_kwargs": {k: user_kwargs.get(k, v) for k, v in spec.static_kwargs.items()},
        }
        saved_skip = FP8GlobalStateManager.get_skip_fp8_weight_update_tensor()
        if spec.cache_quantized_params:
            FP8GlobalStateManager.set_skip_fp8_weight_update_tensor(
                not user_kwargs["is_first_microbatch"])
        try:
            out = _Graphed.apply(spec, call, *flat, *spec.params)
        finally:
            FP8GlobalStateManager.set_skip_fp8_weight_update_tensor(saved_skip)
        return tree_unflatten(list(out), call["out_spec"])

    def new_fwd(*user_args: Any, **user_kwargs: Any) -> Any:
        if spec.module.training == training:
            return graphed(*user_args, **user_kwargs)
        return spec.orig_forward(*user_args, **user_kwargs)

    return new_fwd


def te_submodules(module: torch.nn.Module) -> list[torch.nn.Module]:
    from .module.base import TransformerEngineBaseModule

    return [m for m in module.modules() if isinstance(m, TransformerEngineBaseModule)]


def attach_attributes(target: Any, spec: GraphSpec) -> None:
    """TE's backward_dw / reset attributes of each graphed callable."""

    def backward_dw() -> None:
        # TE replays the captured wgrad graph of modules with delay_wgrad_compute; here their
        # queued weight-gradient jobs run.
        for m in te_submodules(spec.module):
            if m.need_backward_dw():
                m.backward_dw()

    def reset() -> None:
        spec.static_grads = None
        spec.was_reset = True

    target.backward_dw = backward_dw
    target.reset = reset

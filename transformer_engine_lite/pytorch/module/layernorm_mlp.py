"""te.LayerNormMLP: norm -> fc1 -> activation -> fc2, TE's constructor, outputs and parameter names."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..checkpoint import checkpoint as checkpoint_fn
from ..distributed import (
    TPConfig,
    gather_along_first_dim,
    set_tensor_model_parallel_attributes,
    split_size,
)
from ._autograd import activation as apply_activation
from .userbuffers import module_ub_config
from ._params import materialize_params
from .base import (
    TransformerEngineBaseModule,
    default_device,
    get_default_init_method,
    reject_unsupported,
)
from .layernorm import (
    _check_eps,
    apply_norm,
    check_normalization,
    make_norm_params,
    reset_norm_params,
)

__all__ = ["ACTIVATIONS", "GATED_ACTIVATIONS", "LayerNormMLP"]

ACTIVATIONS = (
    "gelu",
    "geglu",
    "qgelu",
    "qgeglu",
    "relu",
    "reglu",
    "srelu",
    "sreglu",
    "silu",
    "swiglu",
    "glu",
    "clamped_swiglu",
)
GATED_ACTIVATIONS = ("geglu", "qgeglu", "reglu", "sreglu", "swiglu", "glu", "clamped_swiglu")
# activation_params each activation takes (TE's names), with defaults (GPT-OSS's clamped SwiGLU).
ACTIVATION_PARAMS: dict[str, dict[str, float]] = {
    "clamped_swiglu": {"limit": 7.0, "alpha": 1.702, "glu_linear_offset": 1.0}
}


def resolve_activation_params(owner: str, activation: str, params: Any) -> dict[str, float]:
    """activation_params checked against what `activation` takes: unknown keys are refused (a
    parameter that would be ignored), missing ones take the defaults."""
    allowed = ACTIVATION_PARAMS.get(activation, {})
    if params is None:
        return dict(allowed)
    if not isinstance(params, dict):
        raise TypeError(
            f"{owner}: activation_params: expected a dict or None, got {type(params).__name__}"
        )
    unknown = sorted(k for k in params if k not in allowed)
    if unknown:
        raise ValueError(
            f"{owner}: activation_params: {activation!r} takes "
            f"{sorted(allowed) or 'no parameters'}, got {unknown}"
        )
    out = dict(allowed)
    for k, v in params.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise ValueError(
                f"{owner}: activation_params[{k!r}]: expected a finite number, got {v!r}"
            )
        out[k] = float(v)
    if activation == "clamped_swiglu" and out["limit"] <= 0:
        raise ValueError(f"{owner}: activation_params['limit']: expected > 0, got {out['limit']}")
    return out


def clamped_swiglu(h: torch.Tensor, limit: float, alpha: float,
                   glu_linear_offset: float = 1.0) -> torch.Tensor:
    """TE's clamped SwiGLU (GPT-OSS) on [..., 2H] = [a | b]: a' = min(a, limit),
    b' = clamp(b, -limit, limit); out = a' * sigmoid(alpha * a') * (b' + glu_linear_offset) (the
    core's nvte_clamped_swiglu_v2, fp32 math, differentiable)."""
    return torch.ops.te_lite.clamped_swiglu_fwd(
        h.contiguous(), limit, alpha, glu_linear_offset=glu_linear_offset
    )[0]


class LayerNormMLP(TransformerEngineBaseModule):
    """y = fc2(act(fc1(norm(x)))) (TE's `transformer_engine.pytorch.LayerNormMLP`).

    hidden_size, ffn_hidden_size; activation: one of ACTIVATIONS; gated ones (geglu, ...) make fc1
    produce 2 * ffn_hidden_size features laid out [act input | linear] (TE's convention).
    activation_params: clamped_swiglu's {"limit", "alpha", "glu_linear_offset"} (default 7.0,
    1.702, 1.0); other
    activations take none. checkpoint=True: keep only the input and recompute the activations in
    the backward (TE's selective activation checkpointing; FP8 included).
    delay_wgrad_compute=True: the backward computes input gradients only; backward_dw() then
    computes the weight gradients (TE's split backward for pipeline schedules).
    set_parallel_mode=True: fc1 column parallel, fc2 row parallel over tp_group. Other arguments
    as LayerNormLinear; output_layer_init_method initializes fc2 (default: init_method).
    seq_length and micro_batch_size are TE's userbuffer shape hints: accepted, unused.
    Parameters: layer_norm_weight, layer_norm_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias.
    Returns out, then fc2's bias if return_bias, then the norm output if return_layernorm_output.
    """

    _WORKSPACE_NAMES = ("fc1_weight", "fc2_weight")  # TE's _fp8_workspaces keys

    _role_gemm_names = ("fc1", "fc2")  # CustomRecipe role names "<name>.fc1" (module/_custom.py)

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        eps: float = 1e-5,
        sequence_parallel: bool = False,
        return_bias: bool = False,
        get_rng_state_tracker: Callable[[], Any] | None = None,
        tp_group: Any = None,
        tp_size: int = 1,
        init_method: Callable[[torch.Tensor], Any] | None = None,
        bias: bool = True,
        normalization: str = "LayerNorm",
        activation: str = "gelu",
        output_layer_init_method: Callable[[torch.Tensor], Any] | None = None,
        fuse_wgrad_accumulation: bool = False,
        params_dtype: torch.dtype | None = None,
        return_layernorm_output: bool = False,
        return_layernorm_output_gathered: bool = False,
        seq_length: int | None = None,
        micro_batch_size: int | None = None,
        set_parallel_mode: bool = False,
        zero_centered_gamma: bool = False,
        device: Any = None,
        ub_overlap_ag: bool = False,
        name: str | None = None,
        ub_overlap_rs: bool = False,
        ub_overlap_rs_dgrad: bool = False,
        ub_bulk_dgrad: bool = False,
        ub_bulk_wgrad: bool = False,
        delay_wgrad_compute: bool = False,
        symmetric_ar_type: str | None = None,
        activation_params: dict | None = None,
        checkpoint: bool = False,
    ) -> None:
        owner = "LayerNormMLP"
        reject_unsupported(owner, symmetric_ar_type=symmetric_ar_type)
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"{owner}: activation: expected one of {ACTIVATIONS}, got {activation!r}"
            )
        self.activation_params = resolve_activation_params(owner, activation, activation_params)
        self.checkpoint = bool(checkpoint)
        for arg, v in (("hidden_size", hidden_size), ("ffn_hidden_size", ffn_hidden_size)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{owner}: {arg}: expected an int >= 1, got {v!r}")
        device = torch.device(device) if device is not None else default_device()
        super().__init__(num_gemms=2, device=device, name=name)
        self.set_parallel_mode = set_parallel_mode
        self.tp = TPConfig(
            owner, "column" if set_parallel_mode else None, tp_group, tp_size, sequence_parallel
        )
        self.hidden_size = hidden_size
        self.ffn_hidden_size = ffn_hidden_size
        self.eps = _check_eps(owner, eps)
        self.normalization = check_normalization(owner, normalization)
        self.activation = activation
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self.sequence_parallel = self.tp.sequence_parallel
        self.tp_size = self.tp.size
        # fc1 (column) all-gathers its input / fc2 (row) reduce-scatters its output; TE names
        # their communicators fc1_* / fc2_* (no ub_name)
        module_ub_config(
            owner, parallel_mode="column" if set_parallel_mode else None, mlp=True,
            sequence_parallel=self.sequence_parallel, tp_size=self.tp_size, ub_name=None,
            delay_wgrad_compute=bool(delay_wgrad_compute), ub_overlap_ag=ub_overlap_ag,
            ub_overlap_rs=ub_overlap_rs, ub_overlap_rs_dgrad=ub_overlap_rs_dgrad,
            ub_bulk_dgrad=ub_bulk_dgrad, ub_bulk_wgrad=ub_bulk_wgrad,
        ).apply_to(self, None, mlp=True)
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.delay_wgrad_compute = bool(delay_wgrad_compute)
        self.use_bias = bias
        self.return_bias = return_bias
        self.return_layernorm_output = return_layernorm_output
        self.return_layernorm_output_gathered = return_layernorm_output_gathered
        self.seq_length, self.micro_batch_size = seq_length, micro_batch_size
        self.params_dtype = params_dtype or torch.get_default_dtype()
        self.init_method = init_method or get_default_init_method()
        self.output_layer_init_method = output_layer_init_method or self.init_method
        self.get_rng_state_tracker = get_rng_state_tracker
        tp = self.tp.size if set_parallel_mode else 1
        self.size_per_partition = split_size(owner, "ffn_hidden_size", ffn_hidden_size, tp)
        fc1_out = self.size_per_partition * (2 if activation in GATED_ACTIVATIONS else 1)
        dt = self.params_dtype
        make_norm_params(
            self,
            "layer_norm_",
            self.normalization,
            hidden_size,
            dt,
            device,
            self.sequence_parallel,
        )
        self.fc1_weight = self._new_param((fc1_out, hidden_size), dt, device)
        self.fc1_bias = self._new_param((fc1_out,), dt, device) if bias else None
        self.fc2_weight = self._new_param((hidden_size, self.size_per_partition), dt, device)
        # fc2 is row parallel: its bias is added after the reduction and is not split.
        self.fc2_bias = self._new_param((hidden_size,), dt, device) if bias else None
        if self.fc2_bias is not None:
            # partial gradient under sequence parallelism (see Linear)
            self.fc2_bias.sequence_parallel = self.sequence_parallel
        self.reset_parameters(defer_init=device.type == "meta")  # TE: "meta" defers init

    def reset_parameters(self, defer_init: bool = False) -> None:
        if defer_init:
            return
        materialize_params(self)  # TE's deferred init: "meta" parameters are allocated here
        reset_norm_params(self, "layer_norm_", self.zero_centered_gamma)
        tracker = self.get_rng_state_tracker if self.tp.size > 1 else None
        self._init_weight(self.fc1_weight, self.init_method, tracker)
        self._init_weight(self.fc2_weight, self.output_layer_init_method, tracker)
        with torch.no_grad():
            for b in (self.fc1_bias, self.fc2_bias):
                if b is not None and b.device.type != "meta":
                    b.zero_()
        # TE's TP tags: fc1 column parallel (dim 0, its bias too), fc2 row parallel (dim 1).
        set_tensor_model_parallel_attributes(self.fc1_weight, True, 0, 1)
        set_tensor_model_parallel_attributes(self.fc2_weight, True, 1, 1)
        if self.fc1_bias is not None:
            set_tensor_model_parallel_attributes(self.fc1_bias, True, 0, 1)

    def set_tensor_parallel_group(self, tp_group: Any) -> None:
        mode = "column" if self.set_parallel_mode else None
        tp = TPConfig("LayerNormMLP", mode, tp_group, 1, self.sequence_parallel)
        if self.set_parallel_mode and tp.size != self.tp.size:
            raise ValueError(
                f"LayerNormMLP: set_tensor_parallel_group: group size {tp.size} differs from the "
                f"tp_size {self.tp.size} the parameters were split for"
            )
        self.tp = tp

    def forward(self, inp: torch.Tensor, is_first_microbatch: bool | None = None) -> Any:
        if self.checkpoint and torch.is_grad_enabled():
            # Selective activation checkpointing: only the input is kept; norm, fc1, activation
            # (and fc2) run again in the backward, with the forward's FP8 scales (checkpoint.py).
            return checkpoint_fn(self._forward, inp, is_first_microbatch, use_reentrant=False)
        return self._forward(inp, is_first_microbatch)

    def _activation(self, h: torch.Tensor) -> torch.Tensor:
        if self.activation == "clamped_swiglu":
            p = self.activation_params
            return clamped_swiglu(h, p["limit"], p["alpha"], p["glu_linear_offset"])
        return apply_activation(h, self.activation)

    def _forward(self, inp: torch.Tensor, is_first_microbatch: bool | None = None) -> Any:
        owner = "LayerNormMLP"
        x, fp8 = self._prepare_input(owner, inp, self.hidden_size, "hidden_size")
        ln_out = apply_norm(
            x,
            self.layer_norm_weight,
            self.layer_norm_bias,
            self.normalization,
            self.eps,
            self.zero_centered_gamma,
        )
        ln_local = ln_out
        parallel = self.set_parallel_mode and self.tp.size > 1
        gathered = False
        if parallel and self.tp.sequence_parallel:
            ln_out = gather_along_first_dim(ln_out, self.tp.group)
            gathered = True
        fuse = self.fuse_wgrad_accumulation
        fc1_mode = "column" if self.set_parallel_mode else None
        fc2_mode = "row" if self.set_parallel_mode else None
        h = self._run_linear(
            ln_out,
            self.fc1_weight,
            self.fc1_bias,
            0,
            fc1_mode,
            self.tp,
            fp8,
            add_bias=True,
            main_grad=self._main_grad(owner, fuse, self.fc1_weight),
            input_gathered=gathered,
            is_first_microbatch=is_first_microbatch,
        )
        h = self._activation(h)
        y = self._run_linear(
            h,
            self.fc2_weight,
            self.fc2_bias,
            1,
            fc2_mode,
            self.tp,
            fp8,
            add_bias=not self.return_bias,
            main_grad=self._main_grad(owner, fuse, self.fc2_weight),
            is_first_microbatch=is_first_microbatch,
        )
        outs: list[Any] = [y]
        if self.return_bias:
            outs.append(self.fc2_bias.to(x.dtype) if self.fc2_bias is not None else None)
        if self.return_layernorm_output:
            outs.append(ln_out if self.return_layernorm_output_gathered else ln_local)
        return outs[0] if len(outs) == 1 else tuple(outs)

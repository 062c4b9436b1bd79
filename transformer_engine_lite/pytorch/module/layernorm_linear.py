"""te.LayerNormLinear: LayerNorm/RMSNorm followed by a Linear, TE's constructor and outputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..distributed import (
    TPConfig,
    gather_along_first_dim,
    set_tensor_model_parallel_attributes,
    split_size,
)
from ._params import materialize_params
from .userbuffers import module_ub_config
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
from .linear import resolve_parameters_split

__all__ = ["LayerNormLinear"]


class LayerNormLinear(TransformerEngineBaseModule):
    """y = norm(x) W^T + b (TE's `transformer_engine.pytorch.LayerNormLinear`).

    Arguments as Linear plus: eps, normalization ("LayerNorm" / "RMSNorm"), zero_centered_gamma,
    return_layernorm_output (also return the norm's output, as TE: (out[, bias], ln_out)) and
    return_layernorm_output_gathered (with sequence parallelism, return the all-gathered one).
    Parameters: layer_norm_weight, layer_norm_bias (LayerNorm only), weight, bias.
    parallel_mode "row" is not supported (the norm needs the whole hidden dim on each rank).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        eps: float = 1e-5,
        sequence_parallel: bool = False,
        fuse_wgrad_accumulation: bool = False,
        tp_group: Any = None,
        tp_size: int = 1,
        get_rng_state_tracker: Callable[[], Any] | None = None,
        rng_tracker_name: str | None = None,
        init_method: Callable[[torch.Tensor], Any] | None = None,
        bias: bool = True,
        normalization: str = "LayerNorm",
        return_bias: bool = False,
        params_dtype: torch.dtype | None = None,
        parallel_mode: str | None = None,
        return_layernorm_output: bool = False,
        return_layernorm_output_gathered: bool = False,
        parameters_split: Any = None,
        zero_centered_gamma: bool = False,
        device: Any = None,
        ub_overlap_ag: bool = False,
        ub_overlap_rs_dgrad: bool = False,
        ub_bulk_wgrad: bool = False,
        ub_bulk_dgrad: bool = False,
        ub_name: str | None = None,
        delay_wgrad_compute: bool = False,
        symmetric_ar_type: str | None = None,
        name: str | None = None,
    ) -> None:
        owner = "LayerNormLinear"
        reject_unsupported(owner, symmetric_ar_type=symmetric_ar_type)
        if parallel_mode == "row":
            raise NotImplementedError(
                f"{owner}: parallel_mode='row' is not supported (the norm needs the whole hidden "
                "dim); use Linear for a row-parallel GEMM"
            )
        for arg, v in (("in_features", in_features), ("out_features", out_features)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{owner}: {arg}: expected an int >= 1, got {v!r}")
        device = torch.device(device) if device is not None else default_device()
        super().__init__(num_gemms=1, device=device, name=name)
        self.tp = TPConfig(owner, parallel_mode, tp_group, tp_size, sequence_parallel)
        self.in_features = in_features
        self.out_features = out_features
        self.eps = _check_eps(owner, eps)
        self.normalization = check_normalization(owner, normalization)
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self.parallel_mode = parallel_mode
        self.sequence_parallel = self.tp.sequence_parallel
        self.tp_size = self.tp.size
        module_ub_config(
            owner, parallel_mode=parallel_mode, sequence_parallel=self.sequence_parallel,
            tp_size=self.tp_size, ub_name=ub_name, delay_wgrad_compute=bool(delay_wgrad_compute),
            ub_overlap_ag=ub_overlap_ag, ub_overlap_rs_dgrad=ub_overlap_rs_dgrad,
            ub_bulk_dgrad=ub_bulk_dgrad, ub_bulk_wgrad=ub_bulk_wgrad,
        ).apply_to(self, ub_name)
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.delay_wgrad_compute = bool(delay_wgrad_compute)
        self.use_bias = bias
        self.return_bias = return_bias
        self.return_layernorm_output = return_layernorm_output
        self.return_layernorm_output_gathered = return_layernorm_output_gathered
        self.params_dtype = params_dtype or torch.get_default_dtype()
        self.init_method = init_method or get_default_init_method()
        self.get_rng_state_tracker = get_rng_state_tracker
        self.rng_tracker_name = rng_tracker_name
        make_norm_params(
            self,
            "layer_norm_",
            self.normalization,
            in_features,
            self.params_dtype,
            device,
            self.sequence_parallel,
        )
        col = parallel_mode == "column" and self.tp.size > 1
        splits = resolve_parameters_split(owner, parameters_split, out_features)
        if splits is not None and fuse_wgrad_accumulation:
            raise NotImplementedError(
                f"{owner}: fuse_wgrad_accumulation with parameters_split is not supported"
            )
        splits = splits or [("", out_features)]
        self.weight_names: list[str] = []
        self.bias_names: list[str] = []
        for prefix, size in splits:
            local = split_size(owner, f"output split '{prefix or 'weight'}'", size, self.tp.size)
            local = local if col else size
            wname = f"{prefix}_weight" if prefix else "weight"
            bname = f"{prefix}_bias" if prefix else "bias"
            self.register_parameter(
                wname, self._new_param((local, in_features), self.params_dtype, device)
            )
            self.weight_names.append(wname)
            if bias:
                self.register_parameter(bname, self._new_param((local,), self.params_dtype, device))
                self.bias_names.append(bname)
            else:
                self.register_parameter(bname, None)
        self.reset_parameters(defer_init=device.type == "meta")  # TE: "meta" defers init

    def reset_parameters(self, defer_init: bool = False) -> None:
        if defer_init:
            return
        materialize_params(self)  # TE's deferred init: "meta" parameters are allocated here
        reset_norm_params(self, "layer_norm_", self.zero_centered_gamma)
        tracker = self.get_rng_state_tracker if self.tp.size > 1 else None
        for wname in self.weight_names:
            self._init_weight(
                getattr(self, wname), self.init_method, tracker, self.rng_tracker_name
            )
        with torch.no_grad():
            for bname in self.bias_names:
                b = getattr(self, bname)
                if b.device.type != "meta":
                    b.zero_()
        self._set_tp_attributes()

    def _set_tp_attributes(self) -> None:
        # TE's tags (distributed.set_tensor_model_parallel_attributes): weights are always marked
        # parallel, split along dim 1 (row) or 0; column-parallel biases are split along dim 0.
        for wname in self.weight_names:
            set_tensor_model_parallel_attributes(
                getattr(self, wname), True, 1 if self.parallel_mode == "row" else 0, 1
            )
        if self.parallel_mode == "column":
            for bname in self.bias_names:
                set_tensor_model_parallel_attributes(getattr(self, bname), True, 0, 1)

    def set_tensor_parallel_group(self, tp_group: Any) -> None:
        tp = TPConfig("LayerNormLinear", self.parallel_mode, tp_group, 1, self.sequence_parallel)
        if tp.size != self.tp.size:
            raise ValueError(
                f"LayerNormLinear: set_tensor_parallel_group: group size {tp.size} differs from "
                f"the tp_size {self.tp.size} the parameters were split for"
            )
        self.tp = tp

    def forward(
        self,
        inp: torch.Tensor,
        is_first_microbatch: bool | None = None,
        fp8_output: bool = False,
        fp8_grad: bool = False,
    ) -> Any:
        owner = "LayerNormLinear"
        reject_unsupported(f"{owner}.forward", fp8_output=fp8_output, fp8_grad=fp8_grad)
        x, fp8 = self._prepare_input(owner, inp, self.in_features, "in_features")
        ln_out = apply_norm(
            x,
            self.layer_norm_weight,
            self.layer_norm_bias,
            self.normalization,
            self.eps,
            self.zero_centered_gamma,
        )
        ln_local = ln_out
        gathered = False
        if self.tp.size > 1 and self.parallel_mode == "column" and self.tp.sequence_parallel:
            ln_out = gather_along_first_dim(ln_out, self.tp.group)
            gathered = True
        ws = [getattr(self, n) for n in self.weight_names]
        weight = ws[0] if len(ws) == 1 else torch.cat(ws, 0)
        bias = None
        if self.use_bias:
            bs = [getattr(self, n) for n in self.bias_names]
            bias = bs[0] if len(bs) == 1 else torch.cat(bs, 0)
        main_grad = self._main_grad(owner, self.fuse_wgrad_accumulation, weight)
        y = self._run_linear(
            ln_out,
            weight,
            bias,
            0,
            self.parallel_mode,
            self.tp,
            fp8,
            add_bias=not self.return_bias,
            main_grad=main_grad,
            input_gathered=gathered,
            is_first_microbatch=is_first_microbatch,
        )
        outs: list[Any] = [y]
        if self.return_bias:
            outs.append(bias.to(x.dtype) if bias is not None else None)
        if self.return_layernorm_output:
            outs.append(ln_out if self.return_layernorm_output_gathered else ln_local)
        return outs[0] if len(outs) == 1 else tuple(outs)

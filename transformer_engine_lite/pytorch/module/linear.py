"""te.Linear: y = x @ W^T + b with TE's constructor, FP8 recipes and tensor parallelism."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..distributed import TPConfig, set_tensor_model_parallel_attributes, split_size
from ._params import materialize_params
from .userbuffers import module_ub_config
from .base import (
    TransformerEngineBaseModule,
    default_device,
    get_default_init_method,
    reject_unsupported,
)

__all__ = ["Linear", "resolve_parameters_split"]


def resolve_parameters_split(
    owner: str, parameters_split: Any, out_features: int
) -> list[tuple[str, int]] | None:
    """TE's parameters_split: None, a tuple/list of names (equal split) or a dict name -> size.
    Returns [(name prefix, size)] with TE's names: "query_" -> "query_weight", "query_bias"."""
    if parameters_split is None:
        return None
    if isinstance(parameters_split, dict):
        items = list(parameters_split.items())
    elif isinstance(parameters_split, (tuple, list)):
        n = len(parameters_split)
        if n == 0 or out_features % n:
            raise ValueError(
                f"{owner}: parameters_split: {n} names cannot split out_features={out_features} "
                "equally"
            )
        items = [(name, out_features // n) for name in parameters_split]
    else:
        raise TypeError(
            f"{owner}: parameters_split: expected None, a tuple/list of names or a dict name -> "
            f"size, got {type(parameters_split).__name__}"
        )
    if sum(size for _, size in items) != out_features:
        raise ValueError(
            f"{owner}: parameters_split: sizes {[s for _, s in items]} must add up to "
            f"out_features={out_features}"
        )
    names = [str(name).rstrip("_") for name, _ in items]
    if len(set(names)) != len(names) or any(not n for n in names):
        raise ValueError(
            f"{owner}: parameters_split: names must be non-empty and distinct: {names}"
        )
    return [(name, size) for name, (_, size) in zip(names, items)]


class Linear(TransformerEngineBaseModule):
    """Applies y = x W^T + b (TE's `transformer_engine.pytorch.Linear`).

    in_features, out_features: sizes before tensor-parallel splitting.
    bias: learn an additive bias. return_bias: return (y, bias) without adding it (fusing it later).
    params_dtype: dtype of the parameters (default torch.get_default_dtype()).
    device: where parameters live (default "cuda" when a GPU is present, else "cpu"; "meta" defers
        initialization to reset_parameters()).
    init_method: callable initializing the weight (default normal(0, 0.023)); bias starts at 0.
    parameters_split: split the weight (and bias) into named parameters along the output dim.
    fuse_wgrad_accumulation: accumulate weight gradients into `weight.main_grad` (fp32) instead of
        returning them in `.grad`.
    parallel_mode: None, "column" or "row"; tp_group / tp_size: tensor-parallel group;
        sequence_parallel: sequence-sharded activations around the GEMM (see distributed.py).
    get_rng_state_tracker, rng_tracker_name: RNG tracker forked around weight initialization.
    The forward accepts TE's is_first_microbatch (True: cast the weight to FP8 and cache the cast in
    _fp8_workspaces["weight"], re-quantized in place on later first microbatches;
    False: reuse it, for the later microbatches of a gradient-accumulation step; None: no cache),
    fp8_output and fp8_grad (FP8 outputs: not supported).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        sequence_parallel: bool = False,
        fuse_wgrad_accumulation: bool = False,
        tp_group: Any = None,
        tp_size: int = 1,
        get_rng_state_tracker: Callable[[], Any] | None = None,
        rng_tracker_name: str | None = None,
        init_method: Callable[[torch.Tensor], Any] | None = None,
        bias: bool = True,
        return_bias: bool = False,
        params_dtype: torch.dtype | None = None,
        parallel_mode: str | None = None,
        parameters_split: Any = None,
        device: Any = None,
        ub_overlap_ag: bool = False,
        ub_overlap_rs: bool = False,
        ub_overlap_rs_dgrad: bool = False,
        ub_bulk_dgrad: bool = False,
        ub_bulk_wgrad: bool = False,
        ub_name: str | None = None,
        delay_wgrad_compute: bool = False,
        symmetric_ar_type: str | None = None,
        save_original_input: bool = False,
        name: str | None = None,
    ) -> None:
        owner = "Linear"
        reject_unsupported(owner, symmetric_ar_type=symmetric_ar_type)
        for arg, v in (("in_features", in_features), ("out_features", out_features)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{owner}: {arg}: expected an int >= 1, got {v!r}")
        device = torch.device(device) if device is not None else default_device()
        super().__init__(num_gemms=1, device=device, name=name)
        self.tp = TPConfig(owner, parallel_mode, tp_group, tp_size, sequence_parallel)
        self.in_features = in_features
        self.out_features = out_features
        self.parallel_mode = parallel_mode
        self.sequence_parallel = self.tp.sequence_parallel
        self.tp_size = self.tp.size
        module_ub_config(
            owner, parallel_mode=parallel_mode, sequence_parallel=self.sequence_parallel,
            tp_size=self.tp_size, ub_name=ub_name, delay_wgrad_compute=bool(delay_wgrad_compute),
            ub_overlap_ag=ub_overlap_ag, ub_overlap_rs=ub_overlap_rs,
            ub_overlap_rs_dgrad=ub_overlap_rs_dgrad, ub_bulk_dgrad=ub_bulk_dgrad,
            ub_bulk_wgrad=ub_bulk_wgrad,
        ).apply_to(self, ub_name)
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.delay_wgrad_compute = bool(delay_wgrad_compute)
        self.save_original_input = bool(save_original_input)
        self.use_bias = bias
        self.return_bias = return_bias
        self.params_dtype = params_dtype or torch.get_default_dtype()
        self.init_method = init_method or get_default_init_method()
        self.get_rng_state_tracker = get_rng_state_tracker
        self.rng_tracker_name = rng_tracker_name
        tp = max(1, self.tp.size)
        col = parallel_mode == "column" and tp > 1
        self.in_features_local = (
            split_size(owner, "in_features", in_features, tp)
            if parallel_mode == "row" and tp > 1
            else in_features
        )
        splits = resolve_parameters_split(owner, parameters_split, out_features)
        if splits is not None and fuse_wgrad_accumulation:
            raise NotImplementedError(
                f"{owner}: fuse_wgrad_accumulation with parameters_split is not supported"
            )
        splits = splits or [("", out_features)]
        self.weight_names: list[str] = []
        self.bias_names: list[str] = []
        self._split_sizes: list[int] = []
        for prefix, size in splits:
            local = (
                split_size(owner, f"output split '{prefix or 'weight'}'", size, tp) if col else size
            )
            wname = f"{prefix}_weight" if prefix else "weight"
            bname = f"{prefix}_bias" if prefix else "bias"
            self.register_parameter(
                wname, self._new_param((local, self.in_features_local), self.params_dtype, device)
            )
            self.weight_names.append(wname)
            self._split_sizes.append(local)
            if bias:
                # Row parallel: the bias is added after the reduction, so it is not split.
                b = self._new_param((local,), self.params_dtype, device)
                # Row parallel + sequence parallel: each rank sees a slice of the tokens, so the
                # bias gradient is partial (TE flags it; allreduce_sequence_parallel_grads sums).
                b.sequence_parallel = parallel_mode == "row" and self.sequence_parallel
                self.register_parameter(bname, b)
                self.bias_names.append(bname)
            else:
                self.register_parameter(bname, None)
        self.out_features_local = sum(self._split_sizes)
        self.reset_parameters(defer_init=device.type == "meta")  # TE: "meta" defers init

    def reset_parameters(self, defer_init: bool = False) -> None:
        """(Re)initialize the parameters (after device="meta": materialize with to_empty first)."""
        if defer_init:
            return
        materialize_params(self)  # TE's deferred init: "meta" parameters are allocated here
        for wname in self.weight_names:
            self._init_weight(
                getattr(self, wname), self.init_method, self._rng_tracker(), self.rng_tracker_name
            )
        with torch.no_grad():
            for bname in self.bias_names:
                b = getattr(self, bname)
                if b.device.type != "meta":
                    b.zero_()
        self._set_tp_attributes()

    def _rng_tracker(self) -> Callable[[], Any] | None:
        return self.get_rng_state_tracker if self.tp.size > 1 else None

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
        """Set the TP group after construction (TE API); the local sizes must not change."""
        tp = TPConfig("Linear", self.parallel_mode, tp_group, 1, self.sequence_parallel)
        if tp.size != self.tp.size:
            raise ValueError(
                f"Linear: set_tensor_parallel_group: group size {tp.size} differs from the "
                f"tp_size {self.tp.size} the parameters were split for"
            )
        self.tp = tp

    def _weight_and_bias(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        ws = [getattr(self, n) for n in self.weight_names]
        w = ws[0] if len(ws) == 1 else torch.cat(ws, 0)
        if not self.use_bias:
            return w, None
        bs = [getattr(self, n) for n in self.bias_names]
        return w, bs[0] if len(bs) == 1 else torch.cat(bs, 0)

    def forward(
        self,
        inp: torch.Tensor,
        is_first_microbatch: bool | None = None,
        fp8_output: bool = False,
        fp8_grad: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]:
        reject_unsupported("Linear.forward", fp8_output=fp8_output, fp8_grad=fp8_grad)
        x, fp8 = self._prepare_input(
            "Linear", inp, self.in_features_local, "in_features per TP rank"
        )
        weight, bias = self._weight_and_bias()
        main_grad = self._main_grad("Linear", self.fuse_wgrad_accumulation, weight)
        y = self._run_linear(
            x,
            weight,
            bias,
            0,
            self.parallel_mode,
            self.tp,
            fp8,
            add_bias=not self.return_bias,
            main_grad=main_grad,
            is_first_microbatch=is_first_microbatch,
        )
        if self.return_bias:
            return y, (bias.to(x.dtype) if bias is not None else None)
        return y

"""TE's FusedAdam: Adam / AdamW (multi_tensor.h's formula, torch's update in fp32) over all the
parameters of a kind in one multi-tensor call, with TE's options: fp32 / fp16 master weights,
exp_avg and exp_avg_sq stored as fp32 / fp16 / bf16 / FP8 (uint8) with a per-tensor scale, BF16
master remainders (store_param_remainders), Float8Tensor parameters updated in place, capturable
(lr and step as tensors), decoupled gradients."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from copy import deepcopy
from itertools import chain
from typing import Any, Callable, Optional

import torch

from . import _ops
from .multi_tensor_apply import multi_tensor_applier

_STATE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.uint8)
_STATES = ("exp_avg", "exp_avg_sq", "master_param")


def _float8_classes() -> tuple[type, type]:
    from ..tensor.float8_tensor import Float8Quantizer, Float8Tensor

    return Float8Tensor, Float8Quantizer


def get_fp8_meta(fp8_tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(scale, amax, scale_inv) of a Float8Tensor parameter."""
    float8_tensor, _ = _float8_classes()
    if not isinstance(fp8_tensor, float8_tensor):
        raise TypeError(f"FusedAdam: expected a Float8Tensor, got {type(fp8_tensor).__name__}")
    if fp8_tensor._quantizer is None:
        raise RuntimeError("FusedAdam: FP8 quantizer data is not initialized")
    q = fp8_tensor._quantizer
    return q.scale, q.amax, fp8_tensor._scale_inv


class FusedAdam(torch.optim.Optimizer):
    """Adam (adam_w_mode=False: torch.optim.Adam's L2 weight decay) or AdamW (default), fused.
    TE's arguments; amsgrad is not supported (RuntimeError, as TE)."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter | dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        bias_correction: bool = True,
        adam_w_mode: bool = True,
        capturable: bool = False,
        master_weights: bool = False,
        master_weight_dtype: torch.dtype = torch.float32,
        exp_avg_dtype: torch.dtype = torch.float32,
        exp_avg_sq_dtype: torch.dtype = torch.float32,
        use_decoupled_grad: bool = False,
        store_param_remainders: bool = False,
        set_grad_none: Optional[bool] = None,  # deprecated
    ) -> None:
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        if master_weights and master_weight_dtype not in (torch.float32, torch.float16):
            raise ValueError(f"FusedAdam: master_weight_dtype: expected torch.float32 or "
                             f"torch.float16, got {master_weight_dtype}")
        for name, dt in (("exp_avg_dtype", exp_avg_dtype), ("exp_avg_sq_dtype", exp_avg_sq_dtype)):
            if dt not in _STATE_DTYPES:
                raise ValueError(f"FusedAdam: {name}: expected one of torch.float32, "
                                 f"torch.float16, torch.bfloat16, torch.uint8 (FP8), got {dt}")
        if capturable:
            for name, dt in (("master_weight_dtype", master_weight_dtype if master_weights
                              else torch.float32), ("exp_avg_dtype", exp_avg_dtype),
                             ("exp_avg_sq_dtype", exp_avg_sq_dtype)):
                if dt != torch.float32:
                    raise ValueError(f"FusedAdam: {name}: capturable mode needs torch.float32, "
                                     f"got {dt}")
            if store_param_remainders:
                raise ValueError("FusedAdam: store_param_remainders: not supported with "
                                 "capturable=True")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"FusedAdam: betas: expected both in [0, 1), got {betas}")
        lr = torch.tensor(lr, dtype=torch.float32) if capturable else lr
        defaults = {"lr": lr, "bias_correction": bias_correction, "betas": betas, "eps": eps,
                    "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.capturable = capturable
        self.master_weights = master_weights
        device = self.param_groups[0]["params"][0].device
        if capturable:
            for group in self.param_groups:
                if group["params"]:
                    group["lr"] = group["lr"].to(group["params"][0].device)
            self._step_supports_amp_scaling = True
        self._dummy_overflow_buf = torch.zeros(1, dtype=torch.int, device=device)
        self.multi_tensor_adam = _ops.multi_tensor_adam
        self.multi_tensor_adam_param_remainder = _ops.multi_tensor_adam_param_remainder
        self.multi_tensor_adam_fp8 = _ops.multi_tensor_adam_fp8
        self.multi_tensor_adam_capturable = _ops.multi_tensor_adam_capturable
        self.multi_tensor_adam_capturable_master = _ops.multi_tensor_adam_capturable_master
        self.master_weight_dtype = master_weight_dtype
        self.exp_avg_dtype = exp_avg_dtype
        self.exp_avg_sq_dtype = exp_avg_sq_dtype
        self.name_to_dtype_map = {"exp_avg": exp_avg_dtype, "exp_avg_sq": exp_avg_sq_dtype,
                                  "master_param": master_weight_dtype}
        # Largest stored magnitude per scaled dtype: fp16 keeps a factor 2 of headroom, FP8 E4M3.
        self.dtype_to_range_map = {torch.float16: torch.finfo(torch.float16).max / 2.0,
                                   torch.uint8: 448.0}
        self._scales: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
        self.use_decoupled_grad = use_decoupled_grad
        self.store_param_remainders = (store_param_remainders and master_weights
                                       and master_weight_dtype == torch.float32)
        self.set_grad_none = set_grad_none
        if set_grad_none is not None:
            warnings.warn("set_grad_none kwarg in FusedAdam constructor is deprecated. "
                          "Use set_to_none kwarg in zero_grad instead.", DeprecationWarning)

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        """Reset gradients (.decoupled_grad with use_decoupled_grad); set_to_none default True."""
        if self.set_grad_none is not None:
            if set_to_none is not None and set_to_none != self.set_grad_none:
                raise ValueError(f"FusedAdam: zero_grad: set_to_none={set_to_none}, but FusedAdam "
                                 f"was initialized with set_grad_none={self.set_grad_none}")
            set_to_none = self.set_grad_none
        set_to_none = True if set_to_none is None else set_to_none
        if not self.use_decoupled_grad:
            super().zero_grad(set_to_none=set_to_none)
            return
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:
                    p.decoupled_grad = None
                elif getattr(p, "decoupled_grad", None) is not None:
                    p.decoupled_grad.zero_()

    # ---- scaled states (TE's helpers, same names)
    def _apply_scale(self, state_name: str, unscaled_state: torch.Tensor,
                     scaled_state: torch.Tensor, scale: torch.Tensor) -> None:
        """Store fp32 `unscaled_state` into `scaled_state`, writing its `scale` (absmax / range)."""
        if scaled_state.dtype == torch.bfloat16:
            scaled_state.copy_(unscaled_state.bfloat16())
            return
        dtype = self.name_to_dtype_map[state_name]
        absmax = (unscaled_state.abs().max() if unscaled_state.numel()
                  else unscaled_state.new_zeros(()))
        torch.div(absmax.float().reshape(1), self.dtype_to_range_map[dtype], out=scale)
        if dtype == torch.uint8:
            scaled_state._quantizer.scale.copy_(torch.where(scale > 0, 1.0 / scale, 1.0))
            scaled_state.copy_(unscaled_state)
        else:
            rscale = torch.where(scale > 0, scale.reciprocal(), 0.0)
            scaled_state.copy_(unscaled_state * rscale)

    def get_unscaled_state(self, param: torch.Tensor, state_name: str) -> torch.Tensor:
        """The fp32 value of a state (the state itself when it is stored in fp32; int16
        remainders as they are)."""
        state = self.state[param][state_name]
        dtype = self.name_to_dtype_map[state_name]
        if dtype == torch.uint8:
            return state.dequantize(dtype=torch.float32)
        if dtype == torch.float16:
            return state.float() * self._scales[param][state_name]
        if dtype == torch.bfloat16:
            return state.float()
        return state

    def set_scaled_state(self, param: torch.Tensor, state_name: str,
                         unscaled_state: torch.Tensor) -> None:
        """Set a state from its fp32 value (int16 for stored remainders), scaling as needed."""
        remainders = (self.store_param_remainders and state_name == "master_param"
                      and param.dtype == torch.bfloat16)
        state = self.state[param]
        if state_name not in state:
            self._initialize_state(param, state_name, False, remainders)
        if remainders or self.name_to_dtype_map[state_name] == torch.float32:
            state[state_name].copy_(unscaled_state)
        else:
            self._apply_scale(state_name, unscaled_state.float(), state[state_name],
                              self._scales[param][state_name])

    def _initialize_state(self, param: torch.Tensor, state_name: str, zero_buffer: bool,
                          store_param_remainders: bool = False) -> None:
        dtype = self.name_to_dtype_map[state_name]
        shape, device = param.shape, param.device
        if store_param_remainders:
            data = torch.zeros(shape, dtype=torch.int16, device=device)
        elif dtype == torch.uint8:
            _, quantizer_cls = _float8_classes()
            quantizer = quantizer_cls(torch.ones(1, device=device), torch.zeros(1, device=device),
                                      torch.float8_e4m3fn)
            data = quantizer(torch.zeros(shape, device=device))
        else:
            data = (torch.zeros if zero_buffer else torch.empty)(shape, dtype=dtype, device=device)
        self.state[param][state_name] = data
        if dtype != torch.float32 and not store_param_remainders:
            self._scales.setdefault(param, {})[state_name] = torch.ones(1, device=device)

    def initialize_state(self, param: torch.Tensor, store_param_remainders: bool) -> None:
        """Zero moments; master weights from the parameter's values."""
        self._initialize_state(param, "exp_avg", zero_buffer=True)
        self._initialize_state(param, "exp_avg_sq", zero_buffer=True)
        if self.master_weights:
            self._initialize_state(param, "master_param", False, store_param_remainders)
            if not store_param_remainders:
                value = param.dequantize() if hasattr(param, "dequantize") else param
                self.set_scaled_state(param, "master_param", value.detach().clone().float())
            # Remainders start at 0: the master is the bf16 value.

    def _id_map(self, state_dict: dict) -> dict:
        saved = deepcopy(state_dict["param_groups"])
        return dict(zip(chain.from_iterable(g["params"] for g in saved),
                        chain.from_iterable(g["params"] for g in self.param_groups)))

    def state_dict(self) -> dict:
        """torch's state dict with every state as its fp32 value."""
        state_dict = super().state_dict()
        id_map = self._id_map(state_dict)
        for k, v in state_dict["state"].items():
            if k in id_map:
                state_dict["state"][k] = {n: self.get_unscaled_state(id_map[k], n) for n in v}
        return state_dict

    def load_state_dict(self, state_dict: dict) -> None:
        """Load, storing each state in its configured dtype again."""
        super().load_state_dict(state_dict)
        id_map = self._id_map(state_dict)
        for k, v in state_dict["state"].items():
            if k in id_map:
                param = id_map[k]
                self.state[param] = {}
                for name, value in v.items():
                    if value is None:
                        continue
                    remainders = (self.store_param_remainders and name == "master_param"
                                  and param.dtype == torch.bfloat16)
                    self.set_scaled_state(param, name, value if remainders else value.float())

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None, grad_scaler: Any = None) -> Any:
        """One Adam step over every parameter with a gradient (.grad or .decoupled_grad)."""
        loss = closure() if closure is not None else None
        float8_tensor, _ = _float8_classes()
        for group in self.param_groups:
            if not group["params"]:
                continue
            device = group["params"][0].device
            bias_correction = 1 if group["bias_correction"] else 0
            beta1, beta2 = group["betas"]
            if self.capturable:
                inc = (self._dummy_overflow_buf != 1).to(torch.int)
                group["step"] = group["step"] + inc if "step" in group else torch.ones(
                    1, dtype=torch.int, device=device)
            else:
                group["step"] = group.get("step", 0) + 1
            # kind -> the lists [g, p, m, v, master, scale, amax, scale_inv] as used
            kinds: dict[str, list[list[torch.Tensor]]] = {
                k: [[] for _ in range(8)] for k in ("fp8", "f16", "f32")}
            rescale: list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]] = []
            fp8_dtype, fp8_quantizers = None, []
            dtypes16 = set()
            for p in group["params"]:
                grad = getattr(p, "decoupled_grad", None) if self.use_decoupled_grad else p.grad
                if grad is None:
                    continue
                if grad.is_sparse:
                    raise RuntimeError("FusedAdam does not support sparse gradients.")
                remainders = self.store_param_remainders and p.dtype == torch.bfloat16
                if len(self.state[p]) == 0:
                    self.initialize_state(p, remainders)
                unscaled = {}
                for name in _STATES:
                    if name not in self.state[p]:
                        continue
                    if name == "master_param" and remainders:
                        unscaled[name] = self.state[p][name]
                        continue
                    unscaled[name] = self.get_unscaled_state(p, name)
                    if self.name_to_dtype_map[name] != torch.float32:
                        rescale.append((name, unscaled[name], self.state[p][name],
                                        self._scales[p][name]))
                if isinstance(p, float8_tensor):
                    if not self.master_weights:
                        raise ValueError("FusedAdam: params: Float8Tensor parameters need "
                                         "master_weights=True")
                    if self.capturable:
                        raise ValueError("FusedAdam: params: Float8Tensor parameters are not "
                                         "supported with capturable=True")
                    lists, data = kinds["fp8"], p._data
                    fp8_dtype = p.fp8_torch_dtype
                    fp8_quantizers.append(p)
                elif p.dtype in (torch.float16, torch.bfloat16):
                    lists, data = kinds["f16"], p.data
                    dtypes16.add(p.dtype)
                elif p.dtype == torch.float32:
                    lists, data = kinds["f32"], p.data
                else:
                    raise TypeError(f"FusedAdam: params: expected float32, float16, bfloat16 or "
                                    f"Float8Tensor parameters, got {p.dtype}")
                lists[0].append(grad)
                lists[1].append(data)
                lists[2].append(unscaled["exp_avg"])
                lists[3].append(unscaled["exp_avg_sq"])
                if self.master_weights and lists is not kinds["f32"]:
                    lists[4].append(unscaled["master_param"])
                if lists is kinds["fp8"]:
                    for i, t in enumerate(get_fp8_meta(p)):
                        lists[5 + i].append(t)
            if len(dtypes16) > 1:
                raise ValueError("FusedAdam: params: a mix of float16 and bfloat16 parameters "
                                 "is not supported (TE: the same)")
            for p in fp8_quantizers:
                # TE-lite FP8 weight parameters (quantizer update_margin set) re-derive their scale
                # from the new values' amax after each update (delayed scaling, one-entry history).
                if getattr(p._quantizer, "update_margin", None) is not None:
                    p._quantizer.amax.zero_()
            self._run(group, kinds, bias_correction, beta1, beta2, fp8_dtype, grad_scaler, device)
            for p in fp8_quantizers:
                self._after_fp8_update(p)
            for name, unscaled, scaled, scale in rescale:
                self._apply_scale(name, unscaled, scaled, scale)
        return loss

    def _run(self, group: dict, kinds: dict, bias_correction: int, beta1: float, beta2: float,
             fp8_dtype: Any, grad_scaler: Any, device: torch.device) -> None:
        def apply(fn: Callable[..., Any], lists: list[list[torch.Tensor]], *extra: Any) -> None:
            multi_tensor_applier(fn, self._dummy_overflow_buf, lists, group["lr"], beta1, beta2,
                                 group["eps"], group["step"], self.adam_w_mode, bias_correction,
                                 group["weight_decay"], *extra)

        f16, f32, fp8 = kinds["f16"], kinds["f32"], kinds["fp8"]
        if self.capturable:
            found_inf = (grad_scaler._check_inf_per_device(self)[device] if grad_scaler
                         is not None else torch.zeros(1, device=device))
            self._dummy_overflow_buf.copy_(found_inf)
            inv_scale = (grad_scaler._get_scale_async().double().reciprocal().float()
                         if grad_scaler is not None else torch.ones(1, device=device))
            if f16[0]:
                if self.master_weights:
                    apply(self.multi_tensor_adam_capturable_master, f16[:5], inv_scale)
                else:
                    apply(self.multi_tensor_adam_capturable, f16[:4], inv_scale)
            if f32[0]:
                apply(self.multi_tensor_adam_capturable, f32[:4], inv_scale)
            return
        if f16[0]:
            bf16 = f16[1][0].dtype == torch.bfloat16
            if self.master_weights and self.store_param_remainders and bf16:
                apply(self.multi_tensor_adam_param_remainder, f16[:5])
            else:
                apply(self.multi_tensor_adam, f16[:5] if self.master_weights else f16[:4])
        if fp8[0]:
            apply(self.multi_tensor_adam_fp8, fp8, fp8_dtype)
        if f32[0]:
            apply(self.multi_tensor_adam, f32[:4])

    @staticmethod
    def _after_fp8_update(p: torch.Tensor) -> None:
        if hasattr(p, "_transpose_invalid"):
            p._transpose_invalid = True
        q = p._quantizer
        if getattr(q, "update_margin", None) is not None:
            from ..quantization import ops

            scale, _ = ops().compute_scale_from_amax(q.amax.reshape(1), p.fp8_torch_dtype, 0.0,
                                                     False)
            q.scale.copy_((scale / 2.0**q.update_margin).reshape(q.scale.shape))

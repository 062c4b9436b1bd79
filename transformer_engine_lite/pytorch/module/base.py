"""Shared base of the GEMM modules: FP8 state (per GEMM 3 forward + 2 backward scale / amax-history
slots, TE's layout), its checkpoint schema, per-forward recipe resolution, parallel settings and
parameter initialization.

FP8 meta layout (TE's FP8FwdTensors / FP8BwdTensors): forward slot 3*g + {0: input, 1: weight,
2: output}, backward slot 2*g + {0: grad output, 1: grad input} for GEMM g. Output and grad-input
slots exist for layout compatibility; outputs stay in high precision here, so their amaxes stay 0
and their scales 1.

Checkpoint (`get_extra_state`): a dict of tensors and plain values, encoded as a uint8 tensor of
torch.save's bytes (pytorch/_extra_state.py: safetensors takes it; it loads with
weights_only=True). Schema version 2 (current):
    {"version": 2, "num_gemms": int, "recipe": dict | None,
     "amax_history_fwd": [L, 3n], "scale_fwd": [3n], "amax_history_bwd": [L, 2n], "scale_bwd": [2n]}
Version 1 is TE's own field names without its pickled globals:
    {"version": 1, "amax_history_fwd", "scale_fwd", "scale_inv_fwd", "amax_history_bwd",
     "scale_bwd", "scale_inv_bwd"} (scale_inv_* ignored: always 1/scale).
None, an empty tensor or an empty dict mean "no FP8 state" and leave the defaults in place.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from ...common.recipe import Recipe, check_backward_override
from ..checkpoint import recomputing, stash_scales
from ..distributed import (
    TPConfig,
    copy_to_tp_region,
    gather_along_first_dim,
    reduce_from_tp_region,
    reduce_scatter_along_first_dim,
)
from ..fp8 import FP8GlobalStateManager
from ..quantization import block_spec, fake_quantize, spec_for
from ..tensor import Float8Quantizer, QuantizedTensor
from .._extra_state import EXTRA_STATE_VERSION
from ._extra_state_hooks import ExtraStateMixin
from ..utils import get_default_init_method
from .._recipe_state import build_fp8_meta
from ._autograd import GemmConfig, linear
from ._custom import builtin_quantizers, custom_gemm_config
from ._params import _moved, materialize_params, weight_param_quantizer  # noqa: F401
from ._recipe_checks import check_recipe_change
from ._weight_quantizers import WeightQuantizerMixin
from ._weight_workspace import WeightCast, get_weight_workspace
from .userbuffers import (  # noqa: F401 (TE's home of the Userbuffers entry points)
    UserBufferQuantizationMode, destroy_ub, get_ub, initialize_ub, is_ub_initialized,
)

__all__ = [
    "EXTRA_STATE_VERSION",
    "TransformerEngineBaseModule",
    "get_default_init_method",
    "get_dummy_wgrad",
]

_DEFAULT_HISTORY_LEN = 1024  # DelayedScaling's default; resized at the first update if different
_HP_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


_DUMMY_WGRADS: dict[tuple[tuple[int, ...], torch.dtype, torch.device], torch.Tensor] = {}


def get_workspace() -> torch.Tensor:
    """TE's GEMM workspace (a cuBLAS scratch buffer on a GPU). The CPU GEMM (oneDNN) allocates
    its own scratch, so the workspace here is an empty uint8 tensor; a caller passing it back to
    our GEMM functions gets the same results as with none."""
    return torch.empty(0, dtype=torch.uint8)


def get_dummy_wgrad(shape: list[int], dtype: torch.dtype, zero: bool = False) -> torch.Tensor:
    """TE's cached placeholder weight gradient (returned to autograd when the real one went into
    main_grad). One buffer per (shape, dtype, device); zero=True clears it first."""
    key = (tuple(shape), dtype, default_device())
    t = _DUMMY_WGRADS.get(key)
    if t is None:
        t = _DUMMY_WGRADS[key] = torch.empty(key[0], dtype=dtype, device=key[2])
    if zero:
        t.zero_()
    return t


def default_device() -> torch.device:
    """TE defaults to "cuda"; here the CPU when no GPU is present."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def reject_unsupported(owner: str, **flags: Any) -> None:
    """NotImplementedError for each TE argument set to a value this implementation cannot honour
    (symmetric all-reduce, FP8 outputs, ...)."""
    for name, value in flags.items():
        if value not in (None, False):
            raise NotImplementedError(
                f"{owner}: argument '{name}'={value!r} is not supported by transformer_engine_lite "
                "(TE feature without an equivalent here); leave it at its default"
            )


class TransformerEngineBaseModule(ExtraStateMixin, WeightQuantizerMixin, torch.nn.Module):
    """Base of Linear, LayerNormLinear and LayerNormMLP."""

    def __init__(self, num_gemms: int, device: Any, name: str | None = None) -> None:
        super().__init__()
        self.num_gemms = num_gemms
        self.name = name
        dev = torch.device(device) if device is not None else default_device()
        self._meta_on_device = dev.type != "meta"
        mdev = dev if dev.type != "meta" else torch.device("cpu")
        f32 = {"dtype": torch.float32, "device": mdev}
        L = _DEFAULT_HISTORY_LEN
        if FP8GlobalStateManager.is_fp8_enabled():  # built inside an autocast: its length (TE
            r = FP8GlobalStateManager.get_fp8_recipe()  # sizes the meta at the first forward)
            L = getattr(r, "amax_history_len", L)
        elif FP8GlobalStateManager.with_fp8_parameters():
            r = FP8GlobalStateManager.get_model_init_recipe()
            L = getattr(r, "amax_history_len", L)
        # The FP8 meta is module state but not a registered buffer (TE keeps it in fp8_meta the
        # same way): loaders that rebuild buffers (HF from_pretrained re-creates non-persistent
        # buffers empty after loading) or broadcast them (DDP) must not touch it. It travels in
        # _extra_state and follows device moves in _apply.
        self.fp8_fwd_amax_history = torch.zeros(L, 3 * num_gemms, **f32)
        self.fp8_fwd_scale = torch.ones(3 * num_gemms, **f32)
        self.fp8_bwd_amax_history = torch.zeros(L, 2 * num_gemms, **f32)
        self.fp8_bwd_scale = torch.ones(2 * num_gemms, **f32)
        # 0: did not run since the last update; else the recipe code it ran under.
        self.fp8_fwd_ran = torch.zeros(1, dtype=torch.int32, device=mdev)
        self.fp8_bwd_ran = torch.zeros(1, dtype=torch.int32, device=mdev)
        self._last_recipe: dict[str, Any] | None = None
        self.primary_weights_in_fp8 = FP8GlobalStateManager.with_fp8_parameters()
        self._fp8_init_recipe = (
            FP8GlobalStateManager.get_model_init_recipe() if self.primary_weights_in_fp8 else None
        )
        self._preserve_init = FP8GlobalStateManager.preserve_high_precision_init_val()
        # delay_wgrad_compute: weight gradients queued by the backward, run by backward_dw()
        self._wgrad_store: list[Any] = []
        # is_first_microbatch: TE's cached weight casts, name -> quantized weight (_weight_cast)
        self._fp8_workspaces: dict[str, Any] = {}  # quantized tensors (GroupedTensor: see there)
        FP8GlobalStateManager.register_module(self)

    _FP8_META_BUFFERS = (
        "fp8_fwd_amax_history",
        "fp8_fwd_scale",
        "fp8_bwd_amax_history",
        "fp8_bwd_scale",
        "fp8_fwd_ran",
        "fp8_bwd_ran",
    )

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> TransformerEngineBaseModule:
        # .to(dtype) / .bfloat16() / .half() must not touch the FP8 meta: it stays float32 (int32
        # flags) and only follows device moves.
        # FP8 weight parameters keep their FP8 storage (a dtype cast would dequantize them into
        # plain tensors): a device move copies it, a dtype cast changes the nominal dtype (TE's).
        saved = {n: self.__dict__[n] for n in self._FP8_META_BUFFERS if n in self.__dict__}
        fp8_params = {
            n: self._parameters.pop(n)
            for n, p in list(self._parameters.items())
            if isinstance(p, QuantizedTensor)
        }
        try:
            super()._apply(fn, recurse)
        finally:
            for n, t in saved.items():
                probe = fn(torch.empty(0, device=t.device))
                self.__dict__[n] = t if probe.device == t.device else t.to(probe.device)
            for n, p in fp8_params.items():
                probe = fn(torch.empty(0, dtype=p.dtype, device=p.device))
                self._parameters[n] = p if probe.device == p.device else _moved(p, probe.device)
                if probe.dtype != p.dtype and probe.is_floating_point():
                    self._parameters[n].retype_(probe.dtype)
        return self

    def __setstate__(self, state: dict[str, Any]) -> None:
        # copy.deepcopy and unpickling build modules without __init__: register the copy too, or
        # its delayed-scaling state would never be updated.
        super().__setstate__(state)
        self.__dict__.setdefault("_fp8_workspaces", {})
        FP8GlobalStateManager.register_module(self)

    # ------------------------------------------------------------------ split backward
    def need_backward_dw(self) -> bool:
        """Whether weight gradients wait for backward_dw() (delay_wgrad_compute=True)."""
        return bool(getattr(self, "delay_wgrad_compute", False))

    def backward_dw(self) -> None:
        """Compute the weight gradients the last backward(s) queued (delay_wgrad_compute=True),
        in order: into param.grad, or main_grad with fuse_wgrad_accumulation (TE's split backward
        for pipeline schedules). Without delay_wgrad_compute there is nothing to do."""
        store, self._wgrad_store[:] = list(self._wgrad_store), []
        with torch.no_grad():
            for job in store:
                job()

    # ------------------------------------------------------------------ FP8 meta (manager API)
    def fp8_meta_initialized(self) -> bool:
        return self.num_gemms > 0

    def fp8_meta_device(self) -> torch.device:
        return self.fp8_fwd_scale.device

    def fp8_meta_tensors(self, forward: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if forward:
            return self.fp8_fwd_amax_history, self.fp8_fwd_scale, self.fp8_fwd_ran
        return self.fp8_bwd_amax_history, self.fp8_bwd_scale, self.fp8_bwd_ran

    @torch.no_grad()
    def resize_amax_history(self, length: int) -> None:
        """Keep the newest min(old, new) rows (row 0 is the newest); pad older rows with 0."""
        for name in ("fp8_fwd_amax_history", "fp8_bwd_amax_history"):
            h = getattr(self, name)
            if h.shape[0] != length:
                new = torch.zeros(length, h.shape[1], dtype=h.dtype, device=h.device)
                k = min(length, h.shape[0])
                new[:k] = h[:k]
                setattr(self, name, new)

    # ------------------------------------------------------------------ forward-time helpers
    def _fp8_mode(self) -> tuple[str, Recipe | None, int]:
        """(mode, recipe, code) of this forward from the active autocast: static Python values,
        guarded by torch.compile."""
        m = FP8GlobalStateManager
        if m.is_fp8_enabled():
            r = m.get_fp8_recipe()
            mode = ("delayed" if r.delayed() else "current" if r.float8_current_scaling()
                    else "custom" if r.custom()
                    else "block" if r.float8_block_scaling() or r.nvfp4()  # block-scaled path
                    else "mxfp8")
            return mode, r, m.get_recipe_code()
        if m.is_fp8_calibration() and m.get_fp8_recipe().delayed():
            return "calibrate", m.get_fp8_recipe(), m.get_recipe_code()
        return "hp", None, 0

    def _gemm_config(
        self, gemm: int, mode: str, recipe: Recipe | None, code: int, fuse_wgrad: bool = False
    ) -> GemmConfig:
        delay = bool(getattr(self, "delay_wgrad_compute", False))
        save_orig = bool(getattr(self, "save_original_input", False))
        if mode in ("hp", "calibrate"):
            return GemmConfig(mode, slot_fwd=3 * gemm, code=code, fuse_wgrad=fuse_wgrad,
                              delay_wgrad=delay, save_original_input=save_orig)
        assert recipe is not None
        if mode == "custom":  # module/_custom.py: the recipe's qfactory decides per slot
            return custom_gemm_config(self, gemm, recipe, code, fuse_wgrad, delay, save_orig)
        if mode != "delayed":  # TE's module.quantizers, for inspection
            builtin_quantizers(self, gemm, recipe)
        override = getattr(recipe, "backward_override", None)
        check_backward_override(type(recipe).__name__, override, delayed=recipe.delayed())
        if save_orig and mode == "delayed":
            raise NotImplementedError(
                f"{type(self).__name__}: save_original_input=True is not supported with "
                "DelayedScaling (the backward would quantize the input with updated scales); use "
                "Float8CurrentScaling or MXFP8BlockScaling"
            )
        if mode == "block":
            return GemmConfig(
                mode, block_spec(recipe, "input"), block_spec(recipe, "weight"),
                block_spec(recipe, "grad"), slot_fwd=3 * gemm, slot_bwd=2 * gemm, code=code,
                fuse_wgrad=fuse_wgrad, bwd_override=override, delay_wgrad=delay,
                save_original_input=save_orig,
            )
        qi = qw = qg = None
        if mode == "current":
            qi, qw, qg = (
                recipe.fp8_quant_fwd_inp,
                recipe.fp8_quant_fwd_weight,
                recipe.fp8_quant_bwd_grad,
            )
        return GemmConfig(
            mode,
            spec_for(recipe, mode, True, qi),
            spec_for(recipe, mode, True, qw),
            spec_for(recipe, mode, False, qg),
            slot_fwd=3 * gemm,
            slot_bwd=2 * gemm,
            code=code,
            fuse_wgrad=fuse_wgrad,
            bwd_override=override,
            delay_wgrad=delay,
            save_original_input=save_orig,
        )

    def _meta_args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.fp8_fwd_scale, self.fp8_bwd_amax_history, self.fp8_bwd_scale, self.fp8_bwd_ran

    def _record_forward(self, cfg: GemmConfig, amax: torch.Tensor) -> None:
        """Delayed scaling / calibration: amax(input, weight) into history row 0; mark "ran"."""
        if cfg.mode in ("delayed", "calibrate"):
            s = cfg.slot_fwd
            with torch.no_grad():
                self.fp8_fwd_amax_history[0, s : s + 2].copy_(amax)
                self.fp8_fwd_ran.fill_(cfg.code)

    def _note_recipe(self, recipe: Recipe | None) -> None:
        if recipe is not None and not torch.compiler.is_compiling():
            check_recipe_change(self, recipe)
            self._last_recipe = recipe.to_dict()
            self._last_recipe_obj = recipe

    @property
    def fp8_meta(self) -> dict[str, Any]:
        """TE's fp8_meta (see _recipe_state.build_fp8_meta): a new dict per access whose recipe
        states are views of this module's FP8 buffers."""
        return build_fp8_meta(self)

    @property
    def quantizers(self) -> dict[str, list[Any]]:
        """TE's module.quantizers: {"scaling_fwd": [...], "scaling_bwd": [...]} of the recipe
        this module last ran under (empty lists before any FP8 forward): delayed scaling's over
        this module's scale / amax-history slots (views); otherwise those its GEMMs ran with
        (kept by module/_custom.py in the instance dict), else built from the recipe."""
        recipe = getattr(self, "_last_recipe_obj", None)
        kept = self.__dict__.get("quantizers")
        if recipe is not None and not recipe.delayed() and isinstance(kept, dict):
            return kept
        meta = build_fp8_meta(self)
        return {k: meta[k].make_quantizers() if k in meta else []
                for k in ("scaling_fwd", "scaling_bwd")}

    @staticmethod
    def _activation_dtype(owner: str, inp: torch.Tensor) -> torch.dtype:
        if not isinstance(inp, torch.Tensor):
            raise TypeError(f"{owner}: input: expected a torch.Tensor, got {type(inp).__name__}")
        if torch.is_autocast_enabled(inp.device.type):
            return torch.get_autocast_dtype(inp.device.type)
        if inp.dtype not in _HP_DTYPES:
            raise TypeError(
                f"{owner}: input: expected dtype float32, float16 or bfloat16, got {inp.dtype}"
            )
        return inp.dtype

    @staticmethod
    def _check_last_dim(owner: str, inp: torch.Tensor, expected: int, what: str) -> None:
        if inp.dim() < 1 or inp.shape[-1] != expected:
            raise ValueError(
                f"{owner}: input: expected last dim {expected} ({what}), got shape "
                f"{tuple(inp.shape)}"
            )

    def _prepare_input(
        self, owner: str, inp: torch.Tensor, expected: int, what: str
    ) -> tuple[torch.Tensor, tuple[str, Recipe | None, int]]:
        """Common forward prologue: validate `inp`, cast it to the activation dtype, and read the FP8
        mode of this step (noting its recipe for checkpoints)."""
        dtype = self._activation_dtype(owner, inp)
        if not torch.is_autocast_enabled(inp.device.type):
            # TE's rule: outside torch.autocast the input sets the compute dtype and every parameter
            # must already have it (an fp32 input into bf16 weights is an error, not a silent cast).
            for name, param in self.named_parameters(recurse=False):
                if param.dtype != inp.dtype:
                    raise ValueError(
                        f"{owner}: input dtype {inp.dtype} differs from parameter {name!r} dtype "
                        f"{param.dtype}; outside torch.autocast they must match (TE's rule)"
                    )
        self._check_last_dim(owner, inp, expected, what)
        x = inp if inp.dtype == dtype else inp.to(dtype)
        fp8 = self._fp8_mode()
        self._note_recipe(fp8[1])
        if getattr(self, "_ub", None) is not None:  # Userbuffers: communicators looked up
            self._ub.check_module_forward(self, inp)
        return x, fp8

    def _run_linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        gemm: int,
        parallel_mode: str | None,
        tp: TPConfig,
        fp8: tuple[str, Recipe | None, int],
        add_bias: bool,
        main_grad: torch.Tensor | None = None,
        input_gathered: bool = False,
        is_first_microbatch: bool | None = None,
        acc: torch.Tensor | None = None,
        alpha: float = 1.0,
    ) -> torch.Tensor:
        """One GEMM with its tensor-parallel communication (see distributed.py). add_bias=False
        leaves the bias to the caller (return_bias). is_first_microbatch: TE's weight-cast cache
        (see _weight_cast). acc: the output is added into it in place (not row-parallel);
        alpha: the GEMM's scale of the product (and of its gradients)."""
        mode, recipe, code = fp8
        dtype = x.dtype
        if tp.size > 1 and parallel_mode == "column" and not input_gathered:
            x = (
                gather_along_first_dim(x, tp.group)
                if tp.sequence_parallel
                else copy_to_tp_region(x, tp.group)
            )
        # An FP8 parameter goes to the GEMM as it is: its bytes under a matching recipe, else
        # dequantized there (a .to() here would dequantize it always).
        keep = weight.dtype == dtype or isinstance(weight, QuantizedTensor)
        w = weight if keep else weight.to(dtype)
        row = tp.size > 1 and parallel_mode == "row"
        b = bias if (add_bias and not row and bias is not None) else None
        w, b, meta, cfg, w_cast = self._linear_args(
            w, b, dtype, gemm, fp8, main_grad, is_first_microbatch,
            torch.is_grad_enabled() and x.requires_grad,
        )
        y, amax = linear(x, w, b, meta, main_grad, cfg, self._wgrad_store, w_cast, acc, alpha)
        self._linear_done(cfg, amax, weight)
        if row:
            y = (
                reduce_scatter_along_first_dim(y, tp.group)
                if tp.sequence_parallel
                else reduce_from_tp_region(y, tp.group)
            )
            if add_bias and bias is not None:
                y = y + bias.to(dtype)
        return y

    def _linear_args(self, w: torch.Tensor, b: torch.Tensor | None, dtype: torch.dtype,
                     gemm: int, fp8: tuple[str, Recipe | None, int],
                     main_grad: torch.Tensor | None, is_first_microbatch: bool | None,
                     columnwise: bool = True) -> tuple:
        """GEMM `gemm`'s (weight, bias in the activation dtype, FP8 meta, config, weight cast).
        columnwise: the backward computes dgrad (the input requires grad)."""
        mode, recipe, code = fp8
        if b is not None and b.dtype != dtype:
            b = b.to(dtype)
        cfg = self._gemm_config(gemm, mode, recipe, code, main_grad is not None)
        self._mark_weight_preswizzle(gemm, w)
        meta = self._meta_args()
        if cfg.mode == "delayed":
            # activation recompute: the recompute quantizes with the forward's scales
            meta = (stash_scales(self, meta[0]), *meta[1:])
        w_cast = self._weight_cast(gemm, w, cfg, meta[0], is_first_microbatch, columnwise)
        return w, b, meta, cfg, w_cast

    def _linear_done(self, cfg: GemmConfig, amax: torch.Tensor, weight: torch.Tensor) -> None:
        """After a GEMM's forward: its amaxes into the history, an FP8 parameter's scale update."""
        if not recomputing():  # a recompute repeats a step that was already recorded
            self._record_forward(cfg, amax)
            q = getattr(weight, "_quantizer", None)
            if cfg.mode == "delayed" and isinstance(q, Float8Quantizer):
                q.update_scale()  # an FP8 parameter's recipe update (see there)

    # TE's _fp8_workspaces keys, by GEMM index (see _weight_workspace.py)
    _WORKSPACE_NAMES: tuple[str, ...] = ("weight",)
    # TE's Linear / LayerNormLinear / LayerNormMLP keep no weight cast under FSDP2 (their weights
    # are all-gathered anew each step, the cast with them; is_fsdp2: _weight_quantizers.py);
    # GroupedLinear caches regardless
    _CACHE_UNDER_FSDP2 = False

    def _workspace_name(self, gemm: int) -> str:
        names = self._WORKSPACE_NAMES
        return names[gemm] if gemm < len(names) else f"weight{gemm}"

    def _weight_cast(
        self,
        gemm: int,
        w: torch.Tensor,
        cfg: GemmConfig,
        fwd_scale: torch.Tensor,
        is_first_microbatch: bool | None,
        columnwise: bool = True,
    ) -> WeightCast | None:
        """TE's weight-cast cache for gradient accumulation (module._fp8_workspaces, see
        _weight_workspace.py): is_first_microbatch=True quantizes the weight into its cached
        tensor (in place once it exists); False reuses it (the weight must not have changed in
        between: TE's contract), so a step of n microbatches casts each weight once instead of n
        times; None: no cache. FP8 parameters need no cast. Eager only (a compiled forward
        casts). A graphed callable with cache_quantized_params sets the manager's skip flag from
        its call's is_first_microbatch; modules inside it receive no argument and follow the
        flag. columnwise: the backward needs the weight's column-wise copy (dgrad)."""
        if is_first_microbatch is None and not torch.compiler.is_compiling():
            skip = FP8GlobalStateManager.get_skip_fp8_weight_update_tensor()
            is_first_microbatch = None if skip is None else not bool(skip)
        if (
            is_first_microbatch is None
            or cfg.mode not in ("delayed", "current", "mxfp8", "block", "custom")
            or isinstance(w, QuantizedTensor)
            or torch.compiler.is_compiling()
            or (not self._CACHE_UNDER_FSDP2 and self.is_fsdp2)
        ):
            return None
        scale = fwd_scale[cfg.slot_fwd + 1 : cfg.slot_fwd + 2]
        return self._cached_weight_cast(gemm, w, cfg, scale, bool(is_first_microbatch),
                                        columnwise and cfg.bwd_override is None)

    def _cached_weight_cast(self, gemm: int, w: torch.Tensor, cfg: GemmConfig,
                            scale: torch.Tensor, update: bool, columnwise: bool
                            ) -> WeightCast | None:
        """GEMM `gemm`'s entry of _fp8_workspaces (GroupedLinear's single grouped weight keeps
        one entry for all its GEMMs instead)."""
        return get_weight_workspace(self._fp8_workspaces, self._workspace_name(gemm), w, cfg,
                                    scale, update, columnwise)

    @staticmethod
    def _main_grad(owner: str, fuse_wgrad: bool, weight: torch.Tensor) -> torch.Tensor | None:
        if not fuse_wgrad or not weight.requires_grad:
            return None  # a frozen weight has no gradient to accumulate
        mg = getattr(weight, "main_grad", None)
        if mg is None:
            raise RuntimeError(
                f"{owner}: fuse_wgrad_accumulation=True needs weight.main_grad (an fp32 tensor of "
                f"shape {tuple(weight.shape)}) set before the forward"
            )
        return mg

    # ------------------------------------------------------------------ parameters
    def _new_param(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: Any
    ) -> torch.nn.Parameter:
        return torch.nn.Parameter(torch.empty(shape, dtype=dtype, device=device))

    def _init_weight(
        self,
        param: torch.nn.Parameter,
        init_method: Callable[[torch.Tensor], Any],
        rng_tracker: Callable[[], Any] | None = None,
        rng_tracker_name: str | None = None,
    ) -> None:
        """init_method on the local shard (TE: under the RNG tracker's fork when given); under
        quantized_model_init the parameter is then replaced by its FP8 form (same name)."""
        if param.device.type == "meta":
            return
        ctx: Any = contextlib.nullcontext()
        if rng_tracker is not None:
            tracker = rng_tracker()
            ctx = tracker.fork(rng_tracker_name) if rng_tracker_name else tracker.fork()
        if isinstance(param, QuantizedTensor):  # reset_parameters() of an FP8 model
            hp = torch.empty(param.shape, dtype=param.dtype, device=param.device)
            with torch.no_grad(), ctx:
                init_method(hp)
            self._set_fp8_param(param, self._make_fp8_primary(hp))
            return
        with torch.no_grad(), ctx:
            init_method(param)
        if self.primary_weights_in_fp8:
            self._set_fp8_param(param, self._make_fp8_primary(param))

    def _set_fp8_param(self, old: torch.Tensor, new: torch.nn.Parameter) -> None:
        name = next(n for n, p in self._parameters.items() if p is old)
        setattr(self, name, new)

    @torch.no_grad()
    def _make_fp8_primary(self, param: torch.Tensor) -> torch.nn.Parameter:
        """The FP8 parameter holding `param` quantized with the quantized_model_init recipe's
        forward format (TE's FP8 primary weights): Float8Tensor (per-tensor scale) or MXFP8Tensor
        (row- and column-wise 1x32 blocks). No high-precision copy is kept, except the optional
        CPU copy of preserve_high_precision_init_val."""
        assert self._fp8_init_recipe is not None
        quantizer = weight_param_quantizer(type(self).__name__, self._fp8_init_recipe, param)
        new = torch.nn.Parameter(quantizer(param.detach()), requires_grad=param.requires_grad)
        if self._preserve_init:
            new._high_precision_init_val = param.detach().to("cpu", copy=True)
        new.fp8_primary = True  # type: ignore[attr-defined]  # TE-lite's flag, kept for old code
        for attr in ("sequence_parallel", "main_grad"):
            if hasattr(param, attr):
                setattr(new, attr, getattr(param, attr))
        return new

    @torch.no_grad()
    def _fake_quantize_primary(self, param: torch.nn.Parameter) -> None:
        """GroupedLinear(single_grouped_weight=True): its [n, out, in] weight is sliced per expert
        at every forward, so it stays in high precision, rounded to FP8 values per expert."""
        if self._preserve_init:
            hp = param.detach().to("cpu", copy=True)
            param._high_precision_init_val = hp  # type: ignore[attr-defined]
            param.get_high_precision_init_val = lambda p=param: p._high_precision_init_val  # type: ignore[attr-defined]

            def _clear(p: torch.nn.Parameter = param) -> None:
                p._high_precision_init_val = None  # type: ignore[attr-defined]

            param.clear_high_precision_init_val = _clear  # type: ignore[attr-defined]
        assert self._fp8_init_recipe is not None
        for w in param.unbind(0):
            w.copy_(fake_quantize(w, self._fp8_init_recipe))
        param.fp8_primary = True  # type: ignore[attr-defined]

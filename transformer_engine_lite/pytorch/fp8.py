"""FP8 autocast, model-init contexts and the delayed-scaling state machine (the availability checks
live in _availability.py and are re-exported here, where TE serves them).

Contract (ARCHITECTURE.md §5, TE semantics):
- Inside `fp8_autocast` / `autocast`, TE-lite modules run their GEMMs in FP8 per the recipe.
- Delayed scaling: a module's forward quantizes with its current scales and writes the amaxes it saw
  into row 0 of its amax history, and marks itself "ran" with the recipe's code (a tensor write, so
  compiled forwards do it too). At the exit of the outermost autocast, every module that ran under
  a delayed recipe gets its amaxes all-reduced (MAX, over the autocast's group, when
  torch.distributed is initialized and `reduce_amax`) and its history/scales updated with
  `torch.ops.te_lite.delayed_scaling_update`; modules that did not run are left untouched. The
  backward pass does the same for gradient slots: at the end of an eager backward (autograd engine
  callback), or, after a compiled backward, at the next autocast entry (before any FP8 backward
  scale is read again), or when `FP8GlobalStateManager.reduce_and_update_fp8_tensors(False)` is
  called.
- Current scaling and MXFP8 keep no state between steps.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..common.recipe import (
    FP8_MAX,
    CustomRecipe,
    DelayedScaling,
    Float8CurrentScaling,
    Format,
    Float8BlockScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    Recipe,
)
from ._availability import (
    _fp8_block_scaling_support,
    _nvfp4_support,
    check_fp8_block_scaling_support,
    check_fp8_support,
    check_mxfp8_support,
    check_nvfp4_support,
    is_fp8_available,
    is_fp8_block_scaling_available,
    is_mxfp8_available,
    is_nvfp4_available,
)

__all__ = [
    "FP8GlobalStateManager",
    "autocast",
    "check_fp8_block_scaling_support",
    "check_fp8_support",
    "check_mxfp8_support",
    "check_nvfp4_support",
    "check_recipe_support",
    "fp8_autocast",
    "fp8_model_init",
    "get_default_fp8_recipe",
    "get_default_recipe",
    "get_fp4_te_dtype",
    "get_fp8_te_dtype",
    "get_fp8_torch_dtype",
    "is_fp8_available",
    "is_fp8_block_scaling_available",
    "is_mxfp8_available",
    "is_nvfp4_available",
    "quantized_model_init",
]

logger = logging.getLogger(__name__)

_TORCH_FP8 = {
    "e4m3": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2,
    "e4m3fnuz": torch.float8_e4m3fnuz,
    "e5m2fnuz": torch.float8_e5m2fnuz,
}


def get_fp8_torch_dtype(fp8_format: Format | Recipe, fprop_tensor: bool = True) -> torch.dtype:
    """torch dtype of forward (activations, weights) or backward (gradients) tensors of a format,
    or of a recipe's fp8_format (TE 2.x's signature: get_fp8_torch_dtype(recipe, fprop_tensor))."""
    fmt = getattr(fp8_format, "fp8_format", fp8_format)
    if not isinstance(fmt, Format):
        raise TypeError(f"get_fp8_torch_dtype: fp8_format: expected a Format or a recipe with "
                        f"one, got {fp8_format!r}")
    return _TORCH_FP8[fmt.dtype_name(bool(fprop_tensor))]


def get_fp8_te_dtype(fp8_format: Format | Recipe, fprop_tensor: bool = True) -> Any:
    """TE's DType (tex.DType) of forward or backward tensors of a recipe's fp8_format (or a
    Format): kFloat8E4M3 / kFloat8E5M2 (ROCm's fnuz variants share them, as in TE)."""
    from .tex import DType

    name = get_fp8_torch_dtype(fp8_format, fprop_tensor)
    return DType.kFloat8E4M3 if name in (torch.float8_e4m3fn, torch.float8_e4m3fnuz) \
        else DType.kFloat8E5M2


def get_fp4_te_dtype(fp4_recipe: Recipe) -> Any:
    """TE's DType of an FP4 recipe's fp4_format: kFloat4E2M1 (the only FP4 format)."""
    from .tex import DType

    fmt = getattr(fp4_recipe, "fp4_format", None)
    if fmt is not Format.E2M1:
        raise ValueError(f"get_fp4_te_dtype: fp4_recipe: expected a recipe with fp4_format "
                         f"Format.E2M1, got {fmt!r}")
    return DType.kFloat4E2M1


def get_fp8_max(fp8_format: Format, forward: bool) -> float:
    return FP8_MAX[fp8_format.dtype_name(forward)]


def get_default_fp8_recipe() -> Recipe:
    """TE's default: DelayedScaling() (HYBRID, history 1024, "max")."""
    return DelayedScaling()


def get_default_recipe() -> Recipe:
    """TE 2.x name of get_default_fp8_recipe."""
    return get_default_fp8_recipe()


def check_recipe_support(recipe: Recipe) -> None:
    """Raises when recipe cannot run here (TE: an assertion with the reason)."""
    _check_recipe(recipe)
    ok, reason = (check_mxfp8_support() if recipe.mxfp8()
                  else _fp8_block_scaling_support() if recipe.float8_block_scaling()
                  else _nvfp4_support() if recipe.nvfp4()
                  else check_fp8_support())
    if not ok:
        raise RuntimeError(f"{type(recipe).__name__}: {reason}")


def _check_recipe(recipe: Any) -> Recipe:
    if recipe is None:
        return get_default_fp8_recipe()
    if not isinstance(recipe, (DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling,
                               Float8BlockScaling, NVFP4BlockScaling, CustomRecipe)):
        raise TypeError(
            "fp8 recipe: expected DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling, "
            "Float8BlockScaling, NVFP4BlockScaling or CustomRecipe, "
            f"got {type(recipe).__name__}"
        )
    return recipe


@dataclass
class _AutocastState:
    enabled: bool = False
    calibrating: bool = False
    recipe: Recipe | None = None
    group: Any = None
    code: int = 0


class FP8GlobalStateManager:
    """Process-wide FP8 state: the active autocast, the registry of FP8-capable modules and the
    delayed-scaling updates. All class-level (as TE's manager)."""

    _state = _AutocastState()
    _depth = 0
    # (recipe, group) pairs seen by autocasts; a module's "ran" flag holds 1 + the pair's index.
    # Strong references keep ids unique for the life of the process; the list stays small.
    _recipe_entries: ClassVar[list[tuple[Recipe, Any]]] = []
    _fwd_codes: ClassVar[set[int]] = set()  # delayed codes entered since the last forward update
    _bwd_codes: ClassVar[set[int]] = set()  # delayed codes ever entered
    # CustomRecipe codes whose GEMMs run delayed scaling (DelayedScalingRequest): code -> the
    # DelayedScaling their update uses (module/_custom.py registers it at each such forward).
    _custom_delayed: ClassVar[dict[int, DelayedScaling]] = {}
    _modules: ClassVar[weakref.WeakValueDictionary[int, Any]] = weakref.WeakValueDictionary()
    _module_ids = itertools.count()
    _bwd_callback_queued = False
    # fp8_model_init state
    _model_init_enabled = False
    _model_init_recipe: Recipe | None = None
    _model_init_preserve = False

    # ------------------------------------------------------- availability (TE 2.x classmethods)
    # TE 2.x tests and clients call these on the manager at import time; each returns TE's
    # (available, reason) pair.
    @staticmethod
    def is_fp8_available() -> tuple[bool, str]:
        return check_fp8_support()

    @staticmethod
    def is_mxfp8_available() -> tuple[bool, str]:
        return check_mxfp8_support()

    @staticmethod
    def is_fp8_block_scaling_available() -> tuple[bool, str]:
        return check_fp8_block_scaling_support()

    @staticmethod
    def is_nvfp4_available() -> tuple[bool, str]:
        return check_nvfp4_support()

    @staticmethod
    def get_meta_tensor_key(forward: bool = True) -> str:
        """Key of a module's fp8_meta recipe state: "scaling_fwd" / "scaling_bwd" (TE's)."""
        return "scaling_fwd" if forward else "scaling_bwd"

    # ---------------------------------------------------------------- queries (forward-time)
    @classmethod
    def is_fp8_enabled(cls) -> bool:
        return cls._state.enabled

    @classmethod
    def is_fp8_calibration(cls) -> bool:
        return cls._state.calibrating

    @classmethod
    def get_fp8_recipe(cls) -> Recipe:
        return cls._state.recipe if cls._state.recipe is not None else get_default_fp8_recipe()

    @classmethod
    def get_fp8_group(cls) -> Any:
        return cls._state.group

    @classmethod
    def get_recipe_code(cls) -> int:
        """Value a module writes into its "ran" flag: 1 + index of the active (recipe, group)."""
        return cls._state.code

    @classmethod
    def with_fp8_parameters(cls) -> bool:
        return cls._model_init_enabled

    @classmethod
    def get_model_init_recipe(cls) -> Recipe:
        r = cls._model_init_recipe
        return r if r is not None else get_default_fp8_recipe()

    @classmethod
    def preserve_high_precision_init_val(cls) -> bool:
        return cls._model_init_preserve

    # ---------------------------------------------------------------- registry
    @classmethod
    def register_module(cls, module: Any) -> None:
        """Called once per FP8-capable module at construction (never from forward)."""
        cls._modules[next(cls._module_ids)] = module

    @classmethod
    def _registered(cls) -> list[Any]:
        # Creation order, identical on every rank of an SPMD program (collectives line up).
        return [m for _, m in sorted(cls._modules.items())]

    @classmethod
    def _code_of(cls, recipe: Recipe, group: Any) -> int:
        # Equal recipes share a code (a script that builds DelayedScaling() every step must not
        # grow this list); groups compare by identity.
        for i, (r, g) in enumerate(cls._recipe_entries):
            if g is group and (r is recipe or (type(r) is type(recipe) and r == recipe)):
                return i + 1
        cls._recipe_entries.append((recipe, group))
        return len(cls._recipe_entries)

    # ---------------------------------------------------------------- autocast
    @classmethod
    def autocast_enter(
        cls, enabled: bool, calibrating: bool, recipe: Recipe | None, group: Any
    ) -> _AutocastState:
        if enabled:
            ok, reason = check_fp8_support()
            if not ok:
                raise RuntimeError(f"fp8_autocast: FP8 is not available: {reason}")
        recipe = _check_recipe(recipe)
        if cls._depth == 0:
            # Backward updates that no engine callback performed (compiled backward) happen now,
            # before any backward scale is read again.
            cls.reduce_and_update_fp8_tensors(forward=False)
        saved = cls._state
        code = cls._code_of(recipe, group) if (enabled or calibrating) else 0
        cls._state = _AutocastState(enabled, calibrating, recipe, group, code)
        if code and recipe.delayed():
            cls._fwd_codes.add(code)
            cls._bwd_codes.add(code)
            # History length follows the recipe. Resized here, before any forward captures the
            # buffers for its backward, never between a forward and its backward.
            for m in cls._registered():
                m.resize_amax_history(recipe.amax_history_len)
        cls._depth += 1
        return saved

    @classmethod
    def autocast_exit(cls, saved: _AutocastState) -> None:
        cls._depth -= 1
        cls._state = saved
        if cls._depth == 0:
            cls.reduce_and_update_fp8_tensors(forward=True)

    # ---------------------------------------------------------------- activation recompute
    @classmethod
    def snapshot(cls) -> _AutocastState:
        """The FP8 state a checkpointed forward ran under (checkpoint.py)."""
        return cls._state

    @classmethod
    def enter_recompute(cls, state: _AutocastState) -> tuple[_AutocastState, int]:
        """Run a recompute under the forward's FP8 state. The extra depth keeps autocasts opened
        inside it from running delayed-scaling updates (the step was counted by the forward)."""
        saved = (cls._state, cls._depth)
        cls._state = state
        cls._depth += 1
        return saved

    @classmethod
    def exit_recompute(cls, saved: tuple[_AutocastState, int]) -> None:
        cls._state, cls._depth = saved

    # ---------------------------------------------------------------- graphed weight caching
    # TE's skip_fp8_weight_update tensor: set by a graphed callable built with
    # cache_quantized_params for the duration of its forward (True: reuse the cached weight casts,
    # is_first_microbatch=False; False: recast); None outside one.
    _skip_weight_update: ClassVar[torch.Tensor | None] = None

    @classmethod
    def set_skip_fp8_weight_update_tensor(cls, skip: bool | torch.Tensor | None) -> None:
        if skip is None:
            cls._skip_weight_update = None
            return
        cls._skip_weight_update = torch.tensor([float(bool(skip))], dtype=torch.float32)

    @classmethod
    def get_skip_fp8_weight_update_tensor(cls) -> torch.Tensor | None:
        return cls._skip_weight_update

    # ---------------------------------------------------------------- delayed-scaling updates
    @classmethod
    def queue_backward_update(cls) -> None:
        """Called from an eager FP8 backward: runs the backward update once this backward pass ends."""
        if cls._bwd_callback_queued:
            return
        cls._bwd_callback_queued = True

        def _callback() -> None:
            cls._bwd_callback_queued = False
            cls.reduce_and_update_fp8_tensors(forward=False)

        torch.autograd.Variable._execution_engine.queue_callback(_callback)

    @classmethod
    def reduce_and_update_fp8_tensors(cls, forward: bool) -> None:
        """Amax reduction + history/scale update of every module that ran (forward: since the last
        forward update; backward: whose backward has run since the last backward update)."""
        # Backward: every delayed code ever entered (bounded by the distinct recipes): a backward
        # may run inside the block or long after it; the "ran" flags select the modules.
        codes = cls._fwd_codes if forward else cls._bwd_codes
        if not codes:
            return
        modules = [m for m in cls._registered() if m.fp8_meta_initialized()]
        # The modules that ran under each code: their "ran" flags, read in one host transfer.
        # Only these join the amax reduction. A module that did not run is not updated anyway,
        # and the set of live modules is not the same on every rank: one dropped inside a
        # reference cycle lives until Python's cyclic collector runs, at a different moment on
        # each rank, and a reduction over it would differ in size between ranks (a gloo abort,
        # an NCCL hang). The flags are set identically on every rank of an SPMD program.
        flags = _ran_flags(modules, forward)
        for code in sorted(codes):
            recipe, group = cls._recipe_entries[code - 1]
            recipe = cls._custom_delayed.get(code, recipe)
            ran = [m for m, f in zip(modules, flags) if f == code]
            if recipe.delayed() and ran:
                _update_delayed(ran, recipe, group, code, forward)
        if forward:
            cls._fwd_codes = set()

    @classmethod
    def add_custom_delayed(cls, code: int, inner: DelayedScaling) -> None:
        """A GEMM under the CustomRecipe of `code` runs delayed scaling with `inner`'s settings:
        its amaxes join the updates of that code (one set of settings per code)."""
        known = cls._custom_delayed.setdefault(code, inner)
        if known != inner:
            raise NotImplementedError(
                "CustomRecipe: DelayedScalingRequest: requests with different settings under one "
                f"recipe are not implemented by transformer_engine_lite ({known!r} vs {inner!r})")
        cls._fwd_codes.add(code)
        cls._bwd_codes.add(code)

    # ---------------------------------------------------------------- model init
    @classmethod
    @contextlib.contextmanager
    def _model_init(cls, enabled: bool, recipe: Recipe | None, preserve: bool) -> Iterator[None]:
        checked = _check_recipe(recipe) if enabled else None  # a bad recipe changes nothing
        if checked is not None and checked.custom():
            raise NotImplementedError("quantized_model_init: recipe: CustomRecipe FP8 weight "
                                      "parameters are not implemented by transformer_engine_lite")
        saved = (cls._model_init_enabled, cls._model_init_recipe, cls._model_init_preserve)
        cls._model_init_enabled = enabled
        cls._model_init_recipe = checked
        cls._model_init_preserve = preserve
        try:
            yield
        finally:
            cls._model_init_enabled, cls._model_init_recipe, cls._model_init_preserve = saved

    @classmethod
    def reset(cls) -> None:
        """Forget all state (tests). Modules stay registered."""
        cls._state = _AutocastState()
        cls._depth = 0
        cls._fwd_codes = set()
        cls._bwd_codes = set()
        cls._bwd_callback_queued = False
        cls._skip_weight_update = None


def _ran_flags(modules: list[Any], forward: bool) -> list[int]:
    """Each module's forward / backward "ran" flag, one host transfer per device."""
    by_device: dict[torch.device, list[int]] = {}
    for i, m in enumerate(modules):
        by_device.setdefault(m.fp8_meta_device(), []).append(i)
    flags = [0] * len(modules)
    for idx in by_device.values():
        values = torch.cat([modules[i].fp8_meta_tensors(forward)[2] for i in idx]).tolist()
        for i, f in zip(idx, values):
            flags[i] = f
    return flags


def _reduce_amax(rows: torch.Tensor, group: Any) -> None:
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_world_size(group) > 1:
        dist.all_reduce(rows, op=dist.ReduceOp.MAX, group=group)


def _default_update(
    hist: torch.Tensor,
    scale: torch.Tensor,
    recipe: DelayedScaling,
    fp8_dtype: torch.dtype,
    fp8_max: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    algo = recipe.amax_compute_algo
    sf = recipe.scaling_factor_compute_algo
    if isinstance(algo, str) and sf is None:
        return torch.ops.te_lite.delayed_scaling_update(
            hist, scale, algo, fp8_dtype, float(recipe.margin)
        )
    # User callables (TE allows both): amax per column, then the scale rule or the user's.
    if callable(algo):
        amax = algo(hist)
    elif algo == "max":
        amax = torch.nan_to_num(hist, nan=0.0).amax(dim=0).clamp_min(0.0)
    else:
        amax = hist[0].clone()
    new_hist = torch.roll(hist, -1, 0)
    new_hist[0].zero_()
    if sf is not None:
        new_scale = sf(amax, scale, fp8_max, recipe)
    else:
        s = (fp8_max / amax) / (2.0**recipe.margin)
        s = torch.where(torch.isfinite(amax) & (amax > 0), s, scale)
        new_scale = torch.where(torch.isinf(s), torch.finfo(torch.float32).max, s)
    return new_hist, new_scale.to(torch.float32)


@torch.no_grad()
def _update_delayed(
    modules: list[Any], recipe: DelayedScaling, group: Any, code: int, forward: bool
) -> None:
    """Batched update: concatenate histories and scales, reduce row 0, update, and copy back only
    into the columns of modules whose flag equals `code`."""
    fp8_dtype = get_fp8_torch_dtype(recipe.fp8_format, forward)
    fp8_max = get_fp8_max(recipe.fp8_format, forward)
    # Batches per (device, history length): lengths normally all follow the recipe (autocast
    # entry resizes), but a module may hold another length (checkpoint loaded inside the block,
    # or it last ran under another recipe); it is updated as it is, never resized here.
    groups: dict[tuple[torch.device, int], list[Any]] = {}
    for m in modules:
        key = (m.fp8_meta_device(), m.fp8_meta_tensors(forward)[0].shape[0])
        groups.setdefault(key, []).append(m)
    logger.debug(
        "delayed-scaling update (%s, recipe code %d): %d module(s) in %d batch(es)",
        "forward" if forward else "backward",
        code,
        len(modules),
        len(groups),
    )
    for mods in groups.values():
        metas = [m.fp8_meta_tensors(forward) for m in mods]  # (hist, scale, ran)
        hist = torch.cat([h for h, _, _ in metas], dim=1)
        scale = torch.cat([s for _, s, _ in metas])
        if recipe.reduce_amax:
            row0 = hist[0].contiguous()
            _reduce_amax(row0, group)
            hist[0] = row0
        new_hist, new_scale = _default_update(hist, scale, recipe, fp8_dtype, fp8_max)
        # TE's rule: a slot whose newest amax is 0 (it did not quantize this step: a GEMM output,
        # a cached weight) keeps its history and scale as they are (no roll).
        seen = hist[0] != 0
        col = 0
        for h, s, ran in metas:
            n = s.numel()
            sel = (ran == code) & seen[col : col + n]  # [n] bool: no host sync
            h.copy_(torch.where(sel, new_hist[:, col : col + n], h))
            s.copy_(torch.where(sel, new_scale[col : col + n], s))
            ran.masked_fill_(ran == code, 0)
            col += n


# -------------------------------------------------------------------- public context managers
@contextlib.contextmanager
def fp8_autocast(
    enabled: bool = True,
    calibrating: bool = False,
    fp8_recipe: Recipe | None = None,
    fp8_group: Any = None,
    _graph: bool = False,
) -> Iterator[None]:
    """Run TE-lite modules in FP8 inside the block (TE's `fp8_autocast`).

    enabled: use FP8 GEMMs. calibrating: with enabled=False, run in high precision but record
    amaxes so delayed-scaling scales are ready when FP8 is turned on. fp8_recipe: the recipe
    (default DelayedScaling()). fp8_group: process group of the amax reduction (None: the default
    group). Nesting restores the outer state on exit; delayed-scaling updates happen when the
    outermost block exits.
    """
    if _graph:
        raise NotImplementedError("fp8_autocast: _graph (CUDA graph capture) is not supported")
    saved = FP8GlobalStateManager.autocast_enter(enabled, calibrating, fp8_recipe, fp8_group)
    try:
        yield
    finally:
        FP8GlobalStateManager.autocast_exit(saved)


@contextlib.contextmanager
def autocast(
    enabled: bool = True,
    calibrating: bool = False,
    recipe: Recipe | None = None,
    amax_reduction_group: Any = None,
) -> Iterator[None]:
    """TE 2.x spelling of `fp8_autocast` (recipe may be any quantization recipe)."""
    with fp8_autocast(enabled, calibrating, recipe, amax_reduction_group):
        yield


@contextlib.contextmanager
def quantized_model_init(
    enabled: bool = True,
    recipe: Recipe | None = None,
    preserve_high_precision_init_val: bool = False,
) -> Iterator[None]:
    """Modules created inside keep FP8 primary weights (TE's FP8 parameters).

    Each weight is initialized in high precision, quantized with the recipe's forward format and
    replaced by an `nn.Parameter` holding only FP8 data + scale: a `Float8Tensor` (DelayedScaling:
    scale 1.0, TE's initial delayed scale; Float8CurrentScaling: per-tensor current scaling with
    the recipe's fp8_quant_fwd_weight) or an `MXFP8Tensor` (MXFP8BlockScaling: row- and column-wise
    1x32 blocks). Under a matching fp8_autocast the GEMMs use these bytes directly; outside one the
    weight is dequantized; under a recipe of another type the forward raises RuntimeError (TE's
    "Recipe mismatch", module/_recipe_checks.py). Gradients are plain tensors of the
    parameter's nominal dtype; in-place updates (optimizer steps, copy_, load_state_dict)
    re-quantize in place with the parameter's quantizer. The module attribute
    `primary_weights_in_fp8` (and `param.fp8_primary`) flag it.
    With preserve_high_precision_init_val, `param.get_high_precision_init_val()` returns the
    pre-quantization values (a CPU copy) until `param.clear_high_precision_init_val()`.
    """
    with FP8GlobalStateManager._model_init(enabled, recipe, preserve_high_precision_init_val):
        yield


@contextlib.contextmanager
def fp8_model_init(
    enabled: bool = True,
    recipe: Recipe | None = None,
    preserve_high_precision_init_val: bool = False,
) -> Iterator[None]:
    """TE 1.x spelling of `quantized_model_init`."""
    with quantized_model_init(enabled, recipe, preserve_high_precision_init_val):
        yield

"""The quantization context: `autocast` / `fp8_autocast`, the global recipe, per-recipe configs
(scaling modes per tensor source, Flax state), support queries and QuantizerFactory.

Recipes are those of transformer_engine_lite.common.recipe (shared with PyTorch). As in TE-JAX:
DelayedScaling honours margin, fp8_format, amax_history_len and amax_compute_algo ("max" /
"most_recent"); scaling_factor_compute_algo must be None and reduce_amax True. NVFP4BlockScaling:
NVFP4_2D_SCALING for kernels (NVFP4_1D_SCALING with disable_2d_quantization), NVFP4_1D_SCALING for
x and gradients; the Hadamard transform where the recipe's QParams ask for it (x's and the
gradient's column-wise copies, unless disable_rht), stochastic rounding of gradients (unless
disable_stochastic_rounding) from a state drawn off Flax's "sr_rng" stream (TE-JAX's). Every recipe
is supported on the CPU (emulated bit-exactly), so the support queries answer True there.
"""

from __future__ import annotations

import hashlib
import warnings
from contextlib import contextmanager

import jax
import jax.numpy as jnp

from transformer_engine_lite.common import recipe as _recipe

from ..cpp_extensions.misc import FORMAT_DTYPES, DType  # noqa: F401  (DType: TE-JAX re-exports it here)
from ..cpp_extensions.base import warn_once
from ..sharding import MeshResource, _active_mesh, global_shard_guard
from .quantizer import (
    BlockScaleQuantizer,
    CurrentScaleQuantizer,
    DelayedScaleQuantizer,
    NVFP4Quantizer,
    QuantizeMeta,
    QuantizeMetaSet,
    QuantizerSet,
    noop_quantizer_set,
)
from .scaling_modes import AmaxComputeAlgo, QuantizeLayout, ScalingMode, TensorSource

__all__ = [
    "NVTE_FP8_COLLECTION_NAME",
    "QuantizerFactory",
    "autocast",
    "fp8_autocast",
    "get_global_quantize_recipe",
    "get_quantization_recipe",
    "get_quantize_config",
    "get_quantize_config_with_recipe",
    "get_supported_quantization_recipes",
    "get_supported_scaling_modes",
    "is_fp8_available",
    "is_quantize_recipe_supported",
    "is_scaling_mode_supported",
    "update_collections",
]

NVTE_FP8_COLLECTION_NAME = "fp8_metas"

_GLOBAL_RECIPE: list = [None]


def get_global_quantize_recipe():
    """The recipe of the innermost enabled autocast, or None."""
    return _GLOBAL_RECIPE[0]


def _check_recipe(r) -> None:
    if isinstance(r, _recipe.DelayedScaling):
        if r.scaling_factor_compute_algo is not None:
            raise ValueError("DelayedScaling: scaling_factor_compute_algo: expected None (TE-JAX "
                             f"computes the scale itself), got {r.scaling_factor_compute_algo!r}")
        if not r.reduce_amax:
            raise ValueError("DelayedScaling: reduce_amax: expected True in JAX (amaxes are "
                             "reduced across the mesh), got False")
        if r.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError("DelayedScaling: amax_compute_algo: expected 'max' or 'most_recent' "
                             f"in JAX, got {r.amax_compute_algo!r}")
    elif isinstance(r, _recipe.MXFP8BlockScaling):
        if r.fp8_format not in (_recipe.Format.E4M3, _recipe.Format.HYBRID, _recipe.Format.E5M2):
            raise ValueError("MXFP8BlockScaling: fp8_format: expected an OCP format (E4M3, E5M2, "
                             f"HYBRID), got {r.fp8_format}")
    elif isinstance(r, _recipe.NVFP4BlockScaling):
        # TE's PyTorch-only NVFP4 options: TE-JAX has no row-scaled or 4over6 quantizer.
        if r.row_scaled_activation:
            raise NotImplementedError("NVFP4BlockScaling: row_scaled_activation=True is not "
                                      "supported by the JAX front end")
        if r.nvfp4_4over6 != "none":
            raise NotImplementedError(f"NVFP4BlockScaling: nvfp4_4over6={r.nvfp4_4over6!r} is not "
                                      "supported by the JAX front end (expected 'none')")
    elif not isinstance(r, _recipe.Float8CurrentScaling):
        raise ValueError(f"recipe: expected DelayedScaling, Float8CurrentScaling, "
                         f"MXFP8BlockScaling or NVFP4BlockScaling in JAX, got {type(r).__name__}")
    if getattr(r, "backward_override", None) is not None:
        raise NotImplementedError(f"{type(r).__name__}: backward_override="
                                  f"{r.backward_override!r} is not supported by the JAX front end")


@contextmanager
def autocast(enabled: bool = False, recipe=None, mesh_resource: MeshResource | None = None):
    """Quantized GEMMs inside (TE-JAX's autocast). recipe None -> DelayedScaling()."""
    if recipe is None:
        recipe = _recipe.DelayedScaling()
    if enabled:
        _check_recipe(recipe)
    previous = _GLOBAL_RECIPE[0]
    with global_shard_guard(mesh_resource or MeshResource()):
        _GLOBAL_RECIPE[0] = recipe if enabled else None
        try:
            yield
        finally:
            _GLOBAL_RECIPE[0] = previous


@contextmanager
def fp8_autocast(enabled: bool = False, fp8_recipe=None, mesh_resource=None):
    """Deprecated alias of autocast (TE-JAX's)."""
    warnings.warn("fp8_autocast is deprecated; use autocast(enabled, recipe, mesh_resource)",
                  DeprecationWarning, stacklevel=3)
    with autocast(enabled, fp8_recipe, mesh_resource):
        yield


def update_collections(new: dict, original: dict):
    """Merges `new` into `original`, keeping original's type (dict or FrozenDict)."""
    from flax.core import frozen_dict

    merged = {**frozen_dict.unfreeze(original), **frozen_dict.unfreeze(new)}
    if isinstance(original, frozen_dict.FrozenDict):
        return frozen_dict.freeze(merged)
    return merged


# ------------------------------------------------------------------------------ configs
class QuantizeConfig:
    """What a recipe means for the GEMMs: dtypes and scaling modes per tensor source, Flax state."""

    COLLECTION_NAME = NVTE_FP8_COLLECTION_NAME

    def __init__(self, recipe=None) -> None:
        self.recipe = recipe

    def is_fp8_enabled(self) -> bool:
        return self.recipe is not None

    # TE-JAX's config fields, read from the recipe (None without one, or where the recipe has no
    # such field: MARGIN / AMAX_* belong to DelayedScaling).
    @property
    def FWD_DTYPE(self):  # noqa: N802  (TE's name)
        return None if self.recipe is None else _format2dtypes(self._data_format())[0]

    @property
    def BWD_DTYPE(self):  # noqa: N802
        return None if self.recipe is None else _format2dtypes(self._data_format())[1]

    def _data_format(self):
        """The format of the quantized data: NVFP4's fp4_format (its fp8_format is the block
        scales'), the others' fp8_format."""
        return self.recipe.fp4_format if self._nvfp4() else self.recipe.fp8_format

    def _nvfp4(self) -> bool:
        return isinstance(self.recipe, _recipe.NVFP4BlockScaling)

    # TE-JAX's NVFP4 config fields (None for the other recipes).
    @property
    def DISABLE_STOCHASTIC_ROUNDING(self):  # noqa: N802
        return self.recipe.disable_stochastic_rounding if self._nvfp4() else None

    @property
    def DISABLE_RHT(self):  # noqa: N802
        return self.recipe.disable_rht if self._nvfp4() else None

    @property
    def DISABLE_2D_QUANTIZATION(self):  # noqa: N802
        return self.recipe.disable_2d_quantization if self._nvfp4() else None

    @property
    def MARGIN(self):  # noqa: N802
        return getattr(self.recipe, "margin", None) if self._delayed() else None

    @property
    def AMAX_HISTORY_LEN(self):  # noqa: N802
        return self.recipe.amax_history_len if self._delayed() else None

    @property
    def AMAX_COMPUTE_ALGO(self):  # noqa: N802
        return AmaxComputeAlgo(self.recipe.amax_compute_algo) if self._delayed() else None

    def _delayed(self) -> bool:
        return isinstance(self.recipe, _recipe.DelayedScaling)

    def get_scaling_mode(self, tensor_source: TensorSource) -> ScalingMode:
        r = self.recipe
        if r is None:
            return ScalingMode.NO_SCALING
        if isinstance(r, _recipe.DelayedScaling):
            return ScalingMode.DELAYED_TENSOR_SCALING
        if isinstance(r, _recipe.Float8CurrentScaling):
            return ScalingMode.CURRENT_TENSOR_SCALING
        if self._nvfp4():
            if tensor_source == TensorSource.KERNEL and not r.disable_2d_quantization:
                return ScalingMode.NVFP4_2D_SCALING
            return ScalingMode.NVFP4_1D_SCALING
        return ScalingMode.MXFP8_1D_SCALING

    def dtype(self, tensor_source: TensorSource):
        if self._nvfp4():
            return jnp.float4_e2m1fn
        fmt = self.recipe.fp8_format
        return FORMAT_DTYPES[fmt.dtype_name(tensor_source != TensorSource.DGRAD)]

    def get_quantize_flax_meta(self, module, collection_name, postfix, tensor_source,
                               quantizer_name) -> QuantizeMeta:
        """Delayed scaling: the variables `{name}{postfix}_scale` (1,) and
        `{name}{postfix}_amax_history` (amax_history_len,) in `collection_name`. NVFP4: whether
        the tensor's column-wise copy is Hadamard-transformed, and for the gradient (with
        stochastic rounding) a fresh uint32 [num_devices, 4] state from the module's "sr_rng"
        stream folded with a hash of `quantizer_name` (TE-JAX's derivation)."""
        if self._nvfp4():
            return self._nvfp4_meta(module, tensor_source, quantizer_name)
        if not isinstance(self.recipe, _recipe.DelayedScaling):
            return QuantizeMeta()
        n = self.recipe.amax_history_len
        scale = module.variable(collection_name, f"{quantizer_name}{postfix}_scale",
                                jnp.ones, (1,), jnp.float32)
        hist = module.variable(collection_name, f"{quantizer_name}{postfix}_amax_history",
                               jnp.zeros, (n,), jnp.float32)
        return QuantizeMeta(scale=scale.value, amax_history=hist.value)

    def _nvfp4_meta(self, module, tensor_source, quantizer_name) -> QuantizeMeta:
        use_rht = _recipe_rht(self.recipe, tensor_source)
        if tensor_source != TensorSource.DGRAD or self.recipe.disable_stochastic_rounding:
            return QuantizeMeta(use_rht=use_rht)
        key = module.make_rng("sr_rng")
        digest = int(hashlib.sha256(quantizer_name.encode("utf-8")).hexdigest(), 16)
        key = jax.random.fold_in(key, digest % jnp.iinfo(jnp.int32).max)
        state = jax.random.randint(key, (_num_devices_in_mesh(), 4), 0, jnp.iinfo(jnp.int32).max,
                                   dtype=jnp.int32).view(jnp.uint32)
        return QuantizeMeta(use_rht=use_rht, stochastic_rounding_rng_state=state)

    def is_supported(self) -> tuple[bool, str]:
        return True, ""


def _num_devices_in_mesh() -> int:
    mesh = _active_mesh()
    return 1 if mesh is None else int(mesh.size)


def _recipe_qparams(recipe, tensor_source):
    return {TensorSource.X: recipe.fp4_quant_fwd_inp, TensorSource.KERNEL:
            recipe.fp4_quant_fwd_weight, TensorSource.DGRAD: recipe.fp4_quant_bwd_grad}[
                TensorSource(tensor_source)]


def _recipe_rht(recipe, tensor_source) -> bool:
    """The recipe's RHT choice for a tensor (its QParams: x and gradients unless disable_rht;
    never the weights, whose GEMM partners are not transformed)."""
    return bool(_recipe_qparams(recipe, tensor_source).random_hadamard_transform)


def _format2dtypes(fmt):
    """TE-JAX's helper: a recipe Format -> (forward dtype, backward dtype)."""
    if not isinstance(fmt, _recipe.Format):
        raise TypeError(f"_format2dtypes: argument 'fmt': expected a recipe.Format, got {fmt!r}")
    table = {**FORMAT_DTYPES, "e2m1": jnp.float4_e2m1fn}  # E2M1: NVFP4's data format
    return (table[fmt.dtype_name(True)], table[fmt.dtype_name(False)])


def get_quantize_config_with_recipe(recipe) -> QuantizeConfig:
    return QuantizeConfig(recipe)


def get_quantize_config() -> QuantizeConfig:
    return QuantizeConfig(get_global_quantize_recipe())


# ------------------------------------------------------------------------------ support queries
_CPU_MODES = (ScalingMode.NO_SCALING, ScalingMode.DELAYED_TENSOR_SCALING,
              ScalingMode.CURRENT_TENSOR_SCALING, ScalingMode.MXFP8_1D_SCALING,
              ScalingMode.NVFP4_1D_SCALING, ScalingMode.NVFP4_2D_SCALING)


def is_scaling_mode_supported(scaling_mode=ScalingMode.NO_SCALING, gpu_id=None):
    """(supported, reason), reason a str ("" when supported) as TE's, so that
    `pytest.mark.skipif(not ok, reason=reason)` works: every mode runs (bit-exactly)."""
    del gpu_id
    if ScalingMode(scaling_mode) in _CPU_MODES:
        return True, ""
    return False, f"{ScalingMode(scaling_mode).name} is not implemented by transformer_engine_lite"


def is_fp8_available(scaling_mode=ScalingMode.DELAYED_TENSOR_SCALING, gpu_id=None):
    warnings.warn("is_fp8_available is deprecated; use is_scaling_mode_supported",
                  DeprecationWarning, stacklevel=2)
    return is_scaling_mode_supported(scaling_mode, gpu_id)


_RECIPES = {"DelayedScaling": _recipe.DelayedScaling,
            "Float8CurrentScaling": _recipe.Float8CurrentScaling,
            "MXFP8BlockScaling": _recipe.MXFP8BlockScaling,
            "NVFP4BlockScaling": _recipe.NVFP4BlockScaling}


def get_supported_scaling_modes():
    return [m for m in _CPU_MODES if m != ScalingMode.NO_SCALING]


def get_supported_quantization_recipes():
    return [cls() for cls in _RECIPES.values()]


def is_quantize_recipe_supported(name: str) -> bool:
    return name in _RECIPES


def get_quantization_recipe(name: str):
    if name not in _RECIPES:
        raise ValueError(f"get_quantization_recipe: name: expected one of {list(_RECIPES)}, got "
                         f"{name!r}")
    return _RECIPES[name]()


# ------------------------------------------------------------------------------ factory
class QuantizerFactory:
    @staticmethod
    def create(n_quantizers: int = 1, scaling_mode=None, q_dtype=None, q_layout=None,
               n_groups=None, checkpoint_name=None, recipe=None,
               meta: QuantizeMeta | None = None, tensor_source=TensorSource.X, **kwargs):
        """TE-JAX's factory: `n_quantizers` quantizers (one, or a tuple) of `scaling_mode`; None per
        quantizer for NO_SCALING. `recipe`, `meta` and `tensor_source` (the lite's) give a
        recipe's settings and a delayed-scaling state. q_layout None = row- and column-wise.
        NVFP4 modes also take TE-JAX's `use_rht` and `stochastic_rounding_rng_state` (over what
        `meta` / `recipe` say)."""
        nvfp4_args = {"use_rht", "stochastic_rounding_rng_state"}
        if set(kwargs) - nvfp4_args or (kwargs and scaling_mode is not None
                                        and not ScalingMode(scaling_mode).is_nvfp4_scaling):
            raise TypeError(f"QuantizerFactory.create: unexpected arguments {sorted(kwargs)} for "
                            f"{scaling_mode!r} (use_rht and stochastic_rounding_rng_state are "
                            "NVFP4's)")
        if n_groups is not None and (isinstance(n_groups, bool) or not isinstance(n_groups, int)
                                     or n_groups < 1):
            raise ValueError(f"QuantizerFactory.create: n_groups: expected a positive int or None, "
                             f"got {n_groups!r}")
        if not isinstance(n_quantizers, int) or n_quantizers < 1:
            raise ValueError(f"QuantizerFactory.create: n_quantizers: expected a positive int, got "
                             f"{n_quantizers!r}")
        if scaling_mode is None:
            raise ValueError("QuantizerFactory.create: scaling_mode: expected a ScalingMode, got "
                             "None")
        layout = QuantizeLayout.ROWWISE_COLWISE if q_layout is None else QuantizeLayout(q_layout)
        if kwargs:
            m = meta or QuantizeMeta()
            meta = QuantizeMeta(m.scale, m.amax_history,
                                kwargs.get("use_rht", m.use_rht),
                                kwargs.get("stochastic_rounding_rng_state",
                                           m.stochastic_rounding_rng_state))

        def one():
            q = QuantizerFactory._create_one(scaling_mode, q_dtype, layout, recipe, meta,
                                             tensor_source, checkpoint_name)
            if q is None or n_groups is None:
                return q
            # grouped (MoE): one quantizer of the recipe per group (its own delayed state)
            from .grouped import GroupedQuantizer

            return GroupedQuantizer(
                q_dtype=q.q_dtype, scaling_mode=q.scaling_mode, q_layout=q.q_layout,
                checkpoint_name=q.checkpoint_name, n_groups=n_groups,
                quantizers=(q,) + tuple(QuantizerFactory._create_one(
                    scaling_mode, q_dtype, layout, recipe, meta, tensor_source, checkpoint_name)
                    for _ in range(n_groups - 1)))

        qs = [one() for _ in range(n_quantizers)]
        return qs[0] if n_quantizers == 1 else tuple(qs)

    @staticmethod
    def _create_one(scaling_mode, q_dtype, q_layout, recipe, meta, tensor_source,
                    checkpoint_name):
        q = QuantizerFactory._make(scaling_mode, q_dtype, q_layout, recipe, meta, tensor_source)
        if q is not None:
            q.checkpoint_name = checkpoint_name
        return q

    @staticmethod
    def _make(scaling_mode, q_dtype, q_layout, recipe, meta, tensor_source):
        mode = ScalingMode(scaling_mode)
        if mode == ScalingMode.NO_SCALING:
            return None
        if mode == ScalingMode.DELAYED_TENSOR_SCALING:
            n = recipe.amax_history_len if recipe is not None else 1024
            meta = meta or QuantizeMeta()
            return DelayedScaleQuantizer(
                q_dtype=q_dtype, q_layout=q_layout,
                margin=float(recipe.margin) if recipe is not None else 0.0,
                amax_compute_algo=AmaxComputeAlgo(recipe.amax_compute_algo if recipe else "max"),
                scale=meta.scale if meta.scale is not None else jnp.ones((1,), jnp.float32),
                amax_history=(meta.amax_history if meta.amax_history is not None
                              else jnp.zeros((n,), jnp.float32)))
        if mode == ScalingMode.CURRENT_TENSOR_SCALING:
            q = None
            if recipe is not None:
                q = {TensorSource.X: recipe.fp8_quant_fwd_inp,
                     TensorSource.KERNEL: recipe.fp8_quant_fwd_weight,
                     TensorSource.DGRAD: recipe.fp8_quant_bwd_grad}[tensor_source]
            pow2 = bool(recipe.use_power_2_scales or (q is not None and q.power_2_scale)) if recipe \
                else False
            return CurrentScaleQuantizer(q_dtype=q_dtype, q_layout=q_layout, power_2_scale=pow2,
                                         amax_epsilon=float(q.amax_epsilon) if q else 0.0)
        if mode == ScalingMode.MXFP8_1D_SCALING:
            return BlockScaleQuantizer(q_dtype=q_dtype, q_layout=q_layout)
        if mode.is_nvfp4_scaling:
            return QuantizerFactory._nvfp4(mode, q_dtype, q_layout, recipe, meta, tensor_source)
        raise NotImplementedError(f"QuantizerFactory.create: scaling_mode {mode.name} is not "
                                  "implemented by transformer_engine_lite")

    @staticmethod
    def _nvfp4(mode, q_dtype, q_layout, recipe, meta, tensor_source):
        """use_rht: the meta's, else the recipe's QParams, else off (TE-JAX's default). The
        stochastic-rounding state: the meta's; a recipe asking for SR without one (a functional
        create_set outside Flax) rounds to nearest, with a warning."""
        meta = meta or QuantizeMeta()
        nv = isinstance(recipe, _recipe.NVFP4BlockScaling)
        use_rht = meta.use_rht
        if use_rht is None:
            use_rht = _recipe_rht(recipe, tensor_source) if nv else False
        state = meta.stochastic_rounding_rng_state
        if (state is None and nv and _recipe_qparams(recipe, tensor_source).stochastic_rounding):
            warn_once("NVFP4BlockScaling: stochastic rounding of gradients needs a state "
                      "(Flax modules draw it from the 'sr_rng' stream; or pass "
                      "QuantizeMeta(stochastic_rounding_rng_state=uint32 [num_devices, 4])); "
                      "without one the gradient rounds to nearest")
        return NVFP4Quantizer(q_dtype=jnp.float4_e2m1fn if q_dtype is None else q_dtype,
                              scaling_mode=mode, q_layout=q_layout, use_rht=bool(use_rht),
                              stochastic_rounding_rng_state=state)

    @staticmethod
    def create_set(n_quantizer_sets: int = 1, scaling_mode=None, fwd_dtype=None, bwd_dtype=None,
                   is_2x2x=None, fp8_recipe=None, quantize_meta_set: QuantizeMetaSet | None = None,
                   checkpoint_name: str | None = None, n_groups: int | None = None):
        """QuantizerSet(s) for the given recipe (default: the global one; none -> noop).
        checkpoint_name goes to the forward (x, kernel) quantizers: their outputs are the
        residuals a remat policy may keep; the gradient's quantization is never saved.
        n_groups: GroupedQuantizers (grouped_dense / grouped_gemm)."""
        recipe = fp8_recipe if fp8_recipe is not None else get_global_quantize_recipe()
        if recipe is None and scaling_mode is None:
            sets = [noop_quantizer_set] * n_quantizer_sets
            return sets[0] if n_quantizer_sets == 1 else tuple(sets)
        cfg = QuantizeConfig(recipe)
        metas = quantize_meta_set or QuantizeMetaSet()
        layout = QuantizeLayout.ROWWISE_COLWISE if is_2x2x in (None, True) else \
            QuantizeLayout.ROWWISE

        def make(src, meta):
            mode = scaling_mode if scaling_mode is not None else cfg.get_scaling_mode(src)
            if recipe is not None:
                dt = cfg.dtype(src)
            else:
                dt = bwd_dtype if src == TensorSource.DGRAD else fwd_dtype
            if src == TensorSource.DGRAD and bwd_dtype is not None:
                dt = bwd_dtype
            elif src != TensorSource.DGRAD and fwd_dtype is not None:
                dt = fwd_dtype
            return QuantizerFactory.create(scaling_mode=mode, q_dtype=dt, q_layout=layout,
                                           recipe=recipe, meta=meta, tensor_source=src,
                                           checkpoint_name=None if src == TensorSource.DGRAD
                                           else checkpoint_name, n_groups=n_groups)

        sets = [QuantizerSet(make(TensorSource.X, metas.x), make(TensorSource.KERNEL, metas.kernel),
                             make(TensorSource.DGRAD, metas.grad))
                for _ in range(n_quantizer_sets)]
        return sets[0] if n_quantizer_sets == 1 else tuple(sets)

"""TE's recipe states and the delayed-scaling update functions of te.pytorch.quantization
(RecipeState and its per-recipe classes, _default_sf_compute, _amax_and_scale_update), and the
`fp8_meta` dict of a module (TE's meaning: "recipe", "scaling_fwd" / "scaling_bwd" recipe states,
"fp8_max_fwd" / "fp8_max_bwd", ...) over the module's own FP8 buffers (module/base.py).

A DelayedScalingRecipeState here holds *views* of the module's amax history [L, n] and scale [n]:
writes through it change the module, and the module's updates (in place) show through it."""

from __future__ import annotations

from typing import Any

import torch

from ..common.recipe import DelayedScaling, Recipe
from .fp8 import get_fp8_max, get_fp8_torch_dtype

__all__ = [
    "DelayedScalingRecipeState",
    "Float8CurrentScalingRecipeState",
    "Float8BlockScalingRecipeState",
    "MXFP8BlockScalingRecipeState",
    "NVFP4BlockScalingRecipeState",
    "RecipeState",
    "build_fp8_meta",
    "meta_tensor_key",
]

_FP32_MAX = torch.finfo(torch.float32).max
# fp8_max -> the dtype of the fused update kernel (E5M2 and its FNUZ variant share 57344 and
# therefore every scale); any other fp8_max takes the torch path.
_DTYPE_OF_MAX = {448.0: torch.float8_e4m3fn, 57344.0: torch.float8_e5m2,
                 240.0: torch.float8_e4m3fnuz}


def meta_tensor_key(forward: bool = True) -> str:
    """TE's FP8GlobalStateManager.get_meta_tensor_key: the fp8_meta key of a direction."""
    return "scaling_fwd" if forward else "scaling_bwd"


def _check_mode(owner: str, mode: str) -> bool:
    if mode not in ("forward", "backward"):
        raise ValueError(f"{owner}: mode: expected 'forward' or 'backward', got {mode!r}")
    return mode == "forward"


class RecipeState:
    """A recipe's per-direction quantization state (TE's RecipeState): `create` picks the class
    of the recipe; `make_quantizers()` returns one quantizer per slot."""

    def __init__(self, recipe: Recipe, mode: str, num_quantizers: int = 1) -> None:
        self.recipe = recipe
        self.mode = mode
        self.num_quantizers = num_quantizers
        fwd = _check_mode(type(self).__name__, mode)
        fmt = getattr(recipe, "fp8_format", None)
        self.dtype = get_fp8_torch_dtype(fmt, fwd) if fmt is not None else None

    @staticmethod
    def create(recipe: Recipe, *, mode: str, num_quantizers: int = 1, **kwargs: Any) -> RecipeState:
        for cls in (DelayedScalingRecipeState, Float8CurrentScalingRecipeState,
                    MXFP8BlockScalingRecipeState, Float8BlockScalingRecipeState,
                    NVFP4BlockScalingRecipeState):
            if cls.accepts(recipe):
                return cls(recipe, mode=mode, num_quantizers=num_quantizers, **kwargs)
        if recipe.custom():
            from .quantization import CustomRecipeState

            return CustomRecipeState(recipe, mode=mode, num_quantizers=num_quantizers, **kwargs)
        raise NotImplementedError(
            f"RecipeState.create: {type(recipe).__name__} has no recipe state in "
            "transformer_engine_lite (DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling, "
            "Float8BlockScaling, NVFP4BlockScaling, CustomRecipe)"
        )

    def make_quantizers(self) -> list[Any]:
        raise NotImplementedError


class DelayedScalingRecipeState(RecipeState):
    """scale [n] and amax_history [L, n] (row 0: the current step's amaxes); given tensors are
    used as they are (views of a module's buffers), else new ones (scale 1, history 0)."""

    @staticmethod
    def accepts(recipe: Recipe) -> bool:
        return recipe.delayed()

    def __init__(self, recipe: Recipe, mode: str, num_quantizers: int = 1, *,
                 device: Any = None, scale: torch.Tensor | None = None,
                 amax_history: torch.Tensor | None = None) -> None:
        super().__init__(recipe, mode, num_quantizers)
        dev = torch.device(device) if device is not None else torch.device("cpu")
        if scale is None:
            scale = torch.ones(num_quantizers, dtype=torch.float32, device=dev)
        if amax_history is None:
            amax_history = torch.zeros(recipe.amax_history_len, num_quantizers,
                                       dtype=torch.float32, device=dev)
        self.scale = scale
        self.amax_history = amax_history

    def make_quantizers(self) -> list[Any]:
        from .tensor import Float8Quantizer

        return [Float8Quantizer(self.scale[i : i + 1], self.amax_history[0, i : i + 1], self.dtype)
                for i in range(self.num_quantizers)]


class Float8CurrentScalingRecipeState(RecipeState):
    """Stateless: the quantizers take the recipe's per-role QParams (forward slot 3g: input,
    3g + 1: weight, 3g + 2: output; backward: gradients)."""

    @staticmethod
    def accepts(recipe: Recipe) -> bool:
        return recipe.float8_current_scaling()

    def __init__(self, recipe: Recipe, mode: str, num_quantizers: int = 1, *,
                 device: Any = None) -> None:
        super().__init__(recipe, mode, num_quantizers)
        self.device = torch.device(device) if device is not None else None

    def make_quantizers(self) -> list[Any]:
        from .tensor import Float8CurrentScalingQuantizer

        r = self.recipe
        roles = (r.fp8_quant_fwd_inp, r.fp8_quant_fwd_weight, r.fp8_quant_fwd_inp)
        out = []
        for i in range(self.num_quantizers):
            qp = roles[i % 3] if self.mode == "forward" else r.fp8_quant_bwd_grad
            out.append(Float8CurrentScalingQuantizer(
                self.dtype, self.device, force_pow_2_scales=bool(qp.power_2_scale),
                amax_epsilon=float(qp.amax_epsilon)))
        return out


class MXFP8BlockScalingRecipeState(RecipeState):
    """Stateless: MXFP8 quantizers of the recipe's format."""

    @staticmethod
    def accepts(recipe: Recipe) -> bool:
        return recipe.mxfp8()

    def __init__(self, recipe: Recipe, mode: str, num_quantizers: int = 1, *,
                 device: Any = None) -> None:
        super().__init__(recipe, mode, num_quantizers)

    def make_quantizers(self) -> list[Any]:
        from .tensor import MXFP8Quantizer

        return [MXFP8Quantizer(self.dtype) for _ in range(self.num_quantizers)]


class Float8BlockScalingRecipeState(RecipeState):
    """Stateless: Float8BlockQuantizers of the recipe (TE's order per GEMM: forward input, weight,
    output; backward grad output, grad input)."""

    @staticmethod
    def accepts(recipe: Recipe) -> bool:
        return recipe.float8_block_scaling()

    def __init__(self, recipe: Recipe, mode: str, num_quantizers: int = 1, *,
                 device: Any = None) -> None:
        super().__init__(recipe, mode, num_quantizers)

    def make_quantizers(self) -> list[Any]:
        from .tensor import Float8BlockQuantizer

        r = self.recipe
        if self.mode == "forward":
            roles = ((r.fp8_quant_fwd_inp, r.x_block_scaling_dim),
                     (r.fp8_quant_fwd_weight, r.w_block_scaling_dim),
                     (r.fp8_quant_fwd_inp, r.x_block_scaling_dim))
        else:
            roles = ((r.fp8_quant_bwd_grad, r.grad_block_scaling_dim),) * 2
        return [
            Float8BlockQuantizer(self.dtype, rowwise=True, columnwise=True,
                                 amax_epsilon=float(qp.amax_epsilon),
                                 force_pow_2_scales=bool(qp.power_2_scale), block_scaling_dim=d)
            for qp, d in (roles[i % len(roles)] for i in range(self.num_quantizers))
        ]


_FWD_TYPES = ("input", "weight", "output")
_BWD_TYPES = ("grad_output", "grad_input")


class NVFP4BlockScalingRecipeState(RecipeState):
    """Stateless: one NVFP4Quantizer per slot, chosen by the slot's tensor type (TE's rules).
    The type is the slot's role's tensor_type when `roles` gives a known one, else positional
    (forward: input, weight, output, ...; backward: grad_output, grad_input, ...). Weights take
    fp4_quant_fwd_weight, gradients fp4_quant_bwd_grad, every other forward type (output too)
    fp4_quant_fwd_inp; 4over6 (and its 256 E4M3 bound) applies to the non-gradient types the
    recipe's scopes select, never to gradients; forward non-weight slots are row-scaled under
    row_scaled_activation. 4over6 with the slot's RHT or stochastic rounding is TE's ValueError."""

    @staticmethod
    def accepts(recipe: Recipe) -> bool:
        return recipe.nvfp4()

    def __init__(self, recipe: Recipe, mode: str, num_quantizers: int = 1, *,
                 device: Any = None, roles: list[Any] | None = None) -> None:
        from .quantization import QuantizerRole

        if roles is not None and (len(roles) != num_quantizers or any(
                r is not None and not isinstance(r, QuantizerRole) for r in roles)):
            raise ValueError(
                f"NVFP4BlockScalingRecipeState: roles: expected None or {num_quantizers} "
                f"QuantizerRole / None entries (one per quantizer), got {roles!r}"
            )
        super().__init__(recipe, mode, num_quantizers)
        self.roles = roles
        self.dtype = None  # FP4 (DType.kFloat4E2M1): the quantizers carry it

    def _tensor_type(self, i: int) -> str:
        role = self.roles[i] if self.roles is not None else None
        if role is not None and role.tensor_type in _FWD_TYPES + _BWD_TYPES:
            return role.tensor_type
        types = _FWD_TYPES if self.mode == "forward" else _BWD_TYPES
        return types[i % len(types)]

    def make_quantizers(self) -> list[Any]:
        from .quantization import _in_scope
        from .tensor import NVFP4Quantizer

        r = self.recipe
        out = []
        for i in range(self.num_quantizers):
            kind = self._tensor_type(i)
            grad = kind in _BWD_TYPES
            qp = r.fp4_quant_bwd_grad if grad else (
                r.fp4_quant_fwd_weight if kind == "weight" else r.fp4_quant_fwd_inp)
            # _in_scope reads "weight" against every other forward type
            scope_role = "weight" if kind == "weight" else "input"
            four = not grad and _in_scope(r.nvfp4_4over6, scope_role)
            if four and qp.random_hadamard_transform:
                raise ValueError("NVFP4 4over6 quantization does not support RHT.")
            if four and qp.stochastic_rounding:
                raise ValueError("NVFP4 4over6 quantization does not support stochastic rounding.")
            e4m3_max = 256 if four and _in_scope(r.nvfp4_4over6_e4m3_use_256, scope_role) else 448
            out.append(NVFP4Quantizer(
                rowwise=True, columnwise=True,
                with_rht=bool(qp.random_hadamard_transform),
                with_post_rht_amax=bool(qp.random_hadamard_transform),
                with_2d_quantization=bool(qp.fp4_2d_quantization),
                stochastic_rounding=bool(qp.stochastic_rounding),
                row_scaled_nvfp4=(self.mode == "forward" and kind != "weight"
                                  and bool(r.row_scaled_activation)),
                nvfp4_use_4over6=four, nvfp4_e4m3_max=e4m3_max,
                nvfp4_4over6_err_mode=r.nvfp4_4over6_err_mode,
            ))
        return out


def _default_sf_compute(amax: torch.Tensor, scale: torch.Tensor, fp8_max: float,
                        margin: float) -> torch.Tensor:
    """TE's scale rule, written into `scale` and returned: (fp8_max / amax) / 2^margin where amax
    is finite and > 0; the previous scale where amax is 0, Inf or NaN; FP32 max where the quotient
    overflows (amax below fp8_max / FP32 max)."""
    sf = (fp8_max / amax) / (2.0**margin)
    sf = torch.where(torch.isfinite(amax) & (amax > 0.0), sf, scale)
    sf = torch.where(torch.isinf(sf), torch.full_like(sf, _FP32_MAX), sf)
    scale.copy_(sf)
    return scale


@torch.no_grad()
def _amax_and_scale_update(amax_history: torch.Tensor, scale: torch.Tensor, fp8_max: float,
                           recipe: DelayedScaling) -> None:
    """One delayed-scaling step on (amax_history [L, n], scale [n]), in place: TE's unfused
    update. String algorithms with the default scale rule run the modules' fused kernel
    (torch.ops.te_lite.delayed_scaling_update_, so both agree bit for bit); a callable
    amax_compute_algo or scaling_factor_compute_algo runs here: amax from the history (before the
    roll), history rolled by -1 with row 0 zeroed, then the scale rule."""
    if not isinstance(recipe, DelayedScaling):
        raise TypeError(f"_amax_and_scale_update: recipe: expected DelayedScaling, got "
                        f"{type(recipe).__name__}")
    algo, sf = recipe.amax_compute_algo, recipe.scaling_factor_compute_algo
    dtype = _DTYPE_OF_MAX.get(float(fp8_max))
    if isinstance(algo, str) and sf is None and dtype is not None:
        torch.ops.te_lite.delayed_scaling_update_(amax_history, scale, algo, dtype,
                                                  float(recipe.margin))
        return
    if callable(algo):
        amax = algo(amax_history)
    elif algo == "max":
        amax = amax_history.amax(dim=0)
    else:
        amax = amax_history[0].clone()
    if amax_history.shape[0] > 1:
        amax_history.copy_(torch.roll(amax_history, -1, 0))
    amax_history[0].zero_()
    if sf is None:
        _default_sf_compute(amax, scale, fp8_max, recipe.margin)
    else:
        scale.copy_(sf(amax, scale, fp8_max, recipe))


def build_fp8_meta(module: Any) -> dict[str, Any]:
    """TE's `module.fp8_meta` for the recipe the module last ran under: before any FP8 forward
    only "recipe" (None), "num_gemms" and "fp8_checkpoint"; after one, "scaling_fwd" /
    "scaling_bwd" recipe states (delayed scaling: views of the module's scale and amax history
    buffers, 3 forward and 2 backward slots per GEMM) and "fp8_max_fwd" / "fp8_max_bwd"."""
    recipe = getattr(module, "_last_recipe_obj", None)
    n = module.num_gemms
    meta: dict[str, Any] = {
        "recipe": recipe,
        "num_gemms": n,
        "fp8_checkpoint": recipe is not None or bool(module.primary_weights_in_fp8),
    }
    if recipe is None:
        return meta
    if hasattr(recipe, "fp8_format"):
        meta["fp8_max_fwd"] = get_fp8_max(recipe.fp8_format, True)
        meta["fp8_max_bwd"] = get_fp8_max(recipe.fp8_format, False)
    for fwd, slots in ((True, 3 * n), (False, 2 * n)):
        mode = "forward" if fwd else "backward"
        if recipe.delayed():
            hist, scale, _ = module.fp8_meta_tensors(fwd)
            state = DelayedScalingRecipeState(recipe, mode, slots, scale=scale, amax_history=hist)
        elif recipe.custom():  # the roles the module's GEMMs ask the factory with
            from .module._custom import gemm_roles

            roles = [r for g in range(n) for r in gemm_roles(module, g)[0 if fwd else 1]]
            state = RecipeState.create(recipe, mode=mode, num_quantizers=slots,
                                       device=module.fp8_meta_device(), roles=roles)
        else:
            state = RecipeState.create(recipe, mode=mode, num_quantizers=slots,
                                       device=module.fp8_meta_device())
        meta[meta_tensor_key(fwd)] = state
    return meta

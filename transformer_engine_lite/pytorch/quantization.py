"""How a GEMM operand is quantized under each recipe, on top of torch.ops.te_lite.

One place for the per-recipe casting rules the modules share (ARCHITECTURE.md §5):
- delayed: `quantize(x, scale)` with the module's stored scale; the op also returns amax(x).
- current: `compute_amax` -> `compute_scale_from_amax(eps, pow2)` -> `quantize`, per tensor per step.
- MXFP8: `quantize_mxfp8` (1x32 blocks, E8M0 scales) then `dequantize_mxfp8` to bf16. The core GEMM
  takes per-tensor FP8 operands only, so block-scaled operands enter it as bf16; this is exact
  (an E4M3/E5M2 value times a power of two is representable in bf16) and the GEMM accumulates in
  FP32, so the result equals a native MXFP8 GEMM up to summation order.
Everything here is tensor ops with static Python branching, so it traces under torch.compile.
"""

from __future__ import annotations

import math

from typing import Any, NamedTuple

import torch

from ..common.recipe import DelayedScaling, Format, MXFP8BlockScaling, QParams, Recipe
from .fp8 import (  # noqa: F401  TE 2.x serves the autocast API from pytorch.quantization
    FP8GlobalStateManager,
    autocast,
    fp8_autocast,
    fp8_model_init,
    get_default_fp8_recipe,
    get_fp4_te_dtype,
    get_fp8_te_dtype,
    get_fp8_torch_dtype,
    is_fp8_available,
    is_fp8_block_scaling_available,
    is_mxfp8_available,
    is_nvfp4_available,
    quantized_model_init,
)
from ._recipe_state import (  # noqa: F401  TE's recipe states and unfused delayed-scaling update
    DelayedScalingRecipeState,
    Float8BlockScalingRecipeState,
    Float8CurrentScalingRecipeState,
    MXFP8BlockScalingRecipeState,
    NVFP4BlockScalingRecipeState,
    RecipeState,
    _amax_and_scale_update,
    _default_sf_compute,
)

__all__ = [
    "CustomRecipeState",
    "DelayedScalingRequest",
    "FP8GlobalStateManager",
    "Operand",
    "QuantSpec",
    "QuantizerRole",
    "autocast",
    "fake_quantize",
    "fp8_autocast",
    "fp8_model_init",
    "get_align_size_for_quantization",
    "ops",
    "quantize_operand",
    "quantized_model_init",
]


def ops():
    """torch.ops.te_lite, with a clear error when the extension is not built."""
    try:
        return torch.ops.te_lite
    except (AttributeError, RuntimeError) as e:  # pragma: no cover - depends on the build
        raise ImportError(
            "torch.ops.te_lite is not available: build the PyTorch extension "
            "(pip install --no-build-isolation -e .)"
        ) from e


class QuantSpec(NamedTuple):
    """Static description of how one operand is cast (hashable: a compile-time constant).

    mode: "hp" (no cast), "delayed", "current", "mxfp8", "block" (Float8BlockScaling) or
    "nvfp4" (NVFP4BlockScaling, which the modules run through the "block" GEMM path).
    dtype: FP8 torch dtype (None for "hp"; uint8 for NVFP4's packed E2M1).
    pow2, eps: current-scaling and block-scaling options.
    block_dim: Float8BlockScaling's 1 (1x128 tiles) or 2 (128x128 blocks); NVFP4's 1 (1x16) or 2
    (16x16); 0 otherwise.
    rht, sr: NVFP4's random Hadamard transform (column-wise copy) and stochastic rounding.
    row_scaled, four_over_six, e4m3_max, err_mode: NVFP4's per-row amaxes (row-wise copy) and
    4over6 block scale selection (E4M3 bound 448 or 256, "MAE" / "MSE"), NVFP4Quantizer's options.
    """

    mode: str = "hp"
    dtype: torch.dtype | None = None
    pow2: bool = False
    eps: float = 0.0
    block_dim: int = 0
    rht: bool = False
    sr: bool = False
    row_scaled: bool = False
    four_over_six: bool = False
    e4m3_max: int = 448
    err_mode: str = "MAE"


class Operand(NamedTuple):
    """A GEMM operand ready for torch.ops.te_lite.gemm: data (FP8 or high precision) and its
    scale_inv ([1] fp32 for FP8, None otherwise)."""

    data: torch.Tensor
    scale_inv: torch.Tensor | None


def spec_for(recipe: Recipe, mode: str, forward: bool, qparams: QParams | None = None) -> QuantSpec:
    """The QuantSpec of one operand role under `recipe` (mode already decided by the caller)."""
    if mode == "hp":
        return QuantSpec()
    dtype = get_fp8_torch_dtype(recipe.fp8_format, forward)
    if mode == "current" and qparams is not None:
        return QuantSpec(mode, dtype, bool(qparams.power_2_scale), float(qparams.amax_epsilon))
    return QuantSpec(mode, dtype)


def _in_scope(scope: str, role: str) -> bool:
    """Whether a non-gradient role falls in an NVFP4BlockScaling tensor scope."""
    if scope == "weights":
        return role == "weight"
    if scope == "activations":
        return role != "weight"
    return scope == "all"


def _nvfp4_spec(recipe: Recipe, role: str) -> QuantSpec:
    """NVFP4BlockScaling's QuantSpec of one role, by TE's rules (NVFP4BlockScalingRecipeState):
    row-scaled amaxes for forward activations when row_scaled_activation; 4over6 for the
    non-gradient roles nvfp4_4over6 selects, with the 256 E4M3 bound where
    nvfp4_4over6_e4m3_use_256 selects too; gradients always plain NVFP4. 4over6 with the role's
    RHT or stochastic rounding is TE's ValueError."""
    qp = {"input": recipe.fp4_quant_fwd_inp, "weight": recipe.fp4_quant_fwd_weight,
          "grad": recipe.fp4_quant_bwd_grad}[role]
    rht, sr = bool(qp.random_hadamard_transform), bool(qp.stochastic_rounding)
    four = role != "grad" and _in_scope(recipe.nvfp4_4over6, role)
    if four and rht:
        raise ValueError("NVFP4 4over6 quantization does not support RHT.")
    if four and sr:
        raise ValueError("NVFP4 4over6 quantization does not support stochastic rounding.")
    e4m3_max = 256 if four and _in_scope(recipe.nvfp4_4over6_e4m3_use_256, role) else 448
    return QuantSpec("nvfp4", torch.uint8, block_dim=2 if qp.fp4_2d_quantization else 1,
                     rht=rht, sr=sr, row_scaled=role == "input" and recipe.row_scaled_activation,
                     four_over_six=four, e4m3_max=e4m3_max, err_mode=recipe.nvfp4_4over6_err_mode)


def block_spec(recipe: Recipe, role: str) -> QuantSpec:
    """Float8BlockScaling's or NVFP4BlockScaling's QuantSpec of one operand role ("input",
    "weight" or "grad")."""
    if recipe.nvfp4():
        return _nvfp4_spec(recipe, role)
    qp, dim = {
        "input": (recipe.fp8_quant_fwd_inp, recipe.x_block_scaling_dim),
        "weight": (recipe.fp8_quant_fwd_weight, recipe.w_block_scaling_dim),
        "grad": (recipe.fp8_quant_bwd_grad, recipe.grad_block_scaling_dim),
    }[role]
    dtype = get_fp8_torch_dtype(recipe.fp8_format, role != "grad")
    return QuantSpec("block", dtype, bool(qp.power_2_scale), float(qp.amax_epsilon), int(dim))


def block_dequantized(
    x2d: torch.Tensor, spec: QuantSpec, rowwise: bool, columnwise: bool
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Float8BlockScaling round trip of a 2-D tensor for the high-precision GEMM: the row-wise
    copy (tiles along dim 1) and/or the column-wise one (tiles along dim 0), each quantized from x
    and dequantized to fp32, both as [rows, cols]. fp32 holds decode(q) * scale_inv exactly for
    power-of-two scales and rounds it once otherwise; the GEMM then accumulates in fp32 (TE's
    block GEMM: FP8 products scaled per block into an fp32 accumulator)."""
    if not (rowwise or columnwise):
        return None, None
    if spec.mode == "nvfp4":
        return nvfp4_dequantized(x2d, spec, rowwise, columnwise)
    te = ops()
    row, row_s, col, col_s = te.quantize_fp8_block(
        x2d.contiguous(), spec.dtype, spec.block_dim, rowwise, columnwise, spec.pow2, spec.eps
    )
    r = te.dequantize_fp8_block(row, row_s, spec.block_dim, False, torch.float32) \
        if rowwise else None
    c = te.dequantize_fp8_block(col, col_s, spec.block_dim, True, torch.float32).t().contiguous() \
        if columnwise else None
    return r, c


def block_rowwise(x2d: torch.Tensor, spec: QuantSpec) -> tuple[torch.Tensor, ...]:
    """The row-wise block copy of a 2-D tensor that backward_override="dequantized" saves (TE's
    quantized operand; block_dequantized's row-wise values are its decode): Float8BlockScaling's
    (FP8 bytes, fp32 scale_inv); NVFP4's (packed E2M1 bytes, E4M3 block scales, fp32 amax) — the
    row-wise copy has no Hadamard transform, and inputs / weights no stochastic rounding."""
    if spec.mode == "nvfp4":
        t = nvfp4_quantizer(spec, True, False)._quantize(x2d.contiguous())
        return t._rowwise_data, t._rowwise_scale_inv, t._amax_rowwise
    row, row_s, _, _ = ops().quantize_fp8_block(
        x2d.contiguous(), spec.dtype, spec.block_dim, True, False, spec.pow2, spec.eps
    )
    return row, row_s


def block_rowwise_values(q: tuple[torch.Tensor, ...], spec: QuantSpec) -> torch.Tensor:
    """fp32 [rows, cols] values of a row-wise block copy (block_rowwise's tuple)."""
    if spec.mode == "nvfp4":
        data, scale_inv, amax = q
        return ops().dequantize_nvfp4(data, scale_inv, amax, torch.float32, spec.row_scaled,
                                      spec.e4m3_max)
    return ops().dequantize_fp8_block(q[0], q[1], spec.block_dim, False, torch.float32)


def nvfp4_quantizer(spec: QuantSpec, rowwise: bool = True, columnwise: bool = True) -> Any:
    """The NVFP4Quantizer a QuantSpec("nvfp4") describes (TE's recipe: the post-RHT amax)."""
    from .tensor.nvfp4_tensor import NVFP4Quantizer

    return NVFP4Quantizer(rowwise=rowwise, columnwise=columnwise, with_rht=spec.rht,
                          with_post_rht_amax=spec.rht, with_2d_quantization=spec.block_dim == 2,
                          stochastic_rounding=spec.sr, row_scaled_nvfp4=spec.row_scaled,
                          nvfp4_use_4over6=spec.four_over_six, nvfp4_e4m3_max=spec.e4m3_max,
                          nvfp4_4over6_err_mode=spec.err_mode)


def nvfp4_dequantized(
    x2d: torch.Tensor, spec: QuantSpec, rowwise: bool, columnwise: bool
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """NVFP4 round trip of a 2-D tensor for the fp32 GEMM (as block_dequantized): the row-wise
    copy and/or the column-wise one transposed back to [rows, cols]. The column-wise copy keeps
    the random Hadamard transform along the rows (tokens) when spec.rht: the wgrad GEMM contracts
    two such copies over the tokens, where the orthogonal transform cancels (TE's wgrad)."""
    t = nvfp4_quantizer(spec, rowwise, columnwise)._quantize(x2d.contiguous())
    from .cpp_extensions.nvfp4_gemm import tag_nvfp4_source

    # tagged with their source: the modules' GEMMs run them in the FP4 tensor core's order
    r = tag_nvfp4_source(t._dequantize_copy(False, torch.float32), t, False) if rowwise else None
    c = tag_nvfp4_source(t._dequantize_copy(True, torch.float32), t, True) if columnwise else None
    return r, c


def quantize_per_tensor(
    x: torch.Tensor, spec: QuantSpec, scale: torch.Tensor | None
) -> tuple[Operand, torch.Tensor]:
    """Per-tensor FP8 cast. Returns (operand, amax [1]). Delayed mode uses `scale` (a [1] view of
    the module's scale buffer); current mode computes the scale from x itself."""
    te = ops()
    x = x.contiguous()
    if spec.mode == "current":
        amax = te.compute_amax(x)
        scale, _ = te.compute_scale_from_amax(amax, spec.dtype, spec.eps, spec.pow2)
    data, amax, scale_inv = te.quantize(x, scale, spec.dtype)
    return Operand(data, scale_inv), amax


def mx_dequantized(
    x2d: torch.Tensor, dtype: torch.dtype, rowwise: bool, columnwise: bool
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """MXFP8 round trip of a 2-D tensor: row-wise blocks (along dim 1) and/or column-wise blocks
    (along dim 0), each quantized from x and dequantized to bf16 for the per-tensor GEMM."""
    te = ops()
    row, row_s, col, col_s = te.quantize_mxfp8(x2d.contiguous(), dtype, rowwise, columnwise)
    r = te.dequantize_mxfp8(row, row_s, False, torch.bfloat16) if rowwise else None
    c = te.dequantize_mxfp8(col, col_s, True, torch.bfloat16) if columnwise else None
    return r, c


def quantize_operand(
    x: torch.Tensor, spec: QuantSpec, scale: torch.Tensor | None = None
) -> tuple[Operand, torch.Tensor | None]:
    """Operand for a per-tensor or high-precision GEMM; amax is returned in delayed mode."""
    if spec.mode == "hp":
        return Operand(x.contiguous(), None), None
    op, amax = quantize_per_tensor(x, spec, scale)
    return op, amax


@torch.no_grad()
def fake_quantize(w: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """w rounded to the values the recipe's forward FP8 format can hold (used by
    quantized_model_init): MXFP8 row-wise blocks; delayed scaling: the weight's delayed-scaling
    scale at initialization, 1.0 (TE's FP8 parameters start with it, so the first FP8 forward
    reproduces these values exactly); current scaling: per-tensor current scaling."""
    te = ops()
    dtype = get_fp8_torch_dtype(recipe.fp8_format, True)
    w2 = w.reshape(math.prod(w.shape[:-1]), w.shape[-1]).contiguous()  # (K = 0 too)
    if isinstance(recipe, MXFP8BlockScaling):
        row, row_s, _, _ = te.quantize_mxfp8(w2, dtype, True, False)
        out = te.dequantize_mxfp8(row, row_s, False, w.dtype)
    elif recipe.float8_block_scaling() or recipe.nvfp4():
        out = block_dequantized(w2, block_spec(recipe, "weight"), True, False)[0].to(w.dtype)
    elif recipe.delayed():
        data, _, scale_inv = te.quantize(w2, torch.ones(1, device=w.device), dtype)
        out = te.dequantize(data, scale_inv, w.dtype)
    else:
        amax = te.compute_amax(w2)
        scale, _ = te.compute_scale_from_amax(amax, dtype, 0.0, False)
        data, _, scale_inv = te.quantize(w2, scale, dtype)
        out = te.dequantize(data, scale_inv, w.dtype)
    return out.reshape(w.shape)


# --------------------------------------------------------------------------- custom recipes
import dataclasses as _dc  # noqa: E402  (kept beside the custom-recipe names it serves)


@_dc.dataclass(frozen=True)
class QuantizerRole:
    """TE's identity of a tensor slot asking CustomRecipe.qfactory for a quantizer. Modules fill
    what they know: module_type ("linear", "grouped_linear"), tensor_type ("input", "weight",
    "grad_output") and name (the module's `name`, LayerNormMLP: "<name>.fc1" / "<name>.fc2");
    empty strings otherwise. Slots whose consumer is unknown (a GEMM's output, the gradient it
    produces) get None instead of a role."""

    module_type: str = ""
    tensor_type: str = ""
    name: str = ""

    def __post_init__(self) -> None:
        for f in ("module_type", "tensor_type", "name"):
            v = getattr(self, f)
            if not isinstance(v, str):
                raise TypeError(f"QuantizerRole: {f}: expected a str, got {v!r}")

    def __str__(self) -> str:
        parts = [f"{f}={getattr(self, f)}" for f in ("module_type", "tensor_type", "name")
                 if getattr(self, f)]
        return "|".join(parts) if parts else "QuantizerRole()"


@_dc.dataclass(frozen=True)
class DelayedScalingRequest:
    """A CustomRecipe factory's request for module-managed delayed scaling (TE's name; what
    delayed_scaling_factory returns). A GEMM whose input, weight and grad_output slots all get
    equal requests runs exactly as under DelayedScaling(**fields): the module's scale / amax
    history, updated by the autocast with these settings (module/_custom.py)."""

    fp8_format: Format = Format.HYBRID
    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: Any = "max"
    scaling_factor_compute_algo: Any = None
    reduce_amax: bool = True

    def delayed_scaling(self) -> DelayedScaling:
        """The equivalent DelayedScaling (its checks validate the fields)."""
        return DelayedScaling(backward_override=None, **_dc.asdict(self))


def get_align_size_for_quantization(recipe: Recipe) -> int:
    """Row alignment of grouped quantized GEMM splits (Fp8Padding): a CustomRecipe's declared
    quantization_alignment (qfactory is not called: it may be stateful or role-dependent),
    32 for MXFP8 (one scale block), 16 for per-tensor FP8 (TE's GEMM leading-dim rule)."""
    if not isinstance(recipe, Recipe):
        raise TypeError(f"get_align_size_for_quantization: recipe: expected a Recipe, got "
                        f"{type(recipe).__name__}")
    if recipe.custom():
        return int(recipe.quantization_alignment)
    if recipe.mxfp8():
        return 32
    if recipe.nvfp4():
        return 128
    return 16


def check_factory_output(q: Any, slot: int | str, role: QuantizerRole | None) -> Any:
    """TE's rule: a qfactory answers every slot; high precision is IdentityQuantizer, not None."""
    if q is None:
        raise ValueError(f"CustomRecipe qfactory returned None for slot {slot} (role={role}); "
                         "expected a quantizer or a DelayedScalingRequest (IdentityQuantizer for "
                         "an unquantized slot)")
    return q


@_dc.dataclass
class _DelayedScalingState:
    """Delayed-scaling buffers shared by a CustomRecipeState's requested slots."""

    recipe: DelayedScaling
    scale: torch.Tensor  # [n]
    amax_history: torch.Tensor  # [amax_history_len, n]; row 0 holds the current amaxes


class CustomRecipeState:
    """TE's CustomRecipeState: the quantizers of `num_quantizers` slots of one direction (mode
    "forward" or "backward") from recipe.qfactory(roles[i]) (bare QuantizerRole() when roles is
    None). DelayedScalingRequests (all equal, as TE) become Float8Quantizers over buffers this state
    owns: scale [n] (ones) and amax_history [len, n] (zeros); slot i's quantizer uses views of
    column i (scale[i], amax_history[0, i]). inherit_state_from(other) keeps other's buffers (same
    objects, values kept) for the next make_quantizers when their shape still fits. The modules
    keep their own equivalent state (module/_custom.py); this object builds quantizers for callers
    that manage a recipe state themselves."""

    def __init__(self, recipe: Recipe, *, mode: str, num_quantizers: int = 1,
                 device: Any = None, roles: list[QuantizerRole | None] | None = None) -> None:
        if not isinstance(recipe, Recipe) or not recipe.custom():
            raise TypeError(f"CustomRecipeState: recipe: expected a CustomRecipe, got "
                            f"{type(recipe).__name__}")
        if mode not in ("forward", "backward"):
            raise ValueError(f"CustomRecipeState: mode: expected 'forward' or 'backward', got "
                             f"{mode!r}")
        if isinstance(num_quantizers, bool) or not isinstance(num_quantizers, int) or \
                num_quantizers < 1:
            raise ValueError(f"CustomRecipeState: num_quantizers: expected an int >= 1, got "
                             f"{num_quantizers!r}")
        if roles is not None and (len(roles) != num_quantizers or any(
                r is not None and not isinstance(r, QuantizerRole) for r in roles)):
            raise ValueError(f"CustomRecipeState: roles: expected None or {num_quantizers} "
                             f"QuantizerRole / None entries, got {roles!r}")
        self.recipe, self.mode, self.num_quantizers = recipe, mode, num_quantizers
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.roles = roles
        self._ds_state: _DelayedScalingState | None = None
        self._ds_state_to_inherit: _DelayedScalingState | None = None

    def make_quantizers(self) -> list[Any]:
        from .tensor.float8_tensor import Float8Quantizer

        roles = self.roles if self.roles is not None else [QuantizerRole()] * self.num_quantizers
        raw = [check_factory_output(self.recipe.qfactory(r), i, r) for i, r in enumerate(roles)]
        reqs = [i for i, q in enumerate(raw) if isinstance(q, DelayedScalingRequest)]
        inherit, self._ds_state_to_inherit = self._ds_state_to_inherit, None
        self._ds_state = None
        if not reqs:
            return raw
        first = raw[reqs[0]]
        if any(raw[i] != first for i in reqs):
            raise ValueError("CustomRecipeState: DelayedScalingRequests of one state must be equal, "
                             f"got {[raw[i] for i in reqs]}")
        inner = first.delayed_scaling()
        shape = (inner.amax_history_len, len(reqs))
        if inherit is not None and tuple(inherit.amax_history.shape) == shape:
            inherit.recipe = inner
            self._ds_state = inherit
        else:
            f32 = dict(dtype=torch.float32, device=self.device)
            self._ds_state = _DelayedScalingState(inner, torch.ones(len(reqs), **f32),
                                                  torch.zeros(shape, **f32))
        fp8 = get_fp8_torch_dtype(inner.fp8_format, self.mode == "forward")
        st = self._ds_state
        for col, i in enumerate(reqs):
            raw[i] = Float8Quantizer(st.scale[col], st.amax_history[0][col].reshape(1), fp8)
        return raw

    def inherit_state_from(self, other: Any) -> bool:
        """Keep `other`'s delayed-scaling buffers for the next make_quantizers (True if any)."""
        if not isinstance(other, CustomRecipeState) or other._ds_state is None:
            return False
        self._ds_state_to_inherit = other._ds_state
        return True

    @property
    def _has_delayed_scaling(self) -> bool:
        return self._ds_state is not None

    @property
    def scale(self) -> torch.Tensor | None:
        return self._ds_state.scale if self._ds_state is not None else None

    @property
    def amax_history(self) -> torch.Tensor | None:
        return self._ds_state.amax_history if self._ds_state is not None else None

    @property
    def _inner_delayed_scaling_recipe(self) -> DelayedScaling | None:
        return self._ds_state.recipe if self._ds_state is not None else None

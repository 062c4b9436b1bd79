"""FP8 recipes shared by the PyTorch and JAX front ends (TE's `transformer_engine.common.recipe`).

Framework-free on purpose: no torch or jax import. Field names and defaults follow TE 2.x; every
field is validated at construction with an error that names the field, what was expected and what
was got. FP8 formats are named by strings ("e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz") that each front
end maps to its own dtype.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field
from enum import Enum
from typing import Any, NamedTuple

__all__ = [
    "FP8_MAX",
    "CustomRecipe",
    "DelayedScaling",
    "Float8BlockScaling",
    "Float8CurrentScaling",
    "Format",
    "MMParams",
    "MXFP8BlockScaling",
    "NVFP4BlockScaling",
    "QParams",
    "Recipe",
]

# Largest finite value of each FP8 format (ARCHITECTURE.md §5).
FP8_MAX: dict[str, float] = {
    "e4m3": 448.0,
    "e5m2": 57344.0,
    "e4m3fnuz": 240.0,
    "e5m2fnuz": 57344.0,
}


class _FormatHelper(NamedTuple):
    """Value of a `Format` member: max finite values (as TE's) plus the format names."""

    max_fwd: float
    max_bwd: float
    fwd: str
    bwd: str


class Format(Enum):
    """FP8 format of forward tensors (activations, weights) and backward tensors (gradients).

    E4M3 / E5M2: one format for both passes. HYBRID: E4M3 forward, E5M2 backward (TE's default).
    The FNUZ variants (ROCm gfx94x hardware formats, also supported on the CPU) mirror them.
    """

    E4M3 = _FormatHelper(FP8_MAX["e4m3"], FP8_MAX["e4m3"], "e4m3", "e4m3")
    E5M2 = _FormatHelper(FP8_MAX["e5m2"], FP8_MAX["e5m2"], "e5m2", "e5m2")
    HYBRID = _FormatHelper(FP8_MAX["e4m3"], FP8_MAX["e5m2"], "e4m3", "e5m2")
    E4M3FNUZ = _FormatHelper(FP8_MAX["e4m3fnuz"], FP8_MAX["e4m3fnuz"], "e4m3fnuz", "e4m3fnuz")
    E5M2FNUZ = _FormatHelper(FP8_MAX["e5m2fnuz"], FP8_MAX["e5m2fnuz"], "e5m2fnuz", "e5m2fnuz")
    HYBRID_FNUZ = _FormatHelper(FP8_MAX["e4m3fnuz"], FP8_MAX["e5m2fnuz"], "e4m3fnuz", "e5m2fnuz")
    # FP4 (NVFP4BlockScaling's data format; not an FP8 recipe's fp8_format)
    E2M1 = _FormatHelper(6.0, 6.0, "e2m1", "e2m1")

    @property
    def fwd(self) -> str:
        """Format name of forward tensors."""
        return self.value.fwd

    @property
    def bwd(self) -> str:
        """Format name of backward tensors (gradients)."""
        return self.value.bwd

    @property
    def is_fnuz(self) -> bool:
        return self.value.fwd.endswith("fnuz")

    def dtype_name(self, forward: bool) -> str:
        """Format name of forward (True) or backward (False) tensors."""
        return self.value.fwd if forward else self.value.bwd

    def max(self, forward: bool) -> float:
        """Largest finite value of forward (True) or backward (False) tensors."""
        return self.value.max_fwd if forward else self.value.max_bwd


_PURE_E5M2 = (Format.E5M2, Format.E5M2FNUZ)


def _check_format(recipe: str, value: Any) -> None:
    if not isinstance(value, Format):
        raise TypeError(
            f"{recipe}: fp8_format: expected a Format member "
            f"({', '.join('Format.' + f.name for f in Format)}), got {value!r}"
        )
    if value is Format.E2M1:
        raise ValueError(
            f"{recipe}: fp8_format: Format.E2M1 is an FP4 format (NVFP4BlockScaling's fp4_format), "
            "not an FP8 one; use Format.HYBRID or an E4M3 format"
        )
    if value in _PURE_E5M2:
        # TE asserts the same: E5M2 has 2 mantissa bits, too coarse for forward tensors.
        raise ValueError(
            f"{recipe}: fp8_format: pure E5M2 training is not supported (got Format.{value.name}); "
            "use Format.HYBRID (E4M3 forward, E5M2 backward) or an E4M3 format"
        )


def _check_bool(recipe: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{recipe}: {name}: expected a bool, got {value!r}")


BACKWARD_OVERRIDES = (None, "high_precision", "dequantized")


def _env_flag(name: str) -> bool:
    from . import config

    return (config.get(name) or "0") == "1"


def _default_backward_override() -> str | None:
    from . import config

    return config.get("NVTE_BACKWARD_OVERRIDE") or None


def check_backward_override(recipe: str, value: Any, delayed: bool = False) -> None:
    """TE's backward_override: None, "high_precision" or "dequantized" (DelayedScaling: None).
    Checked at construction and again when a module uses the recipe (fields can be reassigned)."""
    if value not in BACKWARD_OVERRIDES:
        raise ValueError(
            f"{recipe}: backward_override: expected one of {BACKWARD_OVERRIDES}, got {value!r}"
        )
    if delayed and value is not None:
        raise ValueError(f"{recipe}: backward_override: expected None (delayed scaling keeps "
                         f"FP8 backward GEMMs), got {value!r}")


def _check_margin(recipe: str, value: Any) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0:
        raise ValueError(f"{recipe}: margin: expected a finite number >= 0, got {value!r}")


class Recipe:
    """Base class of the recipes; the predicates tell them apart without isinstance chains."""

    def delayed(self) -> bool:
        return isinstance(self, DelayedScaling)

    def float8_current_scaling(self) -> bool:
        return isinstance(self, Float8CurrentScaling)

    def float8_per_tensor_scaling(self) -> bool:
        return isinstance(self, (DelayedScaling, Float8CurrentScaling))

    def mxfp8(self) -> bool:
        return isinstance(self, MXFP8BlockScaling)

    def float8_block_scaling(self) -> bool:
        return False

    def nvfp4(self) -> bool:
        return False

    def custom(self) -> bool:
        return isinstance(self, CustomRecipe)

    def to_dict(self) -> dict[str, Any]:
        """Plain-value description (for checkpoints and logs); callables are recorded by name."""
        out: dict[str, Any] = {"recipe": type(self).__name__}
        for k, v in vars(self).items():
            if isinstance(v, Format):
                out[k] = v.name
            elif callable(v):
                out[k] = getattr(v, "__qualname__", repr(v))
            elif isinstance(v, (QParams, MMParams)):
                out[k] = v._asdict()
            else:
                out[k] = v
        return out


AmaxComputeAlgo = str | Callable[..., Any]


@dataclass()
class DelayedScaling(Recipe):
    """Per-tensor FP8 scaling with scales derived from a history of amaxes (TE's default recipe).

    Per step and tensor (ARCHITECTURE.md §5): `amax = max(history)` ("max") or `history[0]`
    ("most_recent"); the history rolls by -1 with the new row 0 zeroed; `scale = (fp8_max / amax) /
    2^margin` when amax is finite and > 0, else the previous scale.

    margin: extra headroom, in powers of two.
    fp8_format: Format of forward / backward tensors.
    amax_history_len: rows of the amax history window.
    amax_compute_algo: "max", "most_recent", or a callable `f(amax_history) -> amax` (per column).
    scaling_factor_compute_algo: None (the rule above) or a callable
        `f(amax, scale, fp8_max, recipe) -> scale`.
    reduce_amax: all-reduce (MAX) the amaxes over the autocast's group before each update when
        torch.distributed is initialized.
    fp8_dpa, fp8_mha: FP8 attention: DotProductAttention quantizes Q/K/V, S, O and dO, dP,
        dQKV at TE's points (pytorch/attention/dot_product_attention/fp8_attention.py, an exact
        emulation on the unfused backend); fp8_mha also hands FP8 tensors between the
        projections and the attention.
    backward_override: None only (TE's rule for delayed scaling; see Float8CurrentScaling).

    Keywords of TE 1.x that clients still pass (Megatron-Core's TEDelayedScaling, accelerate's
    FP8RecipeKwargs), accepted with a DeprecationWarning, not stored:
    override_linear_precision: (fprop, dgrad, wgrad) GEMMs kept in high precision; only
        (False, False, False) (TE 2.x's behaviour) is supported, a True raises NotImplementedError.
    interval: ignored since TE 1.8 (the scales update every step), as here.
    params_dtype, device: module arguments Megatron-Core passes to its recipe too; a recipe holds
        no parameters, so they have no meaning here.
    """

    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: AmaxComputeAlgo = "max"
    scaling_factor_compute_algo: Callable[..., Any] | None = None
    reduce_amax: bool = True
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = field(default_factory=_default_backward_override)
    override_linear_precision: InitVar[Any] = None
    interval: InitVar[Any] = None
    params_dtype: InitVar[Any] = None
    device: InitVar[Any] = None

    def __post_init__(
        self, override_linear_precision: Any, interval: Any, params_dtype: Any, device: Any
    ) -> None:
        name = "DelayedScaling"
        _check_legacy_keywords(name, override_linear_precision, interval, params_dtype, device)
        check_backward_override(name, self.backward_override, delayed=True)
        _check_margin(name, self.margin)
        _check_format(name, self.fp8_format)
        n = self.amax_history_len
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"{name}: amax_history_len: expected an int >= 1, got {n!r}")
        algo = self.amax_compute_algo
        if not callable(algo) and algo not in ("max", "most_recent"):
            raise ValueError(
                f"{name}: amax_compute_algo: expected 'max', 'most_recent' or a callable, got {algo!r}"
            )
        sf = self.scaling_factor_compute_algo
        if sf is not None and not callable(sf):
            raise TypeError(
                f"{name}: scaling_factor_compute_algo: expected None or a callable, got {sf!r}"
            )
        for flag in ("reduce_amax", "fp8_dpa", "fp8_mha"):
            _check_bool(name, flag, getattr(self, flag))

    def __repr__(self) -> str:
        return (
            f"recipe_type={type(self).__name__}, margin={self.margin}, "
            f"format={self.fp8_format.name}, amax_history_len={self.amax_history_len}, "
            f"amax_compute_algo={self.amax_compute_algo}, fp8_dpa={self.fp8_dpa}, "
            f"fp8_mha={self.fp8_mha}"
        )


def _check_legacy_keywords(
    name: str, override_linear_precision: Any, interval: Any, params_dtype: Any, device: Any
) -> None:
    given = [k for k, v in (("override_linear_precision", override_linear_precision),
                            ("interval", interval), ("params_dtype", params_dtype),
                            ("device", device)) if v is not None]
    if not given:
        return
    olp = override_linear_precision
    if olp is not None:
        if not isinstance(olp, tuple) or len(olp) != 3 or not all(isinstance(v, bool) for v in olp):
            raise TypeError(
                f"{name}: override_linear_precision: expected a tuple of three bools "
                f"(fprop, dgrad, wgrad), got {olp!r}"
            )
        if any(olp):
            raise NotImplementedError(
                f"{name}: override_linear_precision={olp} (GEMMs kept in high precision) is not "
                "supported by transformer_engine_lite (nor by TE 2.x); use (False, False, False), "
                "or Float8CurrentScaling(backward_override='high_precision') for a high-precision "
                "backward"
            )
    if interval is not None and (not isinstance(interval, int) or isinstance(interval, bool)):
        raise TypeError(f"{name}: interval: expected an int, got {interval!r}")
    warnings.warn(
        f"{name}: {', '.join(given)}: TE 1.x keywords, accepted and ignored (TE 2.x has none of "
        "them)", DeprecationWarning, stacklevel=4)


class QParams(NamedTuple):
    """Quantization parameters of one tensor role. power_2_scale / amax_epsilon: FP8 current and
    block scaling; random_hadamard_transform / stochastic_rounding / fp4_2d_quantization: NVFP4
    only (TE's QParams carries all five; an FP8 recipe refuses the NVFP4 ones set)."""

    power_2_scale: bool = False
    amax_epsilon: float = 0.0
    random_hadamard_transform: bool = False
    stochastic_rounding: bool = False
    fp4_2d_quantization: bool = False


class MMParams(NamedTuple):
    """GEMM options of one GEMM role. The CPU GEMM always accumulates in FP32, so the flag only
    matters on GPU backends."""

    use_split_accumulator: bool = True


def _check_qparams(recipe: str, name: str, q: Any) -> None:
    if not isinstance(q, QParams):
        raise TypeError(f"{recipe}: {name}: expected a QParams, got {q!r}")
    _check_bool(recipe, f"{name}.power_2_scale", q.power_2_scale)
    eps = q.amax_epsilon
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not (0.0 <= eps < math.inf):
        raise ValueError(
            f"{recipe}: {name}.amax_epsilon: expected a finite number >= 0, got {eps!r}"
        )
    for flag in _FP4_QPARAMS:
        if getattr(q, flag) is not False:
            raise ValueError(
                f"{recipe}: {name}.{flag}: an NVFP4 option (NVFP4BlockScaling); an FP8 recipe "
                f"expects False, got {getattr(q, flag)!r}"
            )


_FP4_QPARAMS = ("random_hadamard_transform", "stochastic_rounding", "fp4_2d_quantization")


def _check_quant_fields(recipe: str, r: Any) -> None:
    """The per-role QParams and MMParams of the per-tensor-current and block recipes."""
    for q in ("fp8_quant_fwd_inp", "fp8_quant_fwd_weight", "fp8_quant_bwd_grad"):
        _check_qparams(recipe, q, getattr(r, q))
    for m in ("fp8_gemm_fprop", "fp8_gemm_dgrad", "fp8_gemm_wgrad"):
        if not isinstance(getattr(r, m), MMParams):
            raise TypeError(f"{recipe}: {m}: expected an MMParams, got {getattr(r, m)!r}")


@dataclass()
class Float8CurrentScaling(Recipe):
    """Per-tensor FP8 scaling with the scale computed from the tensor itself, every step:
    `amax = max(max|x|, amax_epsilon)`; `scale = fp8_max / amax` (1 when amax is 0/Inf/NaN),
    optionally rounded down to a power of two. Holds no state between steps.

    use_power_2_scales (default: NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES=1): power-of-two scales
    for every tensor role (sets power_2_scale in the three QParams).

    backward_override (default: NVTE_BACKWARD_OVERRIDE): None runs dgrad/wgrad in FP8;
    "high_precision" runs them on the unquantized input and weight with the unquantized gradient;
    "dequantized" on the forward's FP8 input and weight, dequantized, with the unquantized
    gradient (the forward is FP8 in every case)."""

    use_power_2_scales: bool = field(default_factory=lambda: _env_flag(
        "NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES"))
    fp8_format: Format = Format.HYBRID
    fp8_quant_fwd_inp: QParams = field(default_factory=QParams)
    fp8_quant_fwd_weight: QParams = field(default_factory=QParams)
    fp8_quant_bwd_grad: QParams = field(default_factory=QParams)
    fp8_gemm_fprop: MMParams = field(default_factory=lambda: MMParams(False))
    fp8_gemm_dgrad: MMParams = field(default_factory=lambda: MMParams(True))
    fp8_gemm_wgrad: MMParams = field(default_factory=lambda: MMParams(True))
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = field(default_factory=_default_backward_override)

    def __post_init__(self) -> None:
        name = "Float8CurrentScaling"
        check_backward_override(name, self.backward_override)
        _check_bool(name, "use_power_2_scales", self.use_power_2_scales)
        if self.use_power_2_scales:
            # TE's switch: every role rounds its scale down to a power of two
            for q in ("fp8_quant_fwd_inp", "fp8_quant_fwd_weight", "fp8_quant_bwd_grad"):
                qp = getattr(self, q)
                if isinstance(qp, QParams):
                    setattr(self, q, qp._replace(power_2_scale=True))
        _check_format(name, self.fp8_format)
        _check_quant_fields(name, self)
        for flag in ("fp8_dpa", "fp8_mha"):
            _check_bool(name, flag, getattr(self, flag))

    def __repr__(self) -> str:
        return (
            f"recipe_type={type(self).__name__}, format={self.fp8_format.name}, "
            f"fp8_quant_fwd_inp={self.fp8_quant_fwd_inp}, "
            f"fp8_quant_fwd_weight={self.fp8_quant_fwd_weight}, "
            f"fp8_quant_bwd_grad={self.fp8_quant_bwd_grad}"
        )


@dataclass()
class MXFP8BlockScaling(Recipe):
    """MXFP8: blocks of 32 consecutive elements share one E8M0 scale
    `2^ceil(log2(block_amax / fp8_max))` (TE's round-up rule). Holds no state between steps.

    margin: accepted for TE compatibility; TE does not apply it to MX scales, nor do we.
    fp8_format: E4M3 by default (gradients too); HYBRID uses E5M2 for gradients.
    backward_override: as Float8CurrentScaling. enable_2d_quantization: not supported (True raises
    NotImplementedError).
    """

    margin: int = 0
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = field(default_factory=_default_backward_override)
    enable_2d_quantization: bool = False

    def __post_init__(self) -> None:
        name = "MXFP8BlockScaling"
        check_backward_override(name, self.backward_override)
        _check_bool(name, "enable_2d_quantization", self.enable_2d_quantization)
        if self.enable_2d_quantization:
            raise NotImplementedError(
                f"{name}: enable_2d_quantization=True (32x32 weight blocks) is not supported by "
                "transformer_engine_lite; leave it False")
        _check_margin(name, self.margin)
        _check_format(name, self.fp8_format)
        for flag in ("fp8_dpa", "fp8_mha"):
            _check_bool(name, flag, getattr(self, flag))

    def __repr__(self) -> str:
        return (
            f"recipe_type={type(self).__name__}, margin={self.margin}, "
            f"format={self.fp8_format.name}"
        )


@dataclass()
class CustomRecipe(Recipe):
    """TE's CustomRecipe: every quantizer comes from `qfactory(role)`, called by each module for
    each of its tensor slots with a `pytorch.quantization.QuantizerRole` (None for slots whose
    consumer the module does not know: a GEMM's output, the gradient it produces). The factory
    returns a quantizer (Float8CurrentScalingQuantizer, MXFP8Quantizer, IdentityQuantizer for
    high precision); `pytorch.custom_recipes.quantizer_factories` mirrors the built-in recipes.

    fp8_format only names the HYBRID default that format-reading code sees; the factory decides
    every dtype. quantization_alignment (default 128, enough for every TE format): the row
    alignment automatic padding of grouped GEMMs uses (Fp8Padding), read without calling qfactory
    (a factory may be stateful or role-dependent); must be positive."""

    qfactory: Callable[..., Any] = None  # type: ignore[assignment]
    fp8_format: Format = Format.HYBRID
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = field(default_factory=_default_backward_override)
    quantization_alignment: int = 128

    def __post_init__(self) -> None:
        name = "CustomRecipe"
        if not callable(self.qfactory):
            raise TypeError(f"{name}: qfactory: expected a callable role -> quantizer, got "
                            f"{self.qfactory!r}")
        check_backward_override(name, self.backward_override)
        _check_format(name, self.fp8_format)
        a = self.quantization_alignment
        if isinstance(a, bool) or not isinstance(a, int):
            raise TypeError(f"{name}: quantization_alignment: expected an int, got {a!r}")
        if a <= 0:
            raise ValueError(f"{name}: quantization_alignment must be positive, got {a}")
        for flag in ("fp8_dpa", "fp8_mha"):
            _check_bool(name, flag, getattr(self, flag))
        if self.fp8_dpa or self.fp8_mha:
            raise NotImplementedError(f"{name}: fp8_dpa / fp8_mha: FP8 attention under a custom "
                                      "recipe is not implemented by transformer_engine_lite")

    def __repr__(self) -> str:
        return (f"recipe_type={type(self).__name__}, qfactory={self.qfactory}, "
                f"backward_override={self.backward_override}, "
                f"quantization_alignment={self.quantization_alignment}")


# The block-scaled recipes live in recipe_block.py (which imports the names above).
from .recipe_block import Float8BlockScaling, NVFP4BlockScaling  # noqa: E402

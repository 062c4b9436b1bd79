"""The block-scaled recipes of TE's `transformer_engine.common.recipe`: NVFP4BlockScaling and
Float8BlockScaling (DeepSeek-V3's 1x128 / 128x128 FP8). Framework-free like recipe.py, which
re-exports both (import them from there, as from TE); split out to keep recipe.py short."""

from __future__ import annotations

from dataclasses import dataclass, field

from .recipe import (
    Format,
    MMParams,
    QParams,
    Recipe,
    _check_bool,
    _check_format,
    _check_quant_fields,
    _default_backward_override,
    _env_flag,
    check_backward_override,
)

_NVFP4_4OVER6_SCOPES = ("none", "weights", "activations", "all")
_NVFP4_4OVER6_ERR_MODES = ("MAE", "MSE")


def _nvfp4_env(name: str, default: str) -> str:
    from . import config

    return config.get(name) or default


@dataclass()
class NVFP4BlockScaling(Recipe):
    """NVFP4 (TE 2.8+): E2M1 data, an E4M3 scale per 16 values and an FP32 per-tensor scale.
    TE's fields, env defaults (NVTE_NVFP4_*, see common/config.py) and checks. Runs on the CPU
    (autocast, quantized_model_init), row_scaled_activation and the nvfp4_4over6 scopes included
    (TE's per-role rules: pytorch.quantization._nvfp4_spec); the JAX front end refuses those two
    with NotImplementedError, as TE-JAX has neither.
    fp4_quant_fwd_inp / _fwd_weight / _bwd_grad are derived QParams, as TE's."""

    disable_rht: bool = field(default_factory=lambda: _env_flag("NVTE_NVFP4_DISABLE_RHT"))
    disable_stochastic_rounding: bool = field(
        default_factory=lambda: _env_flag("NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING"))
    disable_2d_quantization: bool = field(
        default_factory=lambda: _env_flag("NVTE_NVFP4_DISABLE_2D_QUANTIZATION"))
    row_scaled_activation: bool = field(
        default_factory=lambda: _env_flag("NVTE_NVFP4_ROW_SCALED_ACTIVATION"))
    nvfp4_4over6: str = field(default_factory=lambda: _nvfp4_env("NVTE_NVFP4_4OVER6", "none"))
    nvfp4_4over6_e4m3_use_256: str = field(
        default_factory=lambda: _nvfp4_env("NVTE_NVFP4_4OVER6_E4M3_USE_256", "all"))
    nvfp4_4over6_err_mode: str = field(
        default_factory=lambda: _nvfp4_env("NVTE_NVFP4_4OVER6_ERR_MODE", "MAE").upper())
    fp4_format: Format = Format.E2M1
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = field(default_factory=_default_backward_override)

    def nvfp4(self) -> bool:
        return True

    def __post_init__(self) -> None:
        name = "NVFP4BlockScaling"
        for f, only in (("fp4_format", Format.E2M1), ("fp8_format", Format.E4M3)):
            if getattr(self, f) is not only:  # fp8_format: of the block scales
                raise ValueError(f"{name}: {f}: expected {only}, got {getattr(self, f)!r}")
        check_backward_override(name, self.backward_override)
        for flag in ("disable_rht", "disable_stochastic_rounding", "disable_2d_quantization",
                     "row_scaled_activation", "fp8_dpa", "fp8_mha"):
            _check_bool(name, flag, getattr(self, flag))
        for f, allowed in (("nvfp4_4over6", _NVFP4_4OVER6_SCOPES),
                           ("nvfp4_4over6_e4m3_use_256", _NVFP4_4OVER6_SCOPES),
                           ("nvfp4_4over6_err_mode", _NVFP4_4OVER6_ERR_MODES)):
            if getattr(self, f) not in allowed:
                raise ValueError(f"{name}: {f}: expected one of {allowed}, got "
                                 f"{getattr(self, f)!r}")
        # TE's derivation: RHT on inputs and gradients (their column-wise use, the wgrad GEMM),
        # 2D blocks on weights, stochastic rounding on gradients.
        self.fp4_quant_fwd_inp = QParams(random_hadamard_transform=not self.disable_rht)
        self.fp4_quant_fwd_weight = QParams(fp4_2d_quantization=not self.disable_2d_quantization)
        self.fp4_quant_bwd_grad = QParams(
            random_hadamard_transform=not self.disable_rht,
            stochastic_rounding=not self.disable_stochastic_rounding,
        )

    def __repr__(self) -> str:
        return (
            f"recipe_type={type(self).__name__}, fp4_format={self.fp4_format.name}, "
            f"fp8_format={self.fp8_format.name}, fp8_dpa={self.fp8_dpa}, fp8_mha={self.fp8_mha}, "
            f"backward_override={self.backward_override}, "
            f"row_scaled_activation={self.row_scaled_activation}, "
            f"nvfp4_4over6={self.nvfp4_4over6}, "
            f"nvfp4_4over6_e4m3_use_256={self.nvfp4_4over6_e4m3_use_256}, "
            f"nvfp4_4over6_err_mode={self.nvfp4_4over6_err_mode}, "
            f"fp4_quant_fwd_inp={self.fp4_quant_fwd_inp}, "
            f"fp4_quant_fwd_weight={self.fp4_quant_fwd_weight}, "
            f"fp4_quant_bwd_grad={self.fp4_quant_bwd_grad}"
        )


def _block_scaling_default_qparams() -> QParams:
    # TE: power-of-two scales unless NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1
    return QParams(power_2_scale=not _env_flag("NVTE_FP8_BLOCK_SCALING_FP32_SCALES"))


@dataclass()
class Float8BlockScaling(Recipe):
    """FP8 with one scale per block (DeepSeek-V3's recipe, TE 2.3+): 1x128 tiles for activations
    and gradients (x/grad_block_scaling_dim=1), 128x128 blocks for weights (w_block_scaling_dim=2).

    TE's fields, defaults and checks. The PyTorch front end runs it on the CPU (core
    NVTE_BLOCK_SCALING_1D / _2D kernels; Float8BlockQuantizer); the JAX front end does not
    implement it yet. backward_override: as Float8CurrentScaling.
    """

    use_f32_scales: bool = field(default_factory=lambda: _env_flag(
        "NVTE_FP8_BLOCK_SCALING_FP32_SCALES"))
    fp8_format: Format = Format.E4M3
    fp8_quant_fwd_inp: QParams = field(default_factory=_block_scaling_default_qparams)
    fp8_quant_fwd_weight: QParams = field(default_factory=_block_scaling_default_qparams)
    fp8_quant_bwd_grad: QParams = field(default_factory=_block_scaling_default_qparams)
    x_block_scaling_dim: int = 1
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1
    fp8_gemm_fprop: MMParams = field(default_factory=lambda: MMParams(True))
    fp8_gemm_dgrad: MMParams = field(default_factory=lambda: MMParams(True))
    fp8_gemm_wgrad: MMParams = field(default_factory=lambda: MMParams(True))
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = field(default_factory=_default_backward_override)

    def float8_block_scaling(self) -> bool:
        return True

    def __post_init__(self) -> None:
        name = "Float8BlockScaling"
        check_backward_override(name, self.backward_override)
        _check_bool(name, "use_f32_scales", self.use_f32_scales)
        _check_format(name, self.fp8_format)
        _check_quant_fields(name, self)
        for d in ("x_block_scaling_dim", "w_block_scaling_dim", "grad_block_scaling_dim"):
            v = getattr(self, d)
            if v not in (1, 2) or isinstance(v, bool):
                raise ValueError(f"{name}: {d}: expected 1 or 2, got {v!r}")
        pairs = (("x_block_scaling_dim", "w_block_scaling_dim"),
                 ("x_block_scaling_dim", "grad_block_scaling_dim"),
                 ("w_block_scaling_dim", "grad_block_scaling_dim"))
        for a, b in pairs:  # TE: a GEMM of two 2D-blocked operands is not supported
            if getattr(self, a) == 2 and getattr(self, b) == 2:
                raise ValueError(f"{name}: {a}=2 with {b}=2: a 2D-by-2D block GEMM is not supported")
        for flag in ("fp8_dpa", "fp8_mha"):
            _check_bool(name, flag, getattr(self, flag))
        if self.fp8_dpa or self.fp8_mha:
            raise ValueError(f"{name}: fp8_dpa / fp8_mha: FP8 attention is not supported with "
                             "this recipe (nor by TE)")

    def __repr__(self) -> str:
        return (
            f"recipe_type={type(self).__name__}, format={self.fp8_format.name}, "
            f"fp8_quant_fwd_inp={self.fp8_quant_fwd_inp}, "
            f"fp8_quant_fwd_weight={self.fp8_quant_fwd_weight}, "
            f"fp8_quant_bwd_grad={self.fp8_quant_bwd_grad}, "
            f"x_block_scaling_dim={self.x_block_scaling_dim}, "
            f"w_block_scaling_dim={self.w_block_scaling_dim}, "
            f"grad_block_scaling_dim={self.grad_block_scaling_dim}, "
            f"backward_override={self.backward_override}"
        )


# Their public home is common.recipe (TE's module, which re-exports them): pickles of a recipe, e.g.
# in a checkpoint's extra state, name that module, so they load where TE's would and the
# extra-state classifier (pytorch/_pickled_state.py) finds them among TE's recipe classes.
for _cls in (NVFP4BlockScaling, Float8BlockScaling):
    _cls.__module__ = "transformer_engine_lite.common.recipe"
del _cls

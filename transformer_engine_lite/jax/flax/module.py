"""TE-JAX's Flax modules over the functional API: LayerNorm, DenseGeneral, LayerNormDenseGeneral,
LayerNormMLP, Softmax, plus make_dot_general_cls / wrap_function_in_te_state_module (FP8 GEMMs for
plain Flax layers) and extend_logical_axis_rules.

Parameters are created in `dtype` as logically partitioned boxes (nn.with_logical_partitioning) and
cast to the input dtype for compute (the kernel only when no quantizer is active). FP8 state
(DelayedScaling) lives in the "fp8_metas" collection as `{x,kernel,grad}{postfix}_{scale,
amax_history}`; the backward returns its new values as their gradient (TE's update idiom). Fields
this implementation does not support raise NotImplementedError when the module is set up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from .. import cpp_extensions as tex
from ..activation import activation as _activation
from ..dense import dense
from ..layernorm import canonicalize_norm_type, layernorm
from ..layernorm_dense import layernorm_dense
from ..layernorm_mlp import layernorm_mlp
from ..quantize.helper import (
    NVTE_FP8_COLLECTION_NAME,
    QuantizerFactory,
    get_quantize_config,
    get_quantize_config_with_recipe,
)
from ..quantize.quantizer import QuantizeMetaSet, noop_quantizer_set
from ..quantize.scaling_modes import TensorSource
from ..sharding import get_sharding_map_logic_axis_to_mesh_axis
from ..softmax import SoftmaxFusionType, softmax

__all__ = [
    "DenseGeneral",
    "LayerNorm",
    "LayerNormDenseGeneral",
    "LayerNormMLP",
    "Softmax",
    "TransformerEngineBase",
    "extend_logical_axis_rules",
    "make_dot_general_cls",
    "wrap_function_in_te_state_module",
]

Array = Any
Initializer = Callable[..., Array]


def _canon_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, Iterable) and not isinstance(x, str) else (x,)


def _normalize_axes(axes, ndim) -> tuple[int, ...]:
    return tuple(sorted(a % ndim for a in _canon_tuple(axes)))


def _param(module, name, init, shape, dtype, axes):
    if axes:
        init = nn.with_logical_partitioning(init, tuple(axes))
    return module.param(name, init, shape, dtype)


def _refuse(module, **fields) -> None:
    """NotImplementedError for fields set to something this implementation cannot honour."""
    for name, (value, ok) in fields.items():
        if not ok:
            raise NotImplementedError(f"{type(module).__name__}: field '{name}'={value!r} is not "
                                      "supported by transformer_engine_lite")


def _norm_params(module, hidden, norm_type, bias_init, bias_axes):
    """`scale` (ones, zeros with zero_centered_gamma) and, for layernorm, `ln_bias`: the norm
    parameters of LayerNorm, LayerNormDenseGeneral and LayerNormMLP."""
    scale_init = module.scale_init or (nn.initializers.zeros if module.zero_centered_gamma
                                       else nn.initializers.ones)
    scale = _param(module, "scale", scale_init, (hidden,), module.dtype, module.scale_axes)
    ln_bias = None
    if norm_type == "layernorm":
        ln_bias = _param(module, "ln_bias", bias_init, (hidden,), module.dtype, bias_axes)
    return scale, ln_bias


def _kernel_init_default(dtype):
    return nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", dtype=dtype)


class TransformerEngineBase(nn.Module):
    """Base of the modules with GEMMs: builds the QuantizerSet of the active (or given) recipe,
    its delayed-scaling state in the collection `_state_collection`."""

    _state_collection = NVTE_FP8_COLLECTION_NAME  # a class attribute, not a dataclass field

    def generate_quantizer_set(self, postfix: str = "", fp8_recipe=None,
                               quantization_checkpoint_name=None):
        """The module's QuantizerSet; quantization_checkpoint_name names the quantized arrays
        (TE's: for remat policies that keep them)."""
        cfg = (get_quantize_config_with_recipe(fp8_recipe) if fp8_recipe is not None
               else get_quantize_config())
        if not cfg.is_fp8_enabled():
            return noop_quantizer_set
        coll = self._state_collection
        metas = QuantizeMetaSet(
            x=cfg.get_quantize_flax_meta(self, coll, postfix, TensorSource.X, "x"),
            kernel=cfg.get_quantize_flax_meta(self, coll, postfix, TensorSource.KERNEL, "kernel"),
            grad=cfg.get_quantize_flax_meta(self, coll, postfix, TensorSource.DGRAD, "grad"))
        return QuantizerFactory.create_set(fp8_recipe=cfg.recipe, quantize_meta_set=metas,
                                           checkpoint_name=quantization_checkpoint_name)


class Softmax(nn.Module):
    """Scaled (masked / causal) softmax over the last dim; `bias` is added to the scaled logits."""

    scale_factor: float = 1.0
    softmax_fusion_type: SoftmaxFusionType = SoftmaxFusionType.SCALED
    softmax_type: str = "vanilla"

    @nn.compact
    def __call__(self, inputs, mask=None, bias=None):
        _refuse(self, softmax_type=(self.softmax_type, self.softmax_type == "vanilla"))
        kind = SoftmaxFusionType(self.softmax_fusion_type)
        if bias is not None:
            logits = (inputs.astype(jnp.float32) * self.scale_factor + bias).astype(inputs.dtype)
            scale = 1.0
        else:
            logits, scale = inputs, self.scale_factor
        if kind is SoftmaxFusionType.SCALED_MASKED and mask is None:
            kind = SoftmaxFusionType.SCALED
        sq, sk = logits.shape[-2], logits.shape[-1]
        if kind is SoftmaxFusionType.SCALED_UPPER_TRIANG_MASKED and sq != sk:
            # The causal kernel is square; as TE's module, fall back to the masked kernel with the
            # same (top-left aligned) causal mask: key j > query i is masked.
            mask = (jnp.arange(sk)[None, :] > jnp.arange(sq)[:, None])[None, None]
            kind = SoftmaxFusionType.SCALED_MASKED
        return softmax(logits, mask, scale, kind)


class LayerNorm(nn.Module):
    """LayerNorm (`layernorm_type="layernorm"`) or RMSNorm over the last dim. Params `scale`,
    `ln_bias` (layernorm only)."""

    epsilon: float = 1e-6
    layernorm_type: str = "layernorm"
    zero_centered_gamma: bool = False
    scale_init: Initializer | None = None
    scale_axes: tuple[str, ...] = ("embed",)
    bias_init: Initializer = nn.initializers.zeros
    bias_axes: tuple[str, ...] = ("embed",)
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        norm_type = canonicalize_norm_type(self.layernorm_type)
        features = x.shape[-1]
        scale, beta = _norm_params(self, features, norm_type, self.bias_init, self.bias_axes)
        return layernorm(x, scale, beta, norm_type, self.zero_centered_gamma, self.epsilon)


def _apply_low_rank_adaptation(x, axis, features, lora_a_kernel, lora_b_kernel, alpha):
    """TE-JAX's LoRA term: (x . A . B) * alpha / rank, contracting x's `axis` dims (normalized,
    trailing). TE's parameter layout: A [*x.shape[axis], *features[:-1], rank] and
    B [*features[:-1], rank, features[-1]] (a low-rank factor per leading feature, e.g. per q/k/v)."""
    axis, features = _canon_tuple(axis), _canon_tuple(features)
    if not 1 <= len(axis) <= 5 or not 1 <= len(features) <= 5:
        raise ValueError(f"_apply_low_rank_adaptation: axis and features: expected 1 to 5 dims "
                         f"each, got axis={axis}, features={features}")
    rank = lora_a_kernel.shape[-1]
    if lora_b_kernel.shape[-2] != rank:
        raise ValueError(f"_apply_low_rank_adaptation: lora_b_kernel: expected rank {rank} in its "
                         f"second-to-last dim (lora_a_kernel's last), got shape "
                         f"{tuple(lora_b_kernel.shape)}")
    xin, fout = "ijklm"[:len(axis)], "nopqr"[:len(features)]
    expr = f"...{xin},{xin}{fout[:-1]}s,{fout[:-1]}s{fout[-1]}->...{fout}"
    out = jnp.einsum(expr, x, lora_a_kernel, lora_b_kernel)
    return out * ((alpha / rank) if alpha is not None else 1.0)


def _lora(module, x, contract_ndim, features, rank, alpha, dtype, kernel_axes, prefix=""):
    """Low-rank adaptation term with TE's parameters (`{prefix}lora_a_kernel`, `..._b_kernel`, B
    starting at zero so the adapted layer starts equal to the base one)."""
    features = _canon_tuple(features)
    in_shape = x.shape[-contract_ndim:]
    a = _param(module, f"{prefix}lora_a_kernel", _kernel_init_default(dtype),
               (*in_shape, *features[:-1], rank), dtype, None)
    b = _param(module, f"{prefix}lora_b_kernel", nn.initializers.zeros,
               (*features[:-1], rank, features[-1]), dtype, None)
    del kernel_axes
    axis = tuple(range(x.ndim - contract_ndim, x.ndim))
    return _apply_low_rank_adaptation(x, axis, features, a.astype(x.dtype), b.astype(x.dtype),
                                      alpha)


class DenseGeneral(TransformerEngineBase):
    """y = x . kernel (+ bias) over the `axis` dims of x (trailing dims). Params `kernel`
    (in_dims + features), `bias` (features), `lora_a_kernel` / `lora_b_kernel` with LoRA."""

    features: int | Sequence[int]
    kernel_init: Initializer | None = None
    kernel_axes: tuple[str, ...] = ()
    use_bias: bool = True
    bias_init: Initializer = nn.initializers.zeros
    bias_axes: tuple[str, ...] = ()
    enable_low_rank_adaptation: bool = False
    low_rank_adaptation_dim: int = 32
    low_rank_adaptation_alpha: float | None = None
    axis: int | Sequence[int] = -1
    dtype: Any = jnp.float32
    input_axes: tuple[str, ...] = ()
    transpose_batch_sequence: bool = False
    quantization_checkpoint_name: str | None = None

    @nn.compact
    def __call__(self, inputs):
        features = _canon_tuple(self.features)
        axis = _normalize_axes(self.axis, inputs.ndim)
        if axis != tuple(range(inputs.ndim - len(axis), inputs.ndim)):
            raise NotImplementedError(f"DenseGeneral: field 'axis'={self.axis!r}: only trailing "
                                      f"dims of the input can be contracted (input ndim "
                                      f"{inputs.ndim})")
        kernel_init = self.kernel_init or _kernel_init_default(self.dtype)
        in_shape = tuple(inputs.shape[a] for a in axis)
        kernel = _param(self, "kernel", kernel_init, (*in_shape, *features), self.dtype,
                        self.kernel_axes)
        bias = None
        if self.use_bias:
            bias = _param(self, "bias", self.bias_init, features, self.dtype, self.bias_axes)
        qset = self.generate_quantizer_set(
            quantization_checkpoint_name=self.quantization_checkpoint_name)
        nc = len(axis)
        dims = (tuple(range(inputs.ndim - nc, inputs.ndim)), tuple(range(nc)))
        # transpose_batch_sequence: where TE-JAX's AmaxScope.TPSP finds the sequence dim.
        y = dense(inputs, kernel, bias, dims, input_axes=self.input_axes or None,
                  kernel_axes=self.kernel_axes or None, quantizer_set=qset,
                  transpose_batch_sequence=self.transpose_batch_sequence)
        if self.enable_low_rank_adaptation:
            y = y + _lora(self, inputs, nc, features, self.low_rank_adaptation_dim,
                          self.low_rank_adaptation_alpha, self.dtype, self.kernel_axes)
        return y


class LayerNormDenseGeneral(TransformerEngineBase):
    """norm(x) . kernel (+ bias) -> (z, ln_output or None). Params `scale`, `ln_bias`, `kernel`,
    `bias`, `lora_*`."""

    features: int | Sequence[int]
    enable_layernorm: bool = True
    layernorm_type: str = "layernorm"
    epsilon: float = 1e-6
    zero_centered_gamma: bool = False
    scale_init: Initializer | None = None
    scale_axes: tuple[str, ...] = ("embed",)
    ln_bias_init: Initializer = nn.initializers.zeros
    ln_bias_axes: tuple[str, ...] = ("embed",)
    kernel_init: Initializer | None = None
    kernel_axes: tuple[str, ...] = ()
    use_bias: bool = False
    bias_init: Initializer = nn.initializers.zeros
    bias_axes: tuple[str, ...] = ()
    return_layernorm_output: bool = False
    enable_low_rank_adaptation: bool = False
    low_rank_adaptation_dim: int = 32
    low_rank_adaptation_alpha: float | None = None
    axis: int | Sequence[int] = -1
    dtype: Any = jnp.float32
    layernorm_input_axes: tuple[str, ...] | None = None
    dot_input_axes: tuple[str, ...] | None = None
    depth_scaling: float | None = None
    transpose_batch_sequence: bool = False
    quantization_checkpoint_name: str | None = None

    @nn.compact
    def __call__(self, inputs):
        axis = _normalize_axes(self.axis, inputs.ndim)
        _refuse(self, axis=(self.axis, axis == (inputs.ndim - 1,)))
        features = _canon_tuple(self.features)
        norm_type = canonicalize_norm_type(self.layernorm_type)
        hidden = inputs.shape[-1]
        kernel_init = self.kernel_init or _kernel_init_default(self.dtype)
        kernel = _param(self, "kernel", kernel_init, (hidden, *features), self.dtype,
                        self.kernel_axes)
        bias = None
        if self.use_bias:
            bias = _param(self, "bias", self.bias_init, features, self.dtype, self.bias_axes)
        qset = self.generate_quantizer_set(
            quantization_checkpoint_name=self.quantization_checkpoint_name)
        ln_out = None
        if self.enable_layernorm:
            scale, ln_bias = _norm_params(self, hidden, norm_type, self.ln_bias_init,
                                          self.ln_bias_axes)
            if self.return_layernorm_output or self.enable_low_rank_adaptation:
                ln_out = layernorm(inputs, scale, ln_bias, norm_type, self.zero_centered_gamma,
                                   self.epsilon)
                z = dense(ln_out, kernel, bias, ((ln_out.ndim - 1,), (0,)),
                          input_axes=self.dot_input_axes, kernel_axes=self.kernel_axes or None,
                          quantizer_set=qset,
                          transpose_batch_sequence=self.transpose_batch_sequence)
            else:
                z = layernorm_dense(inputs, kernel, scale, ln_bias, bias, norm_type,
                                    self.zero_centered_gamma, self.epsilon,
                                    transpose_batch_sequence=self.transpose_batch_sequence,
                                    layernorm_input_axes=self.layernorm_input_axes,
                                    dot_input_axes=self.dot_input_axes,
                                    kernel_axes=self.kernel_axes or None, quantizer_set=qset)
        else:
            ln_out = inputs
            z = dense(inputs, kernel, bias, ((inputs.ndim - 1,), (0,)),
                      input_axes=self.dot_input_axes, kernel_axes=self.kernel_axes or None,
                      quantizer_set=qset, transpose_batch_sequence=self.transpose_batch_sequence)
        if self.enable_low_rank_adaptation:
            z = z + _lora(self, ln_out, 1, features, self.low_rank_adaptation_dim,
                          self.low_rank_adaptation_alpha, self.dtype, self.kernel_axes)
        if self.depth_scaling is not None:
            z = z / self.depth_scaling
        return z, (ln_out if self.return_layernorm_output else None)


class LayerNormMLP(TransformerEngineBase):
    """norm(x) -> wi (+ bias) -> activation(s) -> dropout -> wo (+ bias) -> (out, ln_output or
    None). Params `scale`, `ln_bias`, `wi_kernel` (hidden, n_act, intermediate), `wo_kernel`,
    `wi_bias` (n_act, intermediate), `wo_bias`, `wi_lora_*` / `wo_lora_*`."""

    intermediate_dim: int = 2048
    enable_layernorm: bool = True
    layernorm_type: str = "layernorm"
    epsilon: float = 1e-6
    zero_centered_gamma: bool = False
    scale_init: Initializer | None = None
    scale_axes: tuple[str, ...] = ("embed",)
    ln_bias_init: Initializer = nn.initializers.zeros
    ln_bias_axes: tuple[str, ...] = ("embed",)
    kernel_init: Initializer | None = None
    kernel_axes_1: tuple[str, ...] = ("embed", "act", "mlp")
    kernel_axes_2: tuple[str, ...] = ("mlp", "embed")
    use_bias: bool = False
    bias_init: Initializer = nn.initializers.zeros
    bias_axes_1: tuple[str, ...] = ("act", "mlp")
    bias_axes_2: tuple[str, ...] = ("embed",)
    return_layernorm_output: bool = False
    activations: Sequence[str | Callable] = ("gelu",)
    activation_params: Any = None
    intermediate_dropout_rng_name: str = "dropout"
    intermediate_dropout_rate: float = 0.0
    intermediate_hidden_dropout_dims: Sequence[int] = ()
    enable_low_rank_adaptation: bool = False
    low_rank_adaptation_dim: int = 32
    low_rank_adaptation_alpha: float | None = None
    axis: int | Sequence[int] = -1
    dtype: Any = jnp.float32
    layernorm_input_axes: tuple[str, ...] | None = None
    dot_1_input_axes: tuple[str, ...] | None = None
    dot_2_input_axes: tuple[str, ...] | None = None
    ffn1_ckpt_name: str = "ffn1"
    ffn2_ckpt_name: str = "ffn2"
    transpose_batch_sequence: bool = False
    quantization_checkpoint_name: str | None = None

    @nn.compact
    def __call__(self, inputs, deterministic: bool = False):
        _refuse(self, axis=(self.axis, _normalize_axes(self.axis, inputs.ndim)
                            == (inputs.ndim - 1,)),
                activations=(self.activations, all(isinstance(a, str) for a in self.activations)))
        act = tuple(a.lower() for a in self.activations)
        if len(act) > 1 and act[0] in ("linear", "clamped_linear"):
            act = tuple(reversed(act))  # TE's order: ("linear", "gelu") is GEGLU
        fused_act = _fused_activation(act)
        act_params = self.activation_params
        if fused_act and isinstance(act_params, dict):  # TE passes e.g. {"limit": 7.0}
            act_params = tex.ActivationParams.create(act, **act_params)
        elif not fused_act and act_params is not None:
            raise ValueError(f"LayerNormMLP: field 'activation_params': expected None for "
                             f"activations without a fused kernel, got {act_params!r} with "
                             f"{self.activations!r}")
        # One wi slice per activation when composed (TE's rule); a fused kind has 2 when gated.
        n_act = (2 if tex.is_gated(act) else 1) if fused_act else len(act)
        norm_type = canonicalize_norm_type(self.layernorm_type)
        hidden = inputs.shape[-1]
        kernel_init = self.kernel_init or _kernel_init_default(self.dtype)

        def wi_init(key, shape, dtype):
            keys = jax.random.split(key, shape[1])
            return jnp.stack([kernel_init(k, (shape[0], shape[2]), dtype) for k in keys], axis=1)

        wi = _param(self, "wi_kernel", wi_init, (hidden, n_act, self.intermediate_dim), self.dtype,
                    self.kernel_axes_1)
        wo = _param(self, "wo_kernel", kernel_init, (self.intermediate_dim, hidden), self.dtype,
                    self.kernel_axes_2)
        wi_b = wo_b = None
        if self.use_bias:
            wi_b = _param(self, "wi_bias", self.bias_init, (n_act, self.intermediate_dim),
                          self.dtype, self.bias_axes_1)
            wo_b = _param(self, "wo_bias", self.bias_init, (hidden,), self.dtype, self.bias_axes_2)
        scale = ln_bias = None
        if self.enable_layernorm:
            scale, ln_bias = _norm_params(self, hidden, norm_type, self.ln_bias_init,
                                          self.ln_bias_axes)
        q1 = self.generate_quantizer_set(
            "_0", quantization_checkpoint_name=self.quantization_checkpoint_name)
        q2 = self.generate_quantizer_set(
            "_1", quantization_checkpoint_name=self.quantization_checkpoint_name)
        dropout = self.intermediate_dropout_rate > 0 and not deterministic
        fused = (self.enable_layernorm and not dropout and not self.return_layernorm_output
                 and not self.enable_low_rank_adaptation and fused_act)
        if fused:
            out = layernorm_mlp(inputs, scale, ln_bias, [wi, wo], [wi_b, wo_b], norm_type,
                                self.zero_centered_gamma, self.epsilon,
                                transpose_batch_sequence=self.transpose_batch_sequence,
                                norm_input_axes=self.layernorm_input_axes,
                                dot_1_input_axes=self.dot_1_input_axes,
                                dot_2_input_axes=self.dot_2_input_axes,
                                kernel_1_axes=self.kernel_axes_1, kernel_2_axes=self.kernel_axes_2,
                                ffn1_ckpt_name=self.ffn1_ckpt_name,
                                ffn2_ckpt_name=self.ffn2_ckpt_name, activation_type=act,
                                activation_params=act_params, quantizer_sets=(q1, q2))
            return out, None
        # Unfused path: dropout between the GEMMs, LoRA, or the layernorm output requested.
        if self.enable_layernorm:
            ln_out = layernorm(inputs, scale, ln_bias, norm_type, self.zero_centered_gamma,
                               self.epsilon)
        else:
            ln_out = inputs
        h = dense(ln_out, wi, wi_b, ((ln_out.ndim - 1,), (0,)), quantizer_set=q1,
                  transpose_batch_sequence=self.transpose_batch_sequence)
        if self.enable_low_rank_adaptation:
            h = h + _lora(self, ln_out, 1, (n_act, self.intermediate_dim),
                          self.low_rank_adaptation_dim, self.low_rank_adaptation_alpha,
                          self.dtype, None, "wi_")
        if fused_act:
            a = _activation(h if n_act == 2 else h[..., 0, :], act, act_params=act_params)
        else:
            a = _composed_activation(h, act).astype(h.dtype)
        if dropout:
            a = nn.Dropout(rate=self.intermediate_dropout_rate,
                           broadcast_dims=tuple(self.intermediate_hidden_dropout_dims),
                           rng_collection=self.intermediate_dropout_rng_name)(
                               a, deterministic=deterministic)
        out = dense(a, wo, wo_b, ((a.ndim - 1,), (0,)), quantizer_set=q2,
                    transpose_batch_sequence=self.transpose_batch_sequence)
        if self.enable_low_rank_adaptation:
            out = out + _lora(self, a, 1, (hidden,), self.low_rank_adaptation_dim,
                              self.low_rank_adaptation_alpha, self.dtype, None, "wo_")
        return out, (ln_out if self.return_layernorm_output else None)


def _fused_activation(act: tuple) -> bool:
    """Whether `act` is one of the activation kinds the core has a kernel for."""
    try:
        tex.activation_name(act)
    except ValueError:
        return False
    return True


def _composed_activation(h, act: tuple):
    """TE's LayerNormMLP for activation tuples with no fused kernel (e.g. ("relu", "relu")):
    activation i (a flax.linen function by name, "linear" the identity) on slice i of the
    [..., n_act, mlp] product, the results multiplied."""
    out = None
    for i, name in enumerate(act):
        fn = (lambda v: v) if name == "linear" else getattr(nn, name, None)
        if not callable(fn):
            raise ValueError(f"LayerNormMLP: field 'activations': {name!r} is neither a fused "
                             f"activation kind nor a flax.linen function, got {act!r}")
        y = fn(h[..., i, :])
        out = y if out is None else out * y
    return out


# ------------------------------------------------------------------------ FP8 for plain Flax
_OVERWRITE = "_overwrite_with_gradient"


def wrap_function_in_te_state_module(f, quantization_recipe, name=None,
                                     quantization_checkpoint_name=None):
    """A Flax module class whose __call__(*args) runs f(generate_quantizer_set, *args); its FP8
    state lives in the "_overwrite_with_gradient" collection (TE's choice)."""

    class TEWrapper(TransformerEngineBase):
        _state_collection = _OVERWRITE

        @nn.compact
        def __call__(self, *args, **kwargs):
            def gen(postfix=""):
                # The wrapper's own recipe only (None: high precision, whatever autocast says).
                if quantization_recipe is None:
                    return noop_quantizer_set
                return self.generate_quantizer_set(postfix, quantization_recipe,
                                                   quantization_checkpoint_name)

            return f(gen, *args, **kwargs)

    TEWrapper.__name__ = f"TEWrapper_{name or getattr(f, '__name__', 'fn')}"
    return TEWrapper


def make_dot_general_cls(quantization_recipe):
    """A module class for `nn.Dense(..., dot_general=cls())`: the GEMM runs through `dense` with
    FP8 per `quantization_recipe` (batch dims must be empty)."""

    def te_dot_general(generate_quantizer_set, x, kernel, dims, precision=None,
                       preferred_element_type=None, **kwargs):
        del precision, kwargs
        (lc, rc), (lb, rb) = dims
        if lb or rb:
            raise NotImplementedError(f"make_dot_general_cls: dimension_numbers: expected no "
                                      f"batch dims, got {(lb, rb)}")
        out = dense(x, kernel, None, (tuple(lc), tuple(rc)),
                    quantizer_set=generate_quantizer_set())
        return out.astype(preferred_element_type) if preferred_element_type else out

    return wrap_function_in_te_state_module(te_dot_general, quantization_recipe, "dot_general")


def extend_logical_axis_rules(rules) -> tuple:
    """The user's Flax logical axis rules + TE's logical axes mapped for the active MeshResource
    (asserting that the two agree)."""
    rules = tuple(tuple(r) for r in rules)
    te_rules = get_sharding_map_logic_axis_to_mesh_axis()
    known = {k: v for k, v in rules}
    out = list(rules)
    for k, v in te_rules.items():
        if k in known:
            assert known[k] == v, (f"extend_logical_axis_rules: rule for {k!r} expected {v!r} "
                                   f"(TE's), got {known[k]!r}")
        else:
            out.append((k, v))
    return tuple(out)




"""TE-JAX's attention Flax modules: DotProductAttention (fused / unfused backend over
transformer_engine_lite.jax.attention) and MultiHeadAttention (QKV projections, rotary embedding,
decode cache, output projection), with TE's fields, defaults, submodule and parameter names.
Fields this implementation cannot honour raise NotImplementedError when the module runs."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from functools import partial
from math import sqrt
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from ...common import config
from .. import cpp_extensions as tex
from ..attention import (
    AttnBiasType,
    AttnMaskType,
    AttnSoftmaxType,
    CPStrategy,
    QKVLayout,
    canonicalize_attn_mask_type,
    fused_attn,
    is_fused_attn_kernel_available,
    unfused_attn,
)
from ..cpp_extensions.base import warn_once
from ..sharding import (
    BATCH_AXES,
    HEAD_AXES,
    HIDDEN_AXES,
    HIDDEN_TP_AXES,
    JOINED_AXES,
    SEQLEN_AXES,
    SEQLEN_TP_AXES,
    W_FSDP_AXES,
    W_JOINED_AXES,
    W_NO_SHARD_AXES,
    W_TP_AXES,
    with_sharding_constraint_by_logical_axes,
)
from .lora import _lora_scope, _split_init
from .module import DenseGeneral, LayerNormDenseGeneral, _refuse
from .rope import rotary_pos_emb

__all__ = ["DotProductAttention", "MultiHeadAttention", "rotary_pos_emb"]

Array = Any
Initializer = Callable[..., Array]
_CP_STRATEGIES = ("DEFAULT", "ALL_GATHER", "ALLGATHER", "RING")  # TE's accepted spellings
def _enum_field(module, field: str, value: str, enum) -> Any:
    try:
        return enum[value.upper()]
    except (KeyError, AttributeError):
        raise ValueError(f"{type(module).__name__}: field '{field}': expected one of "
                         f"{[m.name.lower() for m in enum]}, got {value!r}") from None


def _tbs_default(module) -> None:
    """TE v2.10+: transpose_batch_sequence=None warns and becomes False."""
    if module.transpose_batch_sequence is None:
        warnings.warn(f"transpose_batch_sequence defaults to False in {type(module).__name__} "
                      "starting TransformerEngine v2.10")
        module.transpose_batch_sequence = False


# -------------------------------------------------------------------------- DotProductAttention
class _DPABackend(nn.Module):
    """Shared body of the two backends: both take [b, s, ...] (or [s, b, ...]) inputs in
    `qkv_layout` and return [b, s_q, h, d_v] (or [s_q, b, ...]). A submodule, not a function, so
    the parameter path matches TE's (`_FusedDotProductAttention_0` / `_Unfused..._0`)."""

    attention_dropout: float = 0.0
    attn_mask_type: AttnMaskType = AttnMaskType.CAUSAL_MASK
    attn_bias_type: AttnBiasType = AttnBiasType.NO_BIAS
    qkv_layout: QKVLayout = QKVLayout.BSHD_BSHD_BSHD
    scale_factor: float = 1.0
    transpose_batch_sequence: bool = False
    window_size: tuple[int, int] | None = None
    max_segments_per_seq: int = 1
    float32_logits: bool = False
    softmax_type: AttnSoftmaxType = AttnSoftmaxType.VANILLA_SOFTMAX

    def _run(self, fn, qkv, layout, sequence_descriptor, bias, dropout_rng, deterministic,
             softmax_offset=None, **extra):
        if self.transpose_batch_sequence:  # the backends are batch-first
            qkv = tuple(jnp.swapaxes(t, 0, 1) for t in qkv)
        x = fn(qkv, bias, sequence_descriptor, dropout_rng, softmax_offset=softmax_offset, **extra,
               attn_bias_type=self.attn_bias_type,
               attn_mask_type=self.attn_mask_type, qkv_layout=layout,
               softmax_type=self.softmax_type, scaling_factor=self.scale_factor,
               # no dropout (and no seed) at inference: the API wants a seed whenever p > 0
               dropout_probability=0.0 if deterministic else self.attention_dropout,
               is_training=not deterministic,
               max_segments_per_seq=self.max_segments_per_seq, window_size=self.window_size)
        return jnp.swapaxes(x, 0, 1) if self.transpose_batch_sequence else x


class _FusedDotProductAttention(_DPABackend):
    # Context parallelism (TE's fields of the fused backend): fused_attn shards the sequence
    # over the CP axis when it has more than one device (cpp_extensions/attention_cp.py).
    context_parallel_causal_load_balanced: bool = False
    context_parallel_axis: str = ""
    context_parallel_strategy: CPStrategy = CPStrategy.DEFAULT

    @nn.compact
    def __call__(self, query, key, value, sequence_descriptor=None, bias=None, *,
                 dropout_rng=None, deterministic=False, softmax_offset=None):
        if self.qkv_layout.is_qkvpacked():
            qkv = (query,)  # [b, s, 3, h, d]; key / value unused
        elif self.qkv_layout.is_kvpacked():
            qkv = (query, key)  # kv [b, s, 2, h_kv, d]
        else:
            qkv = (query, key, value)
        return self._run(fused_attn, qkv, self.qkv_layout, sequence_descriptor, bias,
                         dropout_rng, deterministic, softmax_offset,
                         context_parallel_strategy=self.context_parallel_strategy,
                         context_parallel_causal_load_balanced=(
                             self.context_parallel_causal_load_balanced),
                         context_parallel_axis=self.context_parallel_axis)


class _UnfusedDotProductAttention(_DPABackend):
    @nn.compact
    def __call__(self, query, key, value, sequence_descriptor=None, bias=None, *,
                 dropout_rng=None, deterministic=False, softmax_offset=None):
        # The unfused backend takes separate q, k, v (as TE's): split the packed dim (-3).
        if self.qkv_layout.is_qkvpacked():
            query, key, value = (query[..., i, :, :] for i in range(3))
        elif self.qkv_layout.is_kvpacked():
            key, value = key[..., 0, :, :], key[..., 1, :, :]
        dtype = query.dtype
        if self.float32_logits:
            # TE computes QK^T in fp32; running the whole unfused math in fp32 does that and
            # keeps P.V at least as precise. The result comes back in the input dtype.
            query, key, value = (t.astype(jnp.float32) for t in (query, key, value))
        x = self._run(unfused_attn, (query, key, value), self.qkv_layout.to_separate(),
                      sequence_descriptor, bias, dropout_rng, deterministic, softmax_offset)
        return x.astype(dtype)


class DotProductAttention(nn.Module):
    """softmax(scale * Q K^T (+ bias), masked) V on [b, s, h, d] inputs (layout `qkv_layout`).
    Fused backend when NVTE_FUSED_ATTN != "0" and a kernel is available, else unfused."""

    head_dim: int
    num_attention_heads: int
    num_gqa_groups: int | None = None
    attention_dropout: float = 0.0
    attn_mask_type: str = "causal"
    attn_bias_type: str | None = None
    dtype: Any = None  # deprecated: must match the input dtype
    dropout_rng_name: str = "dropout"
    float32_logits: bool = False
    qkv_layout: str = "bshd_bshd_bshd"
    scale_factor: float | None = None
    transpose_batch_sequence: bool | None = None
    window_size: tuple[int, int] | None = None
    max_segments_per_seq: int | None = 1
    context_parallel_causal_load_balanced: bool = False
    context_parallel_axis: str = ""
    context_parallel_strategy: str = "DEFAULT"
    context_checkpoint_name: str = "context"
    softmax_type: str = "vanilla"
    score_mod: Callable | None = None
    score_mod_bprop: Callable | None = None

    def __post_init__(self):
        _tbs_default(self)
        super().__post_init__()

    def _check_fields(self) -> CPStrategy:
        strategy = str(self.context_parallel_strategy).upper()
        if strategy not in _CP_STRATEGIES:
            raise ValueError(f"DotProductAttention: field 'context_parallel_strategy': expected "
                             f"one of {list(_CP_STRATEGIES)} (case insensitive), got "
                             f"{self.context_parallel_strategy!r}")
        _refuse(self, score_mod=(self.score_mod, self.score_mod is None),
                score_mod_bprop=(self.score_mod_bprop, self.score_mod_bprop is None))
        return CPStrategy.ALL_GATHER if strategy == "ALLGATHER" else CPStrategy[strategy]

    @nn.compact
    def __call__(self, query, key, value, sequence_descriptor=None, bias=None, *,
                 deterministic: bool = False, mask=None,
                 score_mod_tensors: Mapping[str, Any] | None = None,
                 score_mod_bprop_tensors: Mapping[str, Any] | None = None):
        cp_strategy = self._check_fields()
        if score_mod_tensors is not None or score_mod_bprop_tensors is not None:
            raise NotImplementedError("DotProductAttention: arguments 'score_mod_tensors' / "
                                      "'score_mod_bprop_tensors' (score_mod) are not supported "
                                      "by transformer_engine_lite")
        if mask is not None:
            if sequence_descriptor is not None:
                raise ValueError("DotProductAttention: sequence_descriptor and mask cannot be "
                                 "provided at the same time")
            warnings.warn("mask is deprecated, please use sequence_descriptor instead.")
            sequence_descriptor = mask
        if self.attn_bias_type is None:
            bias_type = AttnBiasType.NO_BIAS if bias is None else AttnBiasType.POST_SCALE_BIAS
        else:
            bias_type = _enum_field(self, "attn_bias_type", self.attn_bias_type, AttnBiasType)
        if (bias_type == AttnBiasType.NO_BIAS) != (bias is None):
            raise ValueError(f"DotProductAttention: field 'attn_bias_type'={bias_type.name} "
                             f"needs {'no bias' if bias_type == AttnBiasType.NO_BIAS else 'a bias'}"
                             f", got bias={'None' if bias is None else 'an array'}")
        mask_type = canonicalize_attn_mask_type(self.attn_mask_type)
        layout = _enum_field(self, "qkv_layout", self.qkv_layout, QKVLayout)
        softmax_type = AttnSoftmaxType.from_str(self.softmax_type)
        dtype = query.dtype
        others = () if layout.is_qkvpacked() else (key,) if layout.is_kvpacked() else (key, value)
        for name, t in zip(("key", "value"), others):
            if t.dtype != dtype:
                raise ValueError(f"DotProductAttention: argument '{name}': expected dtype "
                                 f"{dtype} (query's), got {t.dtype}")
        if self.dtype is not None:
            if jnp.dtype(self.dtype) != dtype:
                raise ValueError(f"DotProductAttention: field 'dtype' (deprecated)={self.dtype} "
                                 f"does not match the input dtype {dtype}")
            warnings.warn("DotProductAttention: the dtype argument is deprecated (the module "
                          "has no parameters and uses the input dtype)")
        if bias is not None:
            bias = bias.astype(dtype)

        # Problem size, checked against the fields (a mismatch would silently mis-reshape).
        seq_dim = 0 if self.transpose_batch_sequence else 1
        h_kv = self.num_gqa_groups or self.num_attention_heads
        s_q = query.shape[seq_dim]
        s_kv = s_q if layout.is_qkvpacked() else key.shape[seq_dim]
        got_h = query.shape[-2]
        got_hkv = got_h if layout.is_qkvpacked() else key.shape[-2]
        d_qk = query.shape[-1]
        d_v = value.shape[-1] if layout.is_separate() else d_qk
        if (got_h, got_hkv) != (self.num_attention_heads, h_kv):
            raise ValueError(f"DotProductAttention: fields 'num_attention_heads' / "
                             f"'num_gqa_groups' = {self.num_attention_heads} / {h_kv}: the "
                             f"inputs have {got_h} query and {got_hkv} kv heads")
        if h_kv == 0 or self.num_attention_heads % h_kv:
            raise ValueError(f"DotProductAttention: field 'num_gqa_groups'={h_kv}: must divide "
                             f"num_attention_heads={self.num_attention_heads}")

        use_fused = config.get("NVTE_FUSED_ATTN") != "0"
        if use_fused:
            use_fused = is_fused_attn_kernel_available(
                not deterministic, dtype, dtype, layout, bias_type, mask_type, softmax_type,
                self.attention_dropout, self.num_attention_heads, h_kv, s_q, s_kv, d_qk, d_v,
                self.window_size)
            if not use_fused:
                warn_once("Fused attention is not enabled because there is no available kernel."
                           f"\nFall back to the unfused attention.\nqkv_layout={layout}\n"
                           f"attn_bias_type={bias_type}\nattn_mask_type={mask_type}\n"
                           f"attention_dropout={self.attention_dropout}\n"
                           f"num_attention_heads={self.num_attention_heads}\n"
                           f"num_gqa_groups={h_kv}\nwindow_size={self.window_size}\n"
                           f"seqlen_q={s_q}\nseqlen_kv={s_kv}\nhead_dim_qk={d_qk}\n"
                           f"head_dim_v={d_v}")
        dropout_rng = None
        if not deterministic and self.attention_dropout > 0.0:
            dropout_rng = self.make_rng(self.dropout_rng_name)
        scale = 1.0 / sqrt(d_qk) if self.scale_factor is None else self.scale_factor
        kwargs = {"attention_dropout": self.attention_dropout, "attn_mask_type": mask_type,
                      "attn_bias_type": bias_type, "qkv_layout": layout, "scale_factor": scale,
                      "transpose_batch_sequence": self.transpose_batch_sequence,
                      "window_size": self.window_size,
                      "max_segments_per_seq": self.max_segments_per_seq or 1,
                      "softmax_type": softmax_type}
        if use_fused:  # (the unfused math is global jnp: correct on a CP-sharded sequence too)
            backend = _FusedDotProductAttention(
                context_parallel_strategy=cp_strategy,
                context_parallel_causal_load_balanced=self.context_parallel_causal_load_balanced,
                context_parallel_axis=self.context_parallel_axis, **kwargs)
        else:
            backend = _UnfusedDotProductAttention(float32_logits=self.float32_logits, **kwargs)
        # Attention sinks (TE's param: 'softmax_offset' fp32 [1, h, 1, 1], zeros, for
        # 'learnable'; off-by-one's sink is 0). They run on the unfused math.
        softmax_offset = None
        if softmax_type == AttnSoftmaxType.LEARNABLE_SOFTMAX:
            softmax_offset = self.param(
                "softmax_offset",
                nn.with_logical_partitioning(nn.initializers.zeros, (None, HEAD_AXES, None, None)),
                (1, self.num_attention_heads, 1, 1), jnp.float32)
        x = backend(query, key, value, sequence_descriptor, bias, dropout_rng=dropout_rng,
                    deterministic=deterministic, softmax_offset=softmax_offset)
        x = checkpoint_name(x, self.context_checkpoint_name)
        if x.dtype != dtype:
            raise AssertionError(f"DotProductAttention: output dtype {x.dtype} != input {dtype}")
        return x


# -------------------------------------------------------------------------- MultiHeadAttention
class MultiHeadAttention(nn.Module):
    """[norm ->] QKV projection -> [rotary] -> DotProductAttention -> output projection.
    Returns (out, ln_out)."""

    head_dim: int
    num_attention_heads: int
    num_gqa_groups: int | None = None
    attention_dropout: float = 0.0
    dropout_rng_name: str = "dropout"
    input_layernorm: bool = True
    layernorm_type: str = "layernorm"
    layernorm_epsilon: float = 1e-6
    return_layernorm_output: bool = False
    zero_centered_gamma: bool = False
    kernel_init: Initializer | None = None
    use_bias: bool = False
    bias_init: Initializer = nn.initializers.zeros
    attn_mask_type: str = "causal"
    attn_bias_type: str | None = None
    enable_rotary_pos_emb: bool = False
    rotary_pos_emb_windows: tuple[int, int] = (1, 10000)
    rotary_pos_emb_group_method: str = "consecutive"
    low_rank_adaptation_scope: str = "none"
    low_rank_adaptation_dim: int = 32
    low_rank_adaptation_alpha: float | None = None
    dtype: Any = jnp.float32
    fuse_qkv_params: bool = True
    transpose_batch_sequence: bool | None = None
    enable_sequence_parallel: bool = False
    scale_attn_logits: bool = False
    scaled_query_init: bool = True
    float32_logits: bool = False
    window_size: tuple[int, int] | None = None
    softmax_type: str = "vanilla"
    score_mod: Callable | None = None
    score_mod_bprop: Callable | None = None
    # Deprecated aliases (TE's handling: the first two are mapped, the next raises, the last
    # two only warn; they have no effect in TE either).
    num_heads: int | None = None
    dropout_rate: float | None = None
    output_layernorm: bool | None = None
    apply_residual_connection_post_layernorm: bool | None = None
    fuse_qkv: bool | None = None

    def __post_init__(self):
        _tbs_default(self)
        name = type(self).__name__
        if self.num_heads is not None:
            warnings.warn(f"{name}.num_heads is deprecated; use num_attention_heads",
                          DeprecationWarning)
            self.num_attention_heads = self.num_heads
        if self.dropout_rate is not None:
            warnings.warn(f"{name}.dropout_rate is deprecated; use attention_dropout",
                          DeprecationWarning)
            self.attention_dropout = self.dropout_rate
        for old, new in (("apply_residual_connection_post_layernorm", "return_layernorm_output"),
                         ("fuse_qkv", "fuse_qkv_params")):
            if getattr(self, old) is not None:
                warnings.warn(f"{name}.{old} is deprecated and has no effect; use {new}",
                              DeprecationWarning)
        if self.output_layernorm is not None:
            raise ValueError(f"{name}: field 'output_layernorm' is deprecated; use "
                             "input_layernorm to control the layernorm")
        if self.kernel_init is None:
            self.kernel_init = nn.initializers.variance_scaling(1.0, "fan_in", "normal",
                                                                dtype=self.dtype)
        if self.num_gqa_groups is None:
            self.num_gqa_groups = self.num_attention_heads
        super().__post_init__()

    def _seq_axes(self, sharded_seq: bool):
        axes = [BATCH_AXES, SEQLEN_TP_AXES if sharded_seq else SEQLEN_AXES]
        return tuple(reversed(axes)) if self.transpose_batch_sequence else tuple(axes)

    @nn.compact
    def __call__(self, inputs_q, inputs_kv, mask=None, bias=None, *, decode: bool = False,
                 deterministic: bool = False, score_mod_tensors=None,
                 score_mod_bprop_tensors=None):
        if inputs_q.dtype != inputs_kv.dtype:
            raise ValueError(f"MultiHeadAttention: inputs_q dtype {inputs_q.dtype} != "
                             f"inputs_kv dtype {inputs_kv.dtype}")
        dtype = inputs_q.dtype
        h, g, d = self.num_attention_heads, self.num_gqa_groups, self.head_dim
        lora_qkv, lora_out, _ = _lora_scope(self.low_rank_adaptation_scope)
        depth = jnp.sqrt(d).astype(self.dtype) if self.scaled_query_init else 1.0

        def query_init(key, shape, dt):  # 1/sqrt(d) on W_q replaces the logit scale
            return self.kernel_init(key, shape, dt) / depth

        in_axes = (*self._seq_axes(self.enable_sequence_parallel), HIDDEN_AXES)
        dot_axes = (*self._seq_axes(False), HIDDEN_AXES)
        # before the constraint: under a mesh it returns a new array, and the identity is the test
        is_self_attn = inputs_q is inputs_kv
        inputs_q = with_sharding_constraint_by_logical_axes(inputs_q, in_axes)
        if is_self_attn:
            inputs_kv = inputs_q
        ln_dense = partial(
            LayerNormDenseGeneral, enable_layernorm=self.input_layernorm,
            layernorm_type=self.layernorm_type, zero_centered_gamma=self.zero_centered_gamma,
            epsilon=self.layernorm_epsilon, scale_axes=(W_NO_SHARD_AXES,),
            ln_bias_axes=(W_NO_SHARD_AXES,), use_bias=self.use_bias, bias_init=self.bias_init,
            enable_low_rank_adaptation=lora_qkv, low_rank_adaptation_dim=self.low_rank_adaptation_dim,
            low_rank_adaptation_alpha=self.low_rank_adaptation_alpha, dtype=self.dtype,
            layernorm_input_axes=in_axes, dot_input_axes=dot_axes,
            transpose_batch_sequence=self.transpose_batch_sequence)
        dense = partial(
            DenseGeneral, use_bias=self.use_bias, bias_init=self.bias_init,
            enable_low_rank_adaptation=lora_qkv, low_rank_adaptation_dim=self.low_rank_adaptation_dim,
            low_rank_adaptation_alpha=self.low_rank_adaptation_alpha, dtype=self.dtype,
            transpose_batch_sequence=self.transpose_batch_sequence)
        qkv = kv = query = key = value = None
        if self.fuse_qkv_params and is_self_attn and h == g:
            qkv, ln_out = ln_dense(
                features=(3, h * d), return_layernorm_output=self.return_layernorm_output,
                kernel_axes=(W_FSDP_AXES, W_JOINED_AXES, W_TP_AXES),
                kernel_init=_split_init(self.kernel_init, (query_init, self.kernel_init,
                                                           self.kernel_init)),
                bias_axes=(W_JOINED_AXES, W_TP_AXES), name="qkv")(inputs_q)
            qkv = checkpoint_name(qkv, "combined_qkv_proj")
            layout = QKVLayout.BS3HD
        else:
            # Self-attention projects K/V from the (shared) layernorm output of the query path.
            query, ln_out = ln_dense(
                features=h * d, kernel_axes=(W_FSDP_AXES, W_TP_AXES), kernel_init=query_init,
                bias_axes=(W_TP_AXES,), name="query",
                return_layernorm_output=(self.return_layernorm_output or is_self_attn
                                         or not self.fuse_qkv_params))(inputs_q)
            if is_self_attn:
                inputs_kv = ln_out
            if self.fuse_qkv_params:
                kv = dense(features=(2, g * d), kernel_axes=(W_FSDP_AXES, W_JOINED_AXES, W_TP_AXES),
                           kernel_init=_split_init(self.kernel_init, (self.kernel_init,) * 2),
                           bias_axes=(W_JOINED_AXES, W_TP_AXES), name="kv")(inputs_kv)
                kv = checkpoint_name(kv, "combined_kv_proj")
                layout = QKVLayout.BSHD_BS2HD
            else:
                sep = partial(dense, features=g * d, kernel_axes=(W_FSDP_AXES, W_TP_AXES),
                              kernel_init=self.kernel_init, bias_axes=(W_TP_AXES,))
                query = checkpoint_name(query.astype(dtype), "query_proj")
                key = checkpoint_name(sep(name="key")(inputs_kv).astype(dtype), "key_proj")
                value = checkpoint_name(sep(name="value")(inputs_kv).astype(dtype), "value_proj")
                layout = QKVLayout.BSHD_BSHD_BSHD

        lead = qkv.shape[:2] if qkv is not None else query.shape[:2]
        # Rotary embedding and the decode cache need separate Q / K / V ([.., s, heads, d]).
        if self.enable_rotary_pos_emb or decode:
            if layout == QKVLayout.BS3HD:
                query, key, value = (qkv[..., i, :] for i in range(3))
            elif layout == QKVLayout.BSHD_BS2HD:
                key, value = kv[..., 0, :], kv[..., 1, :]
            layout = QKVLayout.BSHD_BSHD_BSHD
        if layout == QKVLayout.BSHD_BSHD_BSHD:
            query = query.reshape(*query.shape[:2], h, d)
            key = key.reshape(*key.shape[:2], g, d)
            value = value.reshape(*value.shape[:2], g, d)
        if self.enable_rotary_pos_emb:
            rope = partial(rotary_pos_emb, windows=self.rotary_pos_emb_windows,
                           transpose_batch_sequence=self.transpose_batch_sequence,
                           group_method=self.rotary_pos_emb_group_method)
            query, key = rope(query), rope(key)
        if decode:
            key, value, mask, bias = self._decode_step(query, key, value, mask, bias)

        lead_axes = ((SEQLEN_AXES, BATCH_AXES) if self.transpose_batch_sequence
                     else (BATCH_AXES, SEQLEN_AXES))
        if layout == QKVLayout.BS3HD:
            qkv = qkv.reshape(*lead, 3, h, d)
            args = (with_sharding_constraint_by_logical_axes(
                qkv, (*lead_axes, JOINED_AXES, HEAD_AXES, HIDDEN_AXES)), None, None)
        elif layout == QKVLayout.BSHD_BS2HD:
            query = query.reshape(*lead, h, d)
            kv = kv.reshape(*kv.shape[:2], 2, g, d)
            args = (with_sharding_constraint_by_logical_axes(
                        query, (*lead_axes, HEAD_AXES, HIDDEN_AXES)),
                    with_sharding_constraint_by_logical_axes(
                        kv, (*lead_axes, JOINED_AXES, HEAD_AXES, HIDDEN_AXES)), None)
        else:
            args = tuple(with_sharding_constraint_by_logical_axes(
                t, (*lead_axes, HEAD_AXES, HIDDEN_AXES)) for t in (query, key, value))

        x = DotProductAttention(
            head_dim=d, num_attention_heads=h, num_gqa_groups=g,
            attn_mask_type=self.attn_mask_type, attn_bias_type=self.attn_bias_type,
            attention_dropout=self.attention_dropout, dropout_rng_name=self.dropout_rng_name,
            float32_logits=self.float32_logits, qkv_layout=layout.name,
            scale_factor=1.0 / sqrt(d) if self.scale_attn_logits else 1.0,
            transpose_batch_sequence=self.transpose_batch_sequence,
            window_size=self.window_size, softmax_type=self.softmax_type,
            score_mod=self.score_mod, score_mod_bprop=self.score_mod_bprop)(
                *args, mask, bias, deterministic=deterministic,
                score_mod_tensors=score_mod_tensors,
                score_mod_bprop_tensors=score_mod_bprop_tensors)
        x = x.reshape(*x.shape[:2], x.shape[2] * x.shape[3])
        x = with_sharding_constraint_by_logical_axes(x, (*lead_axes, HIDDEN_TP_AXES))
        out = DenseGeneral(
            features=inputs_q.shape[-1], kernel_init=self.kernel_init,
            kernel_axes=(W_TP_AXES, W_FSDP_AXES), use_bias=self.use_bias,
            bias_init=self.bias_init, bias_axes=(W_NO_SHARD_AXES,),
            enable_low_rank_adaptation=lora_out,
            low_rank_adaptation_dim=self.low_rank_adaptation_dim,
            low_rank_adaptation_alpha=self.low_rank_adaptation_alpha, dtype=self.dtype,
            name="out")(x)
        out = checkpoint_name(out, "out_proj")
        if out.dtype != dtype:
            raise AssertionError(f"MultiHeadAttention: output dtype {out.dtype} != input {dtype}")
        return out, ln_out

    def _decode_step(self, query, key, value, mask, bias):
        """Autoregressive cache ("cache": cached_key / cached_value / cache_index). The first
        (initialising) call stores zeros of the full length; each later call writes one step at
        cache_index and masks the positions after it."""
        initialized = self.has_variable("cache", "cached_key")
        ck = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
        cv = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
        ci = self.variable("cache", "cache_index", lambda: jnp.array(0, dtype=jnp.int32))
        if not initialized:
            return key, value, mask, bias
        seq_dim = 0 if self.transpose_batch_sequence else 1
        length = ck.value.shape[seq_dim]
        batch = ck.value.shape[1 - seq_dim]
        want = list(ck.value.shape)
        want[seq_dim], want[-2] = 1, self.num_attention_heads
        if tuple(want) != query.shape:
            raise ValueError(f"MultiHeadAttention: decode: expected a one-step query of shape "
                             f"{tuple(want)}, got {query.shape}")
        idx = ci.value.astype(jnp.int32)
        onehot_shape = [1, 1, 1, 1]
        onehot_shape[seq_dim] = length
        onehot = jax.nn.one_hot(idx, length, dtype=key.dtype).reshape(onehot_shape)
        key = ck.value + key * onehot
        value = cv.value + value * onehot
        ck.value, cv.value, ci.value = key, value, ci.value + 1
        # True = masked: every position after the current step.
        step_mask = jnp.broadcast_to(jnp.arange(length) > idx, (batch, 1, 1, length))
        mask = step_mask if mask is None else jnp.logical_or(mask.astype(bool), step_mask)
        if bias is not None:  # the bias row of the current query position: [1, h, 1, length]
            bias = jax.lax.dynamic_slice_in_dim(bias, idx, 1, axis=-2)
        return key, value, mask, bias

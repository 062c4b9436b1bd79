"""TE-JAX's transformer Flax modules: RelativePositionBiases (T5 buckets), TransformerLayerType
and TransformerLayer (relpos bias -> [self-attention, cross-attention] -> MLP, each with dropout
and residual), re-exporting DotProductAttention / MultiHeadAttention (attention.py) as TE's
`flax/transformer.py` does. Parameter paths are TE's (`attention/qkv/kernel`, `mlp/wi_kernel`,
`relpos_bias/rel_embedding`, decoder `self_attention` / `encoder_decoder_attention`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from ..sharding import (
    BATCH_AXES,
    HIDDEN_AXES,
    HIDDEN_TP_AXES,
    SEQLEN_AXES,
    SEQLEN_TP_AXES,
    W_FSDP_AXES,
    W_JOINED_AXES,
    W_NO_SHARD_AXES,
    W_TP_AXES,
    with_sharding_constraint_by_logical_axes,
)
from .attention import DotProductAttention, MultiHeadAttention
from .lora import (  # noqa: F401  (LoRAScope, _canonicalize_lora_scope: TE-JAX's home)
    LoRAScope, _canonicalize_lora_scope, _lora_scope)
from .rope import rotary_pos_emb
from .module import LayerNorm, LayerNormMLP

__all__ = ["DotProductAttention", "LoRAScope", "MultiHeadAttention", "RelativePositionBiases",
           "TransformerLayer", "TransformerLayerType", "rotary_pos_emb"]

Array = Any
Initializer = Callable[..., Array]

# ------------------------------------------------------------------------ RelativePositionBiases
def _relpos_buckets(q_len: int, k_len: int, num_buckets: int, max_distance: int,
                    bidirectional: bool) -> np.ndarray:
    """T5's bucket of (key - query): exact below half the buckets, log-spaced up to
    max_distance, the sign taking half of the buckets when bidirectional. [q_len, k_len]."""
    rel = np.arange(k_len, dtype=np.int32)[None, :] - np.arange(q_len, dtype=np.int32)[:, None]
    n = -rel
    bucket = np.zeros_like(n)
    nb = num_buckets
    if bidirectional:
        nb //= 2
        bucket += (n < 0).astype(np.int32) * nb
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    exact = nb // 2
    large = exact + (np.log(n.astype(np.float32) / exact + np.finfo(np.float32).eps)
                     / np.log(max_distance / exact) * (nb - exact)).astype(np.int32)
    return bucket + np.where(n < exact, n, np.minimum(large, nb - 1))


class RelativePositionBiases(nn.Module):
    """T5 relative position bias: __call__(q_seqlen, k_seqlen, bidirectional=True) ->
    [1, heads, q_seqlen, k_seqlen] in `dtype`. Param `rel_embedding` (heads, buckets)."""

    num_buckets: int
    max_distance: int
    num_attention_heads: int
    embedding_init: Callable[..., Array] = nn.linear.default_embed_init
    embedding_axes: tuple[str, ...] = ("heads", "relpos_buckets")
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, q_seqlen: int, k_seqlen: int, bidirectional: bool = True):
        buckets = _relpos_buckets(q_seqlen, k_seqlen, self.num_buckets, self.max_distance,
                                  bidirectional)
        table = self.param("rel_embedding",
                           nn.with_logical_partitioning(self.embedding_init, self.embedding_axes),
                           (self.num_attention_heads, self.num_buckets), self.dtype)
        table = jnp.asarray(table, self.dtype)
        # A gather: exact (one term per entry) where TE's one-hot matmul sums zeros.
        return jnp.take(table, jnp.asarray(buckets), axis=1)[None]


class TransformerLayerType(Enum):
    ENCODER = "encoder"
    DECODER = "decoder"


class TransformerLayer(nn.Module):
    """One transformer block on [b, s, hidden] ([s, b, hidden] with transpose_batch_sequence):
    x + drop(MHA(x)) [+ drop(cross-MHA(., encoded)) for decoders] + drop(MLP(.)), pre-norm
    (or the residual taken after the norm, apply_residual_connection_post_layernorm; or one norm
    at the end, output_layernorm)."""

    hidden_size: int = 512
    mlp_hidden_size: int = 2048
    num_attention_heads: int = 8
    num_gqa_groups: int | None = None
    layernorm_type: str = "layernorm"
    layernorm_epsilon: float = 1e-6
    zero_centered_gamma: bool = False
    hidden_dropout: float = 0.1
    hidden_dropout_dims: Sequence[int] = ()
    attention_dropout: float = 0.1
    intermediate_dropout: float = 0.0
    intermediate_dropout_dims: Sequence[int] = ()
    dropout_rng_name: str = "dropout"
    mha_kernel_init: Initializer | None = None
    mlp_kernel_init: Initializer | None = None
    mlp_activations: Sequence[str] = ("gelu",)
    mlp_activation_params: dict | None = None
    use_bias: bool = False
    bias_init: Initializer = nn.initializers.zeros
    apply_residual_connection_post_layernorm: bool = False
    output_layernorm: bool = False
    float32_attention_logits: bool = False
    layer_type: TransformerLayerType = TransformerLayerType.ENCODER
    self_attn_mask_type: str = "causal"
    self_attn_bias_type: str | None = None
    enable_relative_embedding: bool = True
    relative_embedding: nn.Module | None = None
    enable_rotary_pos_emb: bool = False
    rotary_pos_emb_windows: tuple[int, int] = (1, 10000)
    rotary_pos_emb_group_method: str = "consecutive"
    low_rank_adaptation_scope: str = "none"
    low_rank_adaptation_dim: int = 32
    low_rank_adaptation_alpha: float | None = None
    dtype: Any = jnp.float32
    drop_path: float = 0.0
    fuse_qkv_params: bool = True
    transpose_batch_sequence: bool = False
    enable_sequence_parallel: bool = False
    scale_attn_logits: bool = False
    scaled_query_init: bool = True
    window_size: tuple[int, int] | None = None
    softmax_type: str = "vanilla"
    score_mod: Callable | None = None
    score_mod_bprop: Callable | None = None

    def __post_init__(self):
        if self.mha_kernel_init is None:
            self.mha_kernel_init = nn.initializers.variance_scaling(1.0, "fan_in", "normal",
                                                                    dtype=self.dtype)
        if self.mlp_kernel_init is None:
            self.mlp_kernel_init = nn.initializers.variance_scaling(
                1.0, "fan_in", "truncated_normal", dtype=self.dtype)
        if self.num_gqa_groups is None:
            self.num_gqa_groups = self.num_attention_heads
        super().__post_init__()

    def _check(self, inputs, decode):
        if not isinstance(self.layer_type, TransformerLayerType):
            raise TypeError(f"TransformerLayer: field 'layer_type': expected a "
                            f"TransformerLayerType, got {self.layer_type!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"TransformerLayer: field 'hidden_size'={self.hidden_size} must be "
                             f"a multiple of num_attention_heads={self.num_attention_heads}")
        if decode and self.layer_type is TransformerLayerType.ENCODER:
            raise ValueError("TransformerLayer: decode=True needs layer_type=DECODER")
        if inputs.ndim != 3:
            raise ValueError(f"TransformerLayer: inputs must be 3-D (batch, sequence, hidden), "
                             f"got shape {inputs.shape}")
        for d in self.hidden_dropout_dims:
            if not -inputs.ndim <= d < inputs.ndim:
                raise ValueError(f"TransformerLayer: field 'hidden_dropout_dims': {d} is out of "
                                 f"range for {inputs.ndim}-D inputs")

    @nn.compact
    def __call__(self, inputs, encoded=None, attention_mask=None, encoder_decoder_mask=None,
                 deterministic: bool = False, decode: bool = False, max_decode_length=None,
                 score_mod_tensors=None, score_mod_bprop_tensors=None):
        self._check(inputs, decode)
        dtype = inputs.dtype
        is_decoder = self.layer_type is TransformerLayerType.DECODER
        head_dim = self.hidden_size // self.num_attention_heads
        seq_dim = 0 if self.transpose_batch_sequence else 1
        batch_dim = 1 - seq_dim

        def axes(sharded_seq=None, hidden=HIDDEN_AXES):
            sp = self.enable_sequence_parallel if sharded_seq is None else sharded_seq
            a = [None, None]
            a[batch_dim], a[seq_dim] = BATCH_AXES, SEQLEN_TP_AXES if sp else SEQLEN_AXES
            return (*a, hidden)

        def constrain(x):
            return with_sharding_constraint_by_logical_axes(x, axes())

        attn_bias = None
        if self.enable_relative_embedding:
            rel_emb = self.relative_embedding
            if rel_emb is None:  # TE's default: 32 buckets up to distance 128
                rel_emb = RelativePositionBiases(
                    num_buckets=32, max_distance=128, dtype=self.dtype, name="relpos_bias",
                    num_attention_heads=self.num_attention_heads,
                    embedding_init=nn.initializers.variance_scaling(1.0, "fan_avg", "uniform",
                                                                    dtype=self.dtype))
            seqlen = inputs.shape[seq_dim]
            if not is_decoder:
                attn_bias = rel_emb(seqlen, seqlen, True)
            else:  # decoders: causal buckets, over the whole cache when decoding
                n = max_decode_length if (decode and max_decode_length) else seqlen
                attn_bias = rel_emb(n, n, False)

        mha = {"num_attention_heads": self.num_attention_heads, "dtype": self.dtype,
                   "head_dim": head_dim, "num_gqa_groups": self.num_gqa_groups,
                   "transpose_batch_sequence": self.transpose_batch_sequence,
                   "enable_sequence_parallel": self.enable_sequence_parallel,
                   "attention_dropout": self.attention_dropout,
                   "dropout_rng_name": self.dropout_rng_name,
                   "float32_logits": self.float32_attention_logits,
                   "scale_attn_logits": self.scale_attn_logits,
                   "scaled_query_init": self.scaled_query_init, "layernorm_type": self.layernorm_type,
                   "layernorm_epsilon": self.layernorm_epsilon,
                   "zero_centered_gamma": self.zero_centered_gamma,
                   "return_layernorm_output": self.apply_residual_connection_post_layernorm,
                   "enable_rotary_pos_emb": self.enable_rotary_pos_emb,
                   "rotary_pos_emb_windows": self.rotary_pos_emb_windows,
                   "rotary_pos_emb_group_method": self.rotary_pos_emb_group_method,
                   "low_rank_adaptation_scope": self.low_rank_adaptation_scope,
                   "low_rank_adaptation_dim": self.low_rank_adaptation_dim,
                   "low_rank_adaptation_alpha": self.low_rank_adaptation_alpha,
                   "fuse_qkv_params": self.fuse_qkv_params, "kernel_init": self.mha_kernel_init,
                   "use_bias": self.use_bias, "bias_init": self.bias_init,
                   "window_size": self.window_size, "softmax_type": self.softmax_type}

        def dropout(x, rate, broadcast_dims):
            return nn.Dropout(rate=rate, broadcast_dims=tuple(broadcast_dims),
                              rng_collection=self.dropout_rng_name)(x, deterministic=deterministic)

        def residual_add(y, residual, ln_out, with_drop_path):
            y = dropout(constrain(y), self.hidden_dropout, self.hidden_dropout_dims)
            if with_drop_path and self.drop_path > 0.0:
                # Drop the whole branch per example: broadcast over every dim but the batch.
                y = dropout(y, self.drop_path, [i for i in range(y.ndim) if i != batch_dim])
            if self.apply_residual_connection_post_layernorm:
                residual = ln_out
            return y + constrain(residual)

        inputs = constrain(inputs)
        x, ln_out = MultiHeadAttention(
            **mha, input_layernorm=not self.output_layernorm,
            attn_mask_type=self.self_attn_mask_type, attn_bias_type=self.self_attn_bias_type,
            score_mod=self.score_mod, score_mod_bprop=self.score_mod_bprop,
            name="self_attention" if is_decoder else "attention")(
                inputs, inputs, attention_mask, attn_bias, deterministic=deterministic,
                decode=decode, score_mod_tensors=score_mod_tensors,
                score_mod_bprop_tensors=score_mod_bprop_tensors)
        mlp_input = residual_add(x, inputs, ln_out, True)

        if is_decoder:
            # The cross attention is a "padding" attention: it needs the encoder's mask.
            for arg, val in (("encoded", encoded), ("encoder_decoder_mask", encoder_decoder_mask)):
                if val is None:
                    raise ValueError(f"TransformerLayer: argument '{arg}' is required when "
                                     "layer_type == TransformerLayerType.DECODER")
            y, ln_out = MultiHeadAttention(
                **mha, input_layernorm=True, attn_mask_type="padding", attn_bias_type="no_bias",
                name="encoder_decoder_attention")(
                    mlp_input, encoded, encoder_decoder_mask, deterministic=deterministic)
            mlp_input = residual_add(y, mlp_input, ln_out, False)

        mlp_input = constrain(mlp_input)
        z, ln_out = LayerNormMLP(
            layernorm_type=self.layernorm_type, zero_centered_gamma=self.zero_centered_gamma,
            epsilon=self.layernorm_epsilon,
            return_layernorm_output=self.apply_residual_connection_post_layernorm,
            intermediate_dim=self.mlp_hidden_size, activations=self.mlp_activations,
            activation_params=self.mlp_activation_params,
            intermediate_dropout_rng_name=self.dropout_rng_name,
            intermediate_dropout_rate=self.intermediate_dropout,
            intermediate_hidden_dropout_dims=self.intermediate_dropout_dims, dtype=self.dtype,
            scale_axes=(W_NO_SHARD_AXES,), ln_bias_axes=(W_NO_SHARD_AXES,),
            kernel_init=self.mlp_kernel_init, kernel_axes_1=(W_FSDP_AXES, W_JOINED_AXES, W_TP_AXES),
            kernel_axes_2=(W_TP_AXES, W_FSDP_AXES), use_bias=self.use_bias,
            bias_init=self.bias_init, bias_axes_1=(W_JOINED_AXES, W_TP_AXES),
            bias_axes_2=(W_NO_SHARD_AXES,), enable_low_rank_adaptation=_lora_scope(
                self.low_rank_adaptation_scope)[2],
            low_rank_adaptation_dim=self.low_rank_adaptation_dim,
            low_rank_adaptation_alpha=self.low_rank_adaptation_alpha,
            layernorm_input_axes=axes(), dot_1_input_axes=axes(False),
            dot_2_input_axes=axes(False, HIDDEN_TP_AXES),
            transpose_batch_sequence=self.transpose_batch_sequence, name="mlp")(
                mlp_input, deterministic=deterministic)
        z = residual_add(z, mlp_input, ln_out, True)

        if self.output_layernorm:
            z = LayerNorm(layernorm_type=self.layernorm_type,
                          zero_centered_gamma=self.zero_centered_gamma,
                          epsilon=self.layernorm_epsilon, scale_axes=(W_NO_SHARD_AXES,),
                          bias_axes=(W_NO_SHARD_AXES,), dtype=self.dtype,
                          name="output_layernorm")(constrain(z))
        if z.dtype != dtype:
            raise AssertionError(f"TransformerLayer: output dtype {z.dtype} != input {dtype}")
        return z

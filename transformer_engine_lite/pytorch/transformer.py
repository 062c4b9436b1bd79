"""te.TransformerLayer: one encoder or decoder block (self-attention [+ cross-attention] + MLP),
TE's constructor, forward and submodule/parameter names, built on MultiheadAttention and
LayerNormMLP (so its GEMMs run in FP8 under fp8_autocast).

Pre-norm (default): x -> x + drop(attn(norm(x))) -> x + drop(mlp(norm(x))). output_layernorm=True
moves the attention norm after the block (post-norm: the self-attention takes x as is and a final
norm is applied); apply_residual_connection_post_layernorm=True makes the residuals start from the
norm outputs instead of the inputs (TE's options). `drop` is bias + dropout(hidden_dropout) in
training mode, followed by stochastic depth (drop_path_rate) per sample.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .attention.multi_head_attention import MultiheadAttention
from .module.layernorm import LayerNorm, RMSNorm
from .module.layernorm_mlp import LayerNormMLP

__all__ = ["TransformerLayer"]


class TransformerLayer(torch.nn.Module):
    """A transformer block (TE's `transformer_engine.pytorch.TransformerLayer`).

    hidden_size, ffn_hidden_size, num_attention_heads, num_gqa_groups, kv_channels,
    layernorm_epsilon, hidden_dropout, attention_dropout, init_method /
    output_layer_init_method, layer_number, self_attn_mask_type / window_size (self-attention
    defaults), enc_dec_attn_mask_type / enc_dec_window_size (decoder cross-attention defaults),
    layer_type ('encoder' or 'decoder': adds cross-attention over forward's encoder_output),
    apply_residual_connection_post_layernorm, output_layernorm, drop_path_rate, fuse_qkv_params,
    qkv_weight_interleaved, rotary_pos_interleaved, zero_centered_gamma, bias, activation (one of
    LayerNormMLP's), normalization ('LayerNorm' / 'RMSNorm'), params_dtype, device,
    attn_input_format ('sbhd', 'bshd', 'thd': the layout of hidden_states), and the parallel
    arguments of the GEMM modules (set_parallel_mode, tp_group, tp_size, sequence_parallel,
    get_rng_state_tracker, fuse_wgrad_accumulation). Submodules: self_attention,
    inter_attention (decoder), layernorm_mlp, layernorm (output_layernorm).
    parallel_attention_mlp=True: attention and MLP both read the block input and share one
    residual branch (encoder, pre-norm only, as TE). drop_path_rate in [0, 1] (1: the branch is
    always dropped in training). activation_params: passed to LayerNormMLP (clamped_swiglu).
    qk_norm_type / qk_norm_eps / qk_norm_before_rope: QK normalization in the self- and the
    cross-attention (see MultiheadAttention).
    ub_tp_comm_overlap: TE's Userbuffers switch; with it the ub_* flags go to the attention and
    MLP submodules (initialize_ub must have run, see module/userbuffers.py). softmax_type goes to the attention modules (attention sinks). seq_length /
    micro_batch_size: passed to LayerNormMLP and the attentions (TE's JIT warm-up sizes, used by
    qk_norm_type 'L2Normalization').
    """

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        num_attention_heads: int,
        num_gqa_groups: int | None = None,
        layernorm_epsilon: float = 1e-5,
        hidden_dropout: float = 0.1,
        attention_dropout: float = 0.1,
        init_method: Callable[[torch.Tensor], Any] | None = None,
        output_layer_init_method: Callable[[torch.Tensor], Any] | None = None,
        layer_number: int | None = None,
        kv_channels: int | None = None,
        self_attn_mask_type: str = "causal",
        window_size: tuple[int, int] | None = None,
        enc_dec_attn_mask_type: str = "no_mask",
        enc_dec_window_size: tuple[int, int] | None = None,
        tp_group: Any = None,
        tp_size: int = 1,
        params_dtype: torch.dtype | None = None,
        get_rng_state_tracker: Callable[[], Any] | None = None,
        fuse_wgrad_accumulation: bool = False,
        seq_length: int | None = None,
        micro_batch_size: int | None = None,
        sequence_parallel: bool = False,
        apply_residual_connection_post_layernorm: bool = False,
        output_layernorm: bool = False,
        parallel_attention_mlp: bool = False,
        layer_type: str = "encoder",
        drop_path_rate: float = 0.0,
        set_parallel_mode: bool = False,
        fuse_qkv_params: bool = False,
        rotary_pos_interleaved: bool = False,
        zero_centered_gamma: bool = False,
        qkv_weight_interleaved: bool = True,
        ub_tp_comm_overlap: bool = False,
        ub_overlap_ag: bool = True,
        ub_overlap_rs: bool = True,
        ub_overlap_rs_dgrad: bool = False,
        ub_bulk_dgrad: bool = True,
        ub_bulk_wgrad: bool = True,
        bias: bool = True,
        activation: str = "gelu",
        activation_params: dict | None = None,
        normalization: str = "LayerNorm",
        device: Any = None,
        attn_input_format: str = "sbhd",
        name: str | None = None,
        qk_norm_type: str | None = None,
        qk_norm_eps: float = 1e-6,
        qk_norm_before_rope: bool = False,
        softmax_type: str = "vanilla",
    ) -> None:
        super().__init__()
        owner = "TransformerLayer"
        # TE's rule: the ub_* flags take effect only with ub_tp_comm_overlap (the submodules then
        # validate them against initialize_ub's communicators, module/userbuffers.py)
        ub = {
            "ub_overlap_ag": bool(ub_tp_comm_overlap and ub_overlap_ag),
            "ub_overlap_rs": bool(ub_tp_comm_overlap and ub_overlap_rs),
            "ub_overlap_rs_dgrad": bool(ub_tp_comm_overlap and ub_overlap_rs_dgrad),
            "ub_bulk_dgrad": bool(ub_tp_comm_overlap and ub_bulk_dgrad),
            "ub_bulk_wgrad": bool(ub_tp_comm_overlap and ub_bulk_wgrad),
        }
        if layer_type not in ("encoder", "decoder"):
            raise ValueError(
                f"{owner}: layer_type: expected 'encoder' or 'decoder', got {layer_type!r}"
            )
        if not 0.0 <= hidden_dropout < 1.0:
            raise ValueError(
                f"{owner}: hidden_dropout: expected a probability in [0, 1), got {hidden_dropout!r}"
            )
        if not 0.0 <= drop_path_rate <= 1.0:
            raise ValueError(
                f"{owner}: drop_path_rate: expected a probability in [0, 1], got {drop_path_rate!r}"
            )
        if parallel_attention_mlp:
            # TE's restrictions: the MLP reads the block input, so there is one residual branch.
            for arg, bad in (("layer_type='decoder'", layer_type != "encoder"),
                             ("apply_residual_connection_post_layernorm",
                              apply_residual_connection_post_layernorm),
                             ("output_layernorm", output_layernorm)):
                if bad:
                    raise ValueError(
                        f"{owner}: parallel_attention_mlp=True cannot be combined with {arg}"
                    )
        self.parallel_attention_mlp = bool(parallel_attention_mlp)
        if drop_path_rate > 0 and attn_input_format == "thd":
            raise ValueError(
                f"{owner}: drop_path_rate > 0 needs a batch dim (attn_input_format 'sbhd' or "
                "'bshd'), got 'thd'"
            )
        self.layer_type = layer_type
        self.hidden_dropout = hidden_dropout
        self.drop_path_rate = drop_path_rate
        self.output_layernorm = output_layernorm
        self.apply_residual_connection_post_layernorm = apply_residual_connection_post_layernorm
        self.attn_input_format = attn_input_format
        self.self_attn_mask_type = self_attn_mask_type
        self.enc_dec_attn_mask_type = enc_dec_attn_mask_type
        self.layer_number = layer_number
        post_ln_residual = apply_residual_connection_post_layernorm
        common = {
            "layernorm_epsilon": layernorm_epsilon,
            "init_method": init_method,
            "output_layer_init_method": output_layer_init_method,
            "layer_number": layer_number,
            "tp_group": tp_group,
            "tp_size": tp_size,
            "num_gqa_groups": num_gqa_groups,
            "fuse_wgrad_accumulation": fuse_wgrad_accumulation,
            "get_rng_state_tracker": get_rng_state_tracker,
            "sequence_parallel": sequence_parallel,
            "params_dtype": params_dtype,
            "set_parallel_mode": set_parallel_mode,
            "fuse_qkv_params": fuse_qkv_params,
            "zero_centered_gamma": zero_centered_gamma,
            "qkv_weight_interleaved": qkv_weight_interleaved,
            "bias": bias,
            "normalization": normalization,
            "device": device,
            "qkv_format": attn_input_format,
            "kv_channels": kv_channels,
            "attention_dropout": attention_dropout,
            "return_bias": True,
            "rotary_pos_interleaved": rotary_pos_interleaved,
            "softmax_type": softmax_type,
            "qk_norm_type": qk_norm_type,
            "qk_norm_eps": qk_norm_eps,
            "qk_norm_before_rope": qk_norm_before_rope,
            "seq_length": seq_length,
            "micro_batch_size": micro_batch_size,
            **ub,
        }
        self.self_attention = MultiheadAttention(
            hidden_size,
            num_attention_heads,
            attn_mask_type=self_attn_mask_type,
            window_size=window_size,
            input_layernorm=not output_layernorm,
            return_layernorm_output=post_ln_residual and not output_layernorm,
            attention_type="self",
            **common,
        )
        if layer_type == "decoder":
            self.inter_attention = MultiheadAttention(
                hidden_size,
                num_attention_heads,
                attn_mask_type=enc_dec_attn_mask_type,
                window_size=enc_dec_window_size,
                input_layernorm=True,
                return_layernorm_output=post_ln_residual,
                attention_type="cross",
                **common,
            )
        self.layernorm_mlp = LayerNormMLP(
            hidden_size,
            ffn_hidden_size,
            eps=layernorm_epsilon,
            sequence_parallel=sequence_parallel,
            return_bias=True,
            get_rng_state_tracker=get_rng_state_tracker,
            tp_group=tp_group,
            tp_size=tp_size,
            init_method=init_method,
            bias=bias,
            normalization=normalization,
            activation=activation,
            activation_params=activation_params,
            output_layer_init_method=output_layer_init_method,
            fuse_wgrad_accumulation=fuse_wgrad_accumulation,
            params_dtype=params_dtype,
            return_layernorm_output=post_ln_residual,
            seq_length=seq_length,
            micro_batch_size=micro_batch_size,
            set_parallel_mode=set_parallel_mode,
            zero_centered_gamma=zero_centered_gamma,
            device=device,
            **ub,
        )
        if output_layernorm:
            norm_cls = LayerNorm if normalization == "LayerNorm" else RMSNorm
            self.layernorm = norm_cls(
                hidden_size,
                eps=layernorm_epsilon,
                sequence_parallel=sequence_parallel,
                params_dtype=params_dtype,
                zero_centered_gamma=zero_centered_gamma,
                device=device,
            )

    def set_context_parallel_group(
        self, cp_group: Any, cp_global_ranks: list[int] | None, cp_stream: Any,
        cp_comm_type: str = "p2p",
    ) -> None:  # fmt: skip
        """TE's CP setup: passed to every submodule that has it (attention modules)."""
        for child in list(self.modules())[1:]:
            if hasattr(child, "set_context_parallel_group"):
                child.set_context_parallel_group(cp_group, cp_global_ranks, cp_stream, cp_comm_type)

    def _bias_dropout_add(
        self, x: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor
    ) -> torch.Tensor:
        """residual + drop_path(dropout(x + bias)) (TE's bias-dropout-add)."""
        if bias is not None:
            x = x + bias
        x = torch.nn.functional.dropout(x, p=self.hidden_dropout, training=self.training)
        if self.drop_path_rate >= 1.0 and self.training:
            x = x * 0.0  # every sample's branch dropped (the limit of the rule below, no 0/0)
        elif self.drop_path_rate > 0 and self.training:
            # Stochastic depth: the whole branch of a sample is dropped, the kept ones rescaled.
            bdim = 1 if self.attn_input_format == "sbhd" else 0
            shape = [1] * x.dim()
            shape[bdim] = x.shape[bdim]
            keep = torch.empty(shape, dtype=x.dtype, device=x.device).bernoulli_(
                1.0 - self.drop_path_rate
            )
            x = x * keep / (1.0 - self.drop_path_rate)
        return residual + x

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: Any = None,
        self_attn_mask_type: str | None = None,
        window_size: tuple[int, int] | None = None,
        encoder_output: torch.Tensor | None = None,
        enc_dec_attn_mask: Any = None,
        enc_dec_attn_mask_type: str | None = None,
        enc_dec_window_size: tuple[int, int] | None = None,
        is_first_microbatch: bool | None = None,
        checkpoint_core_attention: bool = False,
        inference_params: Any = None,
        rotary_pos_emb: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
        core_attention_bias_type: str = "no_bias",
        core_attention_bias: torch.Tensor | None = None,
        alibi_slopes: torch.Tensor | None = None,
        cu_seqlens_q: torch.Tensor | None = None,
        cu_seqlens_kv: torch.Tensor | None = None,
        cu_seqlens_q_padded: torch.Tensor | None = None,
        cu_seqlens_kv_padded: torch.Tensor | None = None,
        max_seqlen_q: int | None = None,
        max_seqlen_kv: int | None = None,
        pad_between_seqs: bool | None = None,
    ) -> torch.Tensor:
        """hidden_states [s, b, hidden] (sbhd), [b, s, hidden] (bshd) or [t, hidden] (thd) -> the
        same shape. attention_mask / cu_seqlens / bias / alibi / rotary_pos_emb go to the
        self-attention (see MultiheadAttention); enc_dec_attn_mask to the decoder's
        cross-attention over encoder_output."""
        owner = "TransformerLayer"
        if inference_params is not None and self.layer_type == "decoder":
            raise NotImplementedError(
                f"{owner}: inference_params with layer_type 'decoder' (KV caching of the "
                "cross-attention); use layer_type 'encoder' (self-attention is cached)"
            )
        dev = hidden_states.device.type if isinstance(hidden_states, torch.Tensor) else "cpu"
        if torch.is_autocast_enabled(dev):
            # As TE: under torch.autocast the block runs (residuals included) in the autocast dtype.
            amp = torch.get_autocast_dtype(dev)
            hidden_states = hidden_states.to(amp)
            if encoder_output is not None:
                encoder_output = encoder_output.to(amp)
        if self.layer_type == "encoder" and encoder_output is not None:
            raise ValueError(f"{owner}: encoder_output is only used by layer_type 'decoder'")
        seq = {
            "cu_seqlens_q": cu_seqlens_q,
            "cu_seqlens_kv": cu_seqlens_kv,
            "cu_seqlens_q_padded": cu_seqlens_q_padded,
            "cu_seqlens_kv_padded": cu_seqlens_kv_padded,
            "max_seqlen_q": max_seqlen_q,
            "max_seqlen_kv": max_seqlen_kv,
            "pad_between_seqs": pad_between_seqs,
        }
        # As TE: the self-attention reads q's sequences for both sides (cu_seqlens_q,
        # max_seqlen_q); the cross-attention gets q's and kv's (the encoder's), in every format.
        self_seq = dict(seq, cu_seqlens_kv=cu_seqlens_q, cu_seqlens_kv_padded=cu_seqlens_q_padded,
                        max_seqlen_kv=max_seqlen_q)
        outs = self.self_attention(
            hidden_states,
            attention_mask,
            attn_mask_type=self_attn_mask_type,
            window_size=window_size,
            is_first_microbatch=is_first_microbatch,
            checkpoint_core_attention=checkpoint_core_attention,
            rotary_pos_emb=rotary_pos_emb,
            core_attention_bias_type=core_attention_bias_type,
            core_attention_bias=core_attention_bias,
            alibi_slopes=alibi_slopes,
            inference_params=inference_params,
            **self_seq,
        )
        if self.parallel_attention_mlp:
            # out = x + drop(attn(norm(x)) + mlp(norm(x))): both branches read the block input.
            attn_out, attn_bias = outs
            mlp_out, mlp_bias = self.layernorm_mlp(hidden_states, is_first_microbatch)
            branch = attn_out + mlp_out
            for b in (attn_bias, mlp_bias):
                if b is not None:
                    branch = branch + b
            return self._bias_dropout_add(branch, None, hidden_states)
        if self.apply_residual_connection_post_layernorm and not self.output_layernorm:
            attn_out, attn_bias, residual = outs
        else:
            (attn_out, attn_bias), residual = outs, hidden_states
        x = self._bias_dropout_add(attn_out, attn_bias, residual)
        if self.layer_type == "decoder":
            if encoder_output is None:
                raise ValueError(f"{owner}: layer_type 'decoder' needs encoder_output")
            # q: the decoder's sequences, kv: the encoder's (cu_seqlens win over
            # enc_dec_attn_mask for bshd / sbhd padding, as in DotProductAttention)
            outs = self.inter_attention(
                x,
                enc_dec_attn_mask,
                encoder_output=encoder_output,
                attn_mask_type=enc_dec_attn_mask_type,
                window_size=enc_dec_window_size,
                is_first_microbatch=is_first_microbatch,
                checkpoint_core_attention=checkpoint_core_attention,
                **seq,
            )
            if self.apply_residual_connection_post_layernorm:
                attn_out, attn_bias, residual = outs
            else:
                (attn_out, attn_bias), residual = outs, x
            x = self._bias_dropout_add(attn_out, attn_bias, residual)
        outs = self.layernorm_mlp(x, is_first_microbatch)
        if self.apply_residual_connection_post_layernorm:
            mlp_out, mlp_bias, residual = outs
        else:
            (mlp_out, mlp_bias), residual = outs, x
        out = self._bias_dropout_add(mlp_out, mlp_bias, residual)
        return self.layernorm(out) if self.output_layernorm else out

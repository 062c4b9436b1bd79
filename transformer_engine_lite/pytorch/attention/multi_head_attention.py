"""te.MultiheadAttention: QKV projection (optionally with the input norm fused in front:
LayerNormLinear), rotary embedding, DotProductAttention and the output projection (Linear), with
TE's constructor, parameter names and outputs. The projections are the existing GEMM modules, so
they run in FP8 under fp8_autocast. The attention itself runs in FP8 under a recipe with fp8_dpa
or fp8_mha (dot_product_attention/fp8_attention.py); then, as TE's, its output O enters the output
projection as FP8 bytes (a Float8Tensor, no second quantization). TE's other FP8 hand-offs are
emulated by the attention's own points with the same delayed-scaling amaxes: fp8_mha's FP8 QKV
(the QKV GEMM's output quantized once, here by the attention's QKV point from the bf16 output)
and the projection's FP8 dgrad (here the attention's dO point); the gradient dQKV leaves the
attention as FP8 values that the QKV projection's backward quantizes with its own scale (TE hands
it the bytes).

QKV weight layouts (TE's): fuse_qkv_params=False keeps separate query/key/value parameters (the
GEMM output is [q | k | v]); fuse_qkv_params=True has one `weight` whose output rows are, with
qkv_weight_interleaved=True, grouped per KV head as [q_0 .. q_{h/g-1}, k, v] (g groups), else
[q | k | v]. Either way q, k and v are views of the GEMM output (e.g. the bsh3d / bs3hd layouts
without GQA), which DotProductAttention passes to the flash kernel without a copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..distributed import get_distributed_world_size
from ..module.layernorm import LayerNorm, RMSNorm
from ..module.layernorm_linear import LayerNormLinear
from ..module.linear import Linear
from ..ops.basic.l2normalization import L2Normalization
from .dot_product_attention import DotProductAttention
from .dot_product_attention.fp8_attention import fp8_attention_enabled
from .inference import check_inference_params
from .rope import apply_rotary_pos_emb

__all__ = ["MultiheadAttention"]


_QK_NORMS = ("L2Normalization", "RMSNorm", "LayerNorm")


def _qk_norm_modules(
    qk_norm_type: str | None,
    eps: float,
    head_dim: int,
    device: Any,
    params_dtype: torch.dtype | None,
    seq_length: int | None,
    micro_batch_size: int | None,
) -> tuple[torch.nn.Module | None, torch.nn.Module | None]:
    """(q_norm, k_norm) for qk_norm_type, each normalizing over the head dim (TE's choices:
    L2Normalization has no parameters, so q and k share one instance; RMSNorm / LayerNorm get
    one each, so the state dict has q_norm.weight, k_norm.weight (and .bias for LayerNorm))."""
    if qk_norm_type is None:
        return None, None
    if qk_norm_type not in _QK_NORMS:
        raise ValueError(
            f"MultiheadAttention: qk_norm_type: expected None or one of {list(_QK_NORMS)}, "
            f"got {qk_norm_type!r}"
        )
    if qk_norm_type == "L2Normalization":
        l2 = L2Normalization(eps=eps, seq_length=seq_length, micro_batch_size=micro_batch_size)
        return l2, l2
    cls = RMSNorm if qk_norm_type == "RMSNorm" else LayerNorm
    return tuple(  # type: ignore[return-value]
        cls(head_dim, eps=eps, device=device, params_dtype=params_dtype) for _ in range(2)
    )


class MultiheadAttention(torch.nn.Module):
    """Multi-head attention (TE's `transformer_engine.pytorch.MultiheadAttention`).

    hidden_size, num_attention_heads, kv_channels (head dim; default hidden_size // heads),
    num_gqa_groups (KV heads), attention_dropout, layernorm_epsilon, init_method /
    output_layer_init_method (QKV / output projection), layer_number, attn_mask_type,
    window_size, attention_type ('self': q, k, v from hidden_states; 'cross': q from
    hidden_states, k and v from forward's encoder_output), input_layernorm (norm fused into the
    query/QKV GEMM; normalization 'LayerNorm' or 'RMSNorm', zero_centered_gamma),
    return_layernorm_output (also return that norm's output), return_bias (return the output
    projection's bias instead of adding it), bias, params_dtype, device, qkv_format ('sbhd',
    'bshd' or 'thd': the layout of hidden_states and of the attention), fuse_qkv_params,
    qkv_weight_interleaved (see the module docstring), rotary_pos_interleaved (the rotary
    embedding's pair layout). Tensor parallelism: set_parallel_mode=True with tp_group / tp_size
    (QKV column-parallel, output row-parallel, heads split over ranks), sequence_parallel,
    get_rng_state_tracker, fuse_wgrad_accumulation as in the GEMM modules.
    QK normalization (TE's): qk_norm_type None, 'L2Normalization' (one parameter-free
    ops.L2Normalization shared by q and k), 'RMSNorm' or 'LayerNorm' (separate te.RMSNorm /
    te.LayerNorm over the head dim, submodules q_norm and k_norm), qk_norm_eps, applied to each
    head of q and k after the rotary embedding, or before it with qk_norm_before_rope=True.
    softmax_type: passed to DotProductAttention (attention sinks; its softmax_offset is
    self.core_attention.softmax_offset). ub_*: TE's Userbuffers flags, passed to the QKV
    LayerNormLinear (ub_name "qkv") and the proj Linear ("proj"); see module/userbuffers.py. seq_length / micro_batch_size: TE's JIT warm-up sizes, passed to L2Normalization
    (userbuffer shape hints otherwise, unused as in TE without userbuffers).
    """

    def __init__(
        self,
        hidden_size: int,
        num_attention_heads: int,
        kv_channels: int | None = None,
        attention_dropout: float = 0.1,
        layernorm_epsilon: float = 1e-5,
        init_method: Callable[[torch.Tensor], Any] | None = None,
        output_layer_init_method: Callable[[torch.Tensor], Any] | None = None,
        layer_number: int | None = None,
        attn_mask_type: str = "causal",
        window_size: tuple[int, int] | None = None,
        tp_group: Any = None,
        tp_size: int = 1,
        num_gqa_groups: int | None = None,
        fuse_wgrad_accumulation: bool = False,
        get_rng_state_tracker: Callable[[], Any] | None = None,
        sequence_parallel: bool = False,
        params_dtype: torch.dtype | None = None,
        return_bias: bool = False,
        return_layernorm_output: bool = False,
        input_layernorm: bool = False,
        attention_type: str = "self",
        set_parallel_mode: bool = False,
        fuse_qkv_params: bool = False,
        zero_centered_gamma: bool = False,
        qkv_weight_interleaved: bool = True,
        ub_overlap_ag: bool = False,
        ub_overlap_rs: bool = False,
        ub_overlap_rs_dgrad: bool = False,
        ub_bulk_dgrad: bool = False,
        ub_bulk_wgrad: bool = False,
        bias: bool = True,
        normalization: str = "LayerNorm",
        device: Any = None,
        qkv_format: str = "sbhd",
        name: str | None = None,
        qk_norm_type: str | None = None,
        qk_norm_eps: float = 1e-6,
        qk_norm_before_rope: bool = False,
        rotary_pos_interleaved: bool = False,
        seq_length: int | None = None,
        micro_batch_size: int | None = None,
        softmax_type: str = "vanilla",
    ) -> None:
        super().__init__()
        owner = "MultiheadAttention"
        for arg, v in (("hidden_size", hidden_size), ("num_attention_heads", num_attention_heads)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{owner}: {arg}: expected an int >= 1, got {v!r}")
        if attention_type not in ("self", "cross"):
            raise ValueError(
                f"{owner}: attention_type: expected 'self' or 'cross', got {attention_type!r}"
            )
        if kv_channels is None:
            if hidden_size % num_attention_heads:
                raise ValueError(
                    f"{owner}: hidden_size ({hidden_size}) must be divisible by "
                    f"num_attention_heads ({num_attention_heads}), or give kv_channels"
                )
            kv_channels = hidden_size // num_attention_heads
        gqa = num_attention_heads if num_gqa_groups is None else num_gqa_groups
        tp = get_distributed_world_size(tp_group) if tp_group is not None else tp_size
        if tp > 1 and not set_parallel_mode:
            raise ValueError(
                f"{owner}: tp_size {tp} > 1 needs set_parallel_mode=True (QKV column-parallel, "
                "output row-parallel: each rank computes its share of heads)"
            )
        if tp > 1 and fuse_qkv_params and not qkv_weight_interleaved:
            raise NotImplementedError(
                f"{owner}: fuse_qkv_params=True with qkv_weight_interleaved=False under tensor "
                "parallelism (a column split of one [q | k | v] weight mixes q, k and v rows); use "
                "qkv_weight_interleaved=True or fuse_qkv_params=False"
            )
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.num_gqa_groups = gqa
        self.hidden_size_per_attention_head = kv_channels
        self.attention_type = attention_type
        self.input_layernorm = input_layernorm
        self.return_bias = return_bias
        self.return_layernorm_output = return_layernorm_output
        self.qkv_format = qkv_format
        self.attn_mask_type = attn_mask_type
        self.window_size = window_size
        self.layer_number = layer_number
        self.fuse_qkv_params = fuse_qkv_params
        # TE: interleaving describes one fused weight; separate parameters are [q | k | v].
        self.qkv_weight_interleaved = qkv_weight_interleaved and fuse_qkv_params
        self.rotary_pos_interleaved = rotary_pos_interleaved
        self.tp_size = tp
        self.cp_size, self.cp_rank = 1, 0  # set_context_parallel_group; RoPE needs them
        self.qk_norm_before_rope = qk_norm_before_rope
        self.q_norm, self.k_norm = _qk_norm_modules(
            qk_norm_type, qk_norm_eps, kv_channels, device, params_dtype, seq_length,
            micro_batch_size,
        )
        self.core_attention = DotProductAttention(
            num_attention_heads,
            kv_channels,
            num_gqa_groups=gqa,
            attention_dropout=attention_dropout,
            qkv_format=qkv_format,
            attn_mask_type=attn_mask_type,
            window_size=window_size,
            sequence_parallel=sequence_parallel,
            tp_size=tp_size,
            get_rng_state_tracker=get_rng_state_tracker,
            tp_group=tp_group,
            layer_number=layer_number,
            attention_type=attention_type,
            softmax_type=softmax_type,
        )
        self.num_attention_heads_per_partition = num_attention_heads // tp
        self.num_gqa_groups_per_partition = gqa // tp
        hq, hkv = kv_channels * num_attention_heads, kv_channels * gqa
        common = {
            "init_method": init_method,
            "bias": bias,
            "params_dtype": params_dtype,
            "device": device,
            "tp_group": tp_group,
            "tp_size": tp_size,
            "sequence_parallel": sequence_parallel,
            "fuse_wgrad_accumulation": fuse_wgrad_accumulation,
            "get_rng_state_tracker": get_rng_state_tracker,
            "parallel_mode": "column" if set_parallel_mode else None,
        }
        norm = {
            "eps": layernorm_epsilon,
            "normalization": normalization,
            "zero_centered_gamma": zero_centered_gamma,
            "return_layernorm_output": return_layernorm_output,
        }
        if not input_layernorm and return_layernorm_output:
            raise ValueError(f"{owner}: return_layernorm_output=True needs input_layernorm=True")
        # TE's Userbuffers wiring: the norm + QKV GEMM ("qkv") all-gathers its input, the output
        # projection ("proj") reduce-scatters its output (module/userbuffers.py)
        ub_qkv = {"ub_overlap_ag": ub_overlap_ag, "ub_overlap_rs_dgrad": ub_overlap_rs_dgrad,
                  "ub_bulk_dgrad": ub_bulk_dgrad, "ub_bulk_wgrad": ub_bulk_wgrad, "ub_name": "qkv"}
        if attention_type == "self":
            split = None if fuse_qkv_params else {"query": hq, "key": hkv, "value": hkv}
            if input_layernorm:
                self.layernorm_qkv = LayerNormLinear(
                    hidden_size, hq + 2 * hkv, parameters_split=split, **common, **norm, **ub_qkv
                )
            else:
                self.qkv = Linear(hidden_size, hq + 2 * hkv, parameters_split=split, **common)
        else:
            q_split = None if fuse_qkv_params else ("query",)
            if input_layernorm:
                self.layernorm_query = LayerNormLinear(
                    hidden_size, hq, parameters_split=q_split, **common, **norm, **ub_qkv
                )
            else:
                self.query_layer = Linear(hidden_size, hq, parameters_split=q_split, **common)
            kv_split = None if fuse_qkv_params else ("key", "value")
            self.key_value = Linear(hidden_size, 2 * hkv, parameters_split=kv_split, **common)
        common.update(
            init_method=output_layer_init_method or init_method,
            parallel_mode="row" if set_parallel_mode else None,
        )
        self.proj = Linear(hq, hidden_size, return_bias=return_bias, ub_overlap_rs=ub_overlap_rs,
                           ub_overlap_ag=ub_overlap_ag, ub_name="proj", **common)

    def set_context_parallel_group(
        self, cp_group: Any, cp_global_ranks: list[int] | None, cp_stream: Any,
        cp_comm_type: str = "p2p",
    ) -> None:  # fmt: skip
        """TE's CP setup (DotProductAttention.set_context_parallel_group), passed to every child
        that has it; the rank's CP size / rank (TE's, hierarchical for 'a2a+p2p') shift the
        rotary embedding's positions to this rank's sequence chunks."""
        from .dot_product_attention.cp_comm import group_rank, group_size  # noqa: PLC0415

        self.cp_size, self.cp_rank = 1, 0
        if isinstance(cp_group, (list, tuple)) and len(cp_group) == 2:
            a = group_size(cp_group[0])
            self.cp_size = a * group_size(cp_group[1])
            self.cp_rank = a * group_rank(cp_group[1]) + group_rank(cp_group[0])
        elif cp_group is not None:
            self.cp_size, self.cp_rank = group_size(cp_group), group_rank(cp_group)
        for child in list(self.modules())[1:]:
            if hasattr(child, "set_context_parallel_group"):
                child.set_context_parallel_group(cp_group, cp_global_ranks, cp_stream, cp_comm_type)

    def _heads(self, x: torch.Tensor, groups: list[int]) -> list[torch.Tensor]:
        """Splits a projection output [..., n * d] into views [..., heads, d], one per entry of
        `groups` (heads per KV group of each part), following the QKV weight layout."""
        d = self.hidden_size_per_attention_head
        g = self.num_gqa_groups_per_partition
        lead = x.shape[:-1]
        if self.qkv_weight_interleaved:  # [..., g, sum(groups), d]: per KV group q.., k, v
            parts = x.view(*lead, g, sum(groups), d).split(groups, dim=-2)
        else:  # [..., sum(groups), g, d]: all q heads, then all k heads, then all v heads
            parts = x.view(*lead, sum(groups), g, d).split(groups, dim=-3)
        return [p.reshape(*lead, n * g, d) for p, n in zip(parts, groups)]

    def _qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q_norm(q), k_norm(k). The L2Normalization op is applied by its fuser_forward: one op
        needs no op fuser, and skipping it keeps this module traceable by
        torch.compile(fullgraph=True) (the fuser's autograd Function is not)."""
        if isinstance(self.q_norm, L2Normalization):
            return self.q_norm.fuser_forward(q, ())[0], self.k_norm.fuser_forward(k, ())[0]
        return self.q_norm(q), self.k_norm(k)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: Any = None,
        encoder_output: torch.Tensor | None = None,
        attn_mask_type: str | None = None,
        window_size: tuple[int, int] | None = None,
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
    ) -> Any:
        """hidden_states [s, b, hidden] (sbhd), [b, s, hidden] (bshd) or [t, hidden] (thd) ->
        (out[, proj bias if return_bias][, norm output if return_layernorm_output]).
        rotary_pos_emb: fp32 angles [s, 1, 1, d2] for q and k, or a (q, k) pair."""
        owner = "MultiheadAttention"
        start_positions = None
        if inference_params is not None:
            check_inference_params(owner, inference_params)
            if self.layer_number is None:
                raise ValueError(
                    f"{owner}: inference_params needs the module's layer_number (its KV cache's "
                    "key); construct it with layer_number=..."
                )
            if self.attention_type != "self":
                raise NotImplementedError(
                    f"{owner}: inference_params with attention_type 'cross' (a KV cache of the "
                    "encoder output)"
                )
            # TE allocates each layer's cache on first use.
            if self.layer_number not in inference_params.cache_manager.cache:
                inference_params.allocate_memory(self.layer_number)
            # RoPE continues each sequence at its cached length (TE: get_seqlens_pre_step()).
            b = (
                inference_params.batch_size
                if self.qkv_format == "thd"
                else hidden_states.shape[0 if self.qkv_format == "bshd" else 1]
            )
            start_positions = inference_params.get_seqlens_pre_step()[:b]
            if self.qkv_format == "thd" and cu_seqlens_q is None:
                cu_seqlens_q = inference_params.cu_seqlens_q[: b + 1]
                cu_seqlens_kv = cu_seqlens_q  # thd RoPE of k reads the new tokens' offsets too
        hpg = self.num_attention_heads_per_partition // self.num_gqa_groups_per_partition
        ln_out = None
        if self.attention_type == "self":
            if encoder_output is not None:
                raise ValueError(f"{owner}: encoder_output is only used by cross attention")
            if self.input_layernorm:
                mixed = self.layernorm_qkv(hidden_states, is_first_microbatch)
                if self.return_layernorm_output:
                    mixed, ln_out = mixed
            else:
                mixed = self.qkv(hidden_states, is_first_microbatch)
            q, k, v = self._heads(mixed, [hpg, 1, 1])
        else:
            if encoder_output is None:
                raise ValueError(f"{owner}: cross attention needs encoder_output")
            if self.input_layernorm:
                mixed = self.layernorm_query(hidden_states, is_first_microbatch)
                if self.return_layernorm_output:
                    mixed, ln_out = mixed
            else:
                mixed = self.query_layer(hidden_states, is_first_microbatch)
            d = self.hidden_size_per_attention_head
            q = mixed.view(*mixed.shape[:-1], self.num_attention_heads_per_partition, d)
            k, v = self._heads(self.key_value(encoder_output, is_first_microbatch), [1, 1])
        if self.q_norm is not None and self.qk_norm_before_rope:
            q, k = self._qk_norm(q, k)
        if rotary_pos_emb is not None:
            if isinstance(rotary_pos_emb, (tuple, list)):
                if len(rotary_pos_emb) != 2:
                    raise ValueError(f"{owner}: rotary_pos_emb: expected a tensor or a (q, k) pair")
                q_freqs, k_freqs = rotary_pos_emb
            else:
                q_freqs = k_freqs = rotary_pos_emb
            # TE's fused RoPE takes freqs of any float dtype and computes in fp32; ours wants fp32
            q_freqs, k_freqs = q_freqs.float(), k_freqs.float()
            thd = self.qkv_format == "thd"
            q = apply_rotary_pos_emb(
                q,
                q_freqs,
                self.qkv_format,
                interleaved=self.rotary_pos_interleaved,
                fused=True,
                cu_seqlens=cu_seqlens_q if thd else None,
                start_positions=start_positions,
                cp_size=self.cp_size,
                cp_rank=self.cp_rank,
            )
            k = apply_rotary_pos_emb(
                k,
                k_freqs,
                self.qkv_format,
                interleaved=self.rotary_pos_interleaved,
                fused=True,
                cu_seqlens=cu_seqlens_kv if thd else None,
                start_positions=start_positions,
                cp_size=self.cp_size,
                cp_rank=self.cp_rank,
            )
        if self.q_norm is not None and not self.qk_norm_before_rope:
            q, k = self._qk_norm(q, k)
        if torch.compiler.is_compiling():
            # Views of the QKV GEMM output are packed q/k/v that DotProductAttention can only
            # recognise from data pointers, which it does eagerly (a graph break); traced, they
            # go over dense (the attention kernels copy separate inputs dense anyway).
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        context = self.core_attention(
            q,
            k,
            v,
            attention_mask,
            qkv_format=self.qkv_format,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_kv,
            cu_seqlens_q_padded=cu_seqlens_q_padded,
            cu_seqlens_kv_padded=cu_seqlens_kv_padded,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_kv=max_seqlen_kv,
            attn_mask_type=attn_mask_type,
            window_size=window_size,
            checkpoint_core_attention=checkpoint_core_attention,
            core_attention_bias_type=core_attention_bias_type,
            core_attention_bias=core_attention_bias,
            alibi_slopes=alibi_slopes,
            inference_params=inference_params,
            pad_between_seqs=pad_between_seqs,
            fp8_output=fp8_attention_enabled(),
        )
        out = self.proj(context, is_first_microbatch)
        outs = list(out) if self.return_bias else [out]
        if self.return_layernorm_output:
            outs.append(ln_out)
        return outs[0] if len(outs) == 1 else tuple(outs)

"""te.DotProductAttention: TE's core attention module (softmax(Q K^T * scale + bias) V) over the
backends of backends.py, chosen per call by the C selection (ARCHITECTURE.md §7).

forward normalizes TE's arguments into one canonical problem: the mask name (TE's comma forms
"padding,causal" accepted), the window (TE's rules: causal masks end at the diagonal), padding
given as attention_mask ([b, 1, 1, s] bool, True = padding, right padding) or cu_seqlens, the
layout of q, k, v (packed layouts such as bs3hd are recognised from the tensors' memory, as TE
does), then selects the backend and runs it. Unsupported TE features raise NotImplementedError.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import torch

from ...distributed import get_distributed_world_size
from ...jit import no_torch_dynamo
from ...module.base import TransformerEngineBaseModule, default_device, reject_unsupported
from ..backends import (
    FlashAttention,
    UnfusedDotProductAttention,
    _attention_backends,
    draw_rng_state,
    select_backend,
)
from ..inference import attention_inputs, check_inference_params
from .fp8_attention import checkpoint_attention, fp8_attention_plan
from ..inputs import (
    QKV_FORMATS,
    check_bias,
    check_qkv,
    check_window,
    detect_qkv_layout,
    normalize_mask_type,
    resolve_sequences,
)
from .packed_inputs import needs_eager_dpa, unpack_packed_qkv
from .padded_seqs import offsets_differ, real_token_index, scatter_rows
from .context_parallel import check_cp_config, forward_with_cp

__all__ = ["DotProductAttention", "_attention_backends"]

SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")


class DotProductAttention(TransformerEngineBaseModule):
    """Scaled dot-product attention (TE's `transformer_engine.pytorch.DotProductAttention`).

    num_attention_heads, kv_channels (head dim, or (d_qk, d_v)), num_gqa_groups (KV heads; None =
    num_attention_heads), attention_dropout (applied in training mode), qkv_format ('sbhd',
    'bshd', 'thd'), attn_mask_type and window_size (defaults for forward), tp_size / tp_group
    (heads are split over the tensor-parallel ranks: each rank gets its share of heads),
    get_rng_state_tracker (dropout seeds are drawn inside its fork()), layer_number,
    attention_type ('self' or 'cross': how a padding attention_mask is given), softmax_scale
    (default 1 / sqrt(d_qk)). sequence_parallel is accepted for TE compatibility: core attention
    works on whole sequences either way. softmax_type: 'vanilla', 'off-by-one' or 'learnable'
    (attention sinks: one extra sink logit per head, 0 or the parameter `softmax_offset` fp32
    [h], TE's name and shape; flash on the CPU and the unfused backend on any device).
    Context parallelism: cp_group, cp_global_ranks, cp_stream, cp_comm_type (see
    set_context_parallel_group and context_parallel.py). return_max_logit is not supported.
    """

    def __init__(
        self,
        num_attention_heads: int,
        kv_channels: int | tuple[int, int],
        num_gqa_groups: int | None = None,
        attention_dropout: float = 0.0,
        qkv_format: str = "sbhd",
        attn_mask_type: str = "causal",
        window_size: tuple[int, int] | None = None,
        sequence_parallel: bool = False,
        tp_size: int = 1,
        get_rng_state_tracker: Callable[[], Any] | None = None,
        tp_group: Any = None,
        layer_number: int | None = None,
        attention_type: str = "self",
        cp_group: Any = None,
        cp_global_ranks: list[int] | None = None,
        cp_stream: Any = None,
        cp_comm_type: str = "p2p",
        softmax_scale: float | None = None,
        softmax_type: str = "vanilla",
        return_max_logit: bool = False,
    ) -> None:
        # A TE module as in TE: FP8 meta for the attention's three GEMMs (FP8 attention's
        # delayed-scaling slots, fp8_attention.py), saved in the module's _extra_state.
        super().__init__(num_gemms=3, device=None)
        owner = "DotProductAttention"
        reject_unsupported(owner, return_max_logit=return_max_logit)
        self.set_context_parallel_group(cp_group, cp_global_ranks, cp_stream, cp_comm_type)
        if softmax_type not in SOFTMAX_TYPES:
            raise ValueError(
                f"{owner}: softmax_type: expected one of {SOFTMAX_TYPES}, got {softmax_type!r}"
            )
        if isinstance(kv_channels, int):
            kv_channels = (kv_channels, kv_channels)
        if (
            not isinstance(kv_channels, (tuple, list))
            or len(kv_channels) != 2
            or not all(isinstance(c, int) and c >= 1 for c in kv_channels)
        ):
            raise ValueError(
                f"{owner}: kv_channels: expected an int >= 1 or a pair, got {kv_channels!r}"
            )
        if not isinstance(num_attention_heads, int) or num_attention_heads < 1:
            raise ValueError(
                f"{owner}: num_attention_heads: expected an int >= 1, got {num_attention_heads!r}"
            )
        gqa = num_attention_heads if num_gqa_groups is None else num_gqa_groups
        if not isinstance(gqa, int) or gqa < 1 or num_attention_heads % gqa:
            raise ValueError(
                f"{owner}: num_gqa_groups: expected a divisor of num_attention_heads "
                f"({num_attention_heads}), got {num_gqa_groups!r}"
            )
        self.tp_size = get_distributed_world_size(tp_group) if tp_group is not None else tp_size
        if not isinstance(self.tp_size, int) or self.tp_size < 1 or gqa % self.tp_size:
            raise ValueError(
                f"{owner}: tp_size {self.tp_size}: expected an int >= 1 dividing num_gqa_groups "
                f"({gqa}) (each rank gets whole KV groups)"
            )
        if not 0.0 <= attention_dropout < 1.0:
            raise ValueError(
                f"{owner}: attention_dropout: expected [0, 1), got {attention_dropout!r}"
            )
        if qkv_format not in QKV_FORMATS:
            raise ValueError(
                f"{owner}: qkv_format: expected one of {QKV_FORMATS}, got {qkv_format!r}"
            )
        if attention_type not in ("self", "cross"):
            raise ValueError(
                f"{owner}: attention_type: expected 'self' or 'cross', got {attention_type!r}"
            )
        self.attn_mask_type = normalize_mask_type(owner, attn_mask_type)
        self.window_size = check_window(owner, self.attn_mask_type, window_size)
        self._window_arg = window_size
        self.num_attention_heads = num_attention_heads
        self.num_gqa_groups = gqa
        self.num_attention_heads_per_partition = num_attention_heads // self.tp_size
        self.num_gqa_groups_per_partition = gqa // self.tp_size
        self.hidden_size_per_attention_head_k, self.hidden_size_per_attention_head_v = kv_channels
        self.kv_channels = tuple(kv_channels)
        self.attention_dropout = float(attention_dropout)
        self.qkv_format = qkv_format
        self.attention_type = attention_type
        self.layer_number = layer_number
        self.sequence_parallel = sequence_parallel
        self.tp_group = tp_group
        self.softmax_scale = (
            1.0 / math.sqrt(kv_channels[0]) if softmax_scale is None else float(softmax_scale)
        )
        self.attention_dropout_ctx = get_rng_state_tracker().fork if get_rng_state_tracker else None
        # Attention sinks (TE's names and shapes): one fp32 sink logit per local head; a fixed
        # zero buffer for 'off-by-one' (not saved: TE's is a plain attribute), a parameter
        # initialised to 0 for 'learnable'.
        self.softmax_type = softmax_type
        self.softmax_offset = None
        h_local = self.num_attention_heads_per_partition
        if softmax_type == "off-by-one":
            self.softmax_offset = torch.zeros(h_local, device=default_device())
        elif softmax_type == "learnable":
            self.softmax_offset = torch.nn.Parameter(torch.zeros(h_local, device=default_device()))
        self.flash_attention = FlashAttention(self.softmax_scale, self.attention_dropout)
        self.unfused_attention = UnfusedDotProductAttention(
            self.softmax_scale, self.attention_dropout
        )

    def set_context_parallel_group(
        self,
        cp_group: Any,
        cp_global_ranks: list[int] | None,
        cp_stream: Any,
        cp_comm_type: str = "p2p",
    ) -> None:
        """TE's CP setup: cp_group (a process group; [a2a_group, p2p_group] for 'a2a+p2p'),
        cp_global_ranks (the group's global ranks, checked), cp_stream (accepted, unused: the
        CPU's collectives are synchronous but for the ring's K/V exchange), cp_comm_type 'p2p',
        'all_gather', 'a2a' or 'a2a+p2p'. With a group of size > 1, forward takes this rank's
        two sequence chunks (context_parallel.py's layout) and returns this rank's rows."""
        self.cp_size = check_cp_config(
            "DotProductAttention", cp_group, cp_global_ranks, cp_comm_type
        )
        self.cp_group = cp_group
        self.cp_global_ranks = cp_global_ranks
        self.cp_stream = cp_stream
        self.cp_comm_type = cp_comm_type

    # ------------------------------------------------------------------ forward
    @no_torch_dynamo(when=needs_eager_dpa)
    def forward(
        self,
        query_layer: torch.Tensor | None = None,
        key_layer: torch.Tensor | None = None,
        value_layer: torch.Tensor | None = None,
        attention_mask: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
        qkv_format: str | None = None,
        cu_seqlens_q: torch.Tensor | None = None,
        cu_seqlens_kv: torch.Tensor | None = None,
        cu_seqlens_q_padded: torch.Tensor | None = None,
        cu_seqlens_kv_padded: torch.Tensor | None = None,
        max_seqlen_q: int | None = None,
        max_seqlen_kv: int | None = None,
        attn_mask_type: str | None = None,
        window_size: tuple[int, int] | None = None,
        checkpoint_core_attention: bool = False,
        core_attention_bias_type: str = "no_bias",
        core_attention_bias: torch.Tensor | None = None,
        alibi_slopes: torch.Tensor | None = None,
        inference_params: Any = None,
        pad_between_seqs: bool | None = None,
        fp8_output: bool = False,
        fast_zero_fill: bool = True,
        num_splits: int | None = 1,
        qkv_layer: torch.Tensor | None = None,
        kv_layer: torch.Tensor | None = None,
        qkv_interleave_dim: int = -3,
    ) -> torch.Tensor:
        """Attention output [s_q, b, h * d_v] (sbhd), [b, s_q, h * d_v] (bshd) or
        [t_q, h * d_v] (thd).

        attention_mask: padding masks: [b, 1, 1, s] bool (True = padding), a (q, kv) pair for
        cross attention, or give cu_seqlens_q / cu_seqlens_kv (int32 [b + 1]) instead;
        'arbitrary': bool [b or 1, h or 1, s_q, s_kv], True = masked. thd needs cu_seqlens
        (its masks are read as their padding variants: the sequences are the padding).
        max_seqlen_*: thd only (default: computed from cu_seqlens, a host sync). Bias:
        core_attention_bias [1 or b, 1 or h, s_q, s_kv] in q's dtype for pre/post_scale_bias;
        alibi_slopes fp32 [h] or [b, h] for 'alibi' (None: TE's default slopes).
        checkpoint_core_attention recomputes the attention in the backward (FP8 attention
        there with the forward's scales, fp8_attention.checkpoint_attention).
        cu_seqlens_q/kv_padded (thd): TE's offsets with padding between sequences (each
        sequence's real tokens first, then its padding; output rows of the padding are 0);
        pad_between_seqs (TE's hint: None = detect) is read off the offsets. fast_zero_fill: TE's
        choice of how padded output rows are zeroed; every backend here writes those zeros
        itself, so both values give the same output. num_splits: TE's split-KV count (flash-attn
        3); only 1 (or None), no split.
        inference_params: an InferenceParams (KV caching, attention/inference.py; needs the
        module's layer_number and a padding mask type): key/value are this step's new tokens,
        copied into the cache, and q attends to each whole cached sequence, 'padding_causal'
        aligned bottom-right (TE's rule); the sequence lengths are the cache's (TE's: the given
        cu_seqlens_* / max_seqlen_* are superseded by inference_params').
        qkv_layer / kv_layer (TE main): packed inputs declared instead of detected: qkv_layer
        [.., 3, h, d] (qkv_interleave_dim -3, e.g. bs3hd) or [.., h, 3, d] (-2, e.g. bsh3d) in
        place of query/key/value_layer; kv_layer likewise packs K and V beside query_layer.
        q/k/v become views of it and the layout comes from the declaration, so the call traces
        under torch.compile. Calls that cannot be traced (packed views not declared, thd without
        max_seqlen_*, dropout under an RNG tracker) run eagerly with a warning
        (packed_inputs.needs_eager_dpa).
        """
        owner = "DotProductAttention"
        if pad_between_seqs is not None and not isinstance(pad_between_seqs, bool):
            raise ValueError(
                f"{owner}: pad_between_seqs: expected a bool or None, got {pad_between_seqs!r}"
            )
        fp8 = fp8_attention_plan(self, owner)
        if not isinstance(fp8_output, bool):
            raise ValueError(f"{owner}: fp8_output: expected a bool, got {fp8_output!r}")
        fmt = self.qkv_format if qkv_format is None else qkv_format
        if fmt not in QKV_FORMATS:
            raise ValueError(f"{owner}: qkv_format: expected one of {QKV_FORMATS}, got {fmt!r}")
        q, k, v, declared_layout = unpack_packed_qkv(
            qkv_layer, kv_layer, query_layer, key_layer, value_layer, fmt, qkv_interleave_dim,
            inference_params,
        )
        sizes = (
            self.num_attention_heads_per_partition,
            self.num_gqa_groups_per_partition,
            self.hidden_size_per_attention_head_k,
            self.hidden_size_per_attention_head_v,
        )
        check_qkv(owner, q, k, v, fmt, sizes)
        mask = self.attn_mask_type if attn_mask_type is None else attn_mask_type
        mask = normalize_mask_type(owner, mask)
        if window_size is None and attn_mask_type is None:
            window_size = self._window_arg
        window = check_window(owner, mask, window_size)

        if num_splits not in (None, 1):
            raise NotImplementedError(f"{owner}.forward: num_splits={num_splits!r} (only 1)")
        if not isinstance(fast_zero_fill, bool):
            raise ValueError(f"{owner}: fast_zero_fill: expected a bool, got {fast_zero_fill!r}")
        # Padding between thd sequences (offsets_differ): the CP path takes it per chunk; without
        # CP the attention runs on the real tokens (padded_seqs.py). TE's pad_between_seqs flag
        # only says so ahead (None: detected); the offsets decide.
        padded = [offsets_differ(cu, pad) for cu, pad in
                  ((cu_seqlens_q, cu_seqlens_q_padded), (cu_seqlens_kv, cu_seqlens_kv_padded))]
        if any(padded) and fmt != "thd":
            name = "cu_seqlens_q_padded" if padded[0] else "cu_seqlens_kv_padded"
            raise NotImplementedError(
                f"{owner}.forward: {name} different from {name.removesuffix('_padded')} with "
                f"qkv_format={fmt!r}: padding between sequences is for 'thd'"
            )
        if pad_between_seqs and fmt != "thd":
            raise ValueError(
                f"{owner}: pad_between_seqs=True: padding between sequences is for qkv_format "
                f"'thd', got {fmt!r}"
            )
        if any(padded) and self.cp_size <= 1:
            if inference_params is not None or (fp8 is not None and fp8_output):
                raise NotImplementedError(
                    f"{owner}.forward: padding between sequences with "
                    f"{'inference_params' if inference_params is not None else 'fp8_output'}"
                )
            iq = real_token_index(owner, "cu_seqlens_q", cu_seqlens_q, cu_seqlens_q_padded,
                                  q.shape[0])
            ikv = real_token_index(owner, "cu_seqlens_kv", cu_seqlens_kv, cu_seqlens_kv_padded,
                                   k.shape[0])
            out = self.forward(
                q.index_select(0, iq), k.index_select(0, ikv), v.index_select(0, ikv),
                attention_mask=attention_mask, qkv_format="thd", cu_seqlens_q=cu_seqlens_q,
                cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=max_seqlen_q,
                max_seqlen_kv=max_seqlen_kv, attn_mask_type=attn_mask_type,
                window_size=window_size, checkpoint_core_attention=checkpoint_core_attention,
                core_attention_bias_type=core_attention_bias_type,
                core_attention_bias=core_attention_bias, alibi_slopes=alibi_slopes,
                fast_zero_fill=fast_zero_fill, num_splits=num_splits,
            )  # fmt: skip
            return scatter_rows(out, iq, q.shape[0])
        if self.cp_size > 1:
            if fp8 is not None:  # the ring / all-gather return O in FP8 only when asked (TE's)
                fp8.fp8_output = fp8_output
            out = forward_with_cp(
                self, q, k, v, fmt, mask, window, attention_mask, inference_params,
                core_attention_bias_type, core_attention_bias, alibi_slopes,
                (cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded),
                checkpoint_core_attention, pad_between_seqs, fp8,
            )  # fmt: skip
            return fp8.fp8_tensor(out) if fp8 is not None and fp8_output else out
        restore = None
        if inference_params is not None:
            # KV cache: q's new tokens against the cached sequences, bshd with padding (see
            # inference.attention_inputs); the output goes back to q's format at the end.
            check_inference_params(owner, inference_params)
            mask = self._kv_cache_mask(mask, attention_mask)
            q, k, v, cu_q, cu_kv, restore = attention_inputs(
                inference_params, self.layer_number, q, k, v, fmt
            )
            fmt, max_seqlen_q, max_seqlen_kv = "bshd", q.shape[1], k.shape[1]
            if core_attention_bias_type in ("pre_scale_bias", "post_scale_bias"):
                raise NotImplementedError(
                    f"{owner}: core_attention_bias_type={core_attention_bias_type!r} with "
                    "inference_params (a bias over the cached keys); use 'no_bias' or 'alibi'"
                )
        else:
            mask, cu_q, cu_kv, max_seqlen_q, max_seqlen_kv = resolve_sequences(
                owner,
                fmt,
                mask,
                q,
                k,
                attention_mask,
                self.attention_type,
                cu_seqlens_q,
                cu_seqlens_kv,
                max_seqlen_q,
                max_seqlen_kv,
            )
        bias, slopes = check_bias(
            owner,
            core_attention_bias_type,
            core_attention_bias,
            alibi_slopes,
            q,
            fmt,
            cu_q,
            max_seqlen_q,
            max_seqlen_kv,
        )
        p = self.attention_dropout if self.training else 0.0
        # A declared packing names the layout (traceable); otherwise it is read off the memory.
        layout = declared_layout or detect_qkv_layout(q, k, v, fmt)
        backend = select_backend(
            self,
            q,
            layout,
            core_attention_bias_type,
            mask,
            p,
            q.shape[-2],
            k.shape[-2],
            max_seqlen_q,
            max_seqlen_kv,
            q.shape[-1],
            v.shape[-1],
            window,
        )
        if fp8 is not None:
            backend = self._fp8_backend(owner)
        rng_state = draw_rng_state(q.device, self.attention_dropout_ctx) if p > 0 else None
        if mask == "arbitrary":
            mask_arg = {"attention_mask": attention_mask}
            mask = "no_mask"  # the mask tensor carries it; the window (if any) still applies
        else:
            mask_arg = {}
        run = self.flash_attention if backend == "flash" else self.unfused_attention
        if restore is not None and backend != "flash":
            # The unfused backend computes every key position: trim the cache rows to the longest
            # cached sequence (views) instead of the cache's full length.
            max_seqlen_kv = min(max_seqlen_kv, max(inference_params.kv_lens))
            k, v = k[:, :max_seqlen_kv], v[:, :max_seqlen_kv]
        sink_arg = {}
        if self.softmax_type != "vanilla":
            offset = self.softmax_offset
            if offset.device != q.device:
                offset = offset.to(q.device)  # the off-by-one buffer follows q (a parameter moves with .to())
            if offset.dtype != torch.float32:
                # module.to(bf16) rounds the parameter too (as TE's); the kernels read sink logits
                # in fp32, and the gradient flows back through the cast in the parameter's dtype
                offset = offset.float()
            if backend == "flash" and q.device.type != "cpu":
                raise NotImplementedError(
                    f"{owner}: softmax_type={self.softmax_type!r} on the GPU: the flash kernels "
                    "take sinks on the CPU only; set NVTE_FLASH_ATTN=0 for the unfused backend"
                )
            sink_arg = {"softmax_type": self.softmax_type, "softmax_offset": offset}
        if fp8 is not None:
            sink_arg["fp8"] = fp8

        def core(q, k, v, bias, slopes):
            return run(
                q,
                k,
                v,
                layout,
                cu_q,
                cu_kv,
                max_seqlen_q,
                max_seqlen_kv,
                mask,
                window,
                core_attention_bias_type,
                bias,
                slopes,
                rng_state,
                **mask_arg,
                **sink_arg,
            )

        if checkpoint_core_attention and torch.is_grad_enabled():
            out = checkpoint_attention(fp8, core, q, k, v, bias, slopes)
        else:
            out = core(q, k, v, bias, slopes)
        out = out if restore is None else restore(out)
        # fp8_output (TE's): O as a Float8Tensor under FP8 attention; without it the output is
        # in the inputs' precision, as TE's (only FP8 attention produces FP8).
        return fp8.fp8_tensor(out) if fp8 is not None and fp8_output else out

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any
                              ) -> None:
        # Checkpoints saved before DotProductAttention carried FP8 state have no _extra_state
        # key: load them as "no FP8 state" instead of reporting a missing key.
        state_dict.setdefault(prefix + "_extra_state", None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @staticmethod
    def _fp8_backend(owner: str) -> str:
        """FP8 attention runs on the unfused backend, the one with TE's quantization points
        between its GEMMs and the softmax (fp8_attention.py)."""
        if os.environ.get("NVTE_UNFUSED_ATTN", "1") == "0":
            raise NotImplementedError(
                f"{owner}: FP8 attention (recipe fp8_dpa / fp8_mha) runs on the unfused backend, "
                "which NVTE_UNFUSED_ATTN=0 disables"
            )
        return "unfused"

    def _kv_cache_mask(self, mask: str, attention_mask: Any) -> str:
        """The mask and window of a KV-cache step (TE's rules): a padding mask is required (the
        cache's sequence lengths are the padding) and a causal one is aligned bottom-right (the
        new tokens are the last of their sequence), so training's 'padding_causal' serves."""
        owner = "DotProductAttention"
        if self.layer_number is None:
            raise ValueError(
                f"{owner}: inference_params needs the module's layer_number (its cache's key); "
                "construct DotProductAttention(..., layer_number=...)"
            )
        if "padding" not in mask:
            raise ValueError(
                f"{owner}: inference_params needs a padding mask type ('padding', "
                f"'padding_causal' or 'padding_causal_bottom_right'), got {mask!r}"
            )
        if attention_mask is not None:
            raise ValueError(
                f"{owner}: attention_mask with inference_params: the sequence lengths come from "
                "inference_params.pre_step(); pass attention_mask=None"
            )
        # The window (left, 0) of a causal mask carries over: it is measured from the diagonal.
        return "padding_causal_bottom_right" if mask == "padding_causal" else mask

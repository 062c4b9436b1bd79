"""Context parallelism for DotProductAttention (TE's attention.dot_product_attention.
context_parallel): attn_forward_func_with_cp over cp_comm_type 'p2p' (ring), 'all_gather', 'a2a'
(Ulysses) and 'a2a+p2p' (hierarchical), plus TE's batch helpers (pad_thd_sequences_for_cp,
generate_positional_ids_for_cp, get_batch_on_this_cp_rank).

Inputs are each CP rank's share of the sequence in TE's DualChunkSwap layout (rank r holds chunks r
and 2 cp - 1 - r of 2 cp equal chunks, for every mask type; thd: of every packed sequence, whose
padded lengths divide by 2 cp, as get_batch_on_this_cp_rank cuts them), qkv_format 'bshd', 'sbhd'
or 'thd' (not with 'all_gather'), masks 'no_mask' and 'causal' (thd: 'padding', 'padding_causal';
bottom-right variants are the same for self attention). Outputs are the rank's rows of the full
attention; gradients flow to the rank's own q, k, v. Softmax LSEs are combined in fp32
(cp_comm.merge). Communication is torch.distributed (gloo on the CPU): eager and, but for the
ring's K/V exchange, synchronous; cp_stream is accepted for TE's signature and unused.
Padding between thd sequences (cu_seqlens_q != cu_seqlens_q_padded, TE's pad_between_seqs;
each sequence's padding at its end): 'p2p', 'a2a', 'a2a+p2p' attend only the real tokens of
every chunk (cp_layout.ThdLayout), padding rows get zero output and gradients. A post_scale_bias
(bshd / sbhd, the rank's query rows over all keys, TE's sharding) with 'p2p': each ring step
adds its slice and dbias sums the steps in fp32 (TE: no bias with thd or padding masks, nor with
'a2a+p2p' -> ValueError). FP8 attention (DotProductAttention under fp8_dpa / fp8_mha,
DelayedScaling or Float8CurrentScaling), bshd / sbhd, every cp_comm_type: with 'a2a' every rank
runs the unfused FP8 emulation on its heads with each point's amax reduced over the CP group, bit
for bit one process's; 'p2p', 'all_gather', 'a2a+p2p' quantize per ring step / query chunk as
TE's CP does (cp_fp8.py) (TE's FP8 CP takes no thd and no bias -> ValueError).
Not supported (NotImplementedError): a bias with
'all_gather' / 'a2a', padding with 'all_gather', cross attention, padding masks for bshd / sbhd,
dropout, return_max_logit, and sliding windows except with 'a2a' (any window) and 'all_gather'
(causal, left window); attention sinks with 'a2a' only.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from . import cp_comm as comm
from .cp_batch import (
    cp_rank_indices,
    generate_positional_ids_for_cp,
    get_batch_on_this_cp_rank,
    get_cu_seqlens_on_cp_rank,
    pad_thd_sequences_for_cp,
)
from .cp_fp8 import fp8_cp_attention
from .cp_layout import DenseLayout, ThdLayout, thd_a2a_perm
from .fp8_attention import checkpoint_attention

__all__ = [
    "CP_COMM_TYPES",
    "attn_forward_func_with_cp",
    "check_cp_config",
    "cp_rank_indices",
    "forward_with_cp",
    "generate_positional_ids_for_cp",
    "get_batch_on_this_cp_rank",
    "get_cu_seqlens_on_cp_rank",
    "pad_thd_sequences_for_cp",
]

CP_COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")
_OWNER = "attn_forward_func_with_cp"


def check_cp_config(owner: str, cp_group: Any, cp_global_ranks: Any, cp_comm_type: str) -> int:
    """Validates TE's CP arguments; returns the CP size (1 without a group)."""
    if cp_comm_type not in CP_COMM_TYPES:
        raise ValueError(
            f"{owner}: cp_comm_type: expected one of {CP_COMM_TYPES}, got {cp_comm_type!r}"
        )
    if cp_group is None:
        return 1
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(f"{owner}: cp_group given but torch.distributed is not initialized")
    if cp_comm_type == "a2a+p2p":
        if not isinstance(cp_group, (list, tuple)) or len(cp_group) != 2:
            raise ValueError(
                f"{owner}: cp_comm_type='a2a+p2p' needs cp_group = [a2a_group, p2p_group], got "
                f"{cp_group!r}"
            )
        return comm.group_size(cp_group[0]) * comm.group_size(cp_group[1])
    if isinstance(cp_group, (list, tuple)):
        raise ValueError(
            f"{owner}: cp_group: a list of groups is for cp_comm_type='a2a+p2p' only, got "
            f"cp_comm_type={cp_comm_type!r}"
        )
    if cp_global_ranks is not None:
        comm.global_ranks(cp_group, cp_global_ranks)
    return comm.group_size(cp_group)


def _unsupported(what: str) -> NotImplementedError:
    return NotImplementedError(f"{_OWNER}: {what} is not supported with context parallelism")


def attn_forward_func_with_cp(
    is_training: bool,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_kv: torch.Tensor | None,
    max_seqlen_q: int | None,
    max_seqlen_kv: int | None,
    cu_seqlens_q_padded: torch.Tensor | None,
    cu_seqlens_kv_padded: torch.Tensor | None,
    dropout_p: float,
    cp_group: Any,
    cp_global_ranks: list[int] | None,
    cp_stream: Any,
    cp_comm_type: str,
    softmax_scale: float | None = None,
    qkv_format: str = "bshd",
    attn_mask_type: str = "causal",
    attn_bias_type: str = "no_bias",
    attn_bias: torch.Tensor | None = None,
    deterministic: bool = False,
    use_fused_attention: bool = False,
    window_size: tuple[int, int] | None = None,
    fp8: bool = False,
    fp8_meta: Any = None,
    quantizers: Any = None,
    pad_between_seqs: bool = False,
    use_flash_attn_3: bool = False,
    softmax_type: str = "vanilla",
    softmax_offset: torch.Tensor | None = None,
    fp8_output: bool = False,
    layer_number: int = 1,
    return_max_logit: bool = False,
    _fp8_plan: Any = None,
) -> torch.Tensor:
    """TE's entry point: attention of this rank's q rows against the whole sequence's k, v, which
    are spread over cp_group. q, k, v: [b, 2c, h, d] (bshd) or [2c, b, h, d] (sbhd), the rank's
    two chunks, or thd [t / cp, h, d] with the batch's global offsets cu_seqlens_*(_padded)
    (equal: no padding between sequences). Returns [b, 2c, h * d_v] / [2c, b, h * d_v] /
    [t / cp, h * d_v]. max_seqlen_* are not needed (the offsets give them). is_training (the
    LSE is always computed: the merge needs it), deterministic (the
    backward follows torch.are_deterministic_algorithms_enabled()), use_fused_attention,
    use_flash_attn_3 and layer_number select among TE's kernels and have no counterpart here: one
    kernel serves every case."""
    del is_training, deterministic, use_fused_attention, use_flash_attn_3, layer_number, cp_stream
    cp = check_cp_config(_OWNER, cp_group, cp_global_ranks, cp_comm_type)
    if cp_group is None:
        raise ValueError(f"{_OWNER}: cp_group: expected a process group, got None")
    if qkv_format not in ("bshd", "sbhd", "thd"):
        raise ValueError(f"{_OWNER}: qkv_format: expected bshd, sbhd or thd, got {qkv_format!r}")
    given = (("fp8_meta", fp8_meta), ("quantizers", quantizers))
    for name, val in given:
        if val is not None:
            raise _unsupported(f"{name} (given)")
    if _fp8_plan is not None:
        _check_fp8(cp_comm_type, qkv_format, attn_bias_type)
    for name, flag in (
        ("fp8", fp8 and _fp8_plan is None),
        ("fp8_output", fp8_output),
        ("return_max_logit", return_max_logit),
    ):
        if flag:
            raise _unsupported(f"{name}=True")
    if dropout_p:
        raise _unsupported(f"dropout_p={dropout_p!r} (dropout)")
    _check_bias(attn_bias_type, attn_bias, cp_comm_type, qkv_format, attn_mask_type)
    if pad_between_seqs and qkv_format != "thd":
        raise ValueError(
            f"{_OWNER}: pad_between_seqs=True: padding between sequences is for qkv_format "
            f"'thd', got {qkv_format!r}"
        )
    thd = qkv_format == "thd"
    plain = {"causal_bottom_right": "causal"}
    if thd:  # thd's masks are padding masks (the packed sequences are the padding)
        plain = {"padding": "no_mask", "padding_causal": "causal", "causal_bottom_right": "causal",
                 "padding_causal_bottom_right": "causal"}  # fmt: skip
    mask = plain.get(attn_mask_type, attn_mask_type)
    if mask not in ("no_mask", "causal"):
        raise _unsupported(f"attn_mask_type={attn_mask_type!r} (only 'no_mask' and 'causal')")
    causal = mask == "causal"
    window = tuple(window_size) if window_size is not None else (-1, 0 if causal else -1)
    if causal and window[1] != 0:
        raise ValueError(f"{_OWNER}: window_size: a causal mask needs (left, 0), got {window!r}")
    full = window in ((-1, -1), (-1, 0))
    if softmax_type != "vanilla" and cp_comm_type != "a2a":
        raise _unsupported(f"softmax_type={softmax_type!r} with cp_comm_type={cp_comm_type!r}")

    sdim = 1 if qkv_format == "bshd" else 0
    s = q.shape[sdim]
    if k.shape[sdim] != s or v.shape[sdim] != s:
        raise ValueError(
            f"{_OWNER}: q, k, v: expected one local sequence length (self attention), got "
            f"{q.shape[sdim]}, {k.shape[sdim]}, {v.shape[sdim]}"
        )
    real = None
    if thd:
        cu, real = _thd_offsets(
            cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded
        )
        if real is not None and cp_comm_type == "all_gather":
            raise _unsupported("qkv_format='thd' with cp_comm_type='all_gather'")
        if int(cu[-1]) % cp or bool(((cu[1:] - cu[:-1]) % (2 * cp)).any()):
            raise ValueError(
                f"{_OWNER}: cu_seqlens_q_padded {cu.tolist()}: every sequence length must be a "
                f"multiple of 2 * cp = {2 * cp} (pad with pad_thd_sequences_for_cp)"
            )
        if int(cu[-1]) // cp != s:
            raise ValueError(
                f"{_OWNER}: q: {s} tokens, expected cu_seqlens_q_padded[-1] / cp = "
                f"{int(cu[-1]) // cp} (this rank's share of the packed batch)"
            )
    elif s % 2:
        raise ValueError(
            f"{_OWNER}: local sequence length {s}: expected an even number (two chunks per rank: "
            f"the full sequence must divide by 2 * cp = {2 * cp})"
        )
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5

    if cp_comm_type in ("a2a", "a2a+p2p"):
        a2a_group = cp_group if cp_comm_type == "a2a" else cp_group[0]
        a = comm.group_size(a2a_group)
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.shape[-2] % a:
                raise ValueError(
                    f"{_OWNER}: {name}: {t.shape[-2]} heads: expected a multiple of the a2a group "
                    f"size {a} (heads are scattered over it)"
                )
        if cp_comm_type == "a2a+p2p" and not full:
            raise _unsupported(f"window_size={window!r} with cp_comm_type='a2a+p2p'")
        if _fp8_plan is not None and cp_comm_type == "a2a+p2p":
            out = fp8_cp_attention(q, k, v, qkv_format, causal, window, scale, cp_comm_type,
                                   cp_group, None, _fp8_plan)  # fmt: skip
            return out.reshape(*out.shape[:-2], out.shape[-2] * out.shape[-1])
        perm = layout = None
        if thd:
            local = cu // cp
            perm = thd_a2a_perm(local, a)
            if cp_comm_type == "a2a":
                layout = ThdLayout(local * a, real)
            else:  # the p2p ring's rank and size place the gathered super-chunks
                p2p = cp_group[1]
                layout = ThdLayout(local * a, real, comm.group_rank(p2p), comm.group_size(p2p))
        else:
            layout = DenseLayout(qkv_format, s * a)
        qh, kh, vh = (comm.SeqToHeads.apply(t, sdim, a2a_group, perm) for t in (q, k, v))
        if cp_comm_type == "a2a":
            offset = softmax_offset
            if softmax_type == "learnable" and offset is not None:
                per = q.shape[-2] // a
                i = comm.group_rank(a2a_group)
                offset = offset.reshape(-1)[i * per : (i + 1) * per]
            qs, ks, vs = (layout.half(t, None) for t in (qh, kh, vh))  # real tokens
            if _fp8_plan is not None:
                oh = _fp8_attention(qs, ks, vs, qkv_format, causal, window, scale, softmax_type,
                                    offset, _fp8_plan)  # fmt: skip
            else:
                oh, _ = layout.attn_fwd(
                    qs, ks, vs, None, None, layout.mask(causal), window, scale, softmax_type,
                    offset,
                )  # fmt: skip
            if thd:
                oh = layout.scatter(oh, qh.shape[0])
        else:
            p2p = cp_group[1]
            ranks = comm.global_ranks(p2p, None)
            oh = comm.RingAttention.apply(qh, kh, vh, layout, causal, scale, p2p, ranks)
        out = comm.HeadsToSeq.apply(oh, sdim, a2a_group, perm)
    elif cp_comm_type == "p2p":
        if not full:
            raise _unsupported(f"window_size={window!r} with cp_comm_type='p2p'")
        if _fp8_plan is not None:
            out = fp8_cp_attention(q, k, v, qkv_format, causal, window, scale, cp_comm_type,
                                   cp_group, cp_global_ranks, _fp8_plan)  # fmt: skip
            return out.reshape(*out.shape[:-2], out.shape[-2] * out.shape[-1])
        ranks = comm.global_ranks(cp_group, cp_global_ranks)
        r = comm.group_rank(cp_group)
        layout = ThdLayout(cu // cp, real, r, cp) if thd else DenseLayout(qkv_format, s)
        if attn_bias is not None:
            _check_bias_shape(attn_bias, q, s, cp, sdim)
        out = comm.RingAttention.apply(
            q, k, v, layout, causal, scale, cp_group, ranks, attn_bias
        )
    else:  # all_gather
        if thd:
            raise _unsupported("qkv_format='thd' with cp_comm_type='all_gather'")
        if _fp8_plan is not None:
            out = fp8_cp_attention(q, k, v, qkv_format, causal, window, scale, cp_comm_type,
                                   cp_group, None, _fp8_plan)  # fmt: skip
        else:
            out = _all_gather_attention(q, k, v, qkv_format, causal, window, scale, cp_group)
    return out.reshape(*out.shape[:-2], out.shape[-2] * out.shape[-1])


def _thd_offsets(cu_q, cu_kv, cu_q_padded, cu_kv_padded):  # noqa: ANN001, ANN202
    """The packed batch's (global) padded sequence offsets for thd CP, cu_seqlens_q_padded (TE's
    argument; cu_seqlens_q when not given), and the real sequence lengths when they differ
    (padding between sequences, at each sequence's end; else None). Self attention only: kv's
    offsets must equal q's."""
    pad_q = cu_q_padded if cu_q_padded is not None else cu_q
    pad_kv = cu_kv_padded if cu_kv_padded is not None else cu_kv
    if pad_q is None:
        raise ValueError(f"{_OWNER}: qkv_format='thd' needs cu_seqlens_q_padded (or cu_seqlens_q)")
    pad_q = pad_q.to(torch.int64)
    real_cu = pad_q if cu_q is None else cu_q.to(pad_q.device, torch.int64)
    for name, t, want in (
        ("cu_seqlens_kv", cu_kv, real_cu),
        ("cu_seqlens_kv_padded", pad_kv, pad_q),
    ):
        if t is not None and not torch.equal(t.to(pad_q.device, torch.int64), want):
            raise _unsupported(f"{name} different from q's offsets (cross attention)")
    if real_cu.shape != pad_q.shape:
        raise ValueError(
            f"{_OWNER}: cu_seqlens_q {real_cu.tolist()} and cu_seqlens_q_padded "
            f"{pad_q.tolist()}: expected the same number of sequences"
        )
    if torch.equal(real_cu, pad_q):
        return pad_q, None
    real = real_cu[1:] - real_cu[:-1]
    room = pad_q[1:] - pad_q[:-1]
    if bool((real < 0).any()) or bool((real > room).any()):
        raise ValueError(
            f"{_OWNER}: cu_seqlens_q {real_cu.tolist()}: every sequence's length must lie in "
            f"[0, its padded length] (cu_seqlens_q_padded {pad_q.tolist()})"
        )
    return pad_q, real


def _check_fp8(comm_type, fmt, bias_type) -> None:  # noqa: ANN001
    """FP8 attention with CP, every cp_comm_type (TE's four): 'a2a' runs one process's FP8
    emulation on every rank's heads, the others cp_fp8.py's; TE's FP8 CP takes bshd / sbhd and
    no bias (its backend selection refuses thd and a bias under FP8 with CP)."""
    del comm_type
    if fmt == "thd" or bias_type != "no_bias":
        raise ValueError(
            f"{_OWNER}: FP8 attention with qkv_format={fmt!r}, attn_bias_type={bias_type!r}: "
            "TE's context parallelism takes FP8 attention with bshd / sbhd and no bias"
        )


def _fp8_attention(q, k, v, fmt, causal, window, scale, softmax_type, offset, plan):  # noqa
    """One process's FP8 attention (the unfused backend's quantization points, fp8_attention.py)
    on this rank's heads over the whole sequence; the plan's amax_group makes every point's
    scale the group's, so the bytes equal one process's."""
    from ..backends import UnfusedDotProductAttention  # noqa: PLC0415

    s = q.shape[1 if fmt == "bshd" else 0]
    return UnfusedDotProductAttention(scale)(
        q, k, v, f"{fmt}_{fmt}_{fmt}", None, None, s, s, "causal" if causal else "no_mask",
        window, softmax_type=softmax_type, softmax_offset=offset, fp8=plan,
    ).view(*q.shape[:-1], v.shape[-1])  # fmt: skip


def _check_bias(bias_type, bias, comm_type, fmt, mask) -> None:  # noqa: ANN001
    """TE's CP takes a post_scale_bias with 'p2p' (its ring slices it per step) and a
    non-padding mask (not thd); the hierarchical a2a+p2p asserts no bias."""
    if bias_type == "no_bias":
        if bias is not None:
            raise ValueError(f"{_OWNER}: attn_bias given with attn_bias_type='no_bias'")
        return
    if bias_type != "post_scale_bias":
        raise _unsupported(f"attn_bias_type={bias_type!r} (only 'post_scale_bias', with 'p2p')")
    if bias is None:
        raise ValueError(f"{_OWNER}: attn_bias_type='post_scale_bias' needs attn_bias, got None")
    if comm_type == "a2a+p2p" or fmt == "thd" or "padding" in mask:
        raise ValueError(
            f"{_OWNER}: attention bias with cp_comm_type={comm_type!r}, qkv_format={fmt!r}, "
            f"attn_mask_type={mask!r}: TE's context parallelism takes a bias with non-padding "
            "masks (bshd / sbhd) and not with 'a2a+p2p'"
        )
    if comm_type != "p2p":
        raise _unsupported(f"attention bias with cp_comm_type={comm_type!r} (only 'p2p')")


def _check_bias_shape(bias, q, s, cp, sdim) -> None:  # noqa: ANN001
    b, h = q.shape[1 - sdim], q.shape[-2]
    # a broadcast query dim ([.., 1, s_kv], TE's '111s') is refused as the one-process path
    # refuses it (the kernels take [.., s_q, s_kv])
    want = f"[1 or {b}, 1 or {h}, {s}, {s * cp}]"
    shape = tuple(bias.shape)
    if (
        bias.dim() != 4
        or shape[0] not in (1, b)
        or shape[1] not in (1, h)
        or shape[2] != s
        or shape[3] != s * cp
    ):
        raise ValueError(
            f"{_OWNER}: attn_bias: expected {want} (this rank's query rows, every key), got "
            f"{list(shape)}"
        )


def _all_gather_attention(q, k, v, fmt, causal, window, scale, group):  # noqa: ANN001, ANN202
    """K and V gathered into sequence order; each of q's two chunks attends to the keys up to its
    own end (causal, bottom-right aligned so a left window counts from the diagonal), or to all
    keys (no mask). Differentiable through the op's autograd and GatherSequence."""
    sdim = 1 if fmt == "bshd" else 0
    cp, r = comm.group_size(group), comm.group_rank(group)
    kf, vf = (comm.GatherSequence.apply(t, sdim, group) for t in (k, v))
    if not causal:
        if window != (-1, -1):
            raise _unsupported(f"window_size={window!r} without a causal mask with 'all_gather'")
        layout = DenseLayout(fmt, q.shape[sdim])
        return layout.attn_fwd(q, kf, vf, None, None, "no_mask", window, scale)[0]
    c = q.shape[sdim] // 2
    outs = []
    for which, chunk in ((0, r), (1, 2 * cp - 1 - r)):
        qs = q.narrow(sdim, which * c, c).contiguous()
        n = (chunk + 1) * c
        ks, vs = (t.narrow(sdim, 0, n).contiguous() for t in (kf, vf))
        mask = "causal_bottom_right"  # q's chunk ends where the keys end
        outs.append(DenseLayout(fmt, c).attn_fwd(qs, ks, vs, None, None, mask, window, scale)[0])
    return torch.cat(outs, sdim)


def forward_with_cp(
    dpa: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    fmt: str,
    mask: str,
    window: tuple[int, int],
    attention_mask: Any,
    inference_params: Any,
    bias_type: str,
    bias: torch.Tensor | None,
    alibi_slopes: torch.Tensor | None,
    cu_seqlens: tuple[Any, Any, Any, Any],
    checkpoint_core_attention: bool,
    pad_between_seqs: bool = False,
    fp8: Any = None,
) -> torch.Tensor:
    """DotProductAttention.forward's CP branch (its arguments already checked and normalized):
    refuses what CP cannot take, then runs attn_forward_func_with_cp with the module's settings.
    fp8: the forward's FP8AttentionPlan (or None); its amax reduction spans the CP group."""
    owner = "DotProductAttention (context parallelism)"
    for name, val in (
        ("attention_mask", attention_mask),
        ("inference_params", inference_params),
        ("alibi_slopes", alibi_slopes),
    ):
        if val is not None:
            raise NotImplementedError(f"{owner}: {name} is not supported (given)")
    if fmt != "thd" and any(c is not None for c in cu_seqlens):
        raise NotImplementedError(f"{owner}: cu_seqlens_q / cu_seqlens_kv with {fmt} (padding)")
    cu_q, cu_kv, cu_q_pad, cu_kv_pad = cu_seqlens
    p = dpa.attention_dropout if dpa.training else 0.0
    offset = dpa.softmax_offset
    if offset is not None and offset.device != q.device:
        offset = offset.to(q.device)
    if offset is not None and offset.dtype != torch.float32:
        offset = offset.float()  # sink logits in fp32, as DotProductAttention's own path

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None
            ) -> torch.Tensor:
        return attn_forward_func_with_cp(
            dpa.training,
            q,
            k,
            v,
            cu_q,
            cu_kv,
            None,
            None,
            cu_q_pad,
            cu_kv_pad,
            p,
            dpa.cp_group,
            dpa.cp_global_ranks,
            dpa.cp_stream,
            dpa.cp_comm_type,
            softmax_scale=dpa.softmax_scale,
            qkv_format=fmt,
            attn_mask_type=mask,
            attn_bias_type=bias_type,
            attn_bias=bias,
            window_size=window,
            pad_between_seqs=bool(pad_between_seqs),
            softmax_type=dpa.softmax_type,
            softmax_offset=offset,
            fp8=fp8 is not None,
            _fp8_plan=fp8,
        )

    if fp8 is not None:
        fp8.amax_group = dpa.cp_group
    if checkpoint_core_attention and torch.is_grad_enabled():
        return checkpoint_attention(fp8, run, q, k, v, bias)
    return run(q, k, v, bias)

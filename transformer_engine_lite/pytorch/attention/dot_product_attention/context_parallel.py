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
Not supported (NotImplementedError): padding between sequences, cross attention, padding masks
for bshd / sbhd, attention bias, dropout, FP8, return_max_logit, and sliding windows except with
'a2a' (any window) and 'all_gather' (causal, left window); attention sinks with 'a2a' only.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from . import cp_comm as comm
from .cp_layout import DenseLayout, ThdLayout, thd_a2a_perm

__all__ = [
    "CP_COMM_TYPES",
    "attn_forward_func_with_cp",
    "check_cp_config",
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
    given = (("attn_bias", attn_bias), ("fp8_meta", fp8_meta), ("quantizers", quantizers))
    for name, val in given:
        if val is not None:
            raise _unsupported(f"{name} (given)")
    for name, flag in (
        ("fp8", fp8),
        ("fp8_output", fp8_output),
        ("pad_between_seqs", pad_between_seqs),
        ("return_max_logit", return_max_logit),
    ):
        if flag:
            raise _unsupported(f"{name}=True")
    if attn_bias_type != "no_bias":
        raise _unsupported(f"attn_bias_type={attn_bias_type!r}")
    if dropout_p:
        raise _unsupported(f"dropout_p={dropout_p!r} (dropout)")
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
    if thd:
        cu = _thd_offsets(cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded)
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
        perm = layout = None
        if thd:
            local = cu // cp
            perm = thd_a2a_perm(local, a)
            layout = ThdLayout(local * a)
        else:
            layout = DenseLayout(qkv_format, s * a)
        qh, kh, vh = (comm.SeqToHeads.apply(t, sdim, a2a_group, perm) for t in (q, k, v))
        if cp_comm_type == "a2a":
            offset = softmax_offset
            if softmax_type == "learnable" and offset is not None:
                per = q.shape[-2] // a
                i = comm.group_rank(a2a_group)
                offset = offset.reshape(-1)[i * per : (i + 1) * per]
            oh, _ = layout.attn_fwd(
                qh, kh, vh, None, None, layout.mask(causal), window, scale, softmax_type, offset
            )
        else:
            p2p = cp_group[1]
            ranks = comm.global_ranks(p2p, None)
            oh = comm.RingAttention.apply(qh, kh, vh, layout, causal, scale, p2p, ranks)
        out = comm.HeadsToSeq.apply(oh, sdim, a2a_group, perm)
    elif cp_comm_type == "p2p":
        if not full:
            raise _unsupported(f"window_size={window!r} with cp_comm_type='p2p'")
        ranks = comm.global_ranks(cp_group, cp_global_ranks)
        layout = ThdLayout(cu // cp) if thd else DenseLayout(qkv_format, s)
        out = comm.RingAttention.apply(q, k, v, layout, causal, scale, cp_group, ranks)
    else:  # all_gather
        if thd:
            raise _unsupported("qkv_format='thd' with cp_comm_type='all_gather'")
        out = _all_gather_attention(q, k, v, qkv_format, causal, window, scale, cp_group)
    return out.reshape(*out.shape[:-2], out.shape[-2] * out.shape[-1])


def _thd_offsets(cu_q, cu_kv, cu_q_padded, cu_kv_padded) -> torch.Tensor:  # noqa: ANN001
    """The packed batch's (global) sequence offsets for thd CP: cu_seqlens_q_padded (TE's
    argument; cu_seqlens_q when not given). Self attention only (kv's equal q's), and no
    padding between sequences (cu_seqlens equal to their padded offsets)."""
    pad_q = cu_q_padded if cu_q_padded is not None else cu_q
    pad_kv = cu_kv_padded if cu_kv_padded is not None else cu_kv
    if pad_q is None:
        raise ValueError(f"{_OWNER}: qkv_format='thd' needs cu_seqlens_q_padded (or cu_seqlens_q)")
    pad_q = pad_q.to(torch.int64)
    for name, t in (
        ("cu_seqlens_q", cu_q),
        ("cu_seqlens_kv", cu_kv),
        ("cu_seqlens_kv_padded", pad_kv),
    ):
        if t is not None and not torch.equal(t.to(pad_q.device, torch.int64), pad_q):
            raise _unsupported(
                f"{name} different from cu_seqlens_q_padded (cross attention or padding between "
                "sequences)"
            )
    return pad_q


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
) -> torch.Tensor:
    """DotProductAttention.forward's CP branch (its arguments already checked and normalized):
    refuses what CP cannot take, then runs attn_forward_func_with_cp with the module's settings."""
    owner = "DotProductAttention (context parallelism)"
    for name, val in (
        ("attention_mask", attention_mask),
        ("inference_params", inference_params),
        ("core_attention_bias", bias),
        ("alibi_slopes", alibi_slopes),
    ):
        if val is not None:
            raise NotImplementedError(f"{owner}: {name} is not supported (given)")
    if bias_type != "no_bias":
        raise NotImplementedError(f"{owner}: core_attention_bias_type={bias_type!r}")
    if fmt != "thd" and any(c is not None for c in cu_seqlens):
        raise NotImplementedError(f"{owner}: cu_seqlens_q / cu_seqlens_kv with {fmt} (padding)")
    cu_q, cu_kv, cu_q_pad, cu_kv_pad = cu_seqlens
    p = dpa.attention_dropout if dpa.training else 0.0
    offset = dpa.softmax_offset
    if offset is not None and offset.device != q.device:
        offset = offset.to(q.device)
    if offset is not None and offset.dtype != torch.float32:
        offset = offset.float()  # sink logits in fp32, as DotProductAttention's own path

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
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
            window_size=window,
            softmax_type=dpa.softmax_type,
            softmax_offset=offset,
        )

    if checkpoint_core_attention and torch.is_grad_enabled():
        from torch.utils.checkpoint import checkpoint  # noqa: PLC0415

        return checkpoint(run, q, k, v, use_reentrant=False)
    return run(q, k, v)


# ------------------------------------------------------------------------------- batch helpers
def _padded_lengths(cu_seqlens: torch.Tensor, divisibility_factor: int) -> torch.Tensor:
    if not isinstance(divisibility_factor, int) or divisibility_factor < 1:
        raise ValueError(
            f"divisibility_factor: expected an int >= 1, got {divisibility_factor!r}"
        )
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    if bool((lens < 0).any()):
        raise ValueError(f"cu_seqlens: expected non-decreasing offsets, got {cu_seqlens.tolist()}")
    return (lens + divisibility_factor - 1) // divisibility_factor * divisibility_factor


def pad_thd_sequences_for_cp(
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    cu_seqlens: torch.Tensor,
    divisibility_factor: int,
    padding_token_id: int = 0,
    padding_label_id: int = -100,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TE's helper: pads each packed sequence of input_ids / labels ([N] or [1, N]) at its end to a
    multiple of divisibility_factor (2 * cp for CP). Returns (input_ids_padded [N'],
    labels_padded [N'], cu_seqlens_padded)."""
    ids = input_ids.reshape(-1) if input_ids.dim() == 2 else input_ids
    lab = labels.reshape(-1) if labels.dim() == 2 else labels
    padded = _padded_lengths(cu_seqlens, divisibility_factor)
    cu_pad = torch.cat((padded.new_zeros(1), padded.cumsum(0))).to(cu_seqlens.dtype)
    total = int(cu_pad[-1])
    # Token t of sequence i moves from cu_seqlens[i] + t to cu_pad[i] + t.
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    seq = torch.repeat_interleave(torch.arange(lens.numel()), lens)
    src = torch.arange(int(cu_seqlens[-1]) - int(cu_seqlens[0])) + int(cu_seqlens[0])
    dst = src - cu_seqlens.long()[seq] + cu_pad.long()[seq]
    out_ids = torch.full((total,), padding_token_id, dtype=ids.dtype, device=ids.device)
    out_lab = torch.full((total,), padding_label_id, dtype=lab.dtype, device=lab.device)
    out_ids[dst.to(ids.device)] = ids[src.to(ids.device)]
    out_lab[dst.to(lab.device)] = lab[src.to(lab.device)]
    return out_ids, out_lab, cu_pad


def generate_positional_ids_for_cp(
    cu_seqlens: torch.Tensor, divisibility_factor: int, dtype: torch.dtype = torch.long
) -> torch.Tensor:
    """TE's helper: position ids 0 .. L' - 1 of each sequence padded as pad_thd_sequences_for_cp
    pads it (the padding continues the count)."""
    padded = _padded_lengths(cu_seqlens, divisibility_factor)
    starts = torch.cat((padded.new_zeros(1), padded.cumsum(0)[:-1]))
    total = int(padded.sum())
    pos = torch.arange(total) - torch.repeat_interleave(starts, padded)
    return pos.to(dtype)


def get_cu_seqlens_on_cp_rank(
    cu_seqlens: torch.Tensor,
    cu_seqlens_padded_on_cp_rank: torch.Tensor,
    cp_size: int,
    cp_rank: int,
    first_half: bool,
    second_half: bool,
) -> torch.Tensor:
    """TE's helper: offsets of the real (unpadded) tokens CP rank cp_rank holds of each sequence
    in its first and / or second chunk. cu_seqlens: the sequences' real global offsets;
    cu_seqlens_padded_on_cp_rank: the rank's padded local offsets (padded global / cp_size), so
    a chunk is half a local sequence. Chunk j of a sequence of L real tokens holds
    min(max(L - j * chunk, 0), chunk) of them (padding sits at each sequence's end)."""
    real = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64)
    chunk = (cu_seqlens_padded_on_cp_rank[1:] - cu_seqlens_padded_on_cp_rank[:-1]).to(
        torch.int64
    ) // 2
    held = torch.zeros_like(real)
    for use, j in ((first_half, cp_rank), (second_half, 2 * cp_size - 1 - cp_rank)):
        if use:
            held += torch.minimum((real - j * chunk).clamp(min=0), chunk)
    out = torch.zeros_like(cu_seqlens)
    out[1:] = held.cumsum(0).to(cu_seqlens.dtype)
    return out


def cp_rank_indices(cu_seqlens_padded: torch.Tensor, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Token indices CP rank cp_rank holds (DualChunkSwap per sequence): for each sequence of
    length L (a multiple of 2 cp), chunks cp_rank and 2 cp - 1 - cp_rank of size L / (2 cp)."""
    cu = cu_seqlens_padded.long().cpu()
    lens = cu[1:] - cu[:-1]
    if bool((lens % (2 * cp_size)).any()):
        raise ValueError(
            f"cu_seqlens_padded: every sequence length must be a multiple of 2 * cp_size = "
            f"{2 * cp_size}, got lengths {lens.tolist()} (pad with pad_thd_sequences_for_cp)"
        )
    idx = []
    for start, n in zip(cu[:-1].tolist(), lens.tolist()):
        c = n // (2 * cp_size)
        for chunk in (cp_rank, 2 * cp_size - 1 - cp_rank):
            idx.append(torch.arange(start + chunk * c, start + (chunk + 1) * c))
    return torch.cat(idx) if idx else torch.zeros(0, dtype=torch.long)


def get_batch_on_this_cp_rank(
    cu_seqlens_padded: torch.Tensor,
    input_ids_padded: torch.Tensor,
    labels_padded: torch.Tensor,
    position_ids_padded: torch.Tensor,
    cp_group: Any = None,
    qvk_format: str = "thd",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TE's helper (thd only, as TE): this CP rank's tokens of a packed batch, chunks r and
    2 cp - 1 - r of every sequence. Each tensor's sequence dim is found by its length
    (cu_seqlens_padded[-1]): dim 0 of a 1-D tensor, else dim 1, else dim 0. cp_group None: the
    default group. With cp size 1 the tensors come back unchanged."""
    if qvk_format not in ("thd", "bshd", "sbhd"):
        raise ValueError(f"get_batch_on_this_cp_rank: qvk_format: unsupported {qvk_format!r}")
    if qvk_format != "thd":
        raise ValueError(
            f"get_batch_on_this_cp_rank: qvk_format={qvk_format!r} is not supported (thd only, as "
            "TE); split bshd / sbhd along the sequence into chunks r and 2 cp - 1 - r"
        )
    cp = torch.distributed.get_world_size(group=cp_group)
    if cp <= 1:
        return input_ids_padded, labels_padded, position_ids_padded
    r = torch.distributed.get_rank(group=cp_group)
    idx = cp_rank_indices(cu_seqlens_padded, cp, r)
    total = int(cu_seqlens_padded[-1])

    def take(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        if t.dim() == 0:
            raise ValueError("get_batch_on_this_cp_rank: expected tensors of at least 1 dim")
        if t.dim() == 1:
            if t.shape[0] != total:
                raise ValueError(
                    f"get_batch_on_this_cp_rank: a 1-D tensor of {t.shape[0]} tokens: expected "
                    f"cu_seqlens_padded[-1] = {total} (inputs in thd format and padded)"
                )
            sd = 0
        elif t.shape[1] == total:
            sd = 1
        elif t.shape[0] == total:
            sd = 0
        else:
            raise ValueError(
                f"get_batch_on_this_cp_rank: shape {tuple(t.shape)}: no dim of length "
                f"cu_seqlens_padded[-1] = {total} (inputs in thd format and padded)"
            )
        return t.index_select(sd, idx.to(t.device))

    return take(input_ids_padded), take(labels_padded), take(position_ids_padded)

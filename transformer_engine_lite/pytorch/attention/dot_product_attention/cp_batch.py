"""TE's context-parallel batch helpers (attention.dot_product_attention.context_parallel's
pad_thd_sequences_for_cp, generate_positional_ids_for_cp, get_cu_seqlens_on_cp_rank,
get_batch_on_this_cp_rank), and cp_rank_indices, the DualChunkSwap token indices they share
with tex.thd_get_partitioned_indices. Re-exported by context_parallel.py."""

from __future__ import annotations

from typing import Any

import torch

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

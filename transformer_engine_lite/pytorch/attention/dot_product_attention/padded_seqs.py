"""Padding between packed (thd) sequences, TE's cu_seqlens_*_padded / pad_between_seqs, for
DotProductAttention without context parallelism (context_parallel.py handles it per chunk).

Sequence i's tokens start at cu_seqlens_padded[i] and its cu_seqlens[i + 1] - cu_seqlens[i]
real tokens come first; the rest up to cu_seqlens_padded[i + 1] is padding. The attention runs
on the real tokens gathered (offsets cu_seqlens) and its output is scattered back, with zeros
in the padding rows, as TE's kernels write them; the gather's backward gives the padding zero
gradients.
"""

from __future__ import annotations

import torch


def offsets_differ(cu: torch.Tensor | None, padded: torch.Tensor | None) -> bool:
    """Whether padded offsets are given and differ from the real ones (padding present; padded
    offsets without real ones count as differing: the real lengths are unknown)."""
    if padded is None:
        return False
    if cu is None:
        return True
    return padded.shape != cu.shape or not torch.equal(padded.to(cu.device, cu.dtype), cu)


def real_token_index(
    owner: str, name: str, cu: torch.Tensor, padded: torch.Tensor, total: int
) -> torch.Tensor:
    """Indices (int64, in order) of the real tokens of a thd tensor of `total` rows (padded
    None: no padding between the sequences, the tokens of cu[0] .. cu[-1])."""
    if cu is None:
        raise ValueError(f"{owner}: {name}_padded given without {name} (the real offsets)")
    if padded is None:
        return torch.arange(int(cu[0]), int(cu[-1]), device=cu.device)
    if not isinstance(padded, torch.Tensor) or padded.shape != cu.shape:
        raise ValueError(
            f"{owner}: {name}_padded: expected a tensor of {name}'s shape {tuple(cu.shape)}, got "
            f"{padded if not isinstance(padded, torch.Tensor) else tuple(padded.shape)}"
        )
    cu64, pad64 = cu.to(torch.int64).cpu(), padded.to(torch.int64).cpu()
    real, room = cu64[1:] - cu64[:-1], pad64[1:] - pad64[:-1]
    if bool((real < 0).any()) or bool((real > room).any()) or int(pad64[-1]) > total:
        raise ValueError(
            f"{owner}: {name} {cu64.tolist()} / {name}_padded {pad64.tolist()}: expected each "
            f"sequence's length within its padded length, and {name}_padded[-1] <= {total} "
            "(the tokens given)"
        )
    seq = torch.repeat_interleave(torch.arange(real.numel()), real)
    start = torch.cat((real.new_zeros(1), real.cumsum(0)[:-1]))
    idx = torch.arange(int(real.sum())) - start[seq] + pad64[:-1][seq]
    return idx.to(cu.device)


def scatter_rows(out: torch.Tensor, idx: torch.Tensor, total: int) -> torch.Tensor:
    """out's rows back at idx among `total` zero rows (differentiable)."""
    full = out.new_zeros((total, *out.shape[1:]))
    return full.index_copy(0, idx, out)

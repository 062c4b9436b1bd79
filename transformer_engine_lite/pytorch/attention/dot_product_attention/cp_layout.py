"""Where a CP rank's two sequence chunks lie in its tensors, for the ring and the all-to-all
(context_parallel.py's parts): DenseLayout for bshd / sbhd (one sequence length, the two chunks
are the first and second half of the sequence dim), ThdLayout for thd (every packed sequence is
split into 2 cp chunks; the rank holds two of each, so a "half" is a gather of every sequence's
first or second half).

The ring keeps its running softmax LSE "row-major": one fp32 value per output row and head,
[b, s, h] / [s, b, h] / [t, h] (the output's shape without d_v), so a merge weight broadcasts
against the output directly. lse_in / lse_out convert from / to the kernel's [b, h, max_s_q].
"""

from __future__ import annotations

import torch

_ops = torch.ops.te_lite


def _fused_fwd(q, k, v, fmt, cu_q, cu_kv, max_q, max_kv, mask, window, scale, st, off,  # noqa
               bias=None):
    # the op's forward with is_training (the LSE is returned); differentiable through its autograd
    bias_type = "no_bias" if bias is None else "post_scale_bias"
    return _ops.fused_attn_fwd(
        q, k, v, f"{fmt}_{fmt}_{fmt}", bias, cu_q, cu_kv, max_q, max_kv, scale, 0.0, None,
        bias_type, mask, window[0], window[1], True, st, off,
    )  # fmt: skip


class DenseLayout:
    """bshd / sbhd: chunks = halves of the sequence dim (length s, even)."""

    def __init__(self, fmt: str, s: int) -> None:
        self.fmt = fmt
        self.sdim = 1 if fmt == "bshd" else 0
        self.s = s

    def mask(self, causal: bool) -> str:
        return "causal" if causal else "no_mask"

    def half(self, x: torch.Tensor, which: int | None) -> torch.Tensor:
        """x's rows of one half (0 / 1), contiguous; which None: x itself."""
        if which is None:
            return x
        n = self.s // 2
        return x.narrow(self.sdim, which * n, n).contiguous()

    def put(self, dst: torch.Tensor, which: int | None, val: torch.Tensor) -> None:
        (dst if which is None else dst.narrow(self.sdim, which * (self.s // 2), self.s // 2)).copy_(
            val
        )

    def add(self, dst: torch.Tensor, which: int | None, val: torch.Tensor) -> None:
        n = self.s // 2
        (dst if which is None else dst.narrow(self.sdim, which * n, n)).add_(val)

    def lse_in(self, lse: torch.Tensor, which: int | None) -> torch.Tensor:
        return lse.permute(0, 2, 1) if self.fmt == "bshd" else lse.permute(2, 0, 1)

    def lse_out(self, lse: torch.Tensor, which: int | None) -> torch.Tensor:
        return (lse.permute(0, 2, 1) if self.fmt == "bshd" else lse.permute(1, 2, 0)).contiguous()

    def lse_empty(self, q: torch.Tensor) -> torch.Tensor:
        return torch.full(q.shape[:-1], -torch.inf, dtype=torch.float32, device=q.device)

    def for_rank(self, src: int) -> DenseLayout:
        """The layout of ring rank src's K/V chunks: the same shapes on every rank."""
        del src
        return self

    def attn_fwd(  # noqa
        self, q, k, v, q_which, kv_which, mask, window, scale, st="vanilla", off=None,
        kv_layout=None, bias=None,
    ):  # fmt: skip
        sq, skv = q.shape[self.sdim], k.shape[self.sdim]
        return _fused_fwd(
            q, k, v, self.fmt, None, None, sq, skv, mask, window, scale, st, off, bias
        )

    def attn_bwd(  # noqa
        self, q, k, v, out, dout, lse, q_which, kv_which, mask, scale, kv_layout=None, bias=None
    ):
        sq, skv = q.shape[self.sdim], k.shape[self.sdim]
        return _fused_bwd(
            q, k, v, out, dout, lse, self.fmt, None, None, sq, skv, mask, scale, bias
        )


def _fused_bwd(q, k, v, out, dout, lse, fmt, cu_q, cu_kv, max_q, max_kv, mask, scale,  # noqa
               bias=None):
    # the op's backward given the global out / LSE of q's rows (cp_comm's contract); dbias is
    # the step's share of the bias gradient (None without a bias)
    bias_type = "no_bias" if bias is None else "post_scale_bias"
    dq, dk, dv, dbias, _ = _ops.fused_attn_bwd(
        q, k, v, out, dout, lse, f"{fmt}_{fmt}_{fmt}", bias, cu_q, cu_kv, max_q, max_kv, scale,
        0.0, None, bias_type, mask, -1, 0 if "causal" in mask else -1,
        torch.are_deterministic_algorithms_enabled(),
    )  # fmt: skip
    return dq, dk, dv, (None if bias is None else dbias)


class ThdLayout:
    """thd: this rank's tokens of every sequence i, [cu[i], cu[i + 1]) (local offsets, each
    length even: the sequence's two chunks). A half of sequence i is [cu[i], cu[i] + len / 2)
    or the rest; the halves of all sequences packed give a thd tensor with offsets cu / 2.

    Padding between sequences (TE's pad_between_seqs): `real` holds each sequence's real
    (unpadded) global length; its padding sits at the sequence's end, so of a ring of
    `ring_size` ranks, rank `ring_rank`'s chunk j (global chunk index) holds the first
    clamp(real - j C, 0, C) of its C tokens. Then every "half" (and the whole, which=None) is a
    gather of the real tokens only, with the real tokens' offsets; padding rows get no output
    (0), an LSE of -inf and zero gradients, as TE's kernels leave them."""

    fmt = "thd"
    sdim = 0

    def __init__(
        self,
        cu: torch.Tensor,
        real: torch.Tensor | None = None,
        ring_rank: int = 0,
        ring_size: int = 1,
    ) -> None:
        cu = cu.to(torch.int64)
        self._args = (cu, real, ring_size)
        self._ranks: dict[int, ThdLayout] = {}
        lens = cu[1:] - cu[:-1]
        if bool((lens % 2).any()):
            raise ValueError(
                f"thd: local sequence lengths {lens.tolist()}: expected even numbers (two chunks "
                "per rank: every padded sequence length must divide by 2 * cp)"
            )
        self.b = lens.numel()
        self.t = int(cu[-1])
        dev = cu.device
        half = lens // 2
        seq = torch.repeat_interleave(torch.arange(self.b, device=dev), lens)
        pos = torch.arange(self.t, device=dev) - cu[seq]
        first = pos < half[seq]
        if real is None:
            held = (half, half)
        else:
            real = real.to(device=dev, dtype=torch.int64)
            chunks = (ring_rank, 2 * ring_size - 1 - ring_rank)
            held = tuple(torch.minimum((real - j * half).clamp(min=0), half) for j in chunks)
        # a token is real when its position in its chunk is below the chunk's real count
        in_chunk = torch.where(first, pos, pos - half[seq])
        keep = in_chunk < torch.where(first, held[0][seq], held[1][seq])
        self.padded = real is not None and not bool(keep.all())
        sel = {0: (first & keep).nonzero().flatten(), 1: (~first & keep).nonzero().flatten()}
        self.idx = {0: sel[0], 1: sel[1], None: keep.nonzero().flatten() if self.padded else None}
        i32 = torch.int32
        counts = {0: held[0], 1: held[1], None: held[0] + held[1]}
        self.cu, self.max, self.rows = {}, {}, {}
        for which, n in counts.items():
            self.cu[which] = torch.cat((n.new_zeros(1), n.cumsum(0))).to(i32)
            self.max[which] = int(n.max()) if self.b else 0
        # (sequence, position in the kernel's LSE rows) of every row of a full / half tensor
        self.rows[0] = (seq[sel[0]], in_chunk[sel[0]])
        self.rows[1] = (seq[sel[1]], in_chunk[sel[1]])
        rows_all = keep.nonzero().flatten()
        # in the stripped whole, a second-chunk token follows its sequence's real first chunk
        pos_all = torch.where(first, pos, held[0][seq] + pos - half[seq])
        self.rows[None] = (seq[rows_all], pos_all[rows_all])

    def for_rank(self, src: int) -> ThdLayout:
        """The layout of ring rank src's K/V chunks (their real counts differ per rank when
        sequences are padded; the same layout otherwise)."""
        cu, real, ring_size = self._args
        if real is None:
            return self
        if src not in self._ranks:
            self._ranks[src] = ThdLayout(cu, real, src, ring_size)
        return self._ranks[src]

    def mask(self, causal: bool) -> str:
        return "padding_causal" if causal else "padding"

    def half(self, x: torch.Tensor, which: int | None) -> torch.Tensor:
        i = self.idx[which]
        return x if i is None else x.index_select(0, i)

    def put(self, dst: torch.Tensor, which: int | None, val: torch.Tensor) -> None:
        i = self.idx[which]
        if i is None:
            dst.copy_(val)
        else:
            dst.index_copy_(0, i, val)

    def add(self, dst: torch.Tensor, which: int | None, val: torch.Tensor) -> None:
        i = self.idx[which]
        if i is None:
            dst.add_(val)
        else:
            dst.index_add_(0, i, val)

    def scatter(self, val: torch.Tensor, rows: int) -> torch.Tensor:
        """The whole's rows `val` (real tokens) back at their places among `rows` rows, zeros
        at the padding (differentiable: the padding's gradient is dropped)."""
        if self.idx[None] is None:
            return val
        out = val.new_zeros((rows, *val.shape[1:]))
        return out.index_copy(0, self.idx[None], val)

    def lse_in(self, lse: torch.Tensor, which: int | None) -> torch.Tensor:
        seq, pos = self.rows[which]
        return lse[seq, :, pos]  # [rows, h]

    def lse_out(self, lse: torch.Tensor, which: int | None) -> torch.Tensor:
        seq, pos = self.rows[which]
        out = lse.new_full((self.b, lse.shape[-1], max(self.max[which], 1)), -torch.inf)
        out[seq, :, pos] = lse
        return out

    def lse_empty(self, q: torch.Tensor) -> torch.Tensor:
        return torch.full(q.shape[:-1], -torch.inf, dtype=torch.float32, device=q.device)

    def attn_fwd(  # noqa
        self, q, k, v, q_which, kv_which, mask, window, scale, st="vanilla", off=None,
        kv_layout=None, bias=None,
    ):  # fmt: skip
        kl = kv_layout or self
        return _fused_fwd(
            q, k, v, "thd", self.cu[q_which], kl.cu[kv_which], self.max[q_which],
            kl.max[kv_which], mask, window, scale, st, off, bias,
        )  # fmt: skip

    def attn_bwd(  # noqa
        self, q, k, v, out, dout, lse, q_which, kv_which, mask, scale, kv_layout=None, bias=None
    ):
        kl = kv_layout or self
        return _fused_bwd(
            q, k, v, out, dout, lse, "thd", self.cu[q_which], kl.cu[kv_which],
            self.max[q_which], kl.max[kv_which], mask, scale, bias,
        )  # fmt: skip


def thd_a2a_perm(cu_local: torch.Tensor, a: int) -> torch.Tensor:
    """For the all-to-all over a group of a ranks in thd: the rows of the a received blocks
    (rank-major, each with this rank's token layout `cu_local`) in sequence order: per sequence,
    every rank's first chunk in rank order, then every rank's second chunk in reverse rank order
    (DualChunkSwap). The result has offsets a * cu_local."""
    cu = cu_local.to(torch.int64).tolist()
    t = cu[-1]
    parts = []
    for i in range(len(cu) - 1):
        n = (cu[i + 1] - cu[i]) // 2
        parts += [torch.arange(j * t + cu[i], j * t + cu[i] + n) for j in range(a)]
        parts += [torch.arange(j * t + cu[i] + n, j * t + cu[i + 1]) for j in reversed(range(a))]
    return torch.cat(parts).to(cu_local.device) if parts else torch.zeros(0, dtype=torch.int64)

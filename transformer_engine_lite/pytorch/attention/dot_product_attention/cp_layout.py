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


def _fused_fwd(q, k, v, fmt, cu_q, cu_kv, max_q, max_kv, mask, window, scale, st, off):  # noqa
    # the op's forward with is_training (the LSE is returned); differentiable through its autograd
    return _ops.fused_attn_fwd(
        q, k, v, f"{fmt}_{fmt}_{fmt}", None, cu_q, cu_kv, max_q, max_kv, scale, 0.0, None,
        "no_bias", mask, window[0], window[1], True, st, off,
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

    def attn_fwd(  # noqa
        self, q, k, v, q_which, kv_which, mask, window, scale, st="vanilla", off=None
    ):
        sq, skv = q.shape[self.sdim], k.shape[self.sdim]
        return _fused_fwd(q, k, v, self.fmt, None, None, sq, skv, mask, window, scale, st, off)

    def attn_bwd(self, q, k, v, out, dout, lse, q_which, kv_which, mask, scale):  # noqa
        sq, skv = q.shape[self.sdim], k.shape[self.sdim]
        return _fused_bwd(q, k, v, out, dout, lse, self.fmt, None, None, sq, skv, mask, scale)


def _fused_bwd(q, k, v, out, dout, lse, fmt, cu_q, cu_kv, max_q, max_kv, mask, scale):  # noqa
    # the op's backward given the global out / LSE of q's rows (cp_comm's contract)
    dq, dk, dv, _, _ = _ops.fused_attn_bwd(
        q, k, v, out, dout, lse, f"{fmt}_{fmt}_{fmt}", None, cu_q, cu_kv, max_q, max_kv, scale,
        0.0, None, "no_bias", mask, -1, 0 if "causal" in mask else -1,
        torch.are_deterministic_algorithms_enabled(),
    )  # fmt: skip
    return dq, dk, dv


class ThdLayout:
    """thd: this rank's tokens of every sequence i, [cu[i], cu[i + 1]) (local offsets, each
    length even: the sequence's two chunks). A half of sequence i is [cu[i], cu[i] + len / 2)
    or the rest; the halves of all sequences packed give a thd tensor with offsets cu / 2."""

    fmt = "thd"
    sdim = 0

    def __init__(self, cu: torch.Tensor) -> None:
        cu = cu.to(torch.int64)
        lens = cu[1:] - cu[:-1]
        if bool((lens % 2).any()):
            raise ValueError(
                f"thd: local sequence lengths {lens.tolist()}: expected even numbers (two chunks "
                "per rank: every padded sequence length must divide by 2 * cp)"
            )
        self.b = lens.numel()
        self.t = int(cu[-1])
        dev = cu.device
        seq = torch.repeat_interleave(torch.arange(self.b, device=dev), lens)
        pos = torch.arange(self.t, device=dev) - cu[seq]
        first = pos < (lens // 2)[seq]
        self.idx = {0: first.nonzero().flatten(), 1: (~first).nonzero().flatten()}
        half_cu = cu // 2
        i32 = torch.int32
        self.cu = {None: cu.to(i32), 0: half_cu.to(i32), 1: half_cu.to(i32)}
        self.max = {None: int(lens.max()) if self.b else 0}
        self.max[0] = self.max[1] = self.max[None] // 2
        # (sequence, position in the kernel's LSE rows) of every row of a full / half tensor
        self.rows = {None: (seq, pos), 0: (seq[self.idx[0]], pos[self.idx[0]])}
        self.rows[1] = (seq[self.idx[1]], pos[self.idx[1]] - (lens // 2)[seq[self.idx[1]]])

    def mask(self, causal: bool) -> str:
        return "padding_causal" if causal else "padding"

    def half(self, x: torch.Tensor, which: int | None) -> torch.Tensor:
        return x if which is None else x.index_select(0, self.idx[which])

    def put(self, dst: torch.Tensor, which: int | None, val: torch.Tensor) -> None:
        if which is None:
            dst.copy_(val)
        else:
            dst.index_copy_(0, self.idx[which], val)

    def add(self, dst: torch.Tensor, which: int | None, val: torch.Tensor) -> None:
        if which is None:
            dst.add_(val)
        else:
            dst.index_add_(0, self.idx[which], val)

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
        self, q, k, v, q_which, kv_which, mask, window, scale, st="vanilla", off=None
    ):
        return _fused_fwd(
            q, k, v, "thd", self.cu[q_which], self.cu[kv_which], self.max[q_which],
            self.max[kv_which], mask, window, scale, st, off,
        )  # fmt: skip

    def attn_bwd(self, q, k, v, out, dout, lse, q_which, kv_which, mask, scale):  # noqa
        return _fused_bwd(
            q, k, v, out, dout, lse, "thd", self.cu[q_which], self.cu[kv_which],
            self.max[q_which], self.max[kv_which], mask, scale,
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

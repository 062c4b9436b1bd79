"""Rotary position embedding (RoPE): TE's RotaryPositionEmbedding and apply_rotary_pos_emb.

RotaryPositionEmbedding(...)(max_seq_len) gives fp32 angles [s, 1, 1, d2]; apply_rotary_pos_emb
rotates the first d2 features of every head of a [s, b, h, d] (sbhd), [b, s, h, d] (bshd) or
[t, h, d] (thd, with cu_seqlens) tensor by the angles of the token's position and passes the other
d - d2 features through. Per feature j with angle f[j] and partner feature k:

    out[j] = x[j] * cos(f[j]) + rot(x)[j] * sin(f[j])

where rot is TE's rotate_half: non-interleaved, the halves (x1, x2) of the d2 features become
(-x2, x1); interleaved, each adjacent pair (x[2i], x[2i+1]) becomes (-x[2i+1], x[2i]).

The token at local index p of a sequence of local length L uses the angles of row
p + start_positions[seq] of freqs (start_positions: KV-cache decoding, a sequence continuing at
that position), and with context parallelism (cp_size > 1) TE's dual-chunk rows: this rank holds
chunks cp_rank and 2 * cp_size - 1 - cp_rank of the full sequence of cp_size * L tokens, so its
first L/2 tokens add cp_rank * L/2 and the others cp_size * L - (cp_rank + 2) * L/2.

fused=False is TE's framework math (cos/sin cast to t's dtype, products in t's dtype; t may be any
floating dtype, fp64 included); fused=True runs the te_lite.fused_rope_fwd/bwd kernels (fp32, fp16,
bf16 tensors; fp32 freqs; int32 start_positions; computed in fp32) and gives no gradient to freqs.
Differences from TE: seq_len_interpolation_factor alone applies the fixed linear interpolation (TE
ignores it without pretrained_max_position_embeddings); thd tokens past cu_seqlens[-1] / cp_size
are passed through unchanged; rows outside freqs are a ValueError (RuntimeError from the fused
op) on both paths; apply_fused_qkv_rotary_pos_emb also takes start_positions with cp_size > 1.
"""

from __future__ import annotations

import itertools

import torch

__all__ = ["RotaryPositionEmbedding", "apply_fused_qkv_rotary_pos_emb", "apply_rotary_pos_emb"]

TENSOR_FORMATS = ("sbhd", "bshd", "thd")
FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class RotaryPositionEmbedding(torch.nn.Module):
    """Angles of rotary position embeddings (https://arxiv.org/abs/2104.09864), TE's module.

    Parameters
    ----------
    dim: head dimension the embedding is sized for.
    rotary_percent: fraction of `dim` that is rotated (d2 = 2 * ceil(int(dim * percent) / 2)).
    seq_len_interpolation_factor: positions are divided by this factor (position interpolation,
        https://arxiv.org/abs/2306.15595). With pretrained_max_position_embeddings, sequences
        longer than pretrained_max_position_embeddings * factor are instead squeezed into the
        pretrained range (positions * pretrained_max_position_embeddings / max_seq_len).
    pretrained_max_position_embeddings: see above; only used together with the factor.
    rotary_base: base of the geometric series of inverse frequencies.
    interleaved: the angle layout: each angle repeated for an adjacent feature pair instead of the
        angle vector concatenated twice.
    """

    def __init__(
        self,
        dim: int,
        rotary_percent: float = 1.0,
        seq_len_interpolation_factor: float | None = None,
        pretrained_max_position_embeddings: int | None = None,
        rotary_base: float = 10000.0,
        interleaved: bool = False,
    ) -> None:
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
            raise ValueError(f"RotaryPositionEmbedding: dim must be a positive int, got {dim!r}")
        if not 0.0 < rotary_percent <= 1.0:
            raise ValueError(
                f"RotaryPositionEmbedding: rotary_percent must be in (0, 1], got {rotary_percent}"
            )
        if not rotary_base > 0.0:
            raise ValueError(f"RotaryPositionEmbedding: rotary_base must be > 0, got {rotary_base}")
        if seq_len_interpolation_factor is not None and not seq_len_interpolation_factor > 0:
            raise ValueError(
                "RotaryPositionEmbedding: seq_len_interpolation_factor must be > 0, got "
                f"{seq_len_interpolation_factor}"
            )
        if (
            pretrained_max_position_embeddings is not None
            and pretrained_max_position_embeddings <= 0
        ):
            raise ValueError(
                "RotaryPositionEmbedding: pretrained_max_position_embeddings must be > 0, got "
                f"{pretrained_max_position_embeddings}"
            )
        rot_dim = int(dim * rotary_percent) if rotary_percent < 1.0 else dim
        if rot_dim < 1:
            raise ValueError(
                f"RotaryPositionEmbedding: dim * rotary_percent = {dim * rotary_percent} leaves no "
                "feature to rotate"
            )
        self.dim = dim
        self.rotary_percent = rotary_percent
        self.seq_len_interpolation_factor = seq_len_interpolation_factor
        self.pretrained_max_position_embeddings = pretrained_max_position_embeddings
        self.rotary_base = rotary_base
        self.interleaved = interleaved
        # theta_i = base^(-2i / rot_dim) for i < ceil(rot_dim / 2). A persistent buffer, as in TE,
        # so checkpoints carry it.
        exponents = torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim
        self.register_buffer("inv_freq", 1.0 / (rotary_base**exponents))

    def forward(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        """fp32 angles [max_seq_len, 1, 1, d2] of positions offset .. offset + max_seq_len - 1."""
        if max_seq_len < 0:
            raise ValueError(
                f"RotaryPositionEmbedding: max_seq_len must be >= 0, got {max_seq_len}"
            )
        seq = torch.arange(max_seq_len, device=self.inv_freq.device, dtype=torch.float32) + offset
        factor = self.seq_len_interpolation_factor
        if factor is not None:
            pretrained = self.pretrained_max_position_embeddings
            if pretrained is not None and max_seq_len > pretrained * factor:
                seq = seq * (pretrained / max_seq_len)  # dynamic: longer than was learned
            else:
                seq = seq / factor  # fixed linear interpolation
        angles = torch.outer(seq, self.inv_freq.float())
        if self.interleaved:
            emb = angles.repeat_interleave(2, dim=-1)  # [t0, t0, t1, t1, ...]
        else:
            emb = torch.cat((angles, angles), dim=-1)  # [t0, t1, ..., t0, t1, ...]
        return emb.reshape(max_seq_len, 1, 1, emb.shape[-1])

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, rotary_percent={self.rotary_percent}, "
            f"rotary_base={self.rotary_base}, interleaved={self.interleaved}"
        )


def _check_args(
    t: torch.Tensor,
    freqs: torch.Tensor,
    tensor_format: str,
    cu_seqlens: torch.Tensor | None,
    start_positions: torch.Tensor | None,
    cp_size: int,
    cp_rank: int,
) -> None:
    """The checks both paths share (the fused op repeats them in C++ and adds the value checks)."""
    if tensor_format not in TENSOR_FORMATS:
        raise ValueError(
            f"apply_rotary_pos_emb: tensor_format must be one of {TENSOR_FORMATS}, "
            f"got {tensor_format!r}"
        )
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise TypeError(f"apply_rotary_pos_emb: t must be a floating-point tensor, got {t!r:.60}")
    if not isinstance(freqs, torch.Tensor) or not freqs.is_floating_point():
        raise TypeError("apply_rotary_pos_emb: freqs must be a floating-point tensor")
    ndim = 3 if tensor_format == "thd" else 4
    if t.dim() != ndim:
        raise ValueError(
            f"apply_rotary_pos_emb: a {tensor_format} t must be {ndim}-D, got shape "
            f"{tuple(t.shape)}"
        )
    if freqs.dim() != 4 or freqs.shape[1] != 1 or freqs.shape[2] != 1:
        raise ValueError(
            f"apply_rotary_pos_emb: freqs must be [s, 1, 1, d2], got shape {tuple(freqs.shape)}"
        )
    d2, d = freqs.shape[-1], t.shape[-1]
    if d2 % 2 != 0 or d2 > d:
        raise ValueError(
            f"apply_rotary_pos_emb: freqs' last dim d2 must be even and <= t's head dim {d}, "
            f"got {d2}"
        )
    if freqs.device != t.device:
        raise ValueError(f"apply_rotary_pos_emb: freqs is on {freqs.device} but t is on {t.device}")
    for name, v in (("cp_size", cp_size), ("cp_rank", cp_rank)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"apply_rotary_pos_emb: {name} must be an int, got {v!r}")
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise ValueError(
            f"apply_rotary_pos_emb: expected cp_size >= 1 and 0 <= cp_rank < cp_size, got "
            f"cp_size={cp_size}, cp_rank={cp_rank}"
        )
    if tensor_format == "thd":
        if cu_seqlens is None:
            raise ValueError("apply_rotary_pos_emb: tensor_format 'thd' needs cu_seqlens")
        if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
            raise ValueError(
                "apply_rotary_pos_emb: cu_seqlens must be int32 [b + 1], got "
                f"{cu_seqlens.dtype} {tuple(cu_seqlens.shape)}"
            )
        if cu_seqlens.device != t.device:
            raise ValueError(
                f"apply_rotary_pos_emb: cu_seqlens is on {cu_seqlens.device} but t is on {t.device}"
            )
        batch = cu_seqlens.numel() - 1
    else:
        s = t.shape[1] if tensor_format == "bshd" else t.shape[0]
        if s * cp_size > freqs.shape[0]:
            raise ValueError(
                f"apply_rotary_pos_emb: t has {s} positions (x cp_size {cp_size}) but freqs only "
                f"{freqs.shape[0]}"
            )
        if cp_size > 1 and s % 2:
            raise ValueError(
                f"apply_rotary_pos_emb: with cp_size > 1 the local sequence length must be even "
                f"(two chunks), got {s}"
            )
        batch = t.shape[0] if tensor_format == "bshd" else t.shape[1]
    if start_positions is not None:
        if (
            not isinstance(start_positions, torch.Tensor)
            or start_positions.dtype.is_floating_point
            or start_positions.dtype.is_complex
            or start_positions.dtype == torch.bool
            or tuple(start_positions.shape) != (batch,)
        ):
            raise ValueError(
                f"apply_rotary_pos_emb: start_positions must be an integer tensor [{batch}] (one "
                f"offset per sequence), got {start_positions!r:.80}"
            )
        if start_positions.device != t.device:
            raise ValueError(
                f"apply_rotary_pos_emb: start_positions is on {start_positions.device} but t is "
                f"on {t.device}"
            )


def _rotate_half(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    if not interleaved:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    pairs = x.unflatten(-1, (-1, 2))
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)


def _rotate(t: torch.Tensor, angles: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """TE's framework math: angles broadcast against t[..., :d2]; products in t's dtype."""
    d2 = angles.shape[-1]
    x, rest = t[..., :d2], t[..., d2:]
    cos, sin = torch.cos(angles).to(t.dtype), torch.sin(angles).to(t.dtype)
    out = x * cos + _rotate_half(x, interleaved) * sin
    # torch.cat gives a contiguous result (as TE's) whatever layout the broadcast picked.
    return torch.cat((out, rest), dim=-1)


def _rows(
    pos: torch.Tensor, length: torch.Tensor | int, start: torch.Tensor | None, cp: int, rank: int
) -> torch.Tensor:
    """Rows of freqs for local positions `pos` of sequences of local length `length` (see the
    module docstring): the shift, the context-parallel chunk offsets, then start_positions."""
    rows = pos
    if cp > 1:
        half = length // 2
        rows = torch.where(pos < half, pos + rank * half, pos + cp * length - (rank + 2) * half)
    return rows if start is None else rows + start


def _check_rows(start: torch.Tensor | None, full_lengths: torch.Tensor | int, rows: int) -> None:
    """TE's bound: every sequence's rows start_positions[i] .. + cp_size * L - 1 lie in freqs."""
    if isinstance(full_lengths, torch.Tensor) and full_lengths.numel() == 0:
        return  # no sequence
    start = torch.zeros(1, dtype=torch.long) if start is None else start.to("cpu", torch.long)
    end = start + (full_lengths.cpu() if isinstance(full_lengths, torch.Tensor) else full_lengths)
    if start.numel() and (int(start.min()) < 0 or int(end.max()) > rows):
        raise ValueError(
            f"apply_rotary_pos_emb: start_positions {start.tolist()} with sequences of "
            f"{full_lengths if isinstance(full_lengths, int) else full_lengths.tolist()} tokens "
            f"need rows outside freqs' {rows} (expected 0 <= start, start + tokens <= {rows})"
        )


def _thd_rows(
    cu_seqlens: torch.Tensor,
    tokens: int,
    freq_rows: int,
    start_positions: torch.Tensor | None,
    cp_size: int,
    cp_rank: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row of freqs of each token, whether it lies in a sequence) of a thd tensor whose sequence
    i holds this rank's tokens cu_seqlens[i] / cp_size .. cu_seqlens[i + 1] / cp_size - 1."""
    host = cu_seqlens.tolist()  # the value checks need the host, as TE's framework path does
    if host[0] != 0 or any(b < a for a, b in itertools.pairwise(host)):
        raise ValueError(
            f"apply_rotary_pos_emb: cu_seqlens must start at 0 and never decrease, got {host}"
        )
    local = [c // cp_size for c in host]
    if local[-1] > tokens:
        raise ValueError(
            f"apply_rotary_pos_emb: cu_seqlens[-1] / cp_size = {local[-1]} exceeds t's {tokens} "
            "tokens"
        )
    lengths = [b - a for a, b in itertools.pairwise(local)]
    if cp_size > 1 and any(n % 2 for n in lengths):
        raise ValueError(
            "apply_rotary_pos_emb: with cp_size > 1 every sequence needs an even number of local "
            f"tokens (two chunks), got {lengths}"
        )
    _check_rows(start_positions, torch.tensor([n * cp_size for n in lengths]), freq_rows)
    cu = torch.tensor(local, device=cu_seqlens.device)
    token = torch.arange(tokens, device=cu.device)
    seq = torch.searchsorted(cu[1:], token, right=True).clamp(max=max(len(lengths) - 1, 0))
    inside = token < cu[-1]
    if not lengths:
        return torch.zeros_like(token), inside
    pos, length = token - cu[seq], (cu[1:] - cu[:-1])[seq]
    start = None if start_positions is None else start_positions.to(torch.long)[seq]
    return torch.where(inside, _rows(pos, length, start, cp_size, cp_rank), 0), inside


def apply_rotary_pos_emb(
    t: torch.Tensor,
    freqs: torch.Tensor,
    tensor_format: str = "sbhd",
    start_positions: torch.Tensor | None = None,
    interleaved: bool = False,
    fused: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cp_size: int = 1,
    cp_rank: int = 0,
) -> torch.Tensor:
    """Rotates the first freqs.shape[-1] features of each head of `t` by the angles in `freqs`.

    t: [s, b, h, d] (sbhd), [b, s, h, d] (bshd) or [t, h, d] (thd). freqs: [s_max, 1, 1, d2],
    d2 even and <= d; position i of sequence j uses row i + start_positions[j] (shifted per the
    context-parallel chunk when cp_size > 1, see the module docstring), which must lie in freqs.
    start_positions: integer [b] (int32 when fused), or None for 0. cu_seqlens: int32 [b + 1]
    token offsets of the thd sequences (positions restart at 0 in each; with cp_size > 1 the
    offsets of the whole sequences, this rank holding cu_seqlens / cp_size); ignored for sbhd and
    bshd, as in TE. Returns a tensor of t's shape and dtype.
    """
    _check_args(t, freqs, tensor_format, cu_seqlens, start_positions, cp_size, cp_rank)
    if tensor_format != "thd":
        cu_seqlens = None  # TE ignores it for sbhd / bshd
    if fused:
        if freqs.dtype != torch.float32:
            raise TypeError(
                f"apply_rotary_pos_emb: fused=True needs float32 freqs, got {freqs.dtype}"
            )
        if t.dtype not in FUSED_DTYPES:
            raise TypeError(
                f"apply_rotary_pos_emb: fused=True takes t in {FUSED_DTYPES}, got {t.dtype}"
            )
        # torch.ops.te_lite is registered by transformer_engine_lite.pytorch (te_lite_ops.py).
        return torch.ops.te_lite.fused_rope_fwd(
            t, freqs, tensor_format, interleaved, cu_seqlens, start_positions, cp_size, cp_rank
        )
    if tensor_format != "thd":
        s = t.shape[1] if tensor_format == "bshd" else t.shape[0]
        if start_positions is None and cp_size == 1:  # the plain slice, broadcast over b
            angles = freqs[:s]
            return _rotate(t, angles.transpose(0, 1) if tensor_format == "bshd" else angles,
                           interleaved)
        _check_rows(start_positions, s * cp_size, freqs.shape[0])
        pos = torch.arange(s, device=t.device)[:, None]  # [s, 1] against start [b]
        start = None if start_positions is None else start_positions.to(torch.long)
        batch = t.shape[0] if tensor_format == "bshd" else t.shape[1]
        rows = _rows(pos, s, start, cp_size, cp_rank).expand(s, batch)
        angles = freqs[rows.reshape(-1)].reshape(*rows.shape, 1, freqs.shape[-1])  # [s, b, 1, d2]
        return _rotate(t, angles.transpose(0, 1) if tensor_format == "bshd" else angles,
                       interleaved)
    rows, inside = _thd_rows(cu_seqlens, t.shape[0], freqs.shape[0], start_positions, cp_size,
                             cp_rank)
    if freqs.shape[0] == 0:  # every sequence is empty: nothing to rotate, nothing to index
        return t.clone()
    out = _rotate(t, freqs[rows].squeeze(1), interleaved)  # angles [t, 1, d2]
    return torch.where(inside[:, None, None], out, t)


def apply_fused_qkv_rotary_pos_emb(
    qkv: torch.Tensor,
    q_freqs: torch.Tensor,
    k_freqs: torch.Tensor,
    qkv_split_arg_list: list[int],
    tensor_format: str = "sbhd",
    start_positions: torch.Tensor | None = None,
    interleaved: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cp_size: int = 1,
    cp_rank: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TE's RoPE on a fused QKV projection: qkv [s, b, g, q + k + v] (sbhd) or [b, s, g, ...]
    (bshd), each of the g groups holding its q heads, then one k and one v head, concatenated in
    the last dim as qkv_split_arg_list = [q, k, v] elements (q a multiple of k; k is the head dim).
    Returns (q [.., g * q / k, k] rotated by q_freqs, k [.., g, k] rotated by k_freqs, v [.., g, v])
    (Megatron-Core's GQA layout). Runs the fused RoPE kernel on each of q and k, with
    start_positions and the context-parallel rows as apply_rotary_pos_emb (unlike TE, both at once
    too, and the gradient honours start_positions). cu_seqlens is unused (as in TE)."""
    if tensor_format not in ("sbhd", "bshd"):
        raise ValueError(f"apply_fused_qkv_rotary_pos_emb: tensor_format: expected 'sbhd' or 'bshd', "
                         f"got {tensor_format!r}")
    del cu_seqlens
    if not isinstance(qkv, torch.Tensor) or qkv.dim() != 4:
        raise ValueError("apply_fused_qkv_rotary_pos_emb: qkv: expected a 4-D tensor, got "
                         f"{tuple(qkv.shape) if isinstance(qkv, torch.Tensor) else type(qkv).__name__}")
    split = [int(v) for v in qkv_split_arg_list]
    if len(split) != 3 or min(split) < 1 or sum(split) != qkv.shape[-1] or split[0] % split[1]:
        raise ValueError(
            "apply_fused_qkv_rotary_pos_emb: qkv_split_arg_list: expected 3 sizes >= 1 summing to "
            f"qkv's last dim {qkv.shape[-1]}, q a multiple of k, got {qkv_split_arg_list}")
    q, k, v = torch.split(qkv, split, dim=-1)
    q = q.reshape(*qkv.shape[:2], qkv.shape[2] * (split[0] // split[1]), split[1])
    freqs = [f if f.dtype == torch.float32 else f.float() for f in (q_freqs, k_freqs)]
    common = dict(tensor_format=tensor_format, start_positions=start_positions,
                  interleaved=interleaved, fused=True, cp_size=cp_size, cp_rank=cp_rank)
    q = apply_rotary_pos_emb(q.contiguous(), freqs[0].contiguous(), **common)
    k = apply_rotary_pos_emb(k.contiguous(), freqs[1].contiguous(), **common)
    return q, k, v.contiguous()

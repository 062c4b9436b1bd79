"""Rotary position embedding (RoPE): TE's RotaryPositionEmbedding and apply_rotary_pos_emb.

RotaryPositionEmbedding(...)(max_seq_len) gives fp32 angles [s, 1, 1, d2]; apply_rotary_pos_emb
rotates the first d2 features of every head of a [s, b, h, d] (sbhd), [b, s, h, d] (bshd) or
[t, h, d] (thd, with cu_seqlens) tensor by the angles of the token's position and passes the other
d - d2 features through. Per feature j with angle f[j] and partner feature k:

    out[j] = x[j] * cos(f[j]) + rot(x)[j] * sin(f[j])

where rot is TE's rotate_half: non-interleaved, the halves (x1, x2) of the d2 features become
(-x2, x1); interleaved, each adjacent pair (x[2i], x[2i+1]) becomes (-x[2i+1], x[2i]).

fused=False is TE's framework math (cos/sin cast to t's dtype, products in t's dtype; t may be any
floating dtype, fp64 included); fused=True runs the te_lite.fused_rope_fwd/bwd kernels (fp32, fp16,
bf16 tensors; fp32 freqs; computed in fp32) and gives no gradient to freqs. Differences from TE: no
context-parallel arguments (cp_size, cp_rank) nor start_positions; seq_len_interpolation_factor
alone applies the fixed linear interpolation (TE ignores it without
pretrained_max_position_embeddings); thd tokens past cu_seqlens[-1] are passed through unchanged;
cu_seqlens given with sbhd/bshd is an error instead of being ignored.
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
    t: torch.Tensor, freqs: torch.Tensor, tensor_format: str, cu_seqlens: torch.Tensor | None
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
    else:
        if cu_seqlens is not None:
            raise ValueError(
                f"apply_rotary_pos_emb: cu_seqlens is only used with tensor_format 'thd', "
                f"got it with {tensor_format!r}"
            )
        s = t.shape[1] if tensor_format == "bshd" else t.shape[0]
        if s > freqs.shape[0]:
            raise ValueError(
                f"apply_rotary_pos_emb: t has {s} positions but freqs only {freqs.shape[0]}"
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
    return torch.cat((out, rest), dim=-1) if rest.shape[-1] else out


def _thd_positions(
    cu_seqlens: torch.Tensor, tokens: int, max_positions: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(position of each token within its sequence, whether it lies in a sequence)."""
    cu = cu_seqlens.to(torch.long)
    host = cu.tolist()  # the value checks need the host, as TE's framework path does
    lengths = [b - a for a, b in itertools.pairwise(host)]
    if host[0] != 0 or any(n < 0 for n in lengths) or host[-1] > tokens:
        raise ValueError(
            "apply_rotary_pos_emb: cu_seqlens must start at 0, never decrease and end at most at "
            f"t's {tokens} tokens, got {host}"
        )
    if lengths and max(lengths) > max_positions:
        raise ValueError(
            f"apply_rotary_pos_emb: a sequence of {max(lengths)} tokens but freqs only has "
            f"{max_positions} positions"
        )
    token = torch.arange(tokens, device=cu.device)
    seq = torch.searchsorted(cu[1:], token, right=True)  # == b for tokens past cu[-1]
    inside = token < cu[-1]
    pos = torch.where(inside, token - cu[seq.clamp(max=cu.numel() - 1)], 0)
    return pos, inside


def apply_rotary_pos_emb(
    t: torch.Tensor,
    freqs: torch.Tensor,
    tensor_format: str = "sbhd",
    interleaved: bool = False,
    fused: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotates the first freqs.shape[-1] features of each head of `t` by the angles in `freqs`.

    t: [s, b, h, d] (sbhd), [b, s, h, d] (bshd) or [t, h, d] (thd). freqs: [s_max, 1, 1, d2],
    d2 even and <= d, s_max >= the sequence length (position i uses freqs[i]). cu_seqlens: int32
    [b + 1] token offsets of the thd sequences (positions restart at 0 in each); thd only.
    Returns a tensor of t's shape and dtype.
    """
    _check_args(t, freqs, tensor_format, cu_seqlens)
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
        return torch.ops.te_lite.fused_rope_fwd(t, freqs, tensor_format, interleaved, cu_seqlens)
    if tensor_format == "sbhd":
        return _rotate(t, freqs[: t.shape[0]], interleaved)
    if tensor_format == "bshd":
        return _rotate(t, freqs[: t.shape[1]].transpose(0, 1), interleaved)
    pos, inside = _thd_positions(cu_seqlens, t.shape[0], freqs.shape[0])
    if freqs.shape[0] == 0:  # every sequence is empty: nothing to rotate, nothing to index
        return t.clone()
    out = _rotate(t, freqs[pos].squeeze(1), interleaved)  # angles [t, 1, d2]
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
    (Megatron-Core's GQA layout). Runs the fused RoPE kernel on each of q and k.
    cu_seqlens is unused (as in TE). start_positions and context parallelism (cp_size > 1) are not
    implemented here (NotImplementedError)."""
    if tensor_format not in ("sbhd", "bshd"):
        raise ValueError(f"apply_fused_qkv_rotary_pos_emb: tensor_format: expected 'sbhd' or 'bshd', "
                         f"got {tensor_format!r}")
    if start_positions is not None:
        raise NotImplementedError("apply_fused_qkv_rotary_pos_emb: start_positions is not "
                                  "supported by transformer_engine_lite yet")
    if cp_size != 1 or cp_rank != 0:
        raise NotImplementedError("apply_fused_qkv_rotary_pos_emb: context parallelism (cp_size > 1) "
                                  "is not supported by transformer_engine_lite")
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
    q = apply_rotary_pos_emb(q.contiguous(), freqs[0].contiguous(), tensor_format, interleaved,
                             fused=True)
    k = apply_rotary_pos_emb(k.contiguous(), freqs[1].contiguous(), tensor_format, interleaved,
                             fused=True)
    return q, k, v.contiguous()

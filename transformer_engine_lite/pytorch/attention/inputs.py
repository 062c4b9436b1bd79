"""DotProductAttention's argument checks and their normalization into one canonical problem: mask
names (TE's comma forms accepted), windows (TE's rules), padding given as attention_mask or
cu_seqlens, the qkv_layout of q, k, v recognised from their memory (as TE does), bias arguments.
Errors name the argument: ValueError / TypeError for bad values, NotImplementedError for TE
features not supported here.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import torch

__all__ = [
    "BIAS_TYPES",
    "MASK_TYPES",
    "QKV_FORMATS",
    "check_bias",
    "check_qkv",
    "check_window",
    "detect_qkv_layout",
    "normalize_mask_type",
    "resolve_sequences",
]

QKV_FORMATS = ("sbhd", "bshd", "thd")
MASK_TYPES = (
    "no_mask",
    "padding",
    "causal",
    "padding_causal",
    "causal_bottom_right",
    "padding_causal_bottom_right",
    "arbitrary",
)
_MASK_ALIASES = {
    "padding,causal": "padding_causal",
    "causal,padding": "padding_causal",
    "padding,causal_bottom_right": "padding_causal_bottom_right",
    "causal_bottom_right,padding": "padding_causal_bottom_right",
}
BIAS_TYPES = ("no_bias", "pre_scale_bias", "post_scale_bias", "alibi")
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def normalize_mask_type(owner: str, mask: Any) -> str:
    name = _MASK_ALIASES.get(mask, mask) if isinstance(mask, str) else mask
    if name not in MASK_TYPES:
        raise ValueError(
            f"{owner}: attn_mask_type: expected one of {MASK_TYPES} (or TE's comma forms "
            f"{tuple(_MASK_ALIASES)}), got {mask!r}"
        )
    return name


def check_window(owner: str, mask: str, window: Any) -> tuple[int, int]:
    """TE's window rules: None -> (-1, 0) for causal masks, (-1, -1) otherwise; causal masks take
    (left, 0) or (left, -1) (read as 0: the mask already ends at the diagonal)."""
    causal = "causal" in mask
    if window is None:
        return (-1, 0) if causal else (-1, -1)
    if (
        not isinstance(window, (tuple, list))
        or len(window) != 2
        or not all(isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window)
    ):
        raise ValueError(
            f"{owner}: window_size: expected None or (left, right) with ints >= -1, got {window!r}"
        )
    left, right = int(window[0]), int(window[1])
    if causal:
        if right > 0:
            raise ValueError(
                f"{owner}: window_size {window!r}: mask '{mask}' needs right = 0 or -1 (it ends "
                "at the diagonal); use a non-causal mask for a window reaching past it"
            )
        right = 0
    return left, right


def _packed(ts: tuple[torch.Tensor, ...], fmt: str, head_major: bool) -> bool:
    """Whether ts are consecutive slices of one [.., n, h, d] buffer (head_major=False, e.g.
    bs3hd) or [.., h, n, d] buffer (head_major=True, e.g. bsh3d), n = len(ts)."""
    t0 = ts[0]
    if any(t.shape != t0.shape or t.dtype != t0.dtype or t.device != t0.device for t in ts):
        return False
    n, (h, d) = len(ts), t0.shape[-2:]
    tok = n * h * d
    head = n * d if head_major else d
    step = (d if head_major else h * d) * t0.element_size()
    want = (tok, head, 1) if fmt == "thd" else (t0.shape[1] * tok, tok, head, 1)
    for i, t in enumerate(ts):
        if t.data_ptr() != t0.data_ptr() + i * step:
            return False
        if any(size > 1 and st != w for size, st, w in zip(t.shape, t.stride(), want)):
            return False
    return True


def detect_qkv_layout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fmt: str) -> str:
    """TE's qkv_layout of q, k, v in format `fmt` from their memory: 'bs3hd' when all three are
    views of one [b, s, 3, h, d] buffer, 'bshd_bsh2d' when k and v share a [b, s, h, 2, d] one,
    ..., else the separate layout 'bshd_bshd_bshd'. Separate is used while compiling (fake
    tensors have no data pointers); the ops then see dense tensors."""
    pre = {"bshd": "bs", "sbhd": "sb", "thd": "t"}[fmt]
    separate = f"{fmt}_{fmt}_{fmt}"
    if torch.compiler.is_compiling():
        return separate
    if _packed((q, k, v), fmt, False):
        return f"{pre}3hd"
    if _packed((q, k, v), fmt, True):
        return f"{pre}h3d"
    if _packed((k, v), fmt, False):
        return f"{fmt}_{pre}2hd"
    if _packed((k, v), fmt, True):
        return f"{fmt}_{pre}h2d"
    return separate


def _shape_is(t: torch.Tensor, *dims: int) -> bool:
    # Explicit == per dim: under torch.compile, sizes may be symbolic, and dynamo's tuple
    # comparisons and `in` tests do not evaluate them (they compare as unequal).
    if t.dim() != len(dims):
        return False
    for size, want in zip(t.shape, dims):
        if size != want:
            return False
    return True


def _bhss(t: torch.Tensor, b: int, h: int, sq: int, skv: int) -> bool:
    """Whether t is [1 or b, 1 or h, sq, skv] (explicit == only, see _shape_is)."""
    if t.dim() != 4 or not (t.shape[0] == 1 or t.shape[0] == b):
        return False
    return (t.shape[1] == 1 or t.shape[1] == h) and t.shape[2] == sq and t.shape[3] == skv


def _cu_from_lengths(lengths: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)


def check_qkv(
    owner: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fmt: str, want_sizes: tuple
) -> None:
    """Types, dtypes, devices and shapes of query/key/value; want_sizes = (h, h_kv, d_qk, d_v)
    expected per tensor-parallel rank."""
    names = ("query_layer", "key_layer", "value_layer")
    nd = 3 if fmt == "thd" else 4
    for name, t in zip(names, (q, k, v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{owner}: {name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _DTYPES:
            raise TypeError(
                f"{owner}: {name}: expected float32, float16 or bfloat16, got {t.dtype}"
            )
        if t.dim() != nd:
            raise ValueError(
                f"{owner}: {name}: qkv_format '{fmt}' needs a {nd}-D tensor, got shape "
                f"{tuple(t.shape)}"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{owner}: query/key/value dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"{owner}: query/key/value devices differ: {q.device}, {k.device}, {v.device}"
        )
    h, h_kv, d_qk, d_v = want_sizes
    want = (
        ("query_layer heads", q.shape[-2], h),
        ("key_layer heads", k.shape[-2], h_kv),
        ("value_layer heads", v.shape[-2], h_kv),
        ("query_layer head dim", q.shape[-1], d_qk),
        ("key_layer head dim", k.shape[-1], d_qk),
        ("value_layer head dim", v.shape[-1], d_v),
    )
    for what, got, expected in want:
        if got != expected:
            raise ValueError(
                f"{owner}: {what}: expected {expected} (from the constructor, per "
                f"tensor-parallel rank), got {got} (shapes q {tuple(q.shape)}, k "
                f"{tuple(k.shape)}, v {tuple(v.shape)})"
            )
    if not _shape_is(v, *k.shape[:-1], v.shape[-1]):
        raise ValueError(
            f"{owner}: key_layer and value_layer must agree on all but the head dim, got "
            f"{tuple(k.shape)} and {tuple(v.shape)}"
        )
    if fmt != "thd":
        bdim = 0 if fmt == "bshd" else 1
        if q.shape[bdim] != k.shape[bdim]:
            raise ValueError(
                f"{owner}: query_layer and key_layer batch sizes differ: {q.shape[bdim]} and "
                f"{k.shape[bdim]} ({fmt})"
            )


def _check_cu(owner: str, name: str, cu: Any, device: torch.device) -> torch.Tensor:
    if (
        not isinstance(cu, torch.Tensor)
        or cu.dtype != torch.int32
        or cu.dim() != 1
        or cu.numel() < 1
    ):
        raise ValueError(f"{owner}: {name}: expected an int32 tensor [b + 1], got {cu!r:.80}")
    if cu.device != device:
        raise ValueError(f"{owner}: {name}: expected device {device}, got {cu.device}")
    return cu


def _padding_cu_seqlens(
    owner: str, attention_mask: Any, attention_type: str, b: int, sq: int, skv: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """cu_seqlens (q, kv) from TE's padding attention_mask: [b, 1, 1, s] bool, True = padded
    (right padding); a (q_mask, kv_mask) pair for cross attention."""
    if isinstance(attention_mask, (tuple, list)):
        if len(attention_mask) != 2:
            raise ValueError(f"{owner}: attention_mask: expected a tensor or a (q, kv) pair")
        mq, mkv = attention_mask
    elif attention_type == "self":
        mq = mkv = attention_mask
    else:
        raise ValueError(
            f"{owner}: attention_mask: cross attention needs a (q_mask, kv_mask) pair for a "
            "padding mask"
        )
    cus = []
    for name, m, s in (("q", mq, sq), ("kv", mkv, skv)):
        if not isinstance(m, torch.Tensor) or m.dtype != torch.bool or not _shape_is(m, b, 1, 1, s):
            raise ValueError(
                f"{owner}: attention_mask ({name}): expected a bool tensor [{b}, 1, 1, {s}] "
                f"(True = padding), got {m!r:.80}"
            )
        lengths = (~m).view(b, s).sum(-1)
        if not torch.compiler.is_compiling():
            right = torch.arange(s, device=m.device).view(1, s) >= lengths.view(b, 1)
            if not torch.equal(right, m.view(b, s)):
                raise ValueError(
                    f"{owner}: attention_mask ({name}): padding must be at the end of each "
                    "sequence (True only after the last False); use attn_mask_type "
                    "'arbitrary' for other masks"
                )
        cus.append(_cu_from_lengths(lengths))
    return cus[0], cus[1]


def _check_thd_lengths(owner, cu_q, cu_kv, q, k, max_q, max_kv) -> None:
    """Host checks the flash kernel makes on CPU tensors, made for every backend (a sequence
    longer than max_seqlen would otherwise spill into the next one in the unfused path)."""
    for name, cu, t, mx in (("q", cu_q, q, max_q), ("kv", cu_kv, k, max_kv)):
        host = cu.tolist()
        lengths = [b - a for a, b in itertools.pairwise(host)]
        if host[0] != 0 or any(n < 0 for n in lengths) or host[-1] > t.shape[0]:
            raise ValueError(
                f"{owner}: cu_seqlens_{name}: expected offsets starting at 0, non-decreasing, "
                f"ending at most at the {t.shape[0]} tokens, got {host}"
            )
        if lengths and max(lengths) > mx:
            raise ValueError(
                f"{owner}: max_seqlen_{name}={mx} is smaller than the longest sequence "
                f"({max(lengths)} tokens)"
            )


_UNUSED_MASK_WARNED: set[str] = set()


def _check_redundant_mask(owner: str, mask: str, am: Any) -> None:
    """TE's rule: attention_mask is only used with padding or 'arbitrary' mask types; with
    'no_mask' / 'causal' / 'causal_bottom_right' it is accepted and the type decides. We follow it
    (TE code passes such masks) and say so once per mask type instead of ignoring it silently."""
    if not isinstance(am, (torch.Tensor, tuple, list)):
        raise TypeError(
            f"{owner}: attention_mask: expected a bool tensor or a (q, kv) pair, got "
            f"{type(am).__name__}"
        )
    if mask in _UNUSED_MASK_WARNED or torch.compiler.is_compiling():
        return
    _UNUSED_MASK_WARNED.add(mask)
    warnings.warn(
        f"{owner}: attention_mask is not used with attn_mask_type '{mask}' (TE's rule: only "
        "padding and 'arbitrary' types read it); pass attn_mask_type='arbitrary' or a padding "
        "type to apply it",
        UserWarning,
        stacklevel=4,
    )


def resolve_sequences(
    owner: str,
    fmt: str,
    mask: str,
    q: torch.Tensor,
    k: torch.Tensor,
    attention_mask: Any,
    attention_type: str,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_kv: torch.Tensor | None,
    max_seqlen_q: int | None,
    max_seqlen_kv: int | None,
) -> tuple[str, torch.Tensor | None, torch.Tensor | None, int, int]:
    """(mask, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv) in canonical form: thd
    masks become their padding variants; bshd/sbhd padding comes from cu_seqlens, or else from
    attention_mask (TE's [b, 1, 1, s] right-padding masks, or a (q, kv) pair); the rest gets None.
    As TE's DotProductAttention, arguments a format / mask does not use are accepted and ignored:
    attention_mask with thd (cu_seqlens define its sequences), cu_seqlens with a non-padding
    bshd/sbhd mask (every sequence is full), attention_mask when cu_seqlens are given, and a
    bshd/sbhd max_seqlen_q/kv other than the tensors' sequence dims."""
    if fmt == "thd":
        if mask == "arbitrary":
            raise NotImplementedError(f"{owner}: attn_mask_type 'arbitrary' with qkv_format 'thd'")
        if cu_seqlens_q is None or cu_seqlens_kv is None:
            raise ValueError(f"{owner}: qkv_format 'thd' needs cu_seqlens_q and cu_seqlens_kv")
        cu_q = _check_cu(owner, "cu_seqlens_q", cu_seqlens_q, q.device)
        cu_kv = _check_cu(owner, "cu_seqlens_kv", cu_seqlens_kv, q.device)
        if cu_q.numel() != cu_kv.numel():
            raise ValueError(
                f"{owner}: cu_seqlens_q and cu_seqlens_kv: expected the same length (b + 1), "
                f"got {cu_q.numel()} and {cu_kv.numel()}"
            )
        if "padding" not in mask:
            mask = "padding" if mask == "no_mask" else f"padding_{mask}"
        if (max_seqlen_q is None or max_seqlen_kv is None) and torch.compiler.is_compiling():
            raise ValueError(
                f"{owner}: qkv_format 'thd' under torch.compile needs max_seqlen_q and "
                "max_seqlen_kv (computing them from cu_seqlens reads device values)"
            )
        if max_seqlen_q is None:
            max_seqlen_q = int((cu_q[1:] - cu_q[:-1]).max()) if cu_q.numel() > 1 else 0
        if max_seqlen_kv is None:
            max_seqlen_kv = int((cu_kv[1:] - cu_kv[:-1]).max()) if cu_kv.numel() > 1 else 0
        if not torch.compiler.is_compiling():
            _check_thd_lengths(owner, cu_q, cu_kv, q, k, max_seqlen_q, max_seqlen_kv)
    else:
        # bshd / sbhd: the tensors' sequence dims are the lengths; a different max_seqlen_q/kv
        # is ignored, as TE's DotProductAttention does (its kernels read the tensor shapes too)
        sdim = 1 if fmt == "bshd" else 0
        sq, skv = q.shape[sdim], k.shape[sdim]
        max_seqlen_q, max_seqlen_kv = sq, skv
        cu_q = cu_kv = None
        if "padding" in mask:
            if cu_seqlens_q is not None and cu_seqlens_kv is not None:
                cu_q = _check_cu(owner, "cu_seqlens_q", cu_seqlens_q, q.device)
                cu_kv = _check_cu(owner, "cu_seqlens_kv", cu_seqlens_kv, q.device)
            elif attention_mask is not None:
                b = q.shape[1 - sdim]
                cu_q, cu_kv = _padding_cu_seqlens(owner, attention_mask, attention_type, b, sq, skv)
            else:
                raise ValueError(
                    f"{owner}: mask '{mask}' needs attention_mask or cu_seqlens_q and cu_seqlens_kv"
                )
        elif mask == "arbitrary":
            if not isinstance(attention_mask, torch.Tensor) or attention_mask.dtype != torch.bool:
                raise ValueError(
                    f"{owner}: mask 'arbitrary' needs attention_mask: a bool tensor "
                    f"[b or 1, h or 1, {sq}, {skv}] (True = masked), got {attention_mask!r:.80}"
                )
            am = attention_mask
            b = q.shape[1 - sdim]
            h = q.shape[-2]
            if not _bhss(am, b, h, sq, skv):
                raise ValueError(
                    f"{owner}: attention_mask: expected shape [1 or {b}, 1 or {h}, {sq}, "
                    f"{skv}], got {tuple(am.shape)}"
                )
        elif attention_mask is not None:
            _check_redundant_mask(owner, mask, attention_mask)

    return mask, cu_q, cu_kv, max_seqlen_q, max_seqlen_kv


def check_bias(owner, bias_type, bias, slopes, q, fmt, cu_q, max_q, max_kv):
    """Validates the bias arguments; returns (bias tensor, contiguous ALiBi slopes or None)."""
    if bias_type not in BIAS_TYPES:
        raise ValueError(
            f"{owner}: core_attention_bias_type: expected one of {BIAS_TYPES}, got {bias_type!r}"
        )
    h = q.shape[-2]
    b = cu_q.numel() - 1 if fmt == "thd" else q.shape[0 if fmt == "bshd" else 1]
    if bias_type in ("pre_scale_bias", "post_scale_bias"):
        want = f"[1 or {b}, 1 or {h}, {max_q}, {max_kv}]"
        if not isinstance(bias, torch.Tensor):
            raise ValueError(f"{owner}: {bias_type} needs core_attention_bias {want}")
        if not _bhss(bias, b, h, max_q, max_kv):
            raise ValueError(
                f"{owner}: core_attention_bias: expected {want}, got {tuple(bias.shape)}"
            )
        if bias.dtype != q.dtype or bias.device != q.device:
            raise TypeError(
                f"{owner}: core_attention_bias: expected {q.dtype} on {q.device} (q's), got "
                f"{bias.dtype} on {bias.device}"
            )
    elif bias is not None:
        raise ValueError(
            f"{owner}: core_attention_bias is given but core_attention_bias_type is "
            f"{bias_type!r} (use 'post_scale_bias' or 'pre_scale_bias')"
        )
    if bias_type == "alibi":
        if slopes is not None:
            if (
                not isinstance(slopes, torch.Tensor)
                or slopes.dtype != torch.float32
                or not (_shape_is(slopes, h) or _shape_is(slopes, b, h))
            ):
                raise ValueError(
                    f"{owner}: alibi_slopes: expected float32 [{h}] or [{b}, {h}], got "
                    f"{slopes!r:.80}"
                )
            if slopes.device != q.device:
                raise ValueError(f"{owner}: alibi_slopes: expected device {q.device}")
            slopes = slopes.contiguous()
    elif slopes is not None:
        raise ValueError(
            f"{owner}: alibi_slopes is given but core_attention_bias_type is {bias_type!r}"
        )
    return bias, slopes

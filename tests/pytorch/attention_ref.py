"""Attention test helpers (test_attention.py, test_attention_modules.py): a per-sequence reference
in plain torch (fp64 or a low-precision dtype) following fused_attn.h's rules, converters between
the canonical padded form [b, s, h, d] and the layouts DotProductAttention takes, and the harness
that runs one test Case through DotProductAttention, UnfusedDotProductAttention or the
reference, with gradients."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from utils import ATTENTION_FLOOR

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.pytorch.attention import backends
from transformer_engine_lite.pytorch.attention.backends import UnfusedDotProductAttention
from transformer_engine_lite.pytorch.attention.inputs import check_window

_FORMATS = {"b": "bshd", "s": "sbhd", "t": "thd"}
THD_TAIL = 2  # thd tensors get this many tokens past cu_seqlens[-1] (no sequence: output 0)


def lengths_of(mask: str, fmt: str, b: int, sq: int, skv: int) -> tuple[list[int], list[int]]:
    """Per-sequence lengths: full unless padded (thd or a padding mask), then decreasing."""
    if fmt != "thd" and "padding" not in mask:
        return [sq] * b, [skv] * b
    lq, lkv = ([max(1, s - (i * s) // (b + 1)) for i in range(b)] for s in (sq, skv))
    return lq, lkv


def to_format(x: torch.Tensor, fmt: str, lens: list[int]) -> torch.Tensor:
    """Canonical [b, s, h, d] -> bshd (as is), sbhd, or thd (the valid tokens, then THD_TAIL junk
    tokens)."""
    if fmt == "bshd":
        return x.clone()
    if fmt == "sbhd":
        return x.transpose(0, 1).contiguous()
    tokens = [x[i, :n] for i, n in enumerate(lens)] + [x[0, :1].flip(-1) + 3.0] * THD_TAIL
    return torch.cat(tokens)


def canonical_grads(g: torch.Tensor, fmt: str, lens: list[int], s: int) -> torch.Tensor:
    """Inverse of to_format for results (outputs, gradients): thd padded positions are 0, and the
    junk tokens past cu_seqlens[-1] must have come out exactly 0."""
    if fmt == "bshd":
        return g
    if fmt == "sbhd":
        return g.transpose(0, 1)
    tail = g[sum(lens) :]
    assert tail.shape[0] == THD_TAIL and not tail.any(), "thd tokens past cu_seqlens[-1] not 0"
    out = g.new_zeros((len(lens), s, *g.shape[1:]))
    start = 0
    for i, n in enumerate(lens):
        out[i, :n] = g[start : start + n]
        start += n
    return out


def build_layout(layout, qc, kc, vc, lens_q, lens_kv, dtype):
    """q, k, v in `layout` (packed layouts: views of one leaf buffer), the leaves, and a function
    giving dq, dk, dv in canonical form after backward."""
    fmt = _FORMATS[layout[0]]
    s_q, s_kv = qc.shape[1], kc.shape[1]
    qf, kf, vf = (
        to_format(t, fmt, n).to(dtype) for t, n in ((qc, lens_q), (kc, lens_kv), (vc, lens_kv))
    )
    tail = layout.split("_")[-1]
    if "3hd" in tail or "h3d" in tail:
        dim = -3 if "3hd" in tail else -2
        buf = torch.stack((qf, kf, vf), dim=dim).requires_grad_(True)
        q, k, v = (buf.select(dim, i) for i in range(3))
        leaves = [buf]

        def grads(ls):
            return [ls[0].grad.select(dim, i) for i in range(3)]

    elif "2hd" in tail or "h2d" in tail:
        dim = -3 if "2hd" in tail else -2
        q = qf.requires_grad_(True)
        buf = torch.stack((kf, vf), dim=dim).requires_grad_(True)
        k, v = (buf.select(dim, i) for i in range(2))
        leaves = [q, buf]

        def grads(ls):
            return [ls[0].grad, ls[1].grad.select(dim, 0), ls[1].grad.select(dim, 1)]

    else:
        q, k, v = (t.requires_grad_(True) for t in (qf, kf, vf))
        leaves = [q, k, v]

        def grads(ls):
            return [t.grad for t in ls]

    def canonical(ls):
        dq, dk, dv = grads(ls)
        return (
            canonical_grads(dq, fmt, lens_q, s_q),
            canonical_grads(dk, fmt, lens_kv, s_kv),
            canonical_grads(dv, fmt, lens_kv, s_kv),
        )

    return q, k, v, leaves, canonical


def default_alibi_slopes(h: int) -> torch.Tensor:
    """TE's default ALiBi slopes (its get_alibi): powers of 2^(-8/n) for the largest power of two
    n <= h, then odd powers of 2^(-4/n) for the remaining heads."""
    n = 2 ** math.floor(math.log2(h))
    slopes = [(2.0 ** (-8.0 / n)) ** i for i in range(1, n + 1)]
    slopes += [(2.0 ** (-4.0 / n)) ** i for i in range(1, 2 * (h - n), 2)]
    return torch.tensor(slopes, dtype=torch.float64)


def allowed_keys(mask: str, window, lq: int, lkv: int) -> torch.Tensor:
    """bool [lq, lkv] of fused_attn.h: causal / padding_causal keep j <= i (top-left); the
    bottom-right masks and the windows of non-causal masks are aligned at (lq - 1, lkv - 1)."""
    left, right = window if window is not None else (-1, 0 if "causal" in mask else -1)
    if "causal" in mask:
        right = 0
    off = 0 if mask in ("causal", "padding_causal") else lkv - lq
    i = torch.arange(lq).view(-1, 1)
    j = torch.arange(lkv).view(1, -1)
    keep = torch.ones(lq, lkv, dtype=torch.bool)
    if left >= 0:
        keep &= j >= i + off - left
    if right >= 0:
        keep &= j <= i + off + right
    return keep


def ref_attention(
    q,
    k,
    v,
    *,
    mask,
    window,
    scale,
    lens_q,
    lens_kv,
    bias_type="no_bias",
    bias=None,
    slopes=None,
    arbitrary=None,
    keep=None,
    p=0.0,
):
    """Attention of canonical q [b, sq, h, d], k / v [b, skv, h_kv, d(v)] sequence by sequence,
    in q's dtype: [b, sq, h, dv], rows past a sequence's length and rows with no key kept 0.
    keep: the dropout keep mask [b, h, sq, skv] (applied with scale 1 / (1 - p))."""
    b, sq, h, _ = q.shape
    rep = h // k.shape[2]
    outs = []
    for bi in range(b):
        lq, lkv = lens_q[bi], lens_kv[bi]
        qi = q[bi, :lq].transpose(0, 1)
        ki = k[bi, :lkv].transpose(0, 1).repeat_interleave(rep, 0)
        vi = v[bi, :lkv].transpose(0, 1).repeat_interleave(rep, 0)
        s = qi @ ki.transpose(-1, -2)  # [h, lq, lkv]
        if bias_type == "pre_scale_bias":
            s = (s + bias[bi % bias.shape[0], :, :lq, :lkv]) * scale
        else:
            s = s * scale
        if bias_type == "post_scale_bias":
            s = s + bias[bi % bias.shape[0], :, :lq, :lkv]
        if bias_type == "alibi":
            sl = default_alibi_slopes(h) if slopes is None else slopes.double()
            sl = sl.reshape(-1, h)[bi % sl.reshape(-1, h).shape[0]].view(h, 1, 1)
            dist = (torch.arange(lq).view(-1, 1) + lkv - lq - torch.arange(lkv).view(1, -1)).abs()
            s = s + (-sl * dist).to(s.dtype)
        allowed = allowed_keys(mask, window, lq, lkv).expand(h, lq, lkv)
        if arbitrary is not None:
            allowed = allowed & ~arbitrary[bi % arbitrary.shape[0], :, :lq, :lkv]
        probs = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1)
        probs = torch.where(allowed.any(-1, keepdim=True), probs, torch.zeros_like(probs))
        if p > 0:
            probs = probs * keep[bi, :, :lq, :lkv].to(probs.dtype) * (1.0 / (1.0 - p))
        o = (probs @ vi).transpose(0, 1)  # [lq, h, dv]
        outs.append(torch.nn.functional.pad(o, (0, 0, 0, 0, 0, sq - lq)))
    return torch.stack(outs)


# ----------------------------------------------------------------------------- harness
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


@dataclass(frozen=True)
class Case:
    layout: str = "bshd_bshd_bshd"
    mask: str = "no_mask"
    dtype: torch.dtype = torch.bfloat16
    b: int = 2
    sq: int = 17
    skv: int | None = None  # None: sq
    h: int = 4
    h_kv: int | None = None  # None: h
    d: int = 64
    dv: int | None = None  # None: d
    window: tuple[int, int] | None = None
    bias: str = "no_bias"
    bias_shape: str = "1hss"  # pre/post_scale_bias: which of b, h are broadcast
    slopes: str = "default"  # alibi: "default", "h" ([h]) or "bh" ([b, h])
    padding_via: str = "mask"  # bshd/sbhd padding: TE's attention_mask or cu_seqlens

    @property
    def fmt(self) -> str:
        return backends.qkv_format_of(self.layout)

    def id(self) -> str:
        skv = "" if self.skv is None else f"x{self.skv}"
        gqa = "" if self.h_kv is None else f"-gqa{self.h}/{self.h_kv}"
        dv = "" if self.dv is None else f"/{self.dv}"
        win = "" if self.window is None else f"-win{self.window[0]},{self.window[1]}"
        bias = "" if self.bias == "no_bias" else f"-{self.bias}"
        bias += f"-{self.bias_shape}" if "scale" in self.bias else ""
        bias += f"-{self.slopes}" if self.bias == "alibi" else ""
        return (
            f"{self.layout}-{self.mask}-{str(self.dtype)[6:]}-s{self.sq}{skv}-d{self.d}{dv}"
            f"{gqa}{win}{bias}"
        )


def sizes(case: Case):
    skv = case.sq if case.skv is None else case.skv
    return skv, case.h if case.h_kv is None else case.h_kv, case.d if case.dv is None else case.dv


def make_problem(case: Case, seed: int = 0):
    """fp64 canonical inputs: q [b, sq, h, d], k [b, skv, h_kv, d], v [..., dv] (padded rows
    hold junk), lengths, bias / slopes / arbitrary mask, and the output gradient."""
    g = torch.Generator().manual_seed(seed)
    skv, h_kv, dv = sizes(case)
    b, sq, h, d = case.b, case.sq, case.h, case.d

    def rnd(*shape, scale=1.0):
        return torch.randn(shape, generator=g, dtype=torch.float64) * scale

    lens_q, lens_kv = lengths_of(case.mask, case.fmt, b, sq, skv)
    pb = {"1hss": (1, h), "b1ss": (b, 1), "bhss": (b, h), "11ss": (1, 1)}[case.bias_shape]
    bias = rnd(*pb, sq, skv) if "scale" in case.bias else None
    slopes = None
    if case.bias == "alibi" and case.slopes != "default":
        shape = (h,) if case.slopes == "h" else (b, h)
        slopes = (torch.rand(shape, generator=g, dtype=torch.float64) * 0.5 + 0.05).float()
    amask = None
    if case.mask == "arbitrary":
        amask = torch.rand((b, 1, sq, skv), generator=g) < 0.3
        amask[0, 0, 0] = True  # one fully masked row: output 0
    return {
        "q": rnd(b, sq, h, d),
        "k": rnd(b, skv, h_kv, d),
        "v": rnd(b, skv, h_kv, dv),
        "lens_q": lens_q,
        "lens_kv": lens_kv,
        "bias": bias,
        "slopes": slopes,
        "amask": amask,
        "dout": rnd(b, sq, h, dv),
    }


def cu_seqlens(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


def dpa_kwargs(case: Case, prob: dict, bias: torch.Tensor | None) -> dict:
    """DotProductAttention.forward's keyword arguments for the case (TE's forms)."""
    skv = sizes(case)[0]
    kw: dict = {}
    if case.fmt == "thd":
        kw.update(
            cu_seqlens_q=cu_seqlens(prob["lens_q"]),
            cu_seqlens_kv=cu_seqlens(prob["lens_kv"]),
            max_seqlen_q=case.sq,
            max_seqlen_kv=skv,
        )
    elif "padding" in case.mask and case.padding_via == "cu":
        kw.update(
            cu_seqlens_q=cu_seqlens(prob["lens_q"]), cu_seqlens_kv=cu_seqlens(prob["lens_kv"])
        )
    elif "padding" in case.mask:  # TE's [b, 1, 1, s] masks, True = padding
        mq, mkv = (
            (torch.arange(s)[None] >= torch.tensor(n)[:, None]).view(case.b, 1, 1, s)
            for s, n in ((case.sq, prob["lens_q"]), (skv, prob["lens_kv"]))
        )
        kw["attention_mask"] = mq if case.sq == skv and torch.equal(mq, mkv) else (mq, mkv)
    if case.mask == "arbitrary":
        kw["attention_mask"] = prob["amask"]
    if bias is not None:
        kw.update(core_attention_bias_type=case.bias, core_attention_bias=bias)
    elif case.bias == "alibi":
        kw.update(core_attention_bias_type="alibi", alibi_slopes=prob["slopes"])
    return kw


def make_dpa(case: Case, p: float = 0.0) -> te.DotProductAttention:
    _, h_kv, dv = sizes(case)
    return te.DotProductAttention(
        case.h,
        (case.d, dv),
        num_gqa_groups=h_kv,
        attention_dropout=p,
        qkv_format=case.fmt,
        attn_mask_type=case.mask,
        window_size=case.window,
    )


def run_case(case: Case, prob: dict, call) -> tuple:
    """Builds the layout's tensors, runs call(q, k, v, bias) -> out, backward with prob's dout:
    (out, (dq, dk, dv, dbias)) in canonical form."""
    dt = case.dtype
    q, k, v, leaves, grads_of = build_layout(
        case.layout, prob["q"], prob["k"], prob["v"], prob["lens_q"], prob["lens_kv"], dt
    )
    bias = None if prob["bias"] is None else prob["bias"].to(dt).requires_grad_(True)
    out = call(q, k, v, bias)
    dout = to_format(prob["dout"], case.fmt, prob["lens_q"]).to(dt)
    out.backward(dout.reshape(out.shape))
    o = canonical_grads(out.detach().view(dout.shape), case.fmt, prob["lens_q"], case.sq)
    return o, (*grads_of(leaves), None if bias is None else bias.grad)


def run_dpa(case: Case, prob: dict, dpa: te.DotProductAttention | None = None):
    """The case through DotProductAttention: (out, grads, backends that ran)."""
    dpa = dpa or make_dpa(case)
    used: list[str] = []
    hooks = [
        dpa.flash_attention.register_forward_hook(lambda *_: used.append("flash")),
        dpa.unfused_attention.register_forward_hook(lambda *_: used.append("unfused")),
    ]
    try:
        out, grads = run_case(
            case, prob, lambda q, k, v, bias: dpa(q, k, v, **dpa_kwargs(case, prob, bias))
        )
    finally:
        for hk in hooks:
            hk.remove()
    return out, grads, used


def run_unfused_direct(case: Case, prob: dict):
    """UnfusedDotProductAttention called directly with the canonical arguments (no selection)."""
    skv = sizes(case)[0]
    mask = case.mask
    if case.fmt == "thd" and "padding" not in mask:
        mask = "padding" if mask == "no_mask" else f"padding_{mask}"
    padded = case.fmt == "thd" or "padding" in mask
    cu_q, cu_kv = (
        (cu_seqlens(prob["lens_q"]), cu_seqlens(prob["lens_kv"])) if padded else (None, None)
    )
    window = check_window("test", mask, case.window)
    unfused = UnfusedDotProductAttention(case.d**-0.5)
    amask = prob["amask"]

    def call(q, k, v, bias):
        return unfused(
            q,
            k,
            v,
            case.layout,
            cu_q,
            cu_kv,
            case.sq,
            skv,
            "no_mask" if amask is not None else mask,
            window,
            case.bias,
            bias,
            prob["slopes"],
            None,
            amask,
        )

    return run_case(case, prob, call)


def reference(case: Case, prob: dict, dtype: torch.dtype, keep=None, p: float = 0.0):
    """The fp64 (dtype=float64) or plain-torch low-precision reference with its gradients."""
    leaves = [prob[n].detach().to(dtype, copy=True).requires_grad_(True) for n in ("q", "k", "v")]
    bias = prob["bias"]
    bias = None if bias is None else bias.detach().to(dtype, copy=True).requires_grad_(True)
    out = ref_attention(
        *leaves,
        mask=case.mask,
        window=case.window,
        scale=case.d**-0.5,
        lens_q=prob["lens_q"],
        lens_kv=prob["lens_kv"],
        bias_type=case.bias,
        bias=bias,
        slopes=prob["slopes"],
        arbitrary=prob["amask"],
        keep=keep,
        p=p,
    )
    out.backward(prob["dout"].to(dtype))
    grads = [t.grad for t in leaves] + [None if bias is None else bias.grad]
    return out.detach(), grads


def check_bound(what: str, got, ref64, lowp, dtype) -> None:
    """max|got - ref64| <= 2 max|lowp - ref64| + floor * max(1, max|ref64|)."""
    assert got.shape == ref64.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref64.shape)}"
    err = (got.double() - ref64).abs().max().item()
    base = (lowp.double() - ref64).abs().max().item()
    bound = 2 * base + ATTENTION_FLOOR[dtype] * max(1.0, ref64.abs().max().item())
    assert err <= bound, (
        f"{what}: max error {err:.3g} vs fp64 exceeds 2 x torch {dtype}'s {base:.3g} + floor "
        f"(bound {bound:.3g})"
    )


NAMES = ("out", "dq", "dk", "dv", "dbias")

"""Helpers of test_attention.py / test_vs_pytorch.py: attention test cases (`Case`), their inputs
in every TE-JAX layout, an fp64 numpy reference with hand-written gradients, the same math in plain
JAX in the low-precision dtype (the error baseline), and the bound check between them.

The reference is independent of the library: masks are built by loops over explicit segment lists
(fused_attn.h's rules), gradients are the closed-form softmax backward, GQA is np.repeat."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from utils import tols

from transformer_engine_lite.common import attention_selection as selection
from transformer_engine_lite.common import capi
from transformer_engine_lite.jax import attention as A
from transformer_engine_lite.jax.cpp_extensions import attention as tex_attn

# Attention vs fp64: max|ours - ref| <= 2 * max|plain JAX in dtype - ref| + floor * max(1, max|ref|)
# (flash-attention's rule). The floor covers results whose baseline error is ~0 (a one-key softmax):
# a fraction of an ulp at 1.0. Same values as tests/pytorch/utils.py ATTENTION_FLOOR.
ATTENTION_FLOOR = {"float32": 1e-6, "float16": 1e-4, "bfloat16": 1e-3}
NAMES = ("out", "dq", "dk", "dv", "dbias")
_FAST_COMPILE = {"xla_backend_optimization_level": 0}
DTYPES = {"bf16": jnp.bfloat16, "fp16": jnp.float16, "fp32": jnp.float32}


@dataclass(frozen=True)
class Case:
    """One attention problem. thd rows hold `m` segments (with padding gaps); `lens` overrides the
    per-row (q, kv) lengths of a padded bshd case; `desc` picks the SequenceDescriptor form:
    "seqlens" (bshd), "segment_ids" (bshd or thd) or "offsets" (thd)."""

    layout: str = "bshd_bshd_bshd"
    mask: str = "no_mask"
    dtype: str = "bf16"
    b: int = 2
    sq: int = 17
    skv: int | None = None  # None: sq
    h: int = 4
    h_kv: int | None = None  # None: h
    d: int = 16
    dv: int | None = None  # None: d
    window: tuple[int, int] | None = None
    bias: str = "no_bias"
    bias_shape: str = "1hss"  # which of b, h a pre/post_scale_bias has (the others broadcast)
    desc: str | None = None  # None: "seqlens" (bshd) / "segment_ids" (thd)
    m: int = 1  # thd: segments per row (max_segments_per_seq)
    lens: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    seed: int = 0

    @property
    def thd(self) -> bool:
        return self.layout.startswith("t")

    @property
    def padded(self) -> bool:
        return self.thd or "padding" in self.mask

    @property
    def s_kv(self) -> int:
        return self.sq if self.skv is None else self.skv

    @property
    def heads_kv(self) -> int:
        return self.h if self.h_kv is None else self.h_kv

    @property
    def d_v(self) -> int:
        return self.d if self.dv is None else self.dv

    @property
    def jdtype(self):
        return DTYPES[self.dtype]

    @property
    def descriptor_kind(self) -> str:
        return self.desc or ("segment_ids" if self.thd else "seqlens")

    def id(self) -> str:
        s = f"s{self.sq}" + ("" if self.skv is None else f"x{self.skv}")
        parts = [self.layout, self.mask, self.dtype, s, f"d{self.d}"]
        if self.dv is not None:
            parts[-1] += f"/{self.dv}"
        if self.h_kv is not None:
            parts.append(f"gqa{self.h}/{self.h_kv}")
        if self.window is not None:
            parts.append(f"win{self.window[0]},{self.window[1]}")
        if self.bias != "no_bias":
            parts.append(f"{self.bias}-{self.bias_shape}")
        if self.thd:
            parts.append(f"m{self.m}-{self.descriptor_kind}")
        elif self.desc is not None:
            parts.append(self.desc)
        if self.lens is not None:
            parts.append("lens" + ",".join(map(str, self.lens[0] + self.lens[1])))
        return "-".join(parts)


# ----------------------------------------------------------------------------- CI modes
# ci runs the attention suites once per mode; configure_fused_attn_env (ci/_utils.sh) sets these
# switches and NVTE_ATTN_CI_MODE.
MODE = os.environ.get("NVTE_ATTN_CI_MODE") or "auto"
MODE_ENV = {
    "auto": {},
    "flash": {"NVTE_FUSED_ATTN": "0", "NVTE_FUSED_ATTN_CK": "0", "NVTE_FUSED_ATTN_AOTRITON": "0"},
    "unfused": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0"},
    "ck": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN_AOTRITON": "0"},
    "aotriton": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN_CK": "0"},
}
SWITCHES = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_FUSED_ATTN_CK", "NVTE_FUSED_ATTN_AOTRITON")
if MODE not in MODE_ENV:
    raise ValueError(f"NVTE_ATTN_CI_MODE: expected one of {sorted(MODE_ENV)}, got {MODE!r}")


def set_mode(monkeypatch, mode: str) -> None:
    """Sets the switches of `mode` for one test, whatever the CI mode (NVTE_UNFUSED_ATTN on)."""
    for k in (*SWITCHES, "NVTE_UNFUSED_ATTN"):
        monkeypatch.delenv(k, raising=False)
    for k, v in MODE_ENV[mode].items():
        monkeypatch.setenv(k, v)


def selection_log_lines(case: Case, level: int) -> list[str]:
    """The lines NVTE_DEBUG_LEVEL=level logs for a bf16 `case`, built from the C selection's own
    reasons (capi.fused_attn_backend_reasons) and the shared backend names."""
    cfg = capi.NVTEFusedAttnConfig(
        device=0,
        q_dtype=int(capi.DType.BFloat16),
        kv_dtype=int(capi.DType.BFloat16),
        qkv_layout=selection.enum_value("layout", case.layout),
        bias_type=selection.enum_value("bias", case.bias),
        attn_mask_type=selection.enum_value("mask", case.mask),
        dropout=0.0,
        num_attn_heads=case.h,
        num_gqa_groups=case.heads_kv,
        max_seqlen_q=case.sq,
        max_seqlen_kv=case.s_kv,
        head_dim_qk=case.d,
        head_dim_v=case.d_v,
        window_size_left=-1,
        window_size_right=0 if "causal" in case.mask else -1,
    )
    names = capi.fused_attn_backend_names()
    selected, reasons = capi.fused_attn_backend_reasons(cfg)
    lines = []
    if level >= 2:
        lines = [
            f"Disabling {selection.BACKEND_NAMES[n]} due to {reasons[names.index(n)]}"
            for n in ("ck", "aotriton", "flash", "unfused")
            if reasons[names.index(n)]
        ]
    return lines + [f"Selected backend = {selection.BACKEND_NAMES[names[selected]]}"]


# ----------------------------------------------------------------------------- segments
def _thd_rows(s: int, b: int, m: int, rng) -> list[list[tuple[int, int]]]:
    """Per row, up to m (start, length) segments with gaps of 0-2 tokens (odd rows one fewer)."""
    rows = []
    for r in range(b):
        n = m if r % 2 == 0 else max(1, m - 1)
        pos, segs = int(rng.integers(0, 2)) if s > 1 else 0, []
        for i in range(n):
            room = s - pos - 2 * (n - i - 1)
            length = int(rng.integers(1, max(1, room) + 1))
            segs.append((pos, length))
            pos += length + int(rng.integers(0, 3))
            if pos >= s:
                break
        rows.append(segs)
    return rows


def segments(case: Case, rng):
    """(q segments, kv segments): per row a list of (start, length); segment i of q's row attends
    segment i of kv's row."""
    b, sq, skv = case.b, case.sq, case.s_kv
    if case.thd:
        q = _thd_rows(sq, b, case.m, rng)
        if case.layout == "t3hd":
            return q, q
        kv = _thd_rows(skv, b, case.m, rng)
        # pair the same number of segments per row
        n = [min(len(a), len(c)) for a, c in zip(q, kv)]
        return [a[:k] for a, k in zip(q, n)], [c[:k] for c, k in zip(kv, n)]
    if not case.padded:
        return [[(0, sq)]] * b, [[(0, skv)]] * b
    if case.lens is not None:
        lq, lkv = case.lens
    else:
        lq = [max(1, sq - (i * sq) // (b + 1)) for i in range(b)]
        lkv = [max(1, skv - (i * skv) // (b + 2)) for i in range(b)]
    return [[(0, n)] for n in lq], [[(0, n)] for n in lkv]


def descriptor(case: Case, segs_q, segs_kv) -> A.SequenceDescriptor | None:
    """The case's SequenceDescriptor, built from the segment lists."""
    if not case.padded:
        return None
    kind = case.descriptor_kind
    if kind == "seqlens":
        assert not case.thd
        return A.SequenceDescriptor.from_seqlens(
            tuple(jnp.asarray([r[0][1] for r in segs], jnp.int32) for segs in (segs_q, segs_kv))
        )
    if kind == "segment_ids":
        ids, pos = [], []
        for segs, s in ((segs_q, case.sq), (segs_kv, case.s_kv)):
            i_arr = np.zeros((case.b, s), np.int32)
            p_arr = np.zeros((case.b, s), np.int32)
            for r, row in enumerate(segs):
                for n, (start, length) in enumerate(row):
                    i_arr[r, start : start + length] = n + 1
                    p_arr[r, start : start + length] = np.arange(length)
            ids.append(jnp.asarray(i_arr))
            pos.append(jnp.asarray(p_arr))
        return A.SequenceDescriptor.from_segment_ids_and_pos(tuple(ids), tuple(pos))
    assert kind == "offsets" and case.thd
    lens, offs = [], []
    for segs in (segs_q, segs_kv):  # unused entries -1 (the docstring's convention)
        ln = np.full((case.b, case.m), -1, np.int32)
        of = np.full((case.b, case.m + 1), -1, np.int32)
        for r, row in enumerate(segs):
            for n, (start, length) in enumerate(row):
                ln[r, n], of[r, n] = length, start
            of[r, len(row)] = row[-1][0] + row[-1][1]
        lens.append(jnp.asarray(ln))
        offs.append(jnp.asarray(of))
    return A.SequenceDescriptor.from_seqlens_and_offsets(tuple(lens), tuple(offs))


def allowed(mask: str, window, i: int, j: int, lq: int, lkv: int) -> bool:
    """fused_attn.h: causal / padding_causal keep j <= i; the others' windows are bottom-right
    aligned (off = lkv - lq); causal masks imply right = 0; -1 = unbounded."""
    left, right = (-1, -1) if window is None else window
    if "causal" in mask:
        right = 0
    off = 0 if mask in ("causal", "padding_causal") else lkv - lq
    return (left < 0 or j >= i + off - left) and (right < 0 or j <= i + off + right)


def keep_matrix(case: Case, segs_q, segs_kv) -> np.ndarray:
    """bool [b, s_q, s_kv]: key j kept for query i (same segment, allowed by mask and window)."""
    keep = np.zeros((case.b, case.sq, case.s_kv), bool)
    for r in range(case.b):
        for (qs, lq), (ks, lkv) in zip(segs_q[r], segs_kv[r]):
            for i in range(lq):
                for j in range(lkv):
                    keep[r, qs + i, ks + j] = allowed(case.mask, case.window, i, j, lq, lkv)
    return keep


# ----------------------------------------------------------------------------- problem
@dataclass
class Problem:
    """Canonical inputs in the case's dtype (q [b, sq, h, d], k / v [b, skv, h_kv, d(v)]),
    their fp64 values, the mask and the descriptor."""

    q: jax.Array
    k: jax.Array
    v: jax.Array
    bias: jax.Array | None
    dout: jax.Array
    keep: np.ndarray
    desc: A.SequenceDescriptor | None
    segs: tuple = field(default=())

    def f64(self, name: str) -> np.ndarray | None:
        x = getattr(self, name)
        return None if x is None else np.asarray(jnp.asarray(x, jnp.float32), np.float64)


def make_problem(case: Case) -> Problem:
    rng = np.random.default_rng(case.seed)
    dt = case.jdtype

    def rnd(*shape, scale=1.0):
        return jnp.asarray((rng.standard_normal(shape) * scale).astype(np.float32)).astype(dt)

    b, sq, skv, h, hk = case.b, case.sq, case.s_kv, case.h, case.heads_kv
    q, k, v = rnd(b, sq, h, case.d), rnd(b, skv, hk, case.d), rnd(b, skv, hk, case.d_v)
    bias = None
    if case.bias != "no_bias":
        pb = {"1hss": (1, h), "b1ss": (b, 1), "bhss": (b, h), "11ss": (1, 1)}[case.bias_shape]
        bias = rnd(*pb, sq, skv)
    dout = rnd(b, sq, h, case.d_v)
    segs_q, segs_kv = segments(case, rng)
    keep = keep_matrix(case, segs_q, segs_kv)
    return Problem(q, k, v, bias, dout, keep, descriptor(case, segs_q, segs_kv), (segs_q, segs_kv))


def pack(layout: str, q, k, v) -> tuple:
    """Canonical q, k, v -> the layout's qkv argument."""
    if layout in ("bs3hd", "t3hd"):
        return (jnp.stack([q, k, v], axis=2),)
    if layout in ("bshd_bs2hd", "thd_t2hd"):
        return (q, jnp.stack([k, v], axis=2))
    return (q, k, v)


def unpack_grads(layout: str, grads: tuple) -> tuple:
    """Gradients of the layout's qkv argument -> canonical (dq, dk, dv)."""
    if layout in ("bs3hd", "t3hd"):
        g = grads[0]
        return g[:, :, 0], g[:, :, 1], g[:, :, 2]
    if layout in ("bshd_bs2hd", "thd_t2hd"):
        return grads[0], grads[1][:, :, 0], grads[1][:, :, 1]
    return tuple(grads)


def run_jax(
    case: Case,
    prob: Problem,
    fn=None,
    *,
    seed=None,
    dropout: float = 0.0,
    jit: bool = True,
    is_training: bool = True,
):
    """fn (default A.fused_attn) on the case, with gradients of sum(out * dout):
    (out, dq, dk, dv, dbias) as float64 numpy (canonical shapes; dbias None without bias)."""
    fn = A.fused_attn if fn is None else fn

    def loss(qkv, bias):
        out = fn(
            qkv,
            bias,
            prob.desc,
            seed,
            case.bias,
            case.mask,
            case.layout,
            "vanilla",
            case.d**-0.5,
            dropout,
            is_training,
            max_segments_per_seq=case.m,
            window_size=case.window,
        )
        return jnp.sum(out.astype(jnp.float32) * prob.dout.astype(jnp.float32)), out

    step = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)
    if jit:
        step = jax.jit(step)
    (_, out), (g_qkv, g_bias) = step(pack(case.layout, prob.q, prob.k, prob.v), prob.bias)
    res = (out, *unpack_grads(case.layout, g_qkv), g_bias)
    return tuple(
        None if x is None else np.asarray(jnp.asarray(x, jnp.float32), np.float64) for x in res
    )


# ----------------------------------------------------------------------------- dropout
def seed_words(key) -> jax.Array:
    """The Philox words fused_attn derives from a PRNG key: {seed lo, seed hi, 0, 0}."""
    data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    words = jnp.asarray(data, jnp.uint32).reshape(-1)[:2]
    return jnp.concatenate([words, jnp.zeros((2,), jnp.uint32)])


def dropout_mask(case: Case, prob: Problem, key, p: float) -> np.ndarray:
    """bool [b, h, s_q, s_kv] of the kernel's keep mask, indexed in the canonical padded form:
    bshd draws (row, head, i, j); thd draws (sequence = row * m + segment, head, position in q's
    segment, position in kv's segment)."""
    b, h, sq, skv = case.b, case.h, case.sq, case.s_kv
    if not case.thd:
        return np.asarray(tex_attn.dropout_keep_mask(seed_words(key), b, h, sq, skv, p))
    full = np.asarray(tex_attn.dropout_keep_mask(seed_words(key), b * case.m, h, sq, skv, p))
    out = np.zeros((b, h, sq, skv), bool)
    segs_q, segs_kv = prob.segs
    for r in range(b):
        for n, ((qs, lq), (ks, lkv)) in enumerate(zip(segs_q[r], segs_kv[r])):
            out[r, :, qs : qs + lq, ks : ks + lkv] = full[r * case.m + n, :, :lq, :lkv]
    return out


# ----------------------------------------------------------------------------- references
def _reduce_to(x: np.ndarray, shape) -> np.ndarray:
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def reference_fp64(case: Case, prob: Problem, drop: np.ndarray | None = None, p: float = 0.0):
    """fp64 attention and its closed-form gradients: (out, dq, dk, dv, dbias). drop: the dropout
    keep mask bool [b, h, s_q, s_kv] (kept probabilities scaled by 1 / (1 - p))."""
    q, k, v, dout = (prob.f64(n) for n in ("q", "k", "v", "dout"))
    bias = prob.f64("bias")
    scale = case.d**-0.5
    b, _, h, _ = q.shape
    hk = k.shape[2]
    rep = h // hk
    kr, vr = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, kr)
    if case.bias == "pre_scale_bias":
        s = (s + bias) * scale
    else:
        s = s * scale + (bias if case.bias == "post_scale_bias" else 0.0)
    keep = np.broadcast_to(prob.keep[:, None], s.shape)
    live = keep.any(-1, keepdims=True)
    s = np.where(keep, s, -np.inf)
    mx = np.where(live, s.max(-1, keepdims=True), 0.0)
    e = np.where(keep, np.exp(s - mx), 0.0)
    den = e.sum(-1, keepdims=True)
    probs = np.where(live, e / np.where(live, den, 1.0), 0.0)
    mult = 1.0 if drop is None else drop.astype(np.float64) / (1.0 - p)
    pd = probs * mult
    out = np.einsum("bhqk,bkhd->bqhd", pd, vr)
    dpd = np.einsum("bqhd,bkhd->bhqk", dout, vr)
    dvr = np.einsum("bhqk,bqhd->bkhd", pd, dout)
    dp = dpd * mult
    ds = probs * (dp - (dp * probs).sum(-1, keepdims=True))
    dq = scale * np.einsum("bhqk,bkhd->bqhd", ds, kr)
    dkr = scale * np.einsum("bhqk,bqhd->bkhd", ds, q)
    skv = k.shape[1]
    dk = dkr.reshape(b, skv, hk, rep, -1).sum(3)
    dv = dvr.reshape(b, skv, hk, rep, -1).sum(3)
    dbias = None
    if bias is not None:
        dbias = _reduce_to(ds * (scale if case.bias == "pre_scale_bias" else 1.0), bias.shape)
    return out, dq, dk, dv, dbias


def reference_lowp(case: Case, prob: Problem, drop: np.ndarray | None = None, p: float = 0.0):
    """The same math in plain JAX in the case's dtype, gradients by autodiff: the error baseline."""
    dt = case.jdtype
    keep = jnp.asarray(prob.keep[:, None])
    live = jnp.any(keep, axis=-1, keepdims=True)
    scale = jnp.asarray(case.d**-0.5, dt)

    def f(q, k, v, bias):
        rep = case.h // case.heads_kv
        kr, vr = jnp.repeat(k, rep, axis=2), jnp.repeat(v, rep, axis=2)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, kr)
        if case.bias == "pre_scale_bias":
            s = (s + bias) * scale
        else:
            s = s * scale + (bias if case.bias == "post_scale_bias" else 0)
        s = jnp.where(keep, s, jnp.where(live, -jnp.inf, 0).astype(dt))
        probs = jnp.where(live, jax.nn.softmax(s, axis=-1), 0).astype(dt)
        if drop is not None:
            probs = (probs * jnp.asarray(drop, dt) * jnp.asarray(1.0 / (1.0 - p), dt)).astype(dt)
        return jnp.einsum("bhqk,bkhd->bqhd", probs, vr)

    def run(q, k, v, bias, dout):
        out, vjp = jax.vjp(f, q, k, v, bias)
        return (out, *vjp(dout))

    bias = prob.bias if prob.bias is not None else jnp.zeros((), dt)
    args = (prob.q, prob.k, prob.v, bias, prob.dout)
    # LLVM -O0: half the compile time of this one-off function (numerics are XLA's either way)
    res = jax.jit(run).lower(*args).compile(_FAST_COMPILE)(*args)
    res = [np.asarray(jnp.asarray(x, jnp.float32), np.float64) for x in res]
    if prob.bias is None:
        res[4] = None
    return tuple(res)


# ----------------------------------------------------------------------------- checks
def check_bound(what: str, got, ref64, lowp, dtype: str) -> None:
    """max|got - ref64| <= 2 max|lowp - ref64| + floor * max(1, max|ref64|); all finite."""
    assert got.shape == ref64.shape, f"{what}: shape {got.shape} != {ref64.shape}"
    assert np.isfinite(got).all(), f"{what}: {int((~np.isfinite(got)).sum())} non-finite values"
    if not got.size:
        return
    diff = np.abs(got - ref64)
    err, base = diff.max(), np.abs(lowp - ref64).max()
    name = np.dtype(DTYPES[dtype]).name
    bound = 2 * base + ATTENTION_FLOOR[name] * max(1.0, np.abs(ref64).max())
    if err > bound:
        idx = np.unravel_index(diff.argmax(), diff.shape)
        raise AssertionError(
            f"{what}: max error {err:.3g} vs fp64 exceeds 2 x plain-JAX {name}'s {base:.3g} + "
            f"floor (bound {bound:.3g}); {int((diff > bound).sum())}/{diff.size} elements over, "
            f"worst at {tuple(int(i) for i in idx)}: got {got[idx]:.6g}, fp64 {ref64[idx]:.6g}"
        )


def check_structural_zeros(case: Case, prob: Problem, res) -> None:
    """Queries with no key kept (padding, empty windows) get output 0 and dq 0; keys no query
    sees get dk = dv = 0; masked-out logits get dbias 0 (when bias is [b, ., s, s]): exactly."""
    out, dq, dk, dv, dbias = res
    dead_q = ~prob.keep.any(-1)  # [b, sq]
    dead_kv = ~prob.keep.any(-2)  # [b, skv]
    for name, x, dead in (
        ("out", out, dead_q),
        ("dq", dq, dead_q),
        ("dk", dk, dead_kv),
        ("dv", dv, dead_kv),
    ):
        bad = np.abs(x[dead]).max(initial=0.0)
        assert bad == 0.0, f"{name}: {int(dead.sum())} fully masked tokens, max |value| {bad}"
    if dbias is not None and dbias.shape[0] == case.b:
        masked = ~prob.keep[:, None]
        bad = np.abs(dbias[np.broadcast_to(masked, dbias.shape)]).max(initial=0.0)
        assert bad == 0.0, f"dbias at masked logits: max |value| {bad}"


def assert_results_close(what: str, got, want, dtype: str, scale: float = 1.0) -> None:
    """Two backends' (out, dq, dk, dv, dbias) within the dtype's tolerance (tests/jax/utils.TOLS),
    atol relative to max(1, max|want|)."""
    t = tols(DTYPES[dtype])
    for name, a, b in zip(NAMES, got, want):
        if b is None:
            assert a is None, f"{what} {name}: expected none"
            continue
        atol = t["atol"] * scale * max(1.0, np.abs(b).max(initial=0.0))
        np.testing.assert_allclose(
            a, b, rtol=t["rtol"] * scale, atol=atol, err_msg=f"{what}: {name}"
        )


def check_against_reference(case: Case, prob: Problem, res, drop=None, p=0.0, what="") -> None:
    """res = (out, dq, dk, dv, dbias) within check_bound of the fp64 reference, structural zeros
    exact."""
    ref = reference_fp64(case, prob, drop, p)
    low = reference_lowp(case, prob, drop, p)
    for name, got, r, lo in zip(NAMES, res, ref, low):
        if r is None:
            assert got is None, f"{what}{name}: expected none"
            continue
        check_bound(f"{what}{name}", got, r, lo, case.dtype)
    check_structural_zeros(case, prob, res)

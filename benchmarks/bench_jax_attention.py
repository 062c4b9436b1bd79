#!/usr/bin/env python
"""Attention cases of the JAX front end (also run by bench_jax.py): the jitted fused_attn (the C
core's flash kernel) against jax.nn.dot_product_attention(implementation="xla"), and
te_flax.TransformerLayer against the same block in pure Flax; every result checked before it is
timed. --memory: peak memory of one attention fwd+bwd at S = 2048, 4096, 8192 instead.

    python benchmarks/bench_jax_attention.py               # the three cases, full sizes
    python benchmarks/bench_jax_attention.py --quick       # small sizes (smoke test)
    python benchmarks/bench_jax_attention.py --memory      # peak memory, ours vs XLA

Attention: bf16, causal, B=2, H=16, S=2048, D=64 (--quick: B=1, H=4, S=256), both sides in
[B, S, H, D] (QKVLayout.BSHD_BSHD_BSHD, no bias, dropout 0, scale 1/sqrt(D)); fwd+bwd = the jitted
value_and_grad of sum(out * dy) w.r.t. q, k, v (out returned too). Checks: out, dq, dk, dv within 2x
XLA bf16's max error of XLA's fp32 computation on the same values, and norm-wise within 1.5x of its
relative error (+ 0.001) (_common.bf16_peer_check).
TransformerLayer: hidden 1024, MLP 4096, 16 heads, batch 2 x seq 1024, bf16 parameters and
activations (--quick: 256, 1024, 4 heads, 2 x 256), causal self-attention, no relative position
bias, LayerNorm, dropouts 0, scale_attn_logits=True (softmax scale 1/sqrt(head_dim)). Reference:
nn.LayerNorm -> nn.Dense (fused QKV, no bias) -> jax.nn.dot_product_attention (xla) -> nn.Dense ->
residual -> nn.LayerNorm -> nn.Dense -> GELU (tanh) -> nn.Dense -> residual, with our parameters
copied in; the timed call is the jitted value_and_grad w.r.t. (params, x) of sum(y * dy); checked
are y, dx and every parameter gradient (bf16_peer_check against the Flax block in bf16 / fp32).
Settling: the XLA reference allocates and frees 1.3-5 GB of temporaries per call (its [B, H, S, S]
logits); in the 2-core VM this was measured on, the call that follows it (ours, in the interleaved
timing) ran 1.3-1.5x slower for ~0.2 s, with extra system time. So every timed call of these cases,
on both sides, starts after an untimed pause of SETTLE_S (Case.settle_s); without it the fwd+bwd
ratio read 8.2-9.4x, with each side timed alone 13.8x.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

import functools
import json
import math
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Case, MissingOp, bf16_peer_check, cli

BF16, F32 = jnp.bfloat16, jnp.float32
LN_EPS = 1e-6  # TE-JAX's and Flax's default
MEMORY_SEQLENS = (2048, 4096, 8192)
MEMORY_BHD = (1, 16, 64)  # B, H, D of the memory runs
# An XLA run whose compiled buffers would take more than this share of the free memory is not
# run (the machine is shared); its compiled size is reported instead.
MEMORY_SHARE = 0.5
SETTLE_S = 0.5  # see "Settling" above


def to_torch(a) -> torch.Tensor:
    """A JAX array as a float64 torch tensor (for the shared checks in _common)."""
    return torch.from_numpy(np.asarray(a).astype(np.float64))


# ------------------------------------------------------------------------------------ attention
def attn_sizes(quick: bool) -> tuple[int, int, int, int]:
    """(B, H, S, D)"""
    return (1, 4, 256, 64) if quick else (2, 16, 2048, 64)


def ours_attention(q, k, v, is_training: bool = True):
    """TE-JAX's functional fused_attn, causal, no bias, no dropout, bshd_bshd_bshd."""
    try:
        from transformer_engine_lite.jax import attention as A
    except ImportError as e:
        raise MissingOp(f"transformer_engine_lite.jax.attention: {e}") from e
    return A.fused_attn((q, k, v), None, None, None, A.AttnBiasType.NO_BIAS,
                        A.AttnMaskType.CAUSAL_MASK, A.QKVLayout.BSHD_BSHD_BSHD,
                        A.AttnSoftmaxType.VANILLA_SOFTMAX, 1.0 / math.sqrt(q.shape[-1]), 0.0,
                        is_training)


def xla_attention(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")


def attention_fwd_bwd(attn: Callable) -> Callable:
    """jit(value_and_grad) of sum(out * dy) w.r.t. q, k, v, out returned as aux (both sides alike)."""

    def loss(q, k, v, dy):
        out = attn(q, k, v)
        return jnp.sum(out.astype(F32) * dy.astype(F32)), out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


def _attn_results(out, backward: bool) -> dict[str, torch.Tensor]:
    if not backward:
        return {"out": to_torch(out)}
    (_, y), (dq, dk, dv) = out
    return {k: to_torch(v) for k, v in (("out", y), ("dq", dq), ("dk", dk), ("dv", dv))}


class AttnSetup:
    """q, k, v, dy and the jitted functions of both sides (made once: the check compiles what is
    then timed)."""

    def __init__(self, quick: bool) -> None:
        b, h, s, d = attn_sizes(quick)
        keys = jax.random.split(jax.random.PRNGKey(0), 4)
        self.args = [jax.random.normal(kk, (b, s, h, d), F32).astype(BF16) for kk in keys]
        self.fwd = {"ours": jax.jit(functools.partial(ours_attention, is_training=False)),
                    "ref": jax.jit(xla_attention)}
        self.fwd_bwd = {"ours": attention_fwd_bwd(ours_attention),
                        "ref": attention_fwd_bwd(xla_attention)}

    def timed(self, side: str, backward: bool) -> Callable[[], object]:
        fn, args = (self.fwd_bwd[side], self.args) if backward else (self.fwd[side], self.args[:3])
        return lambda: jax.block_until_ready(fn(*args))

    def check(self, backward: bool) -> str | None:
        fns = self.fwd_bwd if backward else self.fwd
        args = self.args if backward else self.args[:3]
        ours = _attn_results(fns["ours"](*args), backward)
        base = _attn_results(fns["ref"](*args), backward)
        # XLA's computation in fp32 on the same (bf16-valued) inputs; computed once per check
        ref32 = _attn_results(fns["ref"](*(a.astype(F32) for a in args)), backward)
        return bf16_peer_check(ours, base, ref32)


@functools.cache
def attn_setup(quick: bool) -> AttnSetup:
    return AttnSetup(quick)


def _attn_case(backward: bool) -> Callable[[bool], Case]:
    def build(quick: bool) -> Case:
        s = attn_setup(quick)
        _, h, sq, d = attn_sizes(quick)
        from transformer_engine_lite.jax.attention import attention_backend

        backend = attention_backend(BF16, "bshd_bshd_bshd", "no_bias", "causal", 0.0, h, h, sq,
                                    sq, d, d)
        return Case(s.timed("ours", backward), s.timed("ref", backward),
                    lambda: s.check(backward), notes=[f"our backend: {backend}"],
                    settle_s=0.0 if quick else SETTLE_S)

    return build


# ---------------------------------------------------------------------------- TransformerLayer
def layer_sizes(quick: bool) -> tuple[int, int, int, int, int]:
    """(hidden, mlp hidden, heads, batch, seq)"""
    return (256, 1024, 4, 2, 256) if quick else (1024, 4096, 16, 2, 1024)


class FlaxBlock(nn.Module):
    """TE-JAX's TransformerLayer (encoder, pre-LayerNorm, fused QKV, no biases) in pure Flax."""

    heads: int
    mlp: int
    dtype: Any = BF16

    @nn.compact
    def __call__(self, x):
        dt, (b, s, hidden) = self.dtype, x.shape
        dense = functools.partial(nn.Dense, use_bias=False, dtype=dt, param_dtype=dt)
        h = nn.LayerNorm(epsilon=LN_EPS, dtype=dt, param_dtype=dt, name="ln1")(x)
        qkv = dense(3 * hidden, name="qkv")(h).reshape(b, s, 3, self.heads, hidden // self.heads)
        a = xla_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]).reshape(b, s, hidden)
        x = x + dense(hidden, name="out")(a)
        h = nn.LayerNorm(epsilon=LN_EPS, dtype=dt, param_dtype=dt, name="ln2")(x)
        h = nn.gelu(dense(self.mlp, name="fc1")(h), approximate=True)
        return x + dense(hidden, name="fc2")(h)

    def apply_params(self, params, x):
        return self.apply({"params": params}, x)


def _to_ref(t: dict) -> dict:
    """Our TransformerLayer's parameters (or their gradients) in FlaxBlock's layout."""
    att, mlp = t["attention"], t["mlp"]
    hidden = att["qkv"]["kernel"].shape[0]
    return {
        "ln1": {"scale": att["qkv"]["scale"], "bias": att["qkv"]["ln_bias"]},
        "qkv": {"kernel": att["qkv"]["kernel"].reshape(hidden, -1)},  # [H, 3, H] -> [H, 3H]
        "out": {"kernel": att["out"]["kernel"]},
        "ln2": {"scale": mlp["scale"], "bias": mlp["ln_bias"]},
        "fc1": {"kernel": mlp["wi_kernel"][:, 0, :]},  # [H, 1, F] -> [H, F]
        "fc2": {"kernel": mlp["wo_kernel"]},
    }


def _layer_step(apply: Callable) -> Callable:
    def loss(params, x, dy):
        y = apply(params, x)
        return jnp.sum(y.astype(F32) * dy.astype(F32)), y

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


def _layer_results(out, ref_layout_grads) -> dict[str, torch.Tensor]:
    (_, y), (_, dx) = out
    res = {"y": y, "dx": dx}
    for path, g in jax.tree_util.tree_flatten_with_path(ref_layout_grads)[0]:
        res["d" + "/".join(str(getattr(k, "key", k)) for k in path)] = g
    return {k: to_torch(v) for k, v in res.items()}


def case_transformer_layer(quick: bool) -> Case:
    try:
        import transformer_engine_lite.jax.flax as te_flax

        layer_cls, layer_type = te_flax.TransformerLayer, te_flax.TransformerLayerType.ENCODER
    except (ImportError, AttributeError) as e:
        raise MissingOp(f"te_flax.TransformerLayer: {e}") from e
    hidden, mlp, heads, batch, seq = layer_sizes(quick)
    ours_mod = layer_cls(
        hidden_size=hidden, mlp_hidden_size=mlp, num_attention_heads=heads, hidden_dropout=0.0,
        attention_dropout=0.0, intermediate_dropout=0.0, layer_type=layer_type,
        self_attn_mask_type="causal", enable_relative_embedding=False, layernorm_type="layernorm",
        mlp_activations=("gelu",), scale_attn_logits=True, dtype=BF16)
    kx, kdy, kp, kn = jax.random.split(jax.random.PRNGKey(0), 4)
    x = jax.random.normal(kx, (batch, seq, hidden), F32).astype(BF16)
    dy = jax.random.normal(kdy, (batch, seq, hidden), F32).astype(BF16)
    params = nn.unbox(ours_mod.init(kp, x, deterministic=True)["params"])
    # non-trivial norm parameters (scale 1 +- 0.1, bias +- 0.1)
    keys = iter(jax.random.split(kn, 4))
    for sub in (params["attention"]["qkv"], params["mlp"]):
        for name, base in (("scale", 1.0), ("ln_bias", 0.0)):
            noise = 0.1 * jax.random.normal(next(keys), sub[name].shape, F32)
            sub[name] = (base + noise).astype(BF16)
    ref_params = _to_ref(params)
    ours_step = _layer_step(lambda p, x: ours_mod.apply({"params": p}, x, deterministic=True))
    ref_steps = {dt: _layer_step(FlaxBlock(heads, mlp, dt).apply_params) for dt in (BF16, F32)}

    def check() -> str | None:
        out = ours_step(params, x, dy)
        ours = _layer_results(out, _to_ref(out[1][0]))
        base_out = ref_steps[BF16](ref_params, x, dy)
        p32 = jax.tree_util.tree_map(lambda a: a.astype(F32), ref_params)
        ref_out = ref_steps[F32](p32, x.astype(F32), dy)
        return bf16_peer_check(ours, _layer_results(base_out, base_out[1][0]),
                               _layer_results(ref_out, ref_out[1][0]))

    return Case(lambda: jax.block_until_ready(ours_step(params, x, dy)),
                lambda: jax.block_until_ready(ref_steps[BF16](ref_params, x, dy)), check,
                settle_s=0.0 if quick else SETTLE_S)


# name: (builder, target ratio or None for report-only)
CASES: dict[str, tuple[Callable[[bool], Case], float | None]] = {
    "jax_attention_fwd_bf16": (_attn_case(backward=False), None),
    "jax_attention_fwd_bwd_bf16": (_attn_case(backward=True), 10.0),
    "jax_transformer_layer_bf16": (case_transformer_layer, 1.5),
}


# ---------------------------------------------------------------------------------- peak memory
def _proc_kib(path: str, field: str) -> int:
    """A "Field:  N kB" line of a /proc file, in KiB."""
    with open(path) as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{path} has no {field}")


def measure_memory(side: str, s: int, run: bool) -> dict:
    """One causal bf16 fwd+bwd at sequence length s (B, H, D = MEMORY_BHD), in this process:
    XLA's compiled buffer sizes and, when run, the resident memory it added at its peak (the
    kernel's own scratch included, which XLA's analysis does not see)."""
    b, h, d = MEMORY_BHD
    args = [jnp.ones((b, s, h, d), BF16) for _ in range(4)]
    compiled = attention_fwd_bwd(ours_attention if side == "ours" else xla_attention).lower(
        *args).compile()
    ma = compiled.memory_analysis()
    res = {"xla_temp_mib": ma.temp_size_in_bytes / 2**20,
           "xla_out_mib": ma.output_size_in_bytes / 2**20, "peak_mib": None}
    if run:
        # Reset the high-water mark to the current resident size, then run once: the growth of
        # the peak is what the call needs (its outputs included).
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        base = _proc_kib("/proc/self/status", "VmRSS")
        jax.block_until_ready(compiled(*args))
        res["peak_mib"] = (_proc_kib("/proc/self/status", "VmHWM") - base) / 1024
    return res


def _measure_in_subprocess(side: str, s: int, run: bool) -> dict:
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import bench_jax_attention as m; "
            "print(json.dumps(m.measure_memory(sys.argv[2], int(sys.argv[3]), sys.argv[4] == '1')))")
    proc = subprocess.run([sys.executable, "-c", code, os.path.dirname(os.path.abspath(__file__)),
                           side, str(s), "1" if run else "0"], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"memory run {side} S={s} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def print_memory() -> int:
    """Peak memory table, each measurement in a fresh process. An XLA size whose compiled buffers
    exceed MEMORY_SHARE of the free memory is compiled only (its run could exhaust the machine)."""
    b, h, d = MEMORY_BHD
    avail_mib = _proc_kib("/proc/meminfo", "MemAvailable") / 1024
    print(f"peak memory of one causal fwd+bwd, bf16, B={b} H={h} D={d} (MiB; free memory "
          f"{avail_mib:,.0f} MiB). 'peak': resident memory added while it ran (outputs "
          "included); 'XLA temp': XLA's compiled temporary buffers (not the kernel's own scratch)")
    print(f"  {'S':>6} {'ours peak':>10} {'ours XLA temp':>14} {'XLA peak':>10} {'XLA temp':>10}")
    for s in MEMORY_SEQLENS:
        ours = _measure_in_subprocess("ours", s, run=True)
        ref = _measure_in_subprocess("xla", s, run=False)
        fits = ref["xla_temp_mib"] + ref["xla_out_mib"] < MEMORY_SHARE * avail_mib
        if fits:
            ref = _measure_in_subprocess("xla", s, run=True)
        ref_peak = f"{ref['peak_mib']:10.1f}" if fits else f"{'not run':>10}"
        print(f"  {s:>6} {ours['peak_mib']:10.1f} {ours['xla_temp_mib']:14.1f} {ref_peak} "
              f"{ref['xla_temp_mib']:10.1f}", flush=True)
    return 0


def header() -> str:
    import flax

    from transformer_engine_lite.common import build_info

    info = build_info()
    return (f"transformer_engine_lite {info['version']} (library threads "
            f"{info.get('max_threads')}); jax {jax.__version__} ({jax.devices()[0].device_kind}, "
            f"{os.cpu_count()} cores), flax {flax.__version__}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--memory" in argv:
        return print_memory()
    return cli(__doc__, CASES, header, argv, default_repeat=(5, 5),
               fatal=(RuntimeError, ValueError, TypeError, NotImplementedError))


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Times the JAX front end (te_flax.LayerNormMLP, te_flax.DenseGeneral, forward + backward, in bf16
and under autocast(Float8CurrentScaling); the current-scaling quantize primitives) against the
equivalent pure-Flax / pure-JAX code, both sides under jax.jit; checks every result (output, dx and
all parameter gradients) before its time counts.

    python benchmarks/bench_jax.py                         # all cases, full sizes
    python benchmarks/bench_jax.py --quick                 # small sizes (smoke test)
    python benchmarks/bench_jax.py --cases jax_dense_fp8 --json out.json

Sizes: hidden 2048, ffn 8192, 4096 tokens as batch 2 x seq 2048 (--quick: 256, 1024, 2 x 256); bf16
parameters and activations; the quantize case bf16 8192x4096 (--quick: 1024x1024). One timed call =
the jitted jax.value_and_grad (w.r.t. the parameters and x) of sum(y * dy) with a fixed dy (i.e.
forward + backward with a fixed output gradient), then jax.block_until_ready on every output.
Ours: te_flax.LayerNormMLP(intermediate_dim, activations=("gelu",), dtype=bf16) (TE-JAX's default
use_bias=False) and te_flax.DenseGeneral(hidden, dtype=bf16) (with bias); the FP8 cases trace the
module inside te.autocast(True, recipe=Float8CurrentScaling()) (HYBRID: E4M3 forward, E5M2
gradients). References: nn.LayerNorm -> nn.Dense (no bias) -> nn.gelu(approximate=True) ->
nn.Dense (no bias), and nn.Dense, with dtype = param_dtype = bf16; for the quantize case the jitted
composite amax = max|x|, scale = 448 / amax, clip(x * scale).astype(float8_e4m3fn).
Timing, ratio (= ref_ms / ours_ms), JSON and exit status: as bench_core.py (benchmarks/_common.py).
Also runs the attention cases of bench_jax_attention.py (jax_attention_fwd_bf16,
jax_attention_fwd_bwd_bf16: fused_attn vs jax.nn.dot_product_attention; jax_transformer_layer_bf16:
te_flax.TransformerLayer vs the same block in pure Flax); peak memory: bench_jax_attention.py --memory.
XLA's CPU thread pool and the library's OpenMP threads both default to every core.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

import functools
import sys
from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Case, bf16_peer_check, cli, rel_err
from bench_jax_attention import CASES as ATTENTION_CASES

import transformer_engine_lite.jax as te
import transformer_engine_lite.jax.cpp_extensions as tex
import transformer_engine_lite.jax.flax as te_flax
from transformer_engine_lite.common import build_info
from transformer_engine_lite.common.recipe import Float8CurrentScaling

LN_EPS = 1e-6  # TE-JAX's and Flax's default
BF16, F32 = jnp.bfloat16, jnp.float32
# HYBRID: E4M3 for forward operands, E5M2 for gradients
FWD_FP8, BWD_FP8 = jnp.float8_e4m3fn, jnp.float8_e5m2
E4M3_MAX = 448.0
RECIPE = Float8CurrentScaling()
FP8_TOL = 0.1  # check_fp8: allowed error, as a fraction of the FP8 rounding's own effect


def sizes(quick: bool) -> tuple[int, int, int, int]:
    """(hidden, ffn, batch, seq); tokens = batch * seq"""
    return (256, 1024, 2, 256) if quick else (2048, 8192, 2, 2048)


def to_torch(a) -> torch.Tensor:
    """A JAX array as a float64 torch tensor (for the shared checks in _common)."""
    return torch.from_numpy(np.asarray(a).astype(np.float64))


# ----------------------------------------------------------------------------- references (Flax)
class FlaxMLP(nn.Module):
    """nn.LayerNorm -> nn.Dense -> GELU (tanh, as TE's) -> nn.Dense, no biases (as TE-JAX's
    LayerNormMLP default), parameters and compute in `dtype`."""

    ffn: int
    dtype: Any = BF16

    @nn.compact
    def __call__(self, x):
        dt = self.dtype
        h = nn.LayerNorm(epsilon=LN_EPS, dtype=dt, param_dtype=dt, name="ln")(x)
        h = nn.Dense(self.ffn, use_bias=False, dtype=dt, param_dtype=dt, name="fc1")(h)
        h = nn.gelu(h, approximate=True)
        return nn.Dense(x.shape[-1], use_bias=False, dtype=dt, param_dtype=dt, name="fc2")(h)


def flax_dense(hidden: int, dtype) -> nn.Module:
    return nn.Dense(hidden, dtype=dtype, param_dtype=dtype)


# ----------------------------------------------------------------- exact FP8 computation (JAX)
def _fake_quant(t, dtype):
    """Current scaling round trip in fp32: scale = max / amax (a true division, as the core),
    encode (clamped: satfinite), dequantize with 1 / scale."""
    fmax = float(jnp.finfo(dtype).max)
    scale = jnp.float32(fmax) / jnp.max(jnp.abs(t))
    q = jnp.clip(t * scale, -fmax, fmax).astype(dtype)
    return q.astype(F32) * (jnp.float32(1.0) / scale)


@jax.custom_vjp
def _fp8_mm(x, w):
    """x [T, K] @ w [K, N], FP8-quantized operands (E4M3), fp32 math; backward: the gradient in
    E5M2, dgrad and wgrad on the forward's quantized operands (TE's rule)."""
    return _fp8_mm_fwd(x, w)[0]


def _fp8_mm_fwd(x, w):
    xq, wq = _fake_quant(x, FWD_FP8), _fake_quant(w, FWD_FP8)
    return jnp.dot(xq, wq, precision="highest"), (xq, wq)


def _fp8_mm_bwd(res, g):
    xq, wq = res
    gq = _fake_quant(g, BWD_FP8)
    return jnp.dot(gq, wq.T, precision="highest"), jnp.dot(xq.T, gq, precision="highest")


_fp8_mm.defvjp(_fp8_mm_fwd, _fp8_mm_bwd)


def _bf16(t):
    """Round to bf16 and back (the cotangent is rounded too): our path's bf16 tensors."""
    return t.astype(BF16).astype(F32)


def exact_fp8_apply(kind: str, p: dict, x):
    """The FP8 computation our path does, in fp32 (parameters p in the Flax reference's layout,
    fp32; x bf16): same quantization points and current scales, bf16 tensors between the ops."""
    lead, k = x.shape[:-1], x.shape[-1]
    x32 = x.astype(F32).reshape(-1, k)
    if kind == "dense":
        y = _fp8_mm(x32, p["kernel"]) + p["bias"]
        return y.reshape(*lead, -1).astype(BF16)
    mu = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mu), axis=-1, keepdims=True)
    z = (x32 - mu) * jax.lax.rsqrt(var + LN_EPS) * p["ln"]["scale"] + p["ln"]["bias"]
    h = _bf16(_fp8_mm(_bf16(z), p["fc1"]["kernel"]))
    a = _bf16(jax.nn.gelu(h, approximate=True))
    return _fp8_mm(a, p["fc2"]["kernel"]).reshape(*lead, -1).astype(BF16)


# ------------------------------------------------------------------------------------- setups
def make_step(apply: Callable, fp8: bool = False) -> Callable:
    """jit(value_and_grad) of sum(y * dy) w.r.t. (params, x); y returned as aux (for the checks;
    both sides alike). fp8: the module is traced inside te.autocast(Float8CurrentScaling)."""

    def loss(params, x, dy):
        if fp8:
            with te.autocast(enabled=True, recipe=RECIPE):
                y = apply(params, x)
        else:
            y = apply(params, x)
        return jnp.sum(y.astype(F32) * dy.astype(F32)), y

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


class Setup:
    """Our module with its parameters, the Flax reference with the same parameters, x and dy."""

    def __init__(self, kind: str, quick: bool) -> None:
        hidden, ffn, batch, seq = sizes(quick)
        self.kind, self.quick = kind, quick
        self._steps: dict[tuple, Callable] = {}
        kx, kdy, kp, kn1, kn2 = jax.random.split(jax.random.PRNGKey(0), 5)
        self.x = jax.random.normal(kx, (batch, seq, hidden), F32).astype(BF16)
        self.dy = jax.random.normal(kdy, (batch, seq, hidden), F32).astype(BF16)
        if kind == "mlp":
            self.ours_mod = te_flax.LayerNormMLP(
                intermediate_dim=ffn, activations=("gelu",), dtype=BF16
            )
            self.ref_mod = lambda dt: FlaxMLP(ffn, dt)
        else:
            self.ours_mod = te_flax.DenseGeneral(hidden, dtype=BF16)
            self.ref_mod = lambda dt: flax_dense(hidden, dt)
        params = dict(nn.unbox(self.ours_mod.init(kp, self.x)["params"]))
        # non-trivial norm parameters and biases
        for name, key in (("scale", kn1), ("ln_bias", kn2), ("bias", kn2)):
            if name in params:
                noise = 0.1 * jax.random.normal(key, params[name].shape, F32)
                base = 1.0 if name == "scale" else 0.0
                params[name] = (base + noise).astype(BF16)
        self.ours_params = jax.device_put(params)
        self.ref_params = jax.device_put(self.to_ref(params))

    def to_ref(self, tree: dict) -> dict:
        """Our parameters (or their gradients) in the Flax reference's layout."""
        if self.kind == "dense":
            return {"kernel": tree["kernel"], "bias": tree["bias"]}
        return {
            "ln": {"scale": tree["scale"], "bias": tree["ln_bias"]},
            "fc1": {"kernel": tree["wi_kernel"][:, 0, :]},  # [H, 1, I] -> [H, I]
            "fc2": {"kernel": tree["wo_kernel"]},
        }

    def ours_apply(self, params, x):
        y = self.ours_mod.apply({"params": params}, x)
        return y[0] if self.kind == "mlp" else y  # LayerNormMLP returns (out, ln_out or None)

    def ours_step(self, fp8: bool) -> Callable:
        """The jitted step (made once: the check compiles what is then timed)."""
        key = ("ours", fp8)
        if key not in self._steps:
            self._steps[key] = make_step(self.ours_apply, fp8)
        return self._steps[key]

    def ref_step(self, dtype=BF16) -> Callable:
        key = ("ref", np.dtype(dtype).name)
        if key not in self._steps:
            mod = self.ref_mod(dtype)
            self._steps[key] = make_step(lambda p, x: mod.apply({"params": p}, x))
        return self._steps[key]

    def timed(self, step: Callable, params) -> Callable[[], object]:
        x, dy = self.x, self.dy
        return lambda: jax.block_until_ready(step(params, x, dy))

    @staticmethod
    def _results(out, grads_ref_layout) -> dict[str, torch.Tensor]:
        (_, y), (_, dx) = out
        res = {"y": y, "dx": dx}
        flat = jax.tree_util.tree_flatten_with_path(grads_ref_layout)[0]
        for path, g in flat:
            res["d" + "/".join(str(getattr(k, "key", k)) for k in path)] = g
        return {k: to_torch(v) for k, v in res.items()}

    def ours_results(self, fp8: bool) -> dict[str, torch.Tensor]:
        out = self.ours_step(fp8)(self.ours_params, self.x, self.dy)
        return self._results(out, self.to_ref(out[1][0]))

    def ref_results(self, which: str) -> dict[str, torch.Tensor]:
        """which: "bf16" (the timed Flax reference), "fp32" (the Flax reference in fp32),
        "fp8_exact" (exact_fp8_apply: fp32 parameters, bf16 x)."""
        p32 = jax.tree_util.tree_map(lambda a: a.astype(F32), self.ref_params)
        if which == "bf16":
            out = self.ref_step(BF16)(self.ref_params, self.x, self.dy)
        elif which == "fp32":
            out = self.ref_step(F32)(p32, self.x.astype(F32), self.dy)
        else:
            step = make_step(functools.partial(exact_fp8_apply, self.kind))
            out = step(p32, self.x, self.dy)
        return self._results(out, out[1][0])


@functools.cache
def setup(kind: str, quick: bool) -> Setup:
    return Setup(kind, quick)


@functools.cache
def reference(kind: str, quick: bool, which: str) -> dict[str, torch.Tensor]:
    """Results of a reference (cached: cases share them)."""
    return setup(kind, quick).ref_results(which)


# -------------------------------------------------------------------------------------- checks
def check_bf16(s: Setup) -> str | None:
    """Flax bf16 as the peer (_common.bf16_peer_check)."""
    return bf16_peer_check(s.ours_results(fp8=False), reference(s.kind, s.quick, "bf16"),
                           reference(s.kind, s.quick, "fp32"))


def check_fp8(s: Setup) -> str | None:
    """Against the exact FP8 computation (same quantization points and current scales, fp32 math,
    bf16 tensors between the ops): each result's relative error at most FP8_TOL of what the FP8
    rounding itself changes (the unquantized fp32 result's distance to it), plus twice the error of
    rounding the exact result to bf16 (bench_pytorch.py's rule)."""
    ours = s.ours_results(fp8=True)
    exact = reference(s.kind, s.quick, "fp8_exact")
    unquantized = reference(s.kind, s.quick, "fp32")
    for k in ours:
        fp8_effect = rel_err(unquantized[k], exact[k])
        rounding = rel_err(exact[k].to(torch.bfloat16), exact[k])
        err = rel_err(ours[k], exact[k])
        if err > FP8_TOL * fp8_effect + 2 * rounding + 1e-5:
            return (
                f"{k}: relative error {err:.3g} vs the exact FP8 computation > {FP8_TOL:g} x the "
                f"FP8 rounding's effect {fp8_effect:.3g} + 2 x bf16 rounding {rounding:.3g}"
            )
    return None


# --------------------------------------------------------------------------------------- cases
def _module_case(kind: str, fp8: bool) -> Callable[[bool], Case]:
    def build(quick: bool) -> Case:
        s = setup(kind, quick)
        ours = s.timed(s.ours_step(fp8), s.ours_params)
        ref = s.timed(s.ref_step(BF16), s.ref_params)
        check = (lambda: check_fp8(s)) if fp8 else (lambda: check_bf16(s))
        return Case(ours, ref, check)

    return build


def _quantize_ours(x):
    amax = tex.calculate_amax(x)
    scale, _ = tex.compute_scale_from_amax(amax, FWD_FP8)
    q, _, scale_inv = tex.quantize(x, scale, FWD_FP8)
    return q, amax, scale, scale_inv


def _quantize_ref(x):
    x32 = x.astype(F32)
    amax = jnp.max(jnp.abs(x32)).reshape(1)
    scale = jnp.float32(E4M3_MAX) / amax
    q = jnp.clip(x32 * scale, -E4M3_MAX, E4M3_MAX).astype(FWD_FP8)
    return q, amax, scale, jnp.float32(1.0) / scale


def case_quantize(quick: bool) -> Case:
    """bf16 -> E4M3 with current scaling: amax -> scale -> quantize, jitted on both sides."""
    rows, cols = (1024, 1024) if quick else (8192, 4096)
    x = (3.0 * jax.random.normal(jax.random.PRNGKey(1), (rows, cols), F32)).astype(BF16)
    ours, ref = jax.jit(_quantize_ours), jax.jit(_quantize_ref)

    def check() -> str | None:
        o = [np.asarray(a) for a in ours(x)]
        r = [np.asarray(a) for a in ref(x)]
        if not np.array_equal(o[0].view(np.uint8), r[0].view(np.uint8)):
            diff = int(np.count_nonzero(o[0].view(np.uint8) != r[0].view(np.uint8)))
            return f"FP8 bytes differ in {diff} of {o[0].size} elements"
        for name, a, b in zip(("amax", "scale"), o[1:3], r[1:3]):
            if not np.array_equal(a.reshape(-1), b.reshape(-1)):
                return f"{name}: ours {a.reshape(-1)} != reference {b.reshape(-1)}"
        # scale_inv: the correctly rounded 1 / scale (XLA's fp32 1 / x is at times 1 ulp off it)
        exact_inv = np.float32(1.0 / np.float64(o[2].reshape(-1)[0]))
        if o[3].reshape(-1)[0] != exact_inv:
            return f"scale_inv: ours {o[3].reshape(-1)} != 1 / scale = {exact_inv}"
        return None

    return Case(
        lambda: jax.block_until_ready(ours(x)), lambda: jax.block_until_ready(ref(x)), check
    )


# name: (builder, target ratio or None for report-only)
CASES: dict[str, tuple[Callable[[bool], Case], float | None]] = {
    "jax_layernorm_mlp_bf16": (_module_case("mlp", False), 1.0),
    "jax_layernorm_mlp_fp8": (_module_case("mlp", True), 0.8),
    "jax_dense_fp8": (_module_case("dense", True), 0.8),
    "jax_quantize_current_e4m3": (case_quantize, 1.5),
    **ATTENTION_CASES,  # jax_attention_fwd(_bwd)_bf16, jax_transformer_layer_bf16
}


def header() -> str:
    info = build_info()
    xla_flags = os.environ.get("XLA_FLAGS")
    return (
        f"transformer_engine_lite {info['version']} (gemm: {info.get('gemm_cpu')}, library threads "
        f"{info.get('max_threads')}); jax {jax.__version__} ({jax.devices()[0].device_kind}, "
        f"{os.cpu_count()} cores{f', XLA_FLAGS={xla_flags}' if xla_flags else ''}), flax "
        f"{flax.__version__}; fp8 recipe Float8CurrentScaling({RECIPE.fp8_format.name})"
    )


def main(argv: list[str] | None = None) -> int:
    return cli(
        __doc__,
        CASES,
        header,
        argv,
        default_repeat=(5, 5),
        fatal=(RuntimeError, ValueError, TypeError, NotImplementedError),
    )


if __name__ == "__main__":
    sys.exit(main())

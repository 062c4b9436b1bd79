"""FP8 attention (recipe fp8_dpa / fp8_mha) against an independent emulation in fp64.

The oracle quantizes with torch's own FP8 dtypes (utils.emulate_cast: satfinite encode of
x * scale) at TE's six points (QKV, S, O forward; dO, dP, dQKV backward) and does everything else
in fp64, with autograd for the backward. The module must agree to fp32 level ("fp8_emulated":
identical quantization, only summation orders differ) in its output and all three gradients, and
its delayed-scaling bookkeeping must put exactly the oracle's amaxes into the recipe's scales.
Accuracy against bf16 attention is checked the way TE's test_dpa_fp8_vs_f16 measures it (RMSE
below rmse_tol times the value range).
"""

from __future__ import annotations

import pytest
import torch
from utils import FP8_MAX, assert_close, assert_fp8_close, current_scale, emulate_cast

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common import recipe as R
from transformer_engine_lite.pytorch.attention.dot_product_attention import fp8_attention as F
from transformer_engine_lite.pytorch.attention.dot_product_attention.utils import (
    AttentionParams,
    get_attention_backend,
)

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


class _Point(torch.autograd.Function):
    """Oracle quantization point: forward round trip with (dtype, scale_fn) or identity; backward
    round trip of the gradients with (dtype, scale_fn) or identity. scale_fn(tensors) -> scale."""

    @staticmethod
    def forward(ctx, fwd, bwd, record, *xs):
        ctx.bwd, ctx.record = bwd, record
        if fwd is None:
            return tuple(x.clone() for x in xs)
        dtype, scale_fn, name = fwd
        s = scale_fn(xs)
        record[name] = max(x.abs().max().item() for x in xs)
        record[name + "_scale"] = float(s)
        return tuple(emulate_cast(x, dtype, s).to(x.dtype) for x in xs)

    @staticmethod
    def backward(ctx, *gs):
        if ctx.bwd is not None:
            dtype, scale_fn, name = ctx.bwd
            s = scale_fn(gs)
            ctx.record[name] = max(g.abs().max().item() for g in gs)
            ctx.record[name + "_scale"] = float(s)
            gs = tuple(emulate_cast(g, dtype, s).to(g.dtype) for g in gs)
        return (None, None, None, *gs)


def _scale_fn(mode, dtype, scales, slot):
    if mode == "current":
        return lambda xs: current_scale(torch.cat([x.reshape(-1) for x in xs]), dtype)
    return lambda xs: scales[slot : slot + 1].clone()


def oracle(q, k, v, causal, mode, fwd_scales, bwd_scales, bwd_dtype, bwd_fp8=True):
    """fp64 attention [b, s, h, d] with TE's FP8 points; returns (out, grads fn, amax record)."""
    rec: dict = {}
    qkv = (E4M3, _scale_fn(mode, E4M3, fwd_scales, F.META_QKV), "qkv")
    dqkv = (bwd_dtype, _scale_fn(mode, bwd_dtype, bwd_scales, F.META_DQKV), "dqkv")
    qh, kh, vh = _Point.apply(qkv, dqkv if bwd_fp8 else None, rec, q, k, v)
    qh, kh, vh = (t.double().transpose(1, 2) for t in (qh, kh, vh))  # [b, h, s, d]
    x = qh @ kh.transpose(-2, -1) / qh.shape[-1] ** 0.5
    dp = (bwd_dtype, _scale_fn(mode, bwd_dtype, bwd_scales, F.META_DP), "dp")
    (x,) = _Point.apply(None, dp if bwd_fp8 else None, rec, x)
    if causal:
        sq, skv = x.shape[-2:]
        keep = torch.ones(sq, skv, dtype=torch.bool).tril()
        x = x.masked_fill(~keep, float("-inf"))
    p = torch.softmax(x, -1)
    s = (E4M3, _scale_fn(mode, E4M3, fwd_scales, F.META_S), "s")
    (ph,) = _Point.apply(s, None, rec, p)
    o = (ph @ vh).transpose(1, 2)
    ofw = (E4M3, _scale_fn(mode, E4M3, fwd_scales, F.META_O), "o")
    do = (bwd_dtype, _scale_fn(mode, bwd_dtype, bwd_scales, F.META_DO), "do")
    (o,) = _Point.apply(ofw, do if bwd_fp8 else None, rec, o)
    return o, rec


def _inputs(b=2, s=16, h=4, d=32, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(b, s, h, d, generator=g) * sc).to(dtype).requires_grad_(True)
            for sc in (1.0, 1.5, 2.0)]


RECIPES = {
    "delayed": lambda: R.DelayedScaling(fp8_dpa=True, amax_history_len=4),
    "current": lambda: R.Float8CurrentScaling(fp8_dpa=True),
}


@pytest.mark.parametrize("mode", ["delayed", "current"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("bwd_fp8", [True, False])
def test_matches_oracle(mode, causal, bwd_fp8, monkeypatch):
    """Three steps (delayed scaling: scale 1, then scales from the recorded amaxes): output and
    gradients vs the oracle run with the module's scales of that step."""
    monkeypatch.setenv("NVTE_FP8_DPA_BWD", "1" if bwd_fp8 else "0")
    recipe = RECIPES[mode]()
    bwd_dtype = E5M2  # HYBRID (the default format): E5M2 gradients
    dpa = te.DotProductAttention(4, 32, qkv_format="bshd",
                                 attn_mask_type="causal" if causal else "no_mask")
    for step in range(3):
        q, k, v = _inputs(seed=step)
        fwd_scales = dpa.fp8_fwd_scale.clone()
        bwd_scales = dpa.fp8_bwd_scale.clone()
        with te.fp8_autocast(fp8_recipe=recipe):
            out = dpa(q, k, v)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(10 + step))
        out.backward(g)
        qr, kr, vr = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        ref, rec = oracle(qr, kr, vr, causal, mode, fwd_scales, bwd_scales, bwd_dtype, bwd_fp8)
        ref.reshape(out.shape).backward(g.double())
        what = f"{mode} causal={causal} bwd_fp8={bwd_fp8} step {step}"
        # out and (with an FP8 backward) dq, dk, dv leave through a quantization point: FP8
        # values, compared as such (see utils.assert_fp8_close).
        assert_fp8_close(out, ref.reshape(out.shape), E4M3, rec["o_scale"], f"{what}: out")
        grads = [(n, a.grad, r.grad) for n, a, r in (("dq", q, qr), ("dk", k, kr), ("dv", v, vr))]
        if bwd_fp8:
            for name, a, r in grads:
                assert_fp8_close(a, r, bwd_dtype, rec["dqkv_scale"], f"{what}: {name}")
        else:
            for name, a, r in grads:
                assert_close(a, r, "fp8_emulated", f"{what}: {name}")
        if mode == "delayed" and step == 0:
            # The update after the first step: each slot's history holds exactly the amax the
            # oracle saw (QKV: of the inputs themselves, so bit for bit), and its scale is
            # fp8_max / amax (margin 0, history max).
            hist = dpa.fp8_fwd_amax_history
            assert hist[:, F.META_QKV].max().item() == rec["qkv"]
            assert dpa.fp8_fwd_scale[F.META_QKV].item() == (
                torch.tensor(448.0) / torch.tensor(rec["qkv"], dtype=torch.float32)).item()
            for slot, name in ((F.META_S, "s"), (F.META_O, "o")):
                assert hist[:, slot].max().item() == pytest.approx(rec[name], rel=1e-5), name
            bhist = dpa.fp8_bwd_amax_history
            if bwd_fp8:
                for slot, name in ((F.META_DO, "do"), (F.META_DP, "dp"), (F.META_DQKV, "dqkv")):
                    amax = bhist[:, slot].max().item()
                    assert amax == pytest.approx(rec[name], rel=1e-5), name
                    assert dpa.fp8_bwd_scale[slot].item() == pytest.approx(
                        FP8_MAX[E5M2] / amax, rel=1e-6), name
            else:
                assert not bhist.any()


def _rmse_ok(a, b, tol):
    a, b = a.double(), b.double()
    rmse = (a - b).square().mean().sqrt().item()
    rng = max(a.max().item(), b.max().item()) - min(a.min().item(), b.min().item())
    return rmse, rmse < tol * rng


@pytest.mark.parametrize("mode", ["delayed", "current"])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
def test_accuracy_vs_bf16(mode, fmt):
    """TE's measure (test_dpa_fp8_vs_f16): RMSE(fp8, bf16) < 0.11 * range for the output and the
    gradients, after a calibrating first step for delayed scaling."""
    recipe = RECIPES[mode]()
    dpa = te.DotProductAttention(16, 64, num_gqa_groups=4, qkv_format=fmt)
    q, k, v = _inputs(b=2, s=128, h=16, d=64, dtype=torch.bfloat16)
    k, v = (t.detach()[:, :, :4].clone().requires_grad_(True) for t in (k, v))
    if fmt == "sbhd":
        q, k, v = (t.detach().transpose(0, 1).contiguous().requires_grad_(True) for t in (q, k, v))
    ref = dpa(q, k, v)
    ref.float().square().sum().backward()
    ref_grads = [t.grad.clone() for t in (q, k, v)]
    for _ in range(2):
        for t in (q, k, v):
            t.grad = None
        with te.fp8_autocast(fp8_recipe=recipe):
            out = dpa(q, k, v)
        out.float().square().sum().backward()
    for name, a, b in (("out", out, ref), *zip(("dq", "dk", "dv"),
                                                 [t.grad for t in (q, k, v)], ref_grads)):
        rmse, ok = _rmse_ok(a, b, 0.11)
        assert ok, f"{mode} {fmt} {name}: RMSE {rmse:.4g} over 0.11 * range"


def test_f16_switch_and_backend(monkeypatch):
    """NVTE_DPA_FP8_RECIPE=F16 runs the inputs' precision (equal to no autocast, whatever the
    backend); the probe reports the unfused backend for FP8 attention."""
    q, k, v = _inputs(dtype=torch.bfloat16)
    dpa = te.DotProductAttention(4, 32, qkv_format="bshd")
    base = dpa(q, k, v)
    # fp8_output applies to FP8 attention only (TE's): otherwise the inputs' precision
    assert type(dpa(q, k, v, fp8_output=True)) is torch.Tensor
    assert torch.equal(dpa(q, k, v, fp8_output=True), base)
    monkeypatch.setenv("NVTE_DPA_FP8_RECIPE", "F16")
    with te.fp8_autocast(fp8_recipe=R.DelayedScaling(fp8_dpa=True)):
        assert torch.equal(dpa(q, k, v), base)
    monkeypatch.delenv("NVTE_DPA_FP8_RECIPE")
    with te.fp8_autocast(fp8_recipe=R.DelayedScaling(fp8_dpa=True)):
        assert not torch.equal(dpa(q, k, v), base)
    meta = {"recipe": R.DelayedScaling(fp8_dpa=True)}
    p = AttentionParams(qkv_dtype=torch.bfloat16, qkv_layout="bshd_bshd_bshd", fp8=True,
                        fp8_meta=meta, num_heads=4, num_gqa_groups=4, head_dim_qk=32,
                        head_dim_v=32, max_seqlen_q=16, max_seqlen_kv=16)
    use_flash, _, use_fused, _, use_unfused, avail = get_attention_backend(p)
    assert (use_flash, use_fused, use_unfused) == (False, False, True)
    assert avail == [False, False, True]


def test_errors(monkeypatch):
    q, k, v = _inputs(dtype=torch.bfloat16)
    dpa = te.DotProductAttention(4, 32, qkv_format="bshd")
    with pytest.raises(NotImplementedError, match="MXFP8BlockScaling"):
        with te.fp8_autocast(fp8_recipe=R.MXFP8BlockScaling(fp8_dpa=True)):
            dpa(q, k, v)
    monkeypatch.setenv("NVTE_DPA_FP8_RECIPE", "DelayedScaling")
    with pytest.raises(NotImplementedError, match="NVTE_DPA_FP8_RECIPE"):
        with te.fp8_autocast(fp8_recipe=R.Float8CurrentScaling(fp8_dpa=True)):
            dpa(q, k, v)
    monkeypatch.delenv("NVTE_DPA_FP8_RECIPE")
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", "0")
    with pytest.raises(NotImplementedError, match="NVTE_UNFUSED_ATTN=0"):
        with te.fp8_autocast(fp8_recipe=R.DelayedScaling(fp8_dpa=True)):
            dpa(q, k, v)
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", "1")
    monkeypatch.setenv("NVTE_FP8_DPA_BWD", "2")
    with pytest.raises(ValueError, match="NVTE_FP8_DPA_BWD"):
        with te.fp8_autocast(fp8_recipe=R.DelayedScaling(fp8_dpa=True)):
            dpa(q, k, v)


def test_checkpoint_and_layer():
    """The attention's delayed-scaling state is module state (TE's core_attention._extra_state):
    it survives a state_dict round trip; a TransformerLayer trains under fp8_dpa, and a
    checkpoint without the key (saved before FP8 attention existed) still loads."""
    torch.manual_seed(0)
    layer = te.TransformerLayer(64, 128, 4, hidden_dropout=0.0, attention_dropout=0.0,
                                params_dtype=torch.bfloat16)
    x = torch.randn(16, 2, 64, dtype=torch.bfloat16, requires_grad=True)
    recipe = R.DelayedScaling(fp8_dpa=True)
    for _ in range(2):
        with te.fp8_autocast(fp8_recipe=recipe):
            y = layer(x)
        y.float().square().mean().backward()
    assert torch.isfinite(x.grad).all()
    dpa = layer.self_attention.core_attention
    assert dpa.fp8_fwd_amax_history[:, F.META_QKV].max() > 0
    sd = layer.state_dict()
    assert "self_attention.core_attention._extra_state" in sd
    fresh = te.TransformerLayer(64, 128, 4, params_dtype=torch.bfloat16)
    fresh.load_state_dict(sd)
    fdpa = fresh.self_attention.core_attention
    assert torch.equal(fdpa.fp8_fwd_scale, dpa.fp8_fwd_scale)
    assert torch.equal(fdpa.fp8_bwd_amax_history, dpa.fp8_bwd_amax_history)
    old = {k: v for k, v in sd.items() if not k.endswith("core_attention._extra_state")}
    te.TransformerLayer(64, 128, 4, params_dtype=torch.bfloat16).load_state_dict(old)


@pytest.mark.parametrize("mode", ["delayed", "current"])
def test_fp8_output_and_linear_bytes(mode):
    """fp8_output=True gives O as a Float8Tensor with exactly the values of the plain output; a
    Linear takes a Float8Tensor input as its bytes (no second quantization: its input slot
    records nothing), so its output is that tensor's values times the FP8 weight, to fp32 level."""
    recipe = RECIPES[mode]()
    dpa = te.DotProductAttention(4, 32, qkv_format="bshd")
    lin = te.Linear(128, 64, params_dtype=torch.float32)
    q, k, v = _inputs()
    for step in range(2):
        with te.fp8_autocast(fp8_recipe=recipe):
            plain = dpa(q, k, v)
            out = dpa(q, k, v, fp8_output=True)
            w_scale = lin.fp8_fwd_scale[1:2].clone()
            y = lin(out)
        assert isinstance(out, te.Float8Tensor)
        assert torch.equal(out.dequantize(), plain)
        y.sum().backward()
        w = lin.weight.detach()
        if mode == "current":
            w_scale = current_scale(w, E4M3).reshape(1)
        ref = out.dequantize().double().reshape(-1, 128) @ emulate_cast(w, E4M3, w_scale).t()
        ref = ref + lin.bias.detach().double()
        assert_close(y.reshape(-1, 64), ref, "fp8_emulated", f"{mode} step {step}: Linear(O)")
        assert q.grad is not None and torch.isfinite(q.grad).all()
        if mode == "delayed":
            assert not lin.fp8_fwd_amax_history[:, 0].any()  # the input quantizer never ran


@pytest.mark.parametrize("recipe", [R.DelayedScaling(fp8_dpa=True),
                                    R.Float8CurrentScaling(fp8_mha=True)])
def test_mha_hands_fp8_output_to_proj(recipe):
    """MultiheadAttention under FP8 attention takes the attention's output as FP8 (TE's
    dpa_fp8_output): its projection's input slot records nothing; accuracy against bf16 by TE's
    test_mha_fp8_vs_f16 measure (RMSE < 0.15 * range)."""
    torch.manual_seed(0)
    mha = te.MultiheadAttention(128, 4, params_dtype=torch.bfloat16, attn_mask_type="causal")
    x = torch.randn(64, 2, 128, dtype=torch.bfloat16, requires_grad=True)
    ref = mha(x)
    ref.float().square().sum().backward()
    ref_dx = x.grad.clone()
    for _ in range(2):
        x.grad = None
        with te.fp8_autocast(fp8_recipe=recipe):
            y = mha(x)
        y.float().square().sum().backward()
    if recipe.delayed():
        assert not mha.proj.fp8_fwd_amax_history[:, 0].any()
        assert mha.core_attention.fp8_fwd_amax_history[:, F.META_O].any()
    for name, a, b in (("out", y, ref), ("dx", x.grad, ref_dx)):
        rmse, ok = _rmse_ok(a, b, 0.15)
        assert ok, f"{type(recipe).__name__} {name}: RMSE {rmse:.4g} over 0.15 * range"


@pytest.mark.parametrize("mode", ["delayed", "current"])
def test_torch_compile_equals_eager(mode):
    """torch.compile of a DotProductAttention under FP8 attention: the same output, gradients
    and delayed-scaling records as eager from the same state."""
    recipe = RECIPES[mode]()
    dpa = te.DotProductAttention(4, 32, qkv_format="bshd")
    q, k, v = _inputs()
    with te.fp8_autocast(fp8_recipe=recipe):  # a first step: non-trivial scales
        dpa(q, k, v).sum().backward()
    state = [t.clone() for t in (dpa.fp8_fwd_amax_history, dpa.fp8_fwd_scale)]
    results = []
    for run in (dpa, torch.compile(dpa)):
        dpa.fp8_fwd_amax_history.copy_(state[0])
        dpa.fp8_fwd_scale.copy_(state[1])
        for t in (q, k, v):
            t.grad = None
        with te.fp8_autocast(fp8_recipe=recipe):
            out = run(q, k, v)
            hist = dpa.fp8_fwd_amax_history[0].clone()  # this step's amaxes, before the update
        out.sum().backward()
        results.append((out, hist, *[t.grad for t in (q, k, v)]))
    for a, b in zip(*results):
        assert torch.equal(a, b)

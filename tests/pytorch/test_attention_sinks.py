"""Attention sinks (TE's softmax_type 'off-by-one' / 'learnable') in DotProductAttention and the
modules on top, for each backend (flash: NVTE_UNFUSED_ATTN=0; unfused: NVTE_FLASH_ATTN=0), against
a pure fp64 torch reference written from the definition: softmax over the kept keys plus one sink
logit per head (0, or the parameter softmax_offset) with no value row."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch as te

BACKENDS = {"flash": {"NVTE_UNFUSED_ATTN": "0"}, "unfused": {"NVTE_FLASH_ATTN": "0"}}
# Output / gradient bounds relative to the largest reference magnitude: fp32 computes in fp32
# (flash: online softmax, fp32 accumulation); bf16 rounds P (and dS) before the GEMMs (2^-9 each).
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request, monkeypatch):
    for k, v in BACKENDS[request.param].items():
        monkeypatch.setenv(k, v)
    return request.param


def reference(q, k, v, offset, softmax_type, mask, scale):
    """fp64 attention with a sink; q [b, s_q, h, d], k / v [b, s_kv, h_kv, d] (bshd)."""
    q, k, v = (t.double().transpose(1, 2) for t in (q, k, v))
    h, h_kv = q.shape[1], k.shape[1]
    k = k.repeat_interleave(h // h_kv, dim=1)
    v = v.repeat_interleave(h // h_kv, dim=1)
    x = scale * q @ k.transpose(-2, -1)
    sq, skv = x.shape[-2:]
    if mask == "causal":
        i = torch.arange(sq).view(-1, 1)
        j = torch.arange(skv).view(1, -1)
        x = x.masked_fill(j > i, float("-inf"))
    if softmax_type != "vanilla":
        sink = offset.double().view(1, h, 1, 1).expand(*x.shape[:-1], 1)
        p = torch.softmax(torch.cat((x, sink), -1), -1)[..., :skv]
    else:
        p = torch.softmax(x, -1)
    return (p @ v).transpose(1, 2).reshape(q.shape[0], sq, -1)


def _inputs(dtype, b=2, sq=21, skv=21, h=4, h_kv=2, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, sq, h, d, generator=g).to(dtype).requires_grad_()
    k = torch.randn(b, skv, h_kv, d, generator=g).to(dtype).requires_grad_()
    v = torch.randn(b, skv, h_kv, d, generator=g).to(dtype).requires_grad_()
    dout = torch.randn(b, sq, h * d, generator=g).to(dtype)
    return q, k, v, dout


def _close(got, ref, dtype, what):
    bound = TOL[dtype] * max(1.0, ref.abs().max().item())
    err = (got.double() - ref).abs().max().item()
    assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mask", ["no_mask", "causal"])
@pytest.mark.parametrize("softmax_type", ["off-by-one", "learnable"])
def test_dpa_matches_fp64_reference(backend, dtype, mask, softmax_type):
    dpa = te.DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="bshd", attn_mask_type=mask,
                                 softmax_type=softmax_type)
    assert dpa.softmax_offset.shape == (4,) and dpa.softmax_offset.dtype == torch.float32
    assert isinstance(dpa.softmax_offset, torch.nn.Parameter) == (softmax_type == "learnable")
    if softmax_type == "learnable":
        with torch.no_grad():
            dpa.softmax_offset.copy_(torch.tensor([-1.0, 0.5, 2.0, 0.0]))
    q, k, v, dout = _inputs(dtype)
    out = dpa(q, k, v)
    out.backward(dout)
    rq, rk, rv = (t.detach().double().requires_grad_() for t in (q, k, v))
    roff = dpa.softmax_offset.detach().double().requires_grad_()
    ref = reference(rq, rk, rv, roff, softmax_type, mask, dpa.softmax_scale)
    ref.backward(dout.double())
    _close(out, ref.detach(), dtype, "out")
    for t, r, n in ((q, rq, "dq"), (k, rk, "dk"), (v, rv, "dv")):
        _close(t.grad, r.grad, dtype, n)
    if softmax_type == "learnable":
        # d offset = -sum over batch and rows of p_sink * rowsum(dO * O): a sum of b * s_q terms,
        # each off by the output's relative error.
        bound = TOL[dtype] * 2 * 21 * max(1.0, roff.grad.abs().max().item())
        err = (dpa.softmax_offset.grad.double() - roff.grad).abs().max().item()
        assert err <= bound, f"d softmax_offset: {err:.3g} > {bound:.3g}"
        assert roff.grad.abs().max() > 1e-2  # the sink matters: the check can fail


def test_sink_changes_the_output_and_vanilla_is_unchanged(backend):
    q, k, v, _ = _inputs(torch.float32)
    outs = {}
    for st in ("vanilla", "off-by-one"):
        dpa = te.DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="bshd",
                                     attn_mask_type="no_mask", softmax_type=st)
        outs[st] = dpa(q, k, v).detach()
    ref = reference(q.detach(), k.detach(), v.detach(), None, "vanilla", "no_mask", 0.25)
    _close(outs["vanilla"], ref, torch.float32, "vanilla out")
    assert (outs["vanilla"] - outs["off-by-one"]).abs().max() > 1e-2


def test_flash_offset_grad_finite_differences():
    """The kernel's d softmax_offset against central differences of the kernel's own forward
    (fp32, eps = 1e-2: the loss is smooth in the offset; the bound covers eps^2 curvature and
    fp32 rounding of the loss)."""
    q, k, v, dout = (t.detach() for t in _inputs(torch.float32, sq=9, skv=13))
    off = torch.tensor([0.3, -0.7, 1.1, 0.0], requires_grad=True)
    args = ("bshd_bshd_bshd", None, None, None, 9, 13, 0.25, 0.0, None, "no_bias",
            "causal_bottom_right", -1, 0)

    def loss(o):
        out, _ = torch.ops.te_lite.fused_attn_fwd(q, k, v, *args, True, "learnable", o)
        return (out.double() * dout.double().view(out.shape)).sum()

    loss(off).backward()
    eps = 1e-2
    for hh in range(4):
        e = torch.zeros(4)
        e[hh] = eps
        fd = (loss(off.detach() + e) - loss(off.detach() - e)).item() / (2 * eps)
        assert abs(off.grad[hh].item() - fd) <= 2e-3 * max(1.0, abs(fd)), (hh, off.grad, fd)


def test_modules_pass_softmax_type_through(backend):
    torch.manual_seed(0)
    layer = te.TransformerLayer(64, 128, 4, softmax_type="learnable", hidden_dropout=0.0,
                                attention_dropout=0.0, params_dtype=torch.float32)
    dpa = layer.self_attention.core_attention
    assert dpa.softmax_type == "learnable"
    names = [n for n, _ in layer.named_parameters()]
    assert "self_attention.core_attention.softmax_offset" in names
    x = torch.randn(8, 2, 64, requires_grad=True)
    layer(x).sum().backward()
    assert dpa.softmax_offset.grad is not None and dpa.softmax_offset.grad.abs().sum() > 0
    mha = te.MultiheadAttention(64, 4, softmax_type="off-by-one")
    assert mha.core_attention.softmax_type == "off-by-one"
    assert "core_attention.softmax_offset" not in dict(mha.named_parameters())
    mha(torch.randn(8, 2, 64))


def test_flash_and_unfused_agree_on_padding(monkeypatch):
    """thd + padding through both backends (each vs the other; the fp64 reference above covers
    bshd)."""
    dpa = te.DotProductAttention(4, 16, qkv_format="thd", attn_mask_type="padding_causal",
                                 softmax_type="learnable")
    with torch.no_grad():
        dpa.softmax_offset.copy_(torch.tensor([1.0, -0.5, 0.0, 2.0]))
    cu = torch.tensor([0, 5, 17], dtype=torch.int32)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(17, 4, 16, generator=g) for _ in range(3))
    res = {}
    for name, env in BACKENDS.items():
        for key in ("NVTE_FLASH_ATTN", "NVTE_UNFUSED_ATTN"):
            monkeypatch.delenv(key, raising=False)
        for key, val in env.items():
            monkeypatch.setenv(key, val)
        dpa.softmax_offset.grad = None
        qq = q.clone().requires_grad_()
        out = dpa(qq, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=12, max_seqlen_kv=12)
        out.sum().backward()
        res[name] = (out.detach(), qq.grad, dpa.softmax_offset.grad.clone())
    for a, b in zip(res["flash"], res["unfused"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_bad_softmax_type_and_offset():
    with pytest.raises(ValueError, match="softmax_type"):
        te.DotProductAttention(4, 16, softmax_type="sink")
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(RuntimeError, match="softmax_offset"):
        torch.ops.te_lite.fused_attn_fwd(q, q, q, "bshd_bshd_bshd", None, None, None, 4, 4, 1.0,
                                         0.0, None, "no_bias", "no_mask", -1, -1, False,
                                         "learnable", None)
    with pytest.raises(RuntimeError, match="softmax_offset|SoftmaxOffset"):
        torch.ops.te_lite.fused_attn_fwd(q, q, q, "bshd_bshd_bshd", None, None, None, 4, 4, 1.0,
                                         0.0, None, "no_bias", "no_mask", -1, -1, False,
                                         "learnable", torch.zeros(3))
    with pytest.raises(RuntimeError, match="softmax_type"):
        torch.ops.te_lite.fused_attn_fwd(q, q, q, "bshd_bshd_bshd", None, None, None, 4, 4, 1.0,
                                         0.0, None, "no_bias", "no_mask", -1, -1, False,
                                         "off_by_one", None)


def test_learnable_offset_in_bf16_module():
    """module.to(bf16) rounds softmax_offset too (TE's test_dpa_softmax does it): the kernels read
    the sink logits in fp32, the gradient comes back in the parameter's dtype, and the result is
    that of an fp32 module holding the same (bf16-rounded) offsets."""
    torch.manual_seed(0)
    dpa = te.DotProductAttention(4, 16, softmax_type="learnable", qkv_format="bshd")
    with torch.no_grad():
        dpa.softmax_offset.copy_(torch.randn(4).bfloat16().float())
    q, k, v = (torch.randn(2, 5, 4, 16, dtype=torch.bfloat16) for _ in range(3))
    ref = dpa(q, k, v)
    low = dpa.to(torch.bfloat16)
    assert low.softmax_offset.dtype == torch.bfloat16
    out = low(q, k, v)
    assert torch.equal(out, ref)
    out.float().sum().backward()
    assert low.softmax_offset.grad.dtype == torch.bfloat16

"""DotProductAttention's declared packed inputs (qkv_layer / kv_layer / qkv_interleave_dim, TE
main) in eager and under torch.compile(fullgraph=True), and the calls that fall back to eager with
a warning (packed views not declared, thd without max_seqlen): what TE's test_torch_compile.py
taught. Each compares against the same attention given separate, dense q/k/v (the same kernel on
the same values, so bit for bit)."""

from __future__ import annotations

import warnings

import pytest
import torch

import transformer_engine_lite.pytorch as te

BF16 = torch.bfloat16
B, S, H, D = 2, 16, 2, 16


def _dpa(fmt: str = "bshd", mask: str = "causal") -> te.DotProductAttention:
    return te.DotProductAttention(H, D, qkv_format=fmt, attn_mask_type=mask).to(BF16)


def _packed(n: int, interleave_dim: int, lead=(B, S)) -> torch.Tensor:
    shape = (*lead, n, H, D) if interleave_dim == -3 else (*lead, H, n, D)
    return torch.randn(shape, dtype=BF16, requires_grad=True)


def _run(fn, grads_of):
    out = fn()
    out.float().sum().backward()
    grads = [t.grad.clone() for t in grads_of]
    for t in grads_of:
        t.grad = None
    return out.detach(), grads


@pytest.mark.parametrize("interleave_dim", [-3, -2])
@pytest.mark.parametrize("packed", ["qkv", "kv"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "fullgraph"])
def test_declared_packing_matches_separate(packed, interleave_dim, compiled):
    torch.manual_seed(0)
    dpa = _dpa()
    buf = _packed(3 if packed == "qkv" else 2, interleave_dim)
    q = torch.randn(B, S, H, D, dtype=BF16, requires_grad=True)
    if packed == "qkv":
        call = lambda: dpa(qkv_layer=buf, qkv_interleave_dim=interleave_dim)  # noqa: E731
        grads_of = [buf]
    else:
        call = lambda: dpa(q, kv_layer=buf, qkv_interleave_dim=interleave_dim)  # noqa: E731
        grads_of = [q, buf]
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(lambda: call(), fullgraph=True)
    else:
        fn = call
    out, grads = _run(fn, grads_of)

    # reference: the same values as separate dense tensors
    n = buf.shape[interleave_dim]
    views = [buf.detach().select(interleave_dim, i).contiguous() for i in range(n)]
    ref_in = ([] if packed == "qkv" else [q.detach()]) + views
    ref_in = [t.clone().requires_grad_(True) for t in ref_in]
    ref_out, ref_grads = _run(lambda: dpa(*ref_in), ref_in)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=0)
    ref_packed = torch.stack([g for g in ref_grads[-len(views):]], dim=interleave_dim)
    torch.testing.assert_close(grads[-1], ref_packed, rtol=0, atol=0)
    if packed == "kv":
        torch.testing.assert_close(grads[0], ref_grads[0], rtol=0, atol=0)


def test_declared_packing_thd_kv():
    torch.manual_seed(1)
    dpa = _dpa("thd", "padding_causal")
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    q = torch.randn(12, H, D, dtype=BF16)
    kv = torch.randn(12, H, 2, D, dtype=BF16)
    kw = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=7, max_seqlen_kv=7)
    out = dpa(q, kv_layer=kv, qkv_interleave_dim=-2, **kw)
    ref = dpa(q, kv[:, :, 0].contiguous(), kv[:, :, 1].contiguous(), **kw)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(qkv_layer="q3", kv_layer="kv"), ValueError, "qkv_layer and kv_layer"),
        (dict(qkv_layer="q3", qkv_interleave_dim=-1), ValueError, "qkv_interleave_dim"),
        (dict(qkv_layer="q3", query_layer="q"), ValueError, "query_layer"),
        (dict(qkv_layer="q2"), ValueError, "size 3 at dim -3"),
        (dict(kv_layer="kv"), ValueError, "query_layer: required with kv_layer"),
        (dict(query_layer="q", kv_layer="kv", key_layer="q"), ValueError, "key_layer"),
        (dict(query_layer="q", key_layer="q"), ValueError, "value_layer"),
        (dict(qkv_layer="q3t"), ValueError, "stride 1"),
    ],
)
def test_packed_bad_arguments(kwargs, exc, match):
    tensors = {
        "q": torch.randn(B, S, H, D, dtype=BF16),
        "q3": torch.randn(B, S, 3, H, D, dtype=BF16),
        "q2": torch.randn(B, S, 2, H, D, dtype=BF16),
        "q3t": torch.randn(B, S, 3, D, H, dtype=BF16).transpose(-1, -2),
        "kv": torch.randn(B, S, 2, H, D, dtype=BF16),
    }
    kwargs = {k: tensors[v] if isinstance(v, str) else v for k, v in kwargs.items()}
    with pytest.raises(exc, match=match):
        _dpa()(**kwargs)


@pytest.mark.parametrize("case", ["packed_views", "thd_without_max_seqlen"])
def test_eager_fallback_warns_and_matches(case):
    torch.manual_seed(2)
    if case == "packed_views":
        dpa = _dpa()
        qkv = torch.randn(B, S, 3, H, D, dtype=BF16)
        args, kwargs = [qkv.select(-3, i) for i in range(3)], {}
        reason = "detecting packed q/k/v"
    else:
        dpa = _dpa("thd", "padding_causal")
        cu = torch.tensor([0, 5, 12], dtype=torch.int32)
        args = [torch.randn(12, H, D, dtype=BF16) for _ in range(3)]
        kwargs = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu)
        reason = "deriving max_seqlen"
    ref = dpa(*args, **kwargs)
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(dpa)(*args, **kwargs)
    messages = [str(w.message) for w in caught]
    assert any("Falling back to eager" in m and reason in m for m in messages)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="torch.compiler.disable"):
        torch.compile(dpa, fullgraph=True)(*args, **kwargs)


def test_separate_inputs_stay_compiled():
    """Dense separate q/k/v need no fallback: fullgraph traces them, no warning."""
    dpa = _dpa()
    q, k, v = (torch.randn(B, S, H, D, dtype=BF16) for _ in range(3))
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(dpa, fullgraph=True)(q, k, v)
    assert not any("Falling back to eager" in str(w.message) for w in caught)
    torch.testing.assert_close(out, dpa(q, k, v), rtol=0, atol=0)

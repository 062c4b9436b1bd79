"""The unfused attention backend under torch.compile(fullgraph=True) computes what eager does, bit
for bit (TE's test_torch_compile taught it). On the CPU inductor lowers a bmm with one query row
(every KV-cache decoding step) to its own multiply + sum, in another order and without the bf16
rounding of the scores; the backend's two GEMMs are an opaque op (attention/_attention_gemm.py)
so both paths run the same matmul."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.pytorch.attention import InferenceParams
from transformer_engine_lite.pytorch.attention._attention_gemm import attention_matmul
from transformer_engine_lite.pytorch.attention.dot_product_attention.dot_product_attention import (
    _attention_backends,
)

# TE's kv_cache_bshd config: a short prefill, a cache of 256, head_dim 64.
B, H, D, S_MAX, CTX = 2, 4, 64, 256, 8


@pytest.fixture
def unfused(monkeypatch):
    for var, on in (("NVTE_FLASH_ATTN", 0), ("NVTE_FUSED_ATTN", 0), ("NVTE_UNFUSED_ATTN", 1)):
        monkeypatch.setenv(var, str(on))
    _attention_backends["backend_selection_requires_update"] = True
    yield
    _attention_backends["backend_selection_requires_update"] = True


def _generate(fn, steps, paged):
    kw = dict(max_batch_size=B, max_sequence_length=S_MAX, num_heads_kv=H, head_dim_k=D,
              dtype=torch.bfloat16, qkv_format="bshd")
    if paged:
        kw.update(is_paged=True, page_size=S_MAX, total_num_pages=B)
    params = InferenceParams(**kw)
    params.allocate_memory(1)
    outs = []
    with torch.no_grad():
        for q, k, v in steps:
            params.pre_step(OrderedDict((i, q.shape[1]) for i in range(B)))
            outs.append(fn(q, k, v, inference_params=params).clone())
    return outs


@pytest.mark.parametrize("paged", [False, True], ids=["non_paged", "paged"])
def test_kv_cache_decoding_compiled_matches_eager(paged, unfused):
    gen = torch.Generator().manual_seed(1234)
    steps = [
        [torch.randn(B, n, H, D, dtype=torch.bfloat16, generator=gen) for _ in range(3)]
        for n in (CTX, 1, 1, 1)
    ]
    dpa = te.DotProductAttention(
        H, D, qkv_format="bshd", attn_mask_type="padding_causal_bottom_right", layer_number=1
    ).to(torch.bfloat16).eval()
    eager = _generate(dpa, steps, paged)
    assert _attention_backends["use_unfused_attention"]
    torch._dynamo.reset()
    compiled = _generate(torch.compile(dpa, fullgraph=True), steps, paged)
    assert _attention_backends["use_unfused_attention"]
    assert len(compiled) == 4
    for got, want in zip(compiled, eager):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("sq", [1, 16])
def test_training_step_compiled_matches_eager(sq, unfused):
    # Forward and backward, one query row (the decomposed shape) and a square block.
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(B, sq, H, D, dtype=torch.bfloat16, generator=gen)
    kv = [torch.randn(B, 48, H, D, dtype=torch.bfloat16, generator=gen) for _ in range(2)]
    grad = torch.randn(B, sq, H * D, dtype=torch.bfloat16, generator=gen)
    dpa = te.DotProductAttention(
        H, D, qkv_format="bshd", attn_mask_type="no_mask", attention_type="cross", layer_number=1
    ).to(torch.bfloat16)

    def run(fn):
        inputs = [t.clone().requires_grad_() for t in (q, *kv)]
        out = fn(*inputs)
        out.backward(grad)
        return [out.detach()] + [t.grad for t in inputs]

    eager = run(dpa)
    torch._dynamo.reset()
    compiled = run(torch.compile(dpa, fullgraph=True))
    assert _attention_backends["use_unfused_attention"]
    for name, got, want in zip(("out", "dq", "dk", "dv"), compiled, eager):
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)


def test_attention_matmul_checks_and_matches_matmul():
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(2, 3, 5, 8, generator=gen, requires_grad=True)
    b = torch.randn(2, 3, 8, 4, generator=gen, requires_grad=True)
    out = attention_matmul(a, b)
    assert torch.equal(out, torch.matmul(a, b))
    g = torch.randn(out.shape, generator=gen)
    da, db = torch.autograd.grad(out, (a, b), g)
    torch.testing.assert_close(da, g @ b.transpose(-2, -1), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(db, a.transpose(-2, -1) @ g, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"attention_matmul: expected a \[\.\.\., m, k\]"):
        attention_matmul(a, b[:1])
    with pytest.raises(ValueError, match="got \\(2, 3, 5, 8\\) and \\(2, 3, 4, 8\\)"):
        attention_matmul(a, b.transpose(-2, -1))

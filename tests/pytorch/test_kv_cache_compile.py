"""KV-cache decoding under torch.compile(fullgraph=True) (TE's test_torch_compile taught it): a
prefill and three single-token steps, compiled vs eager on their own caches, bit for bit (the flash
backend calls the same kernel either way). The cache managers read the step's lengths from the
host copies pre_step() keeps while compiling (a read of cu_seqlens would be data-dependent)."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.pytorch.attention import InferenceParams

B, H, D, S_MAX = 2, 4, 32, 64


def _generate(fn, steps, paged):
    kw = dict(max_batch_size=B, max_sequence_length=S_MAX, num_heads_kv=H, head_dim_k=D,
              dtype=torch.bfloat16, qkv_format="bshd")
    if paged:
        kw.update(is_paged=True, page_size=16, total_num_pages=2 * S_MAX // 16)
    params = InferenceParams(**kw)
    params.allocate_memory(1)
    outs = []
    with torch.no_grad():
        for q, k, v in steps:
            params.pre_step(OrderedDict((i, q.shape[1]) for i in range(B)))
            outs.append(fn(q, k, v, inference_params=params).clone())
    return outs


@pytest.mark.parametrize("paged", [False, True], ids=["non_paged", "paged"])
def test_kv_cache_decoding_compiled_matches_eager(paged, monkeypatch):
    monkeypatch.setenv("NVTE_FLASH_ATTN", "1")
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", "0")
    gen = torch.Generator().manual_seed(7)
    steps = [
        [torch.randn(B, n, H, D, dtype=torch.bfloat16, generator=gen) for _ in range(3)]
        for n in (8, 1, 1, 1)
    ]
    dpa = te.DotProductAttention(
        H, D, qkv_format="bshd", attn_mask_type="padding_causal", layer_number=1
    ).to(torch.bfloat16).eval()
    eager = _generate(dpa, steps, paged)
    torch._dynamo.reset()
    compiled = _generate(torch.compile(dpa, fullgraph=True), steps, paged)
    assert len(compiled) == 4
    for got, want in zip(compiled, eager):
        torch.testing.assert_close(got, want, rtol=0, atol=0)

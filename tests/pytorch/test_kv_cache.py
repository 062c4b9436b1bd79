"""KV cache for inference (InferenceParams): incremental decoding through DotProductAttention,
MultiheadAttention (with RoPE) and TransformerLayer equals recomputing the whole sequence, for
the non-paged and paged caches, qkv_format bshd / sbhd / thd, GQA, both backends, and a schedule
in which sequences of different lengths finish and new ones join mid-run; plus the cache
bookkeeping and the errors."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.pytorch.attention.dot_product_attention.utils import (
    AttentionParams,
    get_attention_backend,
)
from transformer_engine_lite.pytorch.attention.inference import (
    InferenceParams,
    NonPagedKVCacheManager,
    PagedKVCacheManager,
)
from utils import assert_close

H, HKV, D = 4, 2, 16  # GQA: two query heads per KV head
MAX_SEQ, PAGE = 24, 4
BACKENDS = ("flash", "unfused")

# The schedule: seq_id -> (arrival step, context length, generated tokens). At step 0 seqs 0-2
# start; seq 1 finishes first, seq 3 joins when it leaves (step 3), seq 4 when seq 2 leaves
# (step 7), so the non-paged cache re-indexes its rows and the paged cache reuses freed pages.
SCHEDULE = {0: (0, 5, 9), 1: (0, 3, 2), 2: (0, 7, 6), 3: (3, 4, 8), 4: (7, 2, 5)}


def _steps(schedule=SCHEDULE, step_len=1):
    """Per step: OrderedDict {seq_id: (first position, new tokens)} in TE's batch order
    (continuing sequences in order, then new ones). Continuing sequences bring `step_len` tokens
    (the last step of a sequence may bring fewer)."""
    pos, active, steps, t = {}, [], [], 0
    while True:
        for s in list(active):
            arr, ctx, gen = schedule[s]
            if pos[s] >= ctx + gen:
                active.remove(s)
        for s, (arr, _, _) in schedule.items():
            if arr == t:
                active.append(s)
                pos[s] = 0
        if not active and t > max(a for a, _, _ in schedule.values()):
            return steps
        step = OrderedDict()
        for s in active:
            arr, ctx, gen = schedule[s]
            n = ctx if pos[s] == 0 else min(step_len, ctx + gen - pos[s])
            step[s] = (pos[s], n)
            pos[s] += n
        if step:
            steps.append(step)
        t += 1


def _params(fmt, dtype, paged, max_batch=3, h_kv=HKV, d=D):
    kw = {"is_paged": True, "page_size": PAGE, "total_num_pages": max_batch * MAX_SEQ // PAGE}
    return InferenceParams(
        max_batch, MAX_SEQ, h_kv, d, dtype, max_ctx_len=8, qkv_format=fmt, **(kw if paged else {})
    )


def _batch(xs, step, fmt):
    """New tokens of each sequence of `step` from the full per-sequence tensors xs[s] [S, ...]
    in `fmt` (bshd / sbhd padded to the longest, thd packed)."""
    parts = [xs[s][p : p + n] for s, (p, n) in step.items()]
    if fmt == "thd":
        return torch.cat(parts)
    width = max(x.shape[0] for x in parts)
    out = parts[0].new_zeros((len(parts), width, *parts[0].shape[1:]))
    for i, x in enumerate(parts):
        out[i, : x.shape[0]] = x
    return out.transpose(0, 1).contiguous() if fmt == "sbhd" else out


def _unbatch(out, step, fmt):
    """{seq_id: output rows of its new tokens} from a step's output in `fmt`."""
    res, off = {}, 0
    for i, (s, (_, n)) in enumerate(step.items()):
        if fmt == "bshd":
            res[s] = out[i, :n]
        elif fmt == "sbhd":
            res[s] = out[:n, i]
        else:
            res[s] = out[off : off + n]
            off += n
    return res


def _decode(model_call, params, xs, fmt, step_len=1):
    """Runs the schedule through model_call(inputs..., params) and gathers each sequence's
    outputs {seq_id: [S, ...]}."""
    outs = {s: [] for s in xs[0]}
    for step in _steps(step_len=step_len):
        params.pre_step(OrderedDict((s, n) for s, (_, n) in step.items()))
        out = model_call(*[_batch(x, step, fmt) for x in xs])
        for s, rows in _unbatch(out, step, fmt).items():
            outs[s].append(rows)
    return {s: torch.cat(rows) for s, rows in outs.items()}


def _seq_len(s):
    return SCHEDULE[s][1] + SCHEDULE[s][2]


def _qkv(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda h: {  # noqa: E731
        s: torch.randn(_seq_len(s), h, D, generator=g).to(dtype) for s in SCHEDULE
    }
    return mk(H), mk(HKV), mk(HKV)


def _ref_attention(q, k, v):
    """fp64 causal GQA attention of one whole sequence [S, h, d] -> [S, h * d]."""
    q, k, v = (x.double() for x in (q, k, v))
    k, v = (x.repeat_interleave(H // HKV, dim=1) for x in (k, v))
    s = torch.einsum("qhd,khd->hqk", q, k) / D**0.5
    n = q.shape[0]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(n, -1)


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    monkeypatch.setenv("NVTE_FLASH_ATTN", "1" if request.param == "flash" else "0")
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd", "thd"])
def test_dpa_decode_matches_reference(fmt, paged, dtype, backend):
    """Each token's output equals fp64 causal attention over its whole sequence so far."""
    q, k, v = _qkv(dtype)
    dpa = te.DotProductAttention(
        H, D, num_gqa_groups=HKV, qkv_format=fmt, attn_mask_type="padding_causal", layer_number=1
    )
    params = _params(fmt, dtype, paged)
    params.allocate_memory(1)
    got = _decode(lambda *t: dpa(*t, inference_params=params), params, (q, k, v), fmt)
    for s in SCHEDULE:
        assert_close(got[s], _ref_attention(q[s], k[s], v[s]), dtype, f"seq {s}")


@pytest.mark.parametrize("fmt", ["bshd", "thd"])
def test_dpa_decode_equals_full_recompute(fmt, backend):
    """fp32: the cached path equals the same module recomputing the whole prefix each step
    (same backend, causal over the full sequence): only the summation split may differ."""
    q, k, v = _qkv(torch.float32, seed=1)
    kw = {"num_gqa_groups": HKV, "layer_number": 1}
    dpa = te.DotProductAttention(H, D, qkv_format=fmt, attn_mask_type="padding_causal", **kw)
    full = te.DotProductAttention(H, D, qkv_format="bshd", attn_mask_type="causal", **kw)
    params = _params(fmt, torch.float32, paged=False)
    params.allocate_memory(1)
    got = _decode(lambda *t: dpa(*t, inference_params=params), params, (q, k, v), fmt)
    for s in SCHEDULE:
        ref = full(q[s][None], k[s][None], v[s][None])[0]
        assert_close(got[s], ref, torch.float32, f"seq {s}")


@pytest.mark.parametrize("fmt", ["bshd", "sbhd", "thd"])
def test_paged_equals_nonpaged(fmt, backend):
    """Same tokens, same kernel: the paged cache (pages gathered per sequence) gives the
    non-paged cache's outputs bit for bit."""
    q, k, v = _qkv(torch.bfloat16, seed=2)
    res = []
    for paged in (False, True):
        dpa = te.DotProductAttention(
            H, D, num_gqa_groups=HKV, qkv_format=fmt, attn_mask_type="padding_causal",
            layer_number=3,
        )  # fmt: skip
        params = _params(fmt, torch.bfloat16, paged)
        params.allocate_memory(3)
        res.append(_decode(lambda *t: dpa(*t, inference_params=params), params, (q, k, v), fmt))
    for s in SCHEDULE:
        torch.testing.assert_close(res[1][s], res[0][s], rtol=0, atol=0)


@pytest.mark.parametrize("paged", [False, True])
def test_multi_token_steps(paged):
    """Continuing sequences may bring several tokens per step (speculative decoding); the
    causal diagonal is aligned bottom-right over the cached keys."""
    q, k, v = _qkv(torch.float32, seed=3)
    dpa = te.DotProductAttention(
        H, D, num_gqa_groups=HKV, qkv_format="bshd", attn_mask_type="padding_causal",
        layer_number=1,
    )  # fmt: skip
    params = _params("bshd", torch.float32, paged)
    params.allocate_memory(1)
    call = lambda *t: dpa(*t, inference_params=params)  # noqa: E731
    got = _decode(call, params, (q, k, v), "bshd", step_len=3)
    for s in SCHEDULE:
        assert_close(got[s], _ref_attention(q[s], k[s], v[s]), torch.float32, f"seq {s}")


def _module_case(kind, fmt, dtype):
    """(module factory, inputs per sequence, forward kwargs) for MHA / TransformerLayer."""
    hidden = H * D
    torch.manual_seed(5)
    common = {"num_gqa_groups": HKV, "params_dtype": dtype, "layer_number": 1}
    if kind == "MultiheadAttention":
        make = lambda mask, f: te.MultiheadAttention(  # noqa: E731
            hidden, H, attn_mask_type=mask, qkv_format=f, attention_dropout=0.0, **common
        ).eval()
    else:
        make = lambda mask, f: te.TransformerLayer(  # noqa: E731
            hidden, 2 * hidden, H, self_attn_mask_type=mask, attn_input_format=f,
            hidden_dropout=0.0, attention_dropout=0.0, **common,
        ).eval()  # fmt: skip
    g = torch.Generator().manual_seed(6)
    xs = {s: torch.randn(_seq_len(s), hidden, generator=g).to(dtype) for s in SCHEDULE}
    return make, xs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd", "thd"])
@pytest.mark.parametrize("kind", ["MultiheadAttention", "TransformerLayer"])
def test_module_decode_equals_full_recompute(kind, fmt, paged, dtype):
    """Generating token by token with the cache gives the outputs of running the module over
    each whole sequence (causal); MultiheadAttention with RoPE, whose decode positions come from
    the cache's pre-step lengths. The cache is allocated by the module on first use."""
    make, xs = _module_case(kind, fmt, dtype)
    full, inc = make("causal", "bshd"), make("padding_causal", fmt)
    inc.load_state_dict(full.state_dict())
    rope = None
    if kind == "MultiheadAttention":
        rope = te.RotaryPositionEmbedding(D)(MAX_SEQ)
    kw = {"rotary_pos_emb": rope} if rope is not None else {}
    params = _params(fmt, dtype, paged)
    with torch.no_grad():
        got = _decode(lambda x: inc(x, inference_params=params, **kw), params, (xs,), fmt)
        assert 1 in params.cache_manager.cache
        for s in SCHEDULE:
            n = _seq_len(s)
            ref_kw = {"rotary_pos_emb": rope[:n]} if rope is not None else {}
            ref = full(xs[s][None], **ref_kw)[0]
            # fp32: GEMMs of different row counts may round differently (a few ulps); bf16: the
            # table's tolerance for modules chaining rounded ops.
            assert_close(got[s], ref, dtype, f"{kind} seq {s}")


# ------------------------------------------------------------------------------ bookkeeping
def test_pre_step_bookkeeping():
    params = _params("bshd", torch.float32, paged=True)
    params.pre_step(OrderedDict([(7, 5), (9, 3)]))
    assert params.cu_seqlens_q.tolist() == [0, 5, 8, 8]
    assert params.cu_seqlens_kv.tolist() == [0, 5, 8, 8]
    assert params.get_seqlens_pre_step().tolist() == [0, 0, 0]
    mgr = params.cache_manager
    assert mgr.get_page_list(7) == [0, 1] and mgr.get_page_list(9) == [2]
    params.pre_step(OrderedDict([(7, 1), (9, 1)]))  # 7 fits its pages; 9 at 4 tokens still fits
    assert params.cu_seqlens_kv.tolist() == [0, 6, 10, 10]
    assert params.get_seqlens_pre_step().tolist() == [5, 3, 0]
    assert mgr.get_page_list(9) == [2]
    params.pre_step(OrderedDict([(9, 1), (4, 6)]))  # 7 finishes: its pages return to the pool
    assert list(params.sequences.items()) == [(9, 5), (4, 6)]
    assert mgr.get_page_list(9) == [2, 3]
    assert mgr.get_page_list(4) == [4, 5]
    assert mgr.page_table[:2].tolist() == [[2, 3, 0, 0, 0, 0], [4, 5, 0, 0, 0, 0]]
    assert params.output_qkv_format == "bshd"
    params.reset()
    assert mgr.get_sequence_count() == 0 and len(mgr.free_pages) == mgr.total_num_pages


def test_nonpaged_reindexes_rows():
    """When a sequence finishes, the continuing ones move to the front rows of the cache."""
    params = _params("bshd", torch.float32, paged=False)
    params.allocate_memory(1)
    for step in ([(0, 2), (1, 2), (2, 2)], [(0, 1), (2, 1)]):
        params.pre_step(OrderedDict(step))
        b = len(step)
        k = torch.arange(b, dtype=torch.float32).view(b, 1, 1, 1).expand(b, 2, HKV, D) + 1
        params.step(1, k.contiguous(), k.contiguous(), "bshd")
    k_cache = params.cache_manager.cache[1][0]
    # seq 2 (was row 2) now in row 1: its first two tokens (value 3) then this step's (2)
    assert k_cache[1, :3, 0, 0].tolist() == [3.0, 3.0, 2.0]
    assert k_cache[0, :3, 0, 0].tolist() == [1.0, 1.0, 1.0]


def test_convert_paged_to_nonpaged():
    params = _params("thd", torch.float32, paged=True)
    params.allocate_memory(2)
    params.pre_step(OrderedDict([(0, 6), (1, 2)]))
    k = torch.arange(8, dtype=torch.float32).view(8, 1, 1).expand(8, HKV, D).contiguous()
    params.step(2, k, k, "thd")
    kc, _ = params.convert_paged_to_nonpaged(2)
    assert kc.shape == (2, MAX_SEQ, HKV, D)
    assert kc[0, :6, 0, 0].tolist() == [0, 1, 2, 3, 4, 5] and kc[1, :2, 0, 0].tolist() == [6, 7]
    assert isinstance(params.cache_manager, PagedKVCacheManager)
    assert params.output_qkv_format == "thd_2bshd"


def test_exports_and_custom_manager():
    assert te.InferenceParams is InferenceParams
    assert te.attention.InferenceParams is InferenceParams

    class Mine(NonPagedKVCacheManager):
        pass

    p = InferenceParams(2, 8, HKV, D, torch.float32, custom_cache_manager=Mine)
    assert type(p.cache_manager) is Mine


def test_probe_answers_kv_cache_configurations():
    params = _params("thd", torch.bfloat16, paged=True)
    ap = AttentionParams(
        qkv_layout="paged_kv_thd_bshd_bshd", num_heads=H, num_gqa_groups=HKV, head_dim_qk=D,
        head_dim_v=D, max_seqlen_q=8, max_seqlen_kv=MAX_SEQ, attn_mask_type="padding_causal",
        inference_params=params, is_training=False, device="cpu",
    )  # fmt: skip
    avail = get_attention_backend(ap)[5]
    assert avail[0] and avail[2]  # the flash kernel and the unfused backend
    bad = AttentionParams(qkv_layout="paged_kv_bs3hd", inference_params=params, device="cpu")
    assert get_attention_backend(bad)[5] == [False, False, False]


# ------------------------------------------------------------------------------------ errors
def _err(exc, match, fn):
    with pytest.raises(exc, match=match):
        fn()


@pytest.mark.parametrize(
    "kw, exc, match",
    [
        (dict(num_heads_kv=None), ValueError, "required"),
        (dict(max_batch_size=0), ValueError, "max_batch_size"),
        (dict(dtype=torch.float8_e4m3fn), NotImplementedError, "FP8"),
        (dict(is_paged=True, page_size=5, total_num_pages=10), ValueError, "page_size"),
        (dict(is_paged=True, page_size=4, total_num_pages=7), ValueError, "total_num_pages"),
        (dict(is_paged=True), ValueError, "page_size"),
        (dict(qkv_format="thd"), ValueError, "max_ctx_len"),
        (dict(qkv_format="bhsd"), ValueError, "qkv_format"),
        (dict(max_ctx_len=99), ValueError, "max_ctx_len"),
        (dict(custom_cache_manager=dict), ValueError, "custom_cache_manager"),
    ],
)
def test_constructor_errors(kw, exc, match):
    args = dict(max_batch_size=2, max_sequence_length=8, num_heads_kv=HKV, head_dim_k=D)
    args["dtype"] = torch.float32
    args.update(kw)
    _err(exc, match, lambda: InferenceParams(**args))


def test_step_errors():
    p = _params("bshd", torch.float32, paged=True, max_batch=1)
    _err(ValueError, "max_batch_size", lambda: p.pre_step(OrderedDict([(0, 1), (1, 1)])))
    _err(ValueError, "token count", lambda: p.pre_step(OrderedDict([(0, 0)])))
    _err(ValueError, "max_sequence_length", lambda: p.pre_step(OrderedDict([(0, MAX_SEQ + 1)])))
    q = _params("bshd", torch.float32, paged=False)
    q.pre_step(OrderedDict([(0, 2), (1, 2)]))
    _err(ValueError, "batch order", lambda: q.pre_step(OrderedDict([(5, 1), (0, 1), (1, 1)])))
    # a pool too small for its sequences: TE's RuntimeError
    small = InferenceParams(2, 8, HKV, D, torch.float32, is_paged=True, page_size=4,
                            total_num_pages=4)  # fmt: skip
    small.cache_manager.total_num_pages = 1
    small.cache_manager.reset()
    _err(RuntimeError, "KV cache is full", lambda: small.pre_step(OrderedDict([(0, 5)])))


def test_attention_errors():
    x = torch.randn(1, 2, H, D)
    kv = torch.randn(1, 2, HKV, D)
    p = _params("bshd", torch.float32, paged=False)
    p.allocate_memory(1)
    mk = lambda **kw: te.DotProductAttention(  # noqa: E731
        H, D, num_gqa_groups=HKV, qkv_format="bshd", **kw
    )
    dpa = mk(attn_mask_type="padding_causal", layer_number=1)
    _err(TypeError, "InferenceParams", lambda: dpa(x, kv, kv, inference_params=object()))
    _err(ValueError, "pre_step", lambda: dpa(x, kv, kv, inference_params=p))
    p.pre_step(OrderedDict([(0, 2)]))
    _err(ValueError, "layer_number", lambda: mk(attn_mask_type="padding")(x, kv, kv,
                                                                          inference_params=p))
    _err(ValueError, "padding mask", lambda: mk(layer_number=1)(x, kv, kv, inference_params=p))
    _err(ValueError, "allocate_memory", lambda: mk(attn_mask_type="padding", layer_number=2)(
        x, kv, kv, inference_params=p))  # fmt: skip
    mask = torch.zeros(1, 1, 1, 2, dtype=torch.bool)
    _err(ValueError, "attention_mask", lambda: dpa(x, kv, kv, mask, inference_params=p))
    _err(ValueError, "heads", lambda: dpa(x, kv[:, :, :1], kv, inference_params=p))
    _err(ValueError, "batch", lambda: dpa(x.expand(4, -1, -1, -1), kv.expand(4, -1, -1, -1),
                                          kv.expand(4, -1, -1, -1), inference_params=p))
    layer = te.TransformerLayer(H * D, 32, H, layer_type="decoder", layer_number=1)
    _err(NotImplementedError, "decoder", lambda: layer(torch.randn(2, 1, H * D),
                                                       inference_params=p))


def test_cache_stays_outside_autograd():
    """Decoding in grad mode (no torch.no_grad, as TE's own test runs) must not chain the steps'
    graphs onto the cache: the cache tensors stay leaves without grad_fn."""
    make, xs = _module_case("TransformerLayer", "bshd", torch.float32)
    layer = make("padding_causal", "bshd")
    params = _params("bshd", torch.float32, paged=False)
    _decode(lambda x: layer(x, inference_params=params), params, (xs,), "bshd")
    for t in params.cache_manager.cache[1]:
        assert t.grad_fn is None and not t.requires_grad

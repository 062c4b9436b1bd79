#!/usr/bin/env python
"""Times greedy decoding of a small GPT-like stack of te.TransformerLayer with the KV cache
(InferenceParams: prefill the prompt once, then one token per step against the cache) against the
same model without it (each step recomputes the whole sequence so far, causal), in fp32 and bf16.

    python benchmarks/bench_kv_cache.py                  # all cases, full sizes
    python benchmarks/bench_kv_cache.py --quick          # small sizes (smoke test)
    python benchmarks/bench_kv_cache.py --cases decode_bf16 --json out.json

Model (full sizes): token embedding 1024 x 256, 4 TransformerLayers (hidden 256, 4 heads, 1 KV
group, FFN 1024, RMSNorm, SwiGLU, RoPE), tied LM head; batch 2, prompt 64 tokens, 16 generated
tokens (`--quick`: 2 layers, hidden 128, prompt 16, 8 tokens). One timed call = the whole
generation (prefill included). ratio = no-cache ms / cache ms (> 1: the cache is faster); the
notes give tokens/s both ways. Before timing, both paths run teacher-forced over the same tokens
and their logits must agree (see _check).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

import sys
import time
from collections import OrderedDict
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Case, cli, cpu_level_line, rel_err

import transformer_engine_lite.pytorch as te

VOCAB = 1024
TIMES: dict[str, tuple[list[float], list[float], int]] = {}  # case: (cache s, recompute s, tokens)
# Logit agreement, cache vs recompute (relative, Frobenius): both run the same math in the same
# dtype; they differ only in how GEMMs and the attention split rows (a prompt of 1 vs S rows), so
# fp32 agrees to a few ulps through the stack (~1e-6 measured) and bf16 to a few of its 2^-8
# roundings per layer.
TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}


class TinyGPT(torch.nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, dtype: torch.dtype) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, hidden, dtype=dtype)
        self.layers = torch.nn.ModuleList(
            te.TransformerLayer(
                hidden, 4 * hidden, heads, num_gqa_groups=max(1, heads // 4), layer_number=i + 1,
                hidden_dropout=0.0, attention_dropout=0.0, normalization="RMSNorm",
                activation="swiglu", attn_input_format="bshd", params_dtype=dtype,
                self_attn_mask_type="causal",
            )  # fmt: skip
            for i in range(layers)
        )
        self.rope = te.RotaryPositionEmbedding(hidden // heads)(4096)
        self.eval()

    def forward(self, tokens: torch.Tensor, params=None) -> torch.Tensor:
        """Logits [b, s, VOCAB] of tokens [b, s]; with params (InferenceParams) the tokens are
        the step's new ones and the mask is TE's inference mask 'padding_causal'."""
        x = self.embed(tokens)
        kw = {"inference_params": params, "self_attn_mask_type": "padding_causal"} if params else {}
        for layer in self.layers:
            x = layer(x, rotary_pos_emb=self.rope, **kw)
        return x.float() @ self.embed.weight.float().t()


def _params(model: TinyGPT, b: int, max_len: int, dtype: torch.dtype) -> te.InferenceParams:
    layer = model.layers[0].self_attention.core_attention
    return te.InferenceParams(
        b, max_len, layer.num_gqa_groups, layer.hidden_size_per_attention_head_k, dtype
    )


@torch.no_grad()
def generate_cached(model: TinyGPT, prompt: torch.Tensor, n: int, forced=None) -> torch.Tensor:
    """Greedy generation with the KV cache; returns the logits of each generated position
    [b, n, VOCAB]. forced [b, n]: feed these tokens instead of the argmax (teacher forcing)."""
    b, s = prompt.shape
    params = _params(model, b, s + n, model.embed.weight.dtype)
    params.pre_step(OrderedDict((i, s) for i in range(b)))
    logits = [model(prompt, params)[:, -1]]
    for t in range(n - 1):
        nxt = forced[:, t : t + 1] if forced is not None else logits[-1].argmax(-1, keepdim=True)
        params.pre_step(OrderedDict((i, 1) for i in range(b)))
        logits.append(model(nxt, params)[:, -1])
    return torch.stack(logits, 1)


@torch.no_grad()
def generate_recompute(model: TinyGPT, prompt: torch.Tensor, n: int, forced=None) -> torch.Tensor:
    """The same generation without a cache: every step runs the whole sequence."""
    seq, logits = prompt, []
    for t in range(n):
        logits.append(model(seq)[:, -1])
        if t < n - 1:
            nxt = logits[-1].argmax(-1, keepdim=True) if forced is None else forced[:, t : t + 1]
            seq = torch.cat((seq, nxt), 1)
    return torch.stack(logits, 1)


def _case(dtype: torch.dtype) -> Callable[[bool], Case]:
    def build(quick: bool) -> Case:
        layers, hidden, heads, b, s, n = (2, 128, 4, 2, 16, 8) if quick else (4, 256, 4, 2, 64, 16)
        model = TinyGPT(layers, hidden, heads, dtype)
        g = torch.Generator().manual_seed(1)
        prompt = torch.randint(0, VOCAB, (b, s), generator=g)
        forced = torch.randint(0, VOCAB, (b, n), generator=g)

        def check() -> str | None:
            a = generate_cached(model, prompt, n, forced)
            r = generate_recompute(model, prompt, n, forced)
            err = rel_err(a, r)
            if not err <= TOL[dtype]:
                return f"logits, cache vs recompute: relative error {err:.3g} > {TOL[dtype]:g}"
            notes.append(f"logits cache vs recompute: relative error {err:.2g}")
            return None

        notes = [f"{layers} layers, hidden {hidden}, batch {b}, prompt {s}, {n} new tokens"]
        name = "decode_fp32" if dtype == torch.float32 else "decode_bf16"
        times = TIMES[name] = ([], [], b * n)

        def timed(fn, acc):
            def call():
                t0 = time.perf_counter()
                fn(model, prompt, n)
                acc.append(time.perf_counter() - t0)

            return call

        return Case(timed(generate_cached, times[0]), timed(generate_recompute, times[1]), check,
                    notes=notes)  # fmt: skip

    return build


CASES: dict[str, tuple[Callable[[bool], Case], float | None]] = {
    "decode_fp32": (_case(torch.float32), None),
    "decode_bf16": (_case(torch.bfloat16), None),
}


def header() -> str:
    threads = torch.get_num_threads()
    return f"KV-cache decoding vs full recompute; {cpu_level_line()}; threads {threads}"


def main(argv: list[str] | None = None) -> int:
    rc = cli(__doc__, CASES, header, argv, default_repeat=(3, 2), fatal=(RuntimeError,))
    for name, (cached, recompute, tokens) in TIMES.items():
        if cached and recompute:  # best call of each (warmup calls included: same for both)
            c, r = min(cached), min(recompute)
            print(f"{name}: {tokens / c:.1f} tokens/s with the KV cache, {tokens / r:.1f} without "
                  "(best call)")  # fmt: skip
    return rc


if __name__ == "__main__":
    sys.exit(main())

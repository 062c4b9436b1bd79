#!/usr/bin/env python
"""Times HF `generate()` (greedy) of a small random Llama: the TE Llama of examples/pytorch/te_llama.py
(HF's LlamaForCausalLM with te.TransformerLayer decoder layers) against HF's own Llama with eager
attention, both with their KV caches, and the TE Llama with its cache against itself without one.

    python benchmarks/bench_generate.py                  # all cases, full sizes
    python benchmarks/bench_generate.py --quick          # small sizes (smoke test)

Model (full sizes): vocabulary 256, 4 layers, hidden 256, 8 heads, 4 KV heads, FFN 512; batch 2,
prompt 64 tokens, 32 new tokens (`--quick`: 2 layers, hidden 128, prompt 16, 8 tokens). One timed
call = one generate() (prefill included).
- `generate_vs_hf_<dtype>`: ours = TE Llama with TE's KV cache (InferenceParams), ref = HF's Llama
  (`attn_implementation="eager"`) with HF's DynamicCache; ratio = ref / ours.
- `generate_cache_<dtype>`: ours = TE Llama with the cache, ref = TE Llama without (every step runs
  the whole sequence); ratio = ref / ours.
Check, before timing: the three generations give the same tokens (fp32; bf16: the two TE modes
the same tokens). The script prints tokens/s for every side (best call).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "pytorch"))
from _common import Case, cli, cpu_level_line

TIMES: dict[str, tuple[list[float], list[float], int, str]] = {}


def _case(dtype: torch.dtype, vs_hf: bool) -> Callable[[bool], Case]:
    def build(quick: bool) -> Case:
        import te_llama

        sizes = (dict(num_hidden_layers=2, hidden_size=128, intermediate_size=256,
                      num_attention_heads=4, num_key_value_heads=2), 16, 8) if quick else \
            ({}, 64, 32)  # fmt: skip
        config = te_llama.small_config(**sizes[0])
        config._attn_implementation = "eager"
        hf, model = te_llama.models(config)
        hf, model = hf.to(dtype), model.to(dtype)
        b, s, n = 2, sizes[1], sizes[2]
        prompt = torch.randint(0, config.vocab_size, (b, s), generator=torch.Generator().manual_seed(1))
        name = f"generate_{'vs_hf' if vs_hf else 'cache'}_{'fp32' if dtype == torch.float32 else 'bf16'}"
        ref_label = "HF eager + cache" if vs_hf else "TE no cache"
        times = TIMES[name] = ([], [], b * n, ref_label)
        notes = [f"{config.num_hidden_layers} layers, hidden {config.hidden_size}, batch {b}, "
                 f"prompt {s}, {n} new tokens"]  # fmt: skip

        def check() -> str | None:
            ours = te_llama.generate(model, prompt, n, True)[0]
            full = te_llama.generate(model, prompt, n, False)[0]
            if not torch.equal(ours, full):
                return "tokens: TE Llama with the cache != without"
            if dtype == torch.float32 and not torch.equal(ours, te_llama.generate(hf, prompt, n, True)[0]):
                return "tokens: TE Llama != HF Llama (fp32)"
            notes.append("tokens equal" + (" (TE vs HF too)" if dtype == torch.float32 else ""))
            return None

        def timed(m, use_cache: bool, acc: list[float]) -> Callable[[], None]:
            def call() -> None:
                t0 = time.perf_counter()
                te_llama.generate(m, prompt, n, use_cache)
                acc.append(time.perf_counter() - t0)

            return call

        ref = timed(hf, True, times[1]) if vs_hf else timed(model, False, times[1])
        return Case(timed(model, True, times[0]), ref, check, notes=notes)

    return build


CASES: dict[str, tuple[Callable[[bool], Case], float | None]] = {
    "generate_vs_hf_fp32": (_case(torch.float32, True), None),
    "generate_cache_fp32": (_case(torch.float32, False), None),
    "generate_vs_hf_bf16": (_case(torch.bfloat16, True), None),
    "generate_cache_bf16": (_case(torch.bfloat16, False), None),
}


def header() -> str:
    return f"HF generate(), TE Llama vs HF Llama / no cache; {cpu_level_line()}; threads {torch.get_num_threads()}"


def main(argv: list[str] | None = None) -> int:
    rc = cli(__doc__, CASES, header, argv, default_repeat=(1, 2), fatal=(RuntimeError,))
    for name, (ours, ref, tokens, ref_label) in TIMES.items():
        if ours and ref:
            print(f"{name}: {tokens / min(ours):.1f} tokens/s TE Llama + cache, "
                  f"{tokens / min(ref):.1f} {ref_label} (best call)")
    return rc


if __name__ == "__main__":
    sys.exit(main())

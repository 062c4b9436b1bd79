#!/usr/bin/env python
"""Peak memory of one causal bf16 fwd+bwd, te.DotProductAttention (flash) vs SDPA's math path, at
S = 2048, 4096, 8192 (B=1, H=4, D=64), each measured in a fresh subprocess. Ours must grow linearly
in S (no S x S matrix), the math path grows as S^2.

    python benchmarks/bench_attention_memory.py
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _attention_cases import print_peak_memory

if __name__ == "__main__":
    print_peak_memory()

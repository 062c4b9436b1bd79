"""benchmarks/bench_jax.py at quick sizes (its attention cases from bench_jax_attention.py included):
every case's correctness gate passes (timings are printed, never asserted: the machines are noisy)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_jax_quick_checks_pass():
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_jax.py"), "--quick",
                          "--repeat", "1", "--warmup", "1"], capture_output=True, text=True,
                         env=env, timeout=600, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # Every case was timed, i.e. its check passed. The status beyond that is a timing (quick sizes
    # are far from the full-size targets, and the machines are noisy), so any timed status counts.
    timed = ("ok", "report only", "below target (quick sizes)")
    for case in ("jax_layernorm_mlp_bf16", "jax_layernorm_mlp_fp8", "jax_dense_fp8",
                 "jax_quantize_current_e4m3", "jax_attention_fwd_bf16",
                 "jax_attention_fwd_bwd_bf16", "jax_transformer_layer_bf16"):
        status = re.search(rf"^  {case}: (.*)$", run.stderr, re.MULTILINE)
        assert status and status.group(1) in timed, f"{case}: " + run.stderr[-3000:]

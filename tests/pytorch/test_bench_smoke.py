"""benchmarks/bench_core.py at quick sizes: every case's correctness gate passes, and the bounds of
_common.time_pair_ms hold (a side over the per-call limit is reported as too slow, never timed for
minutes; repeats are cut to the case budget). Timings are printed, never asserted."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import _common  # noqa: E402


def test_bench_core_quick_checks_pass():
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    cases = ("quantize_current_e4m3", "layernorm_fwd_bf16", "layernorm_fwd_fp8out", "gemm_bf16",
             "gemm_fp8", "rmsnorm_fwd_bf16", "layernorm_bwd_bf16", "rmsnorm_bwd_bf16")
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_core.py"), "--quick",
                          "--repeat", "1", "--warmup", "1", "--cases", ",".join(cases)],
                         capture_output=True, text=True, env=env, timeout=600, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    timed = ("ok", "report only", "below target (quick sizes)")
    for case in cases:
        status = re.search(rf"^  {case}: (.*)$", run.stderr, re.MULTILINE)
        assert status and status.group(1) in timed, f"{case}: " + run.stderr[-3000:]


def _sleeper(seconds: float, calls: list):
    def fn():
        calls.append(1)
        time.sleep(seconds)
    return fn


def test_side_over_the_call_limit_is_too_slow(monkeypatch):
    monkeypatch.setitem(_common.LIMITS, "max_call_s", 0.05)
    ours, ref = [], []
    with pytest.raises(_common.TooSlow, match=r"reference: 0\.\d s per call \(measured"):
        _common.time_pair_ms(_sleeper(0.0, ours), _sleeper(0.1, ref), warmup=2, repeat=10)
    assert len(ref) == 1  # one call measured, none repeated


def test_repeats_cut_to_the_case_budget(monkeypatch):
    monkeypatch.setitem(_common.LIMITS, "case_budget_s", 0.2)
    ours, ref, notes = [], [], []
    _common.time_pair_ms(_sleeper(0.02, ours), _sleeper(0.02, ref), warmup=3, repeat=50,
                         notes=notes)
    # 0.04 s per pair: 5 pairs fit 0.2 s; the first (timed) warmup call and at most 5 repeats ran
    assert len(ours) == len(ref) <= 1 + 5 and notes and "repeats cut to" in notes[0]


def test_bench_run_reports_too_slow_and_leaves_it_out_of_json(monkeypatch, tmp_path):
    monkeypatch.setattr(_common, "LIMITS", dict(_common.LIMITS))  # cli sets it from its argv
    slow = _common.Case(ours=lambda: None, ref=_sleeper(0.1, []), check=lambda: None)
    fast = _common.Case(ours=lambda: None, ref=lambda: None, check=lambda: None)
    cases = {"slow": (lambda q: slow, 1.0), "fast": (lambda q: fast, None)}
    out = tmp_path / "r.json"
    rc = _common.cli("doc", cases, lambda: "header", ["--max-call-s", "0.05", "--json", str(out)])
    assert rc == 0
    assert '"fast"' in out.read_text() and '"slow"' not in out.read_text()

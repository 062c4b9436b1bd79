"""HF accelerate's FP8 path (accelerate 1.15.0, unmodified) on transformer_engine_lite through the
`transformer_engine` alias: tests/integration/accelerate_fp8.py in its own process (accelerate's
state is process-global)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("accelerate", reason="accelerate is installed by ci/install_deps.sh")
SCRIPT = Path(__file__).resolve().parent / "accelerate_fp8.py"


def run(*args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TE_LITE_AS_TRANSFORMER_ENGINE"}
    env["PYTHONWARNINGS"] = "ignore"
    p = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.mark.parametrize("recipe", ["delayed", "mxfp8"])
def test_accelerator_fp8_prepare_and_train(recipe):
    r = run("--recipe", recipe)
    assert r["backend"].endswith("TE"), r["backend"]
    assert r["modules"][:2] == ["transformer_engine_lite.pytorch.module.linear.Linear",
                                "transformer_engine_lite.pytorch.module.layernorm.LayerNorm"]
    assert r["modules"][-1] == "transformer_engine_lite.pytorch.module.linear.Linear"
    assert r["fp8_in_forward"] and all(r["fp8_in_forward"])  # every TE forward ran in FP8
    ref = run("--mixed-precision", "no")["losses"]
    assert r["losses"][-1] < r["losses"][0]
    assert all(abs(a - b) <= 0.05 * b for a, b in zip(r["losses"], ref)), (r["losses"], ref)

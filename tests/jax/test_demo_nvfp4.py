"""The JAX GPT demo (examples/jax/train_gpt.py) runs NVFP4BlockScaling on request next to bf16: a
few steps train with finite losses (main() returns 1 otherwise), the table has its row and the plot
is written; NVFP4 stays out of the default runs."""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load_demo():
    sys.path.insert(0, str(EXAMPLES))  # _common_demo
    try:
        spec = importlib.util.spec_from_file_location("te_lite_demo_jax", EXAMPLES / "jax" /
                                                      "train_gpt.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["te_lite_demo_jax"] = mod  # dataclasses / flax look their module up
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(EXAMPLES))


def test_jax_demo_runs_nvfp4(tmp_path, caplog):
    demo = _load_demo()
    out = tmp_path / "loss.png"
    argv = ["--quick", "--steps", "4", "--avg-last", "2", "--recipes", "bf16,nvfp4",
            "--hidden", "64", "--heads", "2", "--layers", "1", "--batch", "4", "--seq-len", "64",
            "--warmup", "1", "--no-progress", "--out", str(out)]
    with caplog.at_level(logging.INFO):
        assert demo.main(argv) == 0
    assert out.is_file() and out.stat().st_size > 0
    assert "NVFP4BlockScaling" in caplog.text, "the results table has no NVFP4 row"


def test_jax_demo_default_runs_leave_nvfp4_out():
    demo = _load_demo()
    assert demo.parse_demo_args(demo.make_parser(), [])[1] == list(demo.FP8_DEMO_RECIPES)
    assert demo.parse_demo_args(demo.make_parser(), ["--recipes", "nvfp4"])[1] == ["nvfp4"]

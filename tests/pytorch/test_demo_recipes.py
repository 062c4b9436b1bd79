"""The PyTorch GPT demo (examples/pytorch/train_gpt.py, the README's first command) with the
block-scaled recipes it gained: a few steps of Float8BlockScaling and NVFP4 next to bf16 train with
finite losses (main() returns 1 otherwise), the table has their rows and the plot is written; the
demos that do not run them (JAX, Megatron) refuse them by name."""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(path: Path, name: str):
    sys.path.insert(0, str(EXAMPLES))  # _common_demo
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # dataclasses look their module up
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(EXAMPLES))


def test_pytorch_demo_runs_block_and_nvfp4(tmp_path, caplog):
    demo = _load(EXAMPLES / "pytorch" / "train_gpt.py", "te_lite_demo_pytorch")
    out = tmp_path / "loss.png"
    argv = ["--quick", "--steps", "6", "--avg-last", "2", "--recipes", "bf16,block,nvfp4",
            "--hidden", "64", "--heads", "2", "--layers", "1", "--batch", "4", "--seq-len", "64",
            "--warmup", "1", "--no-progress", "--threads", "1", "--out", str(out)]
    with caplog.at_level(logging.INFO):
        assert demo.main(argv) == 0
    assert out.is_file() and out.stat().st_size > 0
    text = caplog.text
    for label in ("Float8BlockScaling", "NVFP4BlockScaling"):
        assert label in text, f"the results table has no {label} row"


def test_demo_recipe_lists():
    common = _load(EXAMPLES / "_common_demo.py", "te_lite_demo_common")
    parser = common.demo_parser("doc", Path("x.png"))
    with pytest.raises(SystemExit):
        common.parse_demo_args(parser, ["--recipes", "nvfp4"])  # not a default-demo recipe
    parser = common.demo_parser("doc", Path("x.png"), tuple(common.RECIPES))
    args, names = common.parse_demo_args(parser, ["--recipes", "block,nvfp4"])
    assert names == ["block", "nvfp4"]
    assert set(common.RECIPES) == set(common.RECIPE_LABELS)

"""HF accelerate's FP8 path, unmodified (accelerate 1.15.0), on transformer_engine_lite through the
`transformer_engine` alias: `Accelerator(mixed_precision="fp8")` with the TE backend converts a
model's nn.Linear / nn.LayerNorm to TE's modules, runs the forward under TE's fp8_autocast, and
trains a few steps. Prints `RESULT <json>`; run by tests/integration/test_accelerate.py.

One patch, of accelerate's TE detection only: accelerate looks TransformerEngine up by its pip
metadata (`importlib.metadata.metadata("transformer-engine")`), which the alias does not fake, so
its `is_transformer_engine_available` is answered True here.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

import transformer_engine_lite.as_te  # noqa: F401


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mixed-precision", default="fp8")
    p.add_argument("--recipe", choices=["delayed", "mxfp8"], default="delayed")
    a = p.parse_args()
    import accelerate  # noqa: F401
    from accelerate import Accelerator
    from accelerate.utils import FP8RecipeKwargs

    for name, mod in list(sys.modules.items()):
        if name.startswith("accelerate") and hasattr(mod, "is_transformer_engine_available"):
            mod.is_transformer_engine_available = lambda: True
    from transformer_engine_lite.pytorch.fp8 import FP8GlobalStateManager

    handlers = []
    if a.mixed_precision == "fp8":
        extra = {"use_mxfp8_block_scaling": True} if a.recipe == "mxfp8" else {}
        handlers = [FP8RecipeKwargs(backend="te", **extra)]
    acc = Accelerator(mixed_precision=a.mixed_precision, kwargs_handlers=handlers)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.GELU(),
                                torch.nn.Linear(64, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    fp8_seen = []
    for m in model.modules():
        if type(m).__module__.startswith("transformer_engine_lite") and hasattr(m, "weight"):
            m.register_forward_hook(
                lambda *_: fp8_seen.append(FP8GlobalStateManager.is_fp8_enabled()))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 64, generator=g), torch.randn(32, 16, generator=g)
    losses = []
    for _ in range(5):
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    print("RESULT " + json.dumps({
        "backend": str(getattr(acc, "fp8_backend", None)),
        "modules": [type(m).__module__ + "." + type(m).__name__ for m in model.modules()][1:],
        "fp8_in_forward": fp8_seen, "losses": losses}), flush=True)


if __name__ == "__main__":
    main()

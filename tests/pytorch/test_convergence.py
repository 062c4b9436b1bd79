"""A tiny model trained 200 steps under each FP8 recipe ends within 5% of the bf16 loss.

Tiny matrices: one thread is fastest (ci/pytorch.sh runs this file with OMP_NUM_THREADS=1; with
more threads than free cores, OpenMP spin-waits make each op milliseconds)."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common.recipe import (
    DelayedScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
)

STEPS = 200
HIDDEN = 64
RECIPES = {
    "delayed": lambda: DelayedScaling(amax_history_len=16),
    "current": Float8CurrentScaling,
    "mxfp8": MXFP8BlockScaling,
}


class TinyModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = te.LayerNormMLP(HIDDEN, 2 * HIDDEN, activation="swiglu")
        self.proj = te.LayerNormLinear(HIDDEN, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x + self.mlp(x))


def _data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy regression onto a fixed random teacher: the loss plateaus at the noise level."""
    g = torch.Generator().manual_seed(1000 + step)
    teacher = torch.Generator().manual_seed(7)
    w1 = torch.randn(HIDDEN, HIDDEN, generator=teacher) / HIDDEN**0.5
    w2 = torch.randn(HIDDEN, 1, generator=teacher)
    x = torch.randn(64, HIDDEN, generator=g)
    y = torch.tanh(x @ w1) @ w2 / HIDDEN**0.5 * 4 + 0.1 * torch.randn(64, 1, generator=g)
    return x, y


def _train(recipe) -> float:
    torch.manual_seed(0)
    model = TinyModel()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for step in range(STEPS):
        x, y = _data(step)
        with (
            torch.autocast("cpu", dtype=torch.bfloat16),
            te.fp8_autocast(enabled=recipe is not None, fp8_recipe=recipe),
        ):
            out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return sum(losses[-20:]) / 20  # mean over the last 20 steps: less batch noise


@pytest.fixture(scope="module")
def bf16_loss() -> float:
    return _train(None)


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_fp8_training_matches_bf16(recipe, bf16_loss):
    loss = _train(RECIPES[recipe]())
    _, first_y = _data(0)
    baseline = first_y.var().item()  # loss of predicting the mean
    assert bf16_loss < 0.2 * baseline, f"bf16 run did not learn: {bf16_loss} vs {baseline}"
    assert abs(loss - bf16_loss) <= 0.05 * bf16_loss, (
        f"{recipe}: final loss {loss:.5f} vs bf16 {bf16_loss:.5f} (more than 5% apart)"
    )

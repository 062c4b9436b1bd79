"""Framework-free parts of the GPT demos (examples/pytorch/train_gpt.py, examples/jax/train_gpt.py):
the offline corpus, the recipes and their labels, the learning-rate schedule, the results table and
the loss plot. Imports neither torch nor jax, so each demo pulls in only its own framework."""

from __future__ import annotations

import argparse
import logging
import math
import sysconfig
from pathlib import Path

from transformer_engine_lite.common.recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    Format,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)

RECIPES = {
    "bf16": None,
    "delayed": lambda: DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=16),
    "current": lambda: Float8CurrentScaling(fp8_format=Format.HYBRID),
    "mxfp8": lambda: MXFP8BlockScaling(fp8_format=Format.E4M3),
    "block": lambda: Float8BlockScaling(fp8_format=Format.E4M3),
    "nvfp4": lambda: NVFP4BlockScaling(),
}
RECIPE_LABELS = {
    "bf16": "bf16 (no FP8)",
    "delayed": "FP8 DelayedScaling (HYBRID, history 16)",
    "current": "FP8 Float8CurrentScaling (HYBRID)",
    "mxfp8": "MXFP8BlockScaling (E4M3, 1x32 blocks)",
    "block": "FP8 Float8BlockScaling (E4M3, 1x128 / 128x128)",
    "nvfp4": "NVFP4BlockScaling (E2M1, 1x16 / 16x16, RHT, SR)",
}
SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


# ------------------------------------------------------------------------------------------ data
def load_corpus(max_bytes: int) -> tuple[bytes, int]:
    """The stdlib's *.py files in sorted order until max_bytes (deterministic for a given Python).
    Returns (bytes, number of files)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p
        for p in root.rglob("*.py")
        if not (set(p.relative_to(root).parts[:-1]) & SKIP_DIRS) and p.is_file()
    )
    chunks, total, n = [], 0, 0
    for p in files:
        try:
            data = p.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        total += len(data)
        n += 1
        if total >= max_bytes:
            break
    if total == 0:
        raise SystemExit(f"train_gpt: no *.py files found under {root}")
    return b"".join(chunks)[:max_bytes], n


# -------------------------------------------------------------------------------------- training
def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warmup, then cosine decay to 10% of lr."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


# --------------------------------------------------------------------------------------- results
def log_table(log: logging.Logger, results: list[dict], avg_last: int, steps: int,
              eval_batches: int) -> None:
    """The final table: one row per run (dicts with name, final, val, tok_s, seconds)."""
    base = next((r for r in results if r["name"] == "bf16"), None)
    log.info("")
    w = max([42] + [len(RECIPE_LABELS[r["name"]]) for r in results])  # the label column
    head = f"{'run':<{w}} {'train loss':>10} {'val loss':>9} {'vs bf16':>8} {'tokens/s':>9} {'time s':>7}"
    log.info(head)
    log.info("-" * len(head))
    for r in results:
        d = f"{r['val'] - base['val']:+.3f}" if base else "-"
        log.info(
            "%-*s %10.4f %9.4f %8s %9s %7.1f",
            w,
            RECIPE_LABELS[r["name"]],
            r["final"],
            r["val"],
            d,
            f"{r['tok_s']:,.0f}",
            r["seconds"],
        )
    log.info(
        "(train loss: mean of the last %d steps; val: %d held-out batches; nats/byte)",
        min(avg_last, steps),
        eval_batches,
    )


def _smooth(values: list[float], k: int) -> list[float]:
    """Trailing moving average over k points (the first points average what exists so far)."""
    cs = [0.0]
    for v in values:
        cs.append(cs[-1] + v)
    return [(cs[i + 1] - cs[max(0, i + 1 - k)]) / min(k, i + 1) for i in range(len(values))]


def plot(results: list[dict], path: Path, title: str, smooth: int) -> None:
    """Loss curves (top) and, when a bf16 run exists, each run's loss minus bf16's (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = next((r for r in results if r["name"] == "bf16"), None)
    rows = 2 if base is not None and len(results) > 1 else 1
    fig, axes = plt.subplots(
        rows,
        1,
        figsize=(8, 6.4 if rows == 2 else 4.6),
        dpi=110,
        sharex=True,
        gridspec_kw={"height_ratios": [2, 1]} if rows == 2 else None,
        squeeze=False,
    )
    ax = axes[0][0]
    sm = {r["name"]: _smooth(r["losses"], smooth) for r in results}
    for r in results:
        ys = sm[r["name"]]
        ax.plot(
            range(1, len(ys) + 1),
            ys,
            lw=1.4,
            label=f"{RECIPE_LABELS[r['name']]}: train {r['final']:.3f}, val {r['val']:.3f}",
        )
    ax.set_ylabel(f"training loss\n(nats/byte, moving avg {smooth})")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    finite = [v for r in results for v in r["losses"] if math.isfinite(v)]
    if finite:
        lo = min(finite)
        first = max(v for r in results for v in r["losses"][:1] if math.isfinite(v))
        ax.set_ylim(max(0.0, lo - 0.2), min(first, lo + 3.0) + 0.1)
    if rows == 2:
        ax2 = axes[1][0]
        b = sm["bf16"]
        for r in results:
            ys = sm[r["name"]][: len(b)]
            ax2.plot(
                range(1, len(ys) + 1),
                [y - y0 for y, y0 in zip(ys, b)],
                lw=1.2,
                label=RECIPE_LABELS[r["name"]],
            )
        ax2.axhline(0.0, color="k", lw=0.6)
        ax2.set_ylabel("loss - bf16 loss")
        ax2.grid(alpha=0.3)
    axes[-1][0].set_xlabel("step")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


# The recipes every demo runs; the PyTorch one adds the block-scaled ones, the JAX one NVFP4 on
# request (--recipes ...,nvfp4); Megatron's front end here takes neither yet (issue #24).
FP8_DEMO_RECIPES = ("bf16", "delayed", "current", "mxfp8")


def demo_parser(doc: str, out_default: Path,
                recipes: tuple[str, ...] = FP8_DEMO_RECIPES) -> argparse.ArgumentParser:
    """The command line the demos share (model size, schedule, corpus, output); `recipes`: the
    ones this demo runs (all of them by default)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(available_recipes=recipes)
    p.add_argument("--steps", type=int, default=None, help="training steps per run (default 200)")
    p.add_argument("--quick", action="store_true", help="smoke test: 12 steps, smaller corpus")
    p.add_argument("--recipes", default=",".join(recipes),
                   help=f"comma-separated of {list(recipes)}")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--corpus-mb", type=float, default=4.0, help="MB of stdlib source to use")
    p.add_argument("--eval-batches", type=int, default=16, help="held-out batches at the end")
    p.add_argument("--avg-last", type=int, default=20, help="final loss = mean of the last N steps")
    p.add_argument("--out", default=str(out_default), help="loss plot (PNG)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bars (logs only)")
    return p


def parse_demo_args(p: argparse.ArgumentParser, argv: list[str] | None):
    """(args, recipe names) with --quick applied and the sizes checked."""
    args = p.parse_args(argv)
    names = [n.strip() for n in args.recipes.split(",") if n.strip()]
    bad = [n for n in names if n not in args.available_recipes]
    if bad or not names:
        p.error(f"--recipes: expected some of {list(args.available_recipes)}, got {bad or names}")
    if args.steps is None:
        args.steps = 12 if args.quick else 200
    if args.quick:
        args.corpus_mb = min(args.corpus_mb, 0.5)
        args.eval_batches = min(args.eval_batches, 2)
        args.warmup = min(args.warmup, 3)
    if args.hidden % args.heads:
        p.error("--hidden must be a multiple of --heads")
    return args, names


def run_summary(name: str, losses: list[float], val: float, seconds: float, tokens_per_step: int,
                avg_last: int, **extra) -> dict:
    """One run's row for log_table / plot."""
    tail = losses[-min(avg_last, len(losses)):]
    return {"name": name, "losses": losses, "final": sum(tail) / len(tail), "val": val,
            "seconds": seconds, "tok_s": tokens_per_step * len(losses) / seconds, **extra}

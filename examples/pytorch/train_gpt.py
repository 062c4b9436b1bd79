#!/usr/bin/env python
"""Train a small GPT-like byte-level language model with transformer_engine_lite's PyTorch modules
on the CPU, once in bf16 and once per quantized recipe (FP8 delayed scaling, current scaling, MXFP8,
Float8BlockScaling, and NVFP4), with the same seed, data and batches, and compare the loss curves.

Corpus: the Python standard library's own source files (offline everywhere Python is): the *.py files
under sysconfig's "stdlib" path, sorted, tests and site-packages skipped, until --corpus-mb MB; the
last 5% of the bytes are held out for validation. Tokens are bytes (vocabulary 256).

Model: te.TransformerLayer blocks (LayerNorm + fused QKV projection, rotary position embeddings
through the fused RoPE op, causal te.DotProductAttention on the flash backend, output projection,
residual; LayerNormMLP with GELU, residual). Token embeddings, te.RotaryPositionEmbedding, the final
te.LayerNorm and the LM head (te.Linear) run outside fp8_autocast, in bf16, as is usual for FP8
training; inside it the projections run in FP8 and the attention math in high precision. Parameters are
fp32 master weights; activations are bf16 (the modules cast weights to the input's dtype).

    python examples/pytorch/train_gpt.py                  # default: 6 runs, ~5 min on 2 AMX cores
    python examples/pytorch/train_gpt.py --quick          # a few steps, smoke test
    python examples/pytorch/train_gpt.py --steps 300 --recipes bf16,current --out /tmp/loss.png
"""

from __future__ import annotations

import os

# The library's kernels and torch both use OpenMP. PASSIVE waiting keeps idle threads from spinning:
# with many small ops per step, spinning threads cost more than they save on a busy machine (on a
# loaded 2-core machine, 2 spinning threads ran a step ~3x slower than 1 thread). Set before torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import logging
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

import transformer_engine_lite.pytorch as te

# corpus, recipes, schedule, table and plot: shared with examples/jax/train_gpt.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common_demo import (
    RECIPE_LABELS,
    RECIPES,
    demo_parser,
    load_corpus,
    log_table,
    lr_at,
    parse_demo_args,
    plot,
    run_summary,
)

log = logging.getLogger("train_gpt")


# ------------------------------------------------------------------------------------------ data
class Batches:
    """Random windows of seq_len + 1 bytes from a fixed generator: every run sees the same batches."""

    def __init__(self, data: torch.Tensor, batch: int, seq_len: int, seed: int) -> None:
        self.data, self.batch, self.seq_len = data, batch, seq_len
        self.gen = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(
            0, len(self.data) - self.seq_len - 1, (self.batch,), generator=self.gen
        )
        idx = starts[:, None] + torch.arange(self.seq_len + 1)
        w = self.data[idx].long()
        return w[:, :-1], w[:, 1:]


# ----------------------------------------------------------------------------------------- model
@dataclass
class Config:
    vocab: int = 256
    seq_len: int = 128
    hidden: int = 128
    heads: int = 4
    layers: int = 4
    ffn: int = 512


class GPT(torch.nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = torch.nn.Embedding(cfg.vocab, cfg.hidden)
        torch.nn.init.normal_(self.tok.weight, std=0.02)
        self.rope = te.RotaryPositionEmbedding(cfg.hidden // cfg.heads)
        self.blocks = torch.nn.ModuleList(
            te.TransformerLayer(
                cfg.hidden, cfg.ffn, cfg.heads, hidden_dropout=0.0, attention_dropout=0.0,
                self_attn_mask_type="causal", attn_input_format="bshd", fuse_qkv_params=True,
                activation="gelu", layer_number=i + 1, device="cpu")
            for i in range(cfg.layers))
        self.ln_f = te.LayerNorm(cfg.hidden, device="cpu")
        self.head = te.Linear(cfg.hidden, cfg.vocab, bias=False, device="cpu")

    def forward(self, idx: torch.Tensor, recipe) -> torch.Tensor:
        x = self.tok(idx).to(torch.bfloat16)
        freqs = self.rope(idx.shape[1])  # fp32 [s, 1, 1, head_dim]
        # The transformer blocks run their GEMMs in FP8 under the recipe; embeddings, the final
        # norm and the LM head stay in bf16 (TE's usual practice).
        # fp32 parameters, bf16 compute: torch.autocast says so (TE's rule: outside it, a module's
        # input must have its parameters' dtype).
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with te.fp8_autocast(enabled=recipe is not None, fp8_recipe=recipe):
                for blk in self.blocks:
                    x = blk(x, rotary_pos_emb=freqs)
            return self.head(self.ln_f(x))


# -------------------------------------------------------------------------------------- training
def loss_of(model: GPT, x: torch.Tensor, y: torch.Tensor, recipe) -> torch.Tensor:
    logits = model(x, recipe)
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def evaluate(model: GPT, data: torch.Tensor, args, recipe) -> float:
    batches = Batches(data, args.batch, args.seq_len, seed=args.seed + 1)
    losses = [loss_of(model, *batches.next(), recipe).item() for _ in range(args.eval_batches)]
    return sum(losses) / len(losses)


def train_one(name: str, args, cfg: Config, train: torch.Tensor, val: torch.Tensor) -> dict:
    recipe = RECIPES[name]() if RECIPES[name] else None
    torch.manual_seed(args.seed)  # same initial weights for every run
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    batches = Batches(train, args.batch, args.seq_len, seed=args.seed)  # same batches
    losses: list[float] = []
    tokens = args.batch * args.seq_len
    bar = tqdm(
        range(args.steps),
        desc=f"{name:>7}",
        unit="step",
        leave=True,
        dynamic_ncols=True,
        disable=args.no_progress,
    )
    t0 = time.perf_counter()
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        x, y = batches.next()
        loss = loss_of(model, x, y, recipe)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            log.error("%s: loss became %s at step %d; stopping this run", name, losses[-1], step)
            break
        if step % 10 == 0 or step == args.steps - 1:
            el = time.perf_counter() - t0
            bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{tokens * (step + 1) / el:,.0f}")
    elapsed = time.perf_counter() - t0
    bar.close()
    val_loss = evaluate(model, val, args, recipe)
    return run_summary(name, losses, val_loss, elapsed, tokens, args.avg_last)


def main(argv: list[str] | None = None) -> int:
    p = demo_parser(__doc__, Path(__file__).resolve().parent / "out" / "loss.png", tuple(RECIPES))
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    args, names = parse_demo_args(p, argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)

    torch.set_num_threads(args.threads or os.cpu_count() or 1)

    t_start = time.perf_counter()
    raw, nfiles = load_corpus(int(args.corpus_mb * 1e6))
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    split = int(len(data) * 0.95)
    train, val = data[:split], data[split:]
    cfg = Config(
        seq_len=args.seq_len,
        hidden=args.hidden,
        heads=args.heads,
        layers=args.layers,
        ffn=4 * args.hidden,
    )
    nparams = sum(p.numel() for p in GPT(cfg).parameters())
    log.info(
        "corpus: %d stdlib files, %.2f MB (train %.2f MB, val %.2f MB), byte vocabulary",
        nfiles,
        len(data) / 1e6,
        len(train) / 1e6,
        len(val) / 1e6,
    )
    log.info(
        "model: %d layers, hidden %d, %d heads, ffn %d, seq %d: %.2fM parameters; batch %d "
        "(%d tokens/step), %d steps, lr %g; torch %s, %d threads",
        cfg.layers,
        cfg.hidden,
        cfg.heads,
        cfg.ffn,
        cfg.seq_len,
        nparams / 1e6,
        args.batch,
        args.batch * args.seq_len,
        args.steps,
        args.lr,
        torch.__version__,
        torch.get_num_threads(),
    )
    ok, why = te.is_fp8_available(return_reason=True)
    if not ok and any(RECIPES[n] for n in names):
        log.warning("FP8 not available (%s): running bf16 only", why)
        names = [n for n in names if RECIPES[n] is None] or ["bf16"]

    results = []
    for name in names:
        log.info("-- %s", RECIPE_LABELS[name])
        r = train_one(name, args, cfg, train, val)
        log.info(
            "   %s: final train loss %.4f, val loss %.4f, %.1f s, %s tokens/s",
            name,
            r["final"],
            r["val"],
            r["seconds"],
            f"{r['tok_s']:,.0f}",
        )
        results.append(r)

    log_table(log, results, args.avg_last, args.steps, args.eval_batches)

    out = Path(args.out)
    title = (
        f"byte-level GPT on Python stdlib source: {cfg.layers}x{cfg.hidden}, seq {cfg.seq_len}, "
        f"batch {args.batch}, {args.steps} steps"
    )
    plot(results, out, title, smooth=max(1, min(10, args.steps // 10)))
    log.info("loss plot: %s", out)
    log.info("total time: %.1f s", time.perf_counter() - t_start)
    failed = [r["name"] for r in results if not math.isfinite(r["final"])]
    if failed:
        log.error("non-finite loss in: %s", ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Megatron-Core's GPT, unmodified, trained on the CPU with TransformerEngine code paths: the
showcase of "TE code, no GPU". Megatron builds its model from the TE layer spec
(`get_gpt_layer_with_transformer_engine_spec()`: TE's LayerNormLinear, DotProductAttention, Linear,
...) and imports `transformer_engine`; the `transformer_engine_lite.as_te` alias makes that our
package. The same byte-level corpus as examples/pytorch/train_gpt.py (the Python stdlib's source),
bf16 and each FP8 recipe Megatron offers (delayed, tensorwise = current scaling, mxfp8), a progress
bar, a results table and a loss plot (examples/megatron/out/loss.png).

Needs megatron-core (ci/install_deps.sh installs 0.19.2: `pip install --no-deps
--ignore-requires-python megatron-core==0.19.2` on Python 3.11). Megatron's own CUDA-only spots
are patched by cpu_patches.py (shared with tests/integration/megatron_gpt.py) and nowhere else.

    python examples/megatron/train_gpt.py --quick
    python examples/megatron/train_gpt.py --steps 300 --recipes bf16,delayed
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

import transformer_engine_lite.as_te  # noqa: F401  (transformer_engine -> transformer_engine_lite)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common_demo import (  # noqa: E402
    RECIPE_LABELS,
    demo_parser,
    load_corpus,
    log_table,
    lr_at,
    parse_demo_args,
    plot,
    run_summary,
)
from cpu_patches import patch_megatron_cuda_only_spots  # noqa: E402

log = logging.getLogger("megatron_gpt")
MEGATRON_RECIPE = {"bf16": None, "delayed": "delayed", "current": "tensorwise", "mxfp8": "mxfp8"}


class Batches:
    """Random windows of seq_len + 1 bytes from a fixed generator: every run sees the same batches."""

    def __init__(self, data: torch.Tensor, batch: int, seq_len: int, seed: int) -> None:
        self.data, self.batch, self.seq_len = data, batch, seq_len
        self.gen = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, len(self.data) - self.seq_len - 1, (self.batch,), generator=self.gen)
        w = self.data[starts[:, None] + torch.arange(self.seq_len + 1)].long()
        return w[:, :-1], w[:, 1:]


def build_model(args, recipe: str | None):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch.manual_seed(args.seed)  # the same initial weights for every recipe
    model_parallel_cuda_manual_seed(args.seed)
    kw = dict(num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=args.heads,
              ffn_hidden_size=4 * args.hidden, use_cpu_initialization=True,
              params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, bf16=True,
              hidden_dropout=0.0, attention_dropout=0.0, init_method_std=0.02)
    if recipe is not None:
        kw.update(fp8="e4m3" if recipe == "mxfp8" else "hybrid", fp8_recipe=recipe,
                  fp8_amax_history_len=16)
    model = GPTModel(config=TransformerConfig(**kw),
                     transformer_layer_spec=get_gpt_layer_with_transformer_engine_spec(),
                     vocab_size=256, max_sequence_length=args.seq_len)
    return model.to(torch.bfloat16)


def train_one(name: str, args, train: torch.Tensor, val: torch.Tensor) -> dict:
    model = build_model(args, MEGATRON_RECIPE[name])
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    batches = Batches(train, args.batch, args.seq_len, seed=args.seed)
    pos = torch.arange(args.seq_len).unsqueeze(0).expand(args.batch, -1)
    mask = torch.tril(torch.ones(args.seq_len, args.seq_len, dtype=torch.bool)).logical_not()
    mask = mask.view(1, 1, args.seq_len, args.seq_len)

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return model(x, pos, mask, labels=y).float().mean()  # Megatron returns per-token losses

    losses: list[float] = []
    tokens = args.batch * args.seq_len
    bar = tqdm(range(args.steps), desc=f"{name:>7}", unit="step", dynamic_ncols=True,
               disable=args.no_progress)
    t0 = time.perf_counter()
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        # What Megatron's training loop does per step: the TE layers re-quantize their weights.
        model.set_is_first_microbatch()
        loss = loss_of(*batches.next())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            log.error("%s: loss became %s at step %d; stopping this run", name, losses[-1], step)
            break
        if step % 10 == 0 or step == args.steps - 1:
            bar.set_postfix(loss=f"{losses[-1]:.3f}",
                            tok_s=f"{tokens * (step + 1) / (time.perf_counter() - t0):,.0f}")
    elapsed = time.perf_counter() - t0
    bar.close()
    with torch.no_grad():
        vb = Batches(val, args.batch, args.seq_len, seed=args.seed + 1)
        model.set_is_first_microbatch()
        val_loss = sum(loss_of(*vb.next()).item() for _ in range(args.eval_batches))
    return run_summary(name, losses, val_loss / args.eval_batches, elapsed, tokens, args.avg_last)


def main(argv: list[str] | None = None) -> int:
    p = demo_parser(__doc__, Path(__file__).resolve().parent / "out" / "loss.png")
    args, names = parse_demo_args(p, argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    try:
        import megatron.core  # noqa: F401
    except ImportError:
        log.error("megatron-core is not installed (bash ci/install_deps.sh installs it)")
        return 2
    patch_megatron_cuda_only_spots()
    import torch.distributed as dist
    from megatron.core import parallel_state

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    t_start = time.perf_counter()
    raw, nfiles = load_corpus(int(args.corpus_mb * 1e6))
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    split = int(len(data) * 0.95)
    log.info("corpus: %d stdlib files, %.2f MB; Megatron-Core GPTModel with the TE layer spec on "
             "transformer_engine_lite: %d layers, hidden %d, %d heads, seq %d, batch %d, %d steps",
             nfiles, len(data) / 1e6, args.layers, args.hidden, args.heads, args.seq_len,
             args.batch, args.steps)
    results = []
    for name in names:
        log.info("-- %s", RECIPE_LABELS[name])
        results.append(train_one(name, args, data[:split], data[split:]))
    log_table(log, results, args.avg_last, args.steps, args.eval_batches)
    out = Path(args.out)
    plot(results, out, f"Megatron-Core GPT (TE spec) on transformer_engine_lite, CPU: "
         f"{args.layers}x{args.hidden}, {args.steps} steps", smooth=max(1, min(10, args.steps // 10)))
    log.info("loss plot: %s", out)
    log.info("total time: %.1f s", time.perf_counter() - t_start)
    dist.destroy_process_group()
    return 0 if all(math.isfinite(r["final"]) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

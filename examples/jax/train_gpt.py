#!/usr/bin/env python
"""Train a small GPT-like byte-level language model with transformer_engine_lite's JAX/Flax modules
on the CPU, once in bf16 and once per quantized recipe (FP8 delayed scaling, current scaling, MXFP8;
NVFP4 on request: --recipes bf16,nvfp4), with the same seed, data and batches, and compare the loss
curves (the JAX twin of examples/pytorch/train_gpt.py).

Corpus: the Python standard library's own source files (offline everywhere Python is), loaded as the
PyTorch demo does (examples/_common_demo.py); the last 5% of the bytes are held out for validation.
Tokens are bytes (vocabulary 256).

Model: te_flax.TransformerLayer blocks used decoder-only, as TE-JAX's GPT examples do (layer_type
ENCODER with self_attn_mask_type="causal": LayerNorm + fused QKV projection, rotary position
embeddings, causal fused attention on the C core's flash kernel, output projection, residual;
LayerNormMLP with GELU, residual). The token embedding, the final te_flax.LayerNorm and the LM head
(te_flax.DenseGeneral) run outside te.autocast, in bf16, as is usual for FP8 training; inside it the
projections run in FP8 and the attention math in high precision. Parameters are fp32 master
weights (optax AdamW); activations are bf16 (the modules cast weights to the input's dtype).
DelayedScaling keeps its amax histories and scales in the "fp8_metas" collection: the step takes
the gradient w.r.t. it too, and that "gradient" is the updated state (TE-JAX's idiom).
NVFP4BlockScaling rounds gradients stochastically from states the modules draw off the "sr_rng"
stream (TE-JAX's): every step passes a fresh key for it, derived from the seed and the step.

    python examples/jax/train_gpt.py                  # default: 4 runs, see README.md for times
    python examples/jax/train_gpt.py --quick          # a few steps, smoke test
    python examples/jax/train_gpt.py --steps 300 --recipes bf16,current --out /tmp/loss.png
"""

from __future__ import annotations

import os

# The library's kernels use OpenMP next to XLA's own thread pool. PASSIVE waiting keeps idle OpenMP
# threads from spinning while XLA runs its ops (as in the PyTorch demo). Set before the library loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import logging
import math
import sys
import time
from pathlib import Path

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

import transformer_engine_lite.jax as te
import transformer_engine_lite.jax.flax as te_flax

# corpus, recipes, schedule, table and plot: shared with examples/pytorch/train_gpt.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common_demo import (
    FP8_DEMO_RECIPES,
    RECIPE_LABELS,
    RECIPES,
    demo_parser,
    load_corpus,
    log_table,
    parse_demo_args,
    plot,
    run_summary,
)

log = logging.getLogger("train_gpt")
F32, BF16 = jnp.float32, jnp.bfloat16


# ------------------------------------------------------------------------------------------ data
class Batches:
    """Random windows of seq_len + 1 bytes from a fixed generator: every run sees the same batches."""

    def __init__(self, data: np.ndarray, batch: int, seq_len: int, seed: int) -> None:
        self.data, self.batch, self.seq_len = data, batch, seq_len
        self.rng = np.random.default_rng(seed)

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        starts = self.rng.integers(0, len(self.data) - self.seq_len - 1, self.batch)
        w = self.data[starts[:, None] + np.arange(self.seq_len + 1)].astype(np.int32)
        return w[:, :-1], w[:, 1:]


# ----------------------------------------------------------------------------------------- model
class GPT(nn.Module):
    vocab: int = 256
    hidden: int = 128
    heads: int = 4
    layers: int = 4
    ffn: int = 512
    recipe: object = None  # None: bf16; else the FP8 recipe the blocks run under

    @nn.compact
    def __call__(self, idx: jax.Array) -> jax.Array:
        tok = nn.Embed(self.vocab, self.hidden, embedding_init=nn.initializers.normal(0.02),
                       name="tok")
        x = tok(idx).astype(BF16)
        # The blocks run their GEMMs in FP8 under the recipe; embedding, final norm and LM head stay
        # in bf16. autocast acts at trace time, so init and apply see the same FP8 state variables.
        with te.autocast(enabled=self.recipe is not None, recipe=self.recipe):
            for i in range(self.layers):
                x = te_flax.TransformerLayer(
                    hidden_size=self.hidden, mlp_hidden_size=self.ffn,
                    num_attention_heads=self.heads, hidden_dropout=0.0, attention_dropout=0.0,
                    layer_type=te_flax.TransformerLayerType.ENCODER, self_attn_mask_type="causal",
                    enable_relative_embedding=False, enable_rotary_pos_emb=True,
                    mlp_activations=("gelu",), dtype=F32, name=f"block_{i}",
                )(x, deterministic=True)
        x = te_flax.LayerNorm(dtype=F32, name="ln_f")(x)
        return te_flax.DenseGeneral(self.vocab, use_bias=False, dtype=F32, name="head")(x)


# -------------------------------------------------------------------------------------- training
def make_schedule(steps: int, lr: float, warmup: int):
    """_common_demo.lr_at in jnp (optax evaluates it at the update count, 0 at the first step)."""

    def schedule(step):
        t = (step - warmup) / max(1, steps - warmup)
        decay = lr * (0.1 + 0.9 * 0.5 * (1 + jnp.cos(jnp.pi * t)))
        return jnp.where(step < warmup, lr * (step + 1) / warmup, decay)

    return schedule


def make_steps(model: GPT, opt: optax.GradientTransformation):
    """The jitted training and evaluation steps of one run (closures: the model holds its recipe)."""

    def loss_fn(params, state, x, y, sr_key=None):
        # sr_rng: NVFP4's stochastic-rounding stream (unused by the other recipes).
        rngs = {"sr_rng": jax.random.PRNGKey(0) if sr_key is None else sr_key}
        logits = model.apply({"params": params, **state}, x, rngs=rngs)
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(F32), y).mean()

    @jax.jit
    def train_step(params, state, opt_state, x, y, sr_key):
        # Gradients w.r.t. the FP8 state too: for DelayedScaling they are the new amax histories
        # and scales (the state is empty for bf16, current scaling, MXFP8 and NVFP4).
        loss, (g_params, g_state) = jax.value_and_grad(loss_fn, argnums=(0, 1))(
            params, state, x, y, sr_key)
        updates, opt_state = opt.update(g_params, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, te.update_collections(g_state, state), opt_state, loss

    return train_step, jax.jit(loss_fn)


def init_model(model: GPT, seq_len: int, seed: int):
    """(params, state): fp32 master weights (unboxed from their logical-axis boxes) and the other
    collections (fp8_metas under DelayedScaling)."""
    vs = model.init({"params": jax.random.PRNGKey(seed), "sr_rng": jax.random.PRNGKey(seed + 1)},
                    jnp.zeros((1, seq_len), jnp.int32))
    state, params = flax.core.pop(flax.core.unfreeze(vs), "params")
    return nn.unbox(params), nn.unbox(state)


def evaluate(eval_step, params, state, data: np.ndarray, args) -> float:
    batches = Batches(data, args.batch, args.seq_len, seed=args.seed + 1)
    losses = [float(eval_step(params, state, *batches.next()))
              for _ in range(args.eval_batches)]
    return sum(losses) / len(losses)


def train_one(name: str, args, train: np.ndarray, val: np.ndarray) -> dict:
    recipe = RECIPES[name]() if RECIPES[name] else None
    model = GPT(hidden=args.hidden, heads=args.heads, layers=args.layers, ffn=4 * args.hidden,
                recipe=recipe)
    params, state = init_model(model, args.seq_len, args.seed)  # same initial weights every run
    opt = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(make_schedule(args.steps, args.lr, args.warmup), b1=0.9, b2=0.95,
                    weight_decay=0.1),
    )
    opt_state = opt.init(params)
    train_step, eval_step = make_steps(model, opt)
    batches = Batches(train, args.batch, args.seq_len, seed=args.seed)  # same batches every run
    # Compile before the clock starts: XLA's compile time is reported apart from tokens/s.
    t0 = time.perf_counter()
    x0, y0 = batches.next()
    sr_base = jax.random.PRNGKey(args.seed + 2)
    train_step = train_step.lower(params, state, opt_state, x0, y0, sr_base).compile()
    compile_s = time.perf_counter() - t0

    losses: list[float] = []
    tokens = args.batch * args.seq_len
    bar = tqdm(range(args.steps), desc=f"{name:>7}", unit="step", leave=True, dynamic_ncols=True,
               disable=args.no_progress)
    t0 = time.perf_counter()
    for step in bar:
        x, y = (x0, y0) if step == 0 else batches.next()
        params, state, opt_state, loss = train_step(params, state, opt_state, x, y,
                                                    jax.random.fold_in(sr_base, step))
        losses.append(float(loss))  # waits for the step: the timing is of finished steps
        if not math.isfinite(losses[-1]):
            log.error("%s: loss became %s at step %d; stopping this run", name, losses[-1], step)
            break
        if step % 10 == 0 or step == args.steps - 1:
            el = time.perf_counter() - t0
            bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{tokens * (step + 1) / el:,.0f}")
    elapsed = time.perf_counter() - t0
    bar.close()
    val_loss = evaluate(eval_step, params, state, val, args)
    return run_summary(name, losses, val_loss, elapsed, tokens, args.avg_last,
                       compile_s=compile_s)


def make_parser():
    """The shared command line; recipes: the default runs, plus NVFP4 on request
    (--recipes ...,nvfp4)."""
    p = demo_parser(__doc__, Path(__file__).resolve().parent / "out" / "loss.png",
                    FP8_DEMO_RECIPES + ("nvfp4",))
    p.set_defaults(recipes=",".join(FP8_DEMO_RECIPES))
    return p


def main(argv: list[str] | None = None) -> int:
    args, names = parse_demo_args(make_parser(), argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    logging.getLogger("jax").setLevel(logging.WARNING)  # not its INFO notes on absent TPU/GPU


    t_start = time.perf_counter()
    raw, nfiles = load_corpus(int(args.corpus_mb * 1e6))
    data = np.frombuffer(raw, dtype=np.uint8)
    split = int(len(data) * 0.95)
    train, val = data[:split], data[split:]
    model = GPT(hidden=args.hidden, heads=args.heads, layers=args.layers, ffn=4 * args.hidden)
    nparams = sum(a.size for a in jax.tree_util.tree_leaves(init_model(model, args.seq_len, 0)[0]))
    log.info("corpus: %d stdlib files, %.2f MB (train %.2f MB, val %.2f MB), byte vocabulary",
             nfiles, len(data) / 1e6, len(train) / 1e6, len(val) / 1e6)
    log.info(
        "model: %d layers, hidden %d, %d heads, ffn %d, seq %d: %.2fM parameters; batch %d "
        "(%d tokens/step), %d steps, lr %g; jax %s, flax %s, optax %s, %s x%d",
        args.layers, args.hidden, args.heads, 4 * args.hidden, args.seq_len, nparams / 1e6,
        args.batch, args.batch * args.seq_len, args.steps, args.lr, jax.__version__,
        flax.__version__, optax.__version__, jax.devices()[0].platform, os.cpu_count() or 1,
    )

    results = []
    for name in names:
        log.info("-- %s", RECIPE_LABELS[name])
        r = train_one(name, args, train, val)
        log.info("   %s: final train loss %.4f, val loss %.4f, %.1f s (+ %.1f s compile), "
                 "%s tokens/s", name, r["final"], r["val"], r["seconds"], r["compile_s"],
                 f"{r['tok_s']:,.0f}")
        results.append(r)

    log_table(log, results, args.avg_last, args.steps, args.eval_batches)
    log.info("(time s: the training steps; XLA compile time per run is logged above)")
    out = Path(args.out)
    title = (f"JAX byte-level GPT on Python stdlib source: {args.layers}x{args.hidden}, seq "
             f"{args.seq_len}, batch {args.batch}, {args.steps} steps")
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

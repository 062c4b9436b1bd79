"""Trains Megatron-Core's GPTModel (unmodified megatron-core, its TE layer spec) on transformer_engine_lite
through the `transformer_engine` alias, on the CPU with gloo, and prints `RESULT <json>` (losses per
step, rank 0). Run by tests/integration/test_megatron.py, one configuration per process (Megatron's
parallel state is process-global); `torchrun --nproc_per_node 2 ... --tp 2` for tensor parallelism.

Megatron's own CUDA-only spots are patched by examples/megatron/cpu_patches.py (each named there)
and nowhere else; the MoE runs use the "allgather" token dispatcher (alltoall creates a CUDA stream).
Sequence-parallel gradients are all-reduced over the TP group after backward, which Megatron's
DDP + finalize_model_grads would do (this script uses a plain torch optimizer).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from pathlib import Path

import torch

import transformer_engine_lite.as_te  # noqa: F401  (transformer_engine -> transformer_engine_lite)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "megatron"))
from cpu_patches import patch_megatron_cuda_only_spots  # noqa: E402


def count_calls() -> collections.Counter:
    """Counts calls of our fused router, permutation and cross entropy functions (Megatron imports
    them by name: wrap first) and of ops.Sequential (Megatron hides its TEFusedMLP's Sequential
    from .modules())."""
    import transformer_engine_lite.pytorch.cross_entropy as cross_entropy
    import transformer_engine_lite.pytorch.permutation as permutation
    import transformer_engine_lite.pytorch.router as router

    calls: collections.Counter = collections.Counter()

    def counted(module, name: str):
        fn = getattr(module, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        setattr(module, name, wrapper)

    # permutation: Megatron's moe_permute_fusion; cross_entropy: its cross_entropy_loss_fusion
    for module in (router, permutation, cross_entropy):
        for name in module.__all__:
            counted(module, name)
    # FP8 attention (fp8_dot_product_attention): DotProductAttention asks for its FP8 plan
    from transformer_engine_lite.pytorch.attention.dot_product_attention import (
        dot_product_attention as dpa_module,
    )

    plan = dpa_module.fp8_attention_plan

    def fp8_attention_plan(*args, **kwargs):
        out = plan(*args, **kwargs)
        if out is not None:
            calls["fp8_attention"] += 1
        return out

    dpa_module.fp8_attention_plan = fp8_attention_plan
    # the fusible-ops path (use_te_op_fuser): Megatron's TEFusedMLP runs an ops.Sequential
    from transformer_engine_lite.pytorch import ops

    forward = ops.Sequential.forward

    def sequential_forward(self, *args, **kwargs):
        calls["ops.Sequential"] += 1
        return forward(self, *args, **kwargs)

    ops.Sequential.forward = sequential_forward
    # Userbuffers fused ops (use_te_op_fuser with tp_comm_overlap: Megatron passes
    # userbuffers_options to BasicLinear)
    from transformer_engine_lite.pytorch.ops import fused

    for cls, meth in ((fused.UserbuffersForwardLinear, "fuser_forward"),
                      (fused.UserbuffersBackwardLinear, "fuser_backward")):
        def counted_method(self, *args, _fn=getattr(cls, meth), _name=cls.__name__, **kwargs):
            calls[_name] += 1
            return _fn(self, *args, **kwargs)

        setattr(cls, meth, counted_method)
    # TE's ZeRO helpers, which Megatron's fp8_utils calls (the first by name at each call, the
    # second imported at Megatron's import: wrapped before)
    import transformer_engine_lite.pytorch.tensor.utils as tensor_utils

    counted(tensor_utils, "cast_master_weights_to_fp8")
    counted(tensor_utils, "post_all_gather_processing")
    return calls


class ZeroFP8:
    """What Megatron's distributed optimizer does with fp8_param_gather, which cannot run on the
    CPU itself (optimizer.py / distrib_optimizer.py / clip_grads.py make tensors on device='cuda'
    and check param.type() == 'torch.cuda.BFloat16Tensor'): each data-parallel rank keeps an fp32
    master copy of its flat piece of every FP8 weight, takes an SGD step on it, writes the FP8 bytes
    of its piece with Megatron's own fp8_utils.quantize_param_shard (-> TE's
    cast_master_weights_to_fp8), all-gathers the pieces' bytes (Megatron's param all-gather) and
    runs Megatron's fp8_utils.post_all_gather_processing. Other parameters: plain SGD."""

    def __init__(self, model, lr: float):
        import torch.distributed as dist
        from megatron.core import parallel_state

        from transformer_engine_lite.pytorch.tensor import QuantizedTensor

        self.group = parallel_state.get_data_parallel_group()
        self.world, self.rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        self.lr = lr
        self.fp8 = [p for p in model.parameters() if isinstance(p, QuantizedTensor)]
        assert self.fp8, "--zero: the model has no FP8 weights (use --fp8-param)"
        ids = {id(p) for p in self.fp8}
        self.other = torch.optim.SGD([p for p in model.parameters() if id(p) not in ids], lr=lr)
        self.ranges, self.masters = [], []
        for p in self.fp8:
            n = p.numel()
            a, b = n * self.rank // self.world, n * (self.rank + 1) // self.world
            self.ranges.append((a, b))
            self.masters.append(p.dequantize().float().reshape(-1)[a:b].clone())

    def step(self) -> None:
        import torch.distributed as dist
        from megatron.core.fp8_utils import post_all_gather_processing, quantize_param_shard

        for p, m, (a, b) in zip(self.fp8, self.masters, self.ranges):
            g = p.grad.float()
            dist.all_reduce(g, group=self.group)
            m -= self.lr * (g / self.world).reshape(-1)[a:b]
        quantize_param_shard(self.fp8, self.masters, [a for a, _ in self.ranges], self.group)
        for p in self.fp8:
            for name in ("_data", "_rowwise_data", "_columnwise_data"):
                buf = getattr(p, name, None)
                if buf is None:
                    continue
                flat = buf.view(torch.uint8).reshape(-1)
                parts = [torch.empty_like(flat) for _ in range(self.world)]
                dist.all_gather(parts, flat.contiguous(), group=self.group)
                n = flat.numel()
                for r, part in enumerate(parts):
                    a, b = n * r // self.world, n * (r + 1) // self.world
                    flat[a:b] = part[a:b]
        post_all_gather_processing(self.fp8)
        self.other.step()

    def zero_grad(self) -> None:
        for p in self.fp8:
            p.grad = None
        self.other.zero_grad()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--spec", choices=["te", "local"], default="te")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--fp8", choices=["delayed", "tensorwise", "mxfp8", "blockwise"], default=None)
    p.add_argument("--fp8-param", action="store_true")
    p.add_argument("--fp8-dpa", action="store_true")  # Megatron's fp8_dot_product_attention
    p.add_argument("--recompute", action="store_true")
    p.add_argument("--moe", action="store_true")
    p.add_argument("--permute-fusion", action="store_true")  # MoE: TE's fused permutation
    p.add_argument("--op-fuser", action="store_true")  # Megatron's use_te_op_fuser
    p.add_argument("--ce-fusion", action="store_true")  # TE's parallel_cross_entropy for the loss
    # ZeRO-1 over the data-parallel ranks with FP8 weights (needs --fp8-param): see zero_step
    p.add_argument("--zero", action="store_true")
    # Megatron's --tp-comm-overlap: initialize_ub as megatron/training does, then the TE layers
    # take their ub_* flags from TransformerConfig(tp_comm_overlap=True)
    p.add_argument("--tp-comm-overlap", action="store_true")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()

    calls = count_calls()
    patch_megatron_cuda_only_spots()
    import torch.distributed as dist

    if not dist.is_initialized():  # a single process without torchrun
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        dist.init_process_group("gloo")
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel(a.tp, 1)
    torch.manual_seed(0)
    model_parallel_cuda_manual_seed(123)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    kw = dict(num_layers=2, hidden_size=128, num_attention_heads=4, use_cpu_initialization=True,
              params_dtype=dtype, pipeline_dtype=dtype, bf16=a.dtype == "bf16",
              hidden_dropout=0.0, attention_dropout=0.0, tensor_model_parallel_size=a.tp,
              sequence_parallel=a.tp > 1)
    if a.fp8:
        kw.update(fp8="e4m3" if a.fp8 == "mxfp8" else "hybrid", fp8_recipe=a.fp8,
                  fp8_param=a.fp8_param, fp8_dot_product_attention=a.fp8_dpa)
    if a.recompute:
        kw.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    if a.moe:
        kw.update(num_moe_experts=4, moe_router_topk=2, moe_grouped_gemm=True,
                  moe_ffn_hidden_size=64, moe_token_dispatcher_type="allgather",
                  moe_router_fusion=True, moe_permute_fusion=a.permute_fusion)
    if a.tp_comm_overlap:
        # megatron/training/initialize.py:_initialize_tp_communicators (not in megatron-core):
        # the buffer shape is [seq * micro batch, hidden]
        from transformer_engine.pytorch.module import base as te_base

        mode = te_base.UserBufferQuantizationMode
        te_base.initialize_ub(shape=[64 * 2, 128], tp_size=a.tp,
                              quantization_modes=[mode.FP8 if a.fp8 else mode.NONE], ub_cfgs={},
                              bootstrap_backend="nccl")  # Megatron's defaults
        kw.update(tp_comm_overlap=True)
    if a.op_fuser:
        kw.update(use_transformer_engine_op_fuser=True)
    if a.ce_fusion:
        kw.update(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te")
    config = TransformerConfig(**kw)
    if a.spec == "te":
        spec = get_gpt_layer_with_transformer_engine_spec(
            num_experts=4 if a.moe else None, moe_grouped_gemm=a.moe, use_te_op_fuser=a.op_fuser)
    else:
        spec = get_gpt_layer_local_spec(num_experts=4 if a.moe else None, moe_grouped_gemm=a.moe)
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=256,
                     max_sequence_length=64)
    if a.dtype == "bf16":
        model = model.to(torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 256, (2, 64), generator=g)
    labels = torch.randint(0, 256, (2, 64), generator=g)
    position_ids = torch.arange(64).unsqueeze(0).expand(2, -1)
    mask = torch.tril(torch.ones(64, 64, dtype=torch.bool)).logical_not().view(1, 1, 64, 64)
    opt = ZeroFP8(model, lr=0.1) if a.zero else torch.optim.SGD(model.parameters(), lr=0.1)
    tp_group = parallel_state.get_tensor_model_parallel_group()
    losses = []
    for _ in range(a.steps):
        # What Megatron's forward_backward_func does on a step's first microbatch: the TE layers
        # then re-quantize their (updated) weights instead of reusing the cached FP8 copies.
        model.set_is_first_microbatch()
        loss = model(tokens, position_ids, mask, labels=labels).float().mean()
        loss.backward()
        if a.tp > 1:
            for prm in model.parameters():
                if getattr(prm, "sequence_parallel", False) and prm.grad is not None:
                    dist.all_reduce(prm.grad, group=tp_group)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    # Our classes the model runs on (Megatron's TE wrappers subclass them)
    ours = (next((c for c in type(m).__mro__ if c.__module__.startswith("transformer_engine_lite")),
                 None) for m in model.modules())
    modules = sorted({c.__name__ for c in ours if c is not None})
    # the layers that run with a Userbuffers overlap (TE's resolved flags)
    ub = sorted({m.ub_name for m in model.modules()
                 if getattr(m, "ub_name", None) and getattr(m, "_ub", None) is not None
                 and m._ub.enabled})
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"losses": losses, "te_lite_modules": modules,
                                           "calls": dict(calls), "ub_layers": ub}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

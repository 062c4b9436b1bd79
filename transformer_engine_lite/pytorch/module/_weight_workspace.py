"""TE's cached weight casts (`module._fp8_workspaces`, TE's quantize_weight in module/base.py):
per module, name -> the weight quantized for the active recipe as TE's tensor type
(Float8Tensor, MXFP8Tensor, Float8BlockwiseQTensor, NVFP4Tensor), kept across microbatches.

When (TE's rules): a forward with is_first_microbatch True or False caches (None: no cache);
True re-quantizes the cached tensor IN PLACE (quantize_: the data and scale_inv buffers keep
their addresses, so anything captured against them, e.g. a CUDA graph, stays valid); False reuses
it as it is (the weight must not have changed: TE's contract); a miss (no entry yet, or one that
no longer fits: other format, shape, dtype, device, or a missing column-wise copy the backward
needs) quantizes a new tensor and stores it. Keys: "weight" (Linear, LayerNormLinear,
BasicLinear), "fc1_weight" / "fc2_weight" (LayerNormMLP), "weight{i}" (GroupedLinear), "weight"
(GroupedLinear with single_grouped_weight: one GroupedTensor, see get_grouped_weight_workspace).
Under a CustomRecipe the cast is the weight quantizer's own (TE's quantize_weight): a
HybridQuantizer caches a HybridQuantizedTensor, refreshed in place direction by direction. TE's
Linear, LayerNormLinear and LayerNormMLP cache nothing under FSDP2 (module.is_fsdp2).

The GEMMs read the cached tensor as they read an FP8 weight parameter (module/_stored_operands.py:
its bytes, or its copies dequantized exactly), so a cached step gives the bits of an uncached one.
The block-scaled GEMM operands (the dequantized copies) are derived from the cached tensor once and
kept on it, stamped with its buffers' identities and version counters, so any in-place write to
the buffers (a refresh, a user's quantize_) makes the next GEMM derive them again.
MXFP8 and NVFP4 workspaces hold GEMM-swizzled scales where TE's _enable_weight_preswizzle asks for
them (MXFP8 always; NVFP4 for the shapes TE's fused kernels swizzle, as on the SM 100 GPUs this
recipe is emulated as): the GEMM operands read the scales through _scale_grid, which unswizzles.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from ..quantization import nvfp4_quantizer
from ..tensor import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    QuantizedTensor,
    Quantizer,
)

if TYPE_CHECKING:
    from ._autograd import GemmConfig


class WeightCast(NamedTuple):
    """What a forward's GEMM gets from the module's workspace cache: the cached quantized weight
    and, when this forward (re)quantized it under delayed scaling, the weight's amax to record
    (None otherwise: a reused cast records nothing new)."""

    tensor: QuantizedTensor
    amax: torch.Tensor | None


def _quantizer(cfg: GemmConfig, w: torch.Tensor, scale: torch.Tensor) -> Quantizer:
    """The weight quantizer of cfg, producing the bytes the uncached forward would make
    (module/_autograd.py's casts: quantize_per_tensor, mx_dequantized, block_dequantized)."""
    spec = cfg.weight
    if cfg.mode == "custom":
        return cfg.custom[1]  # TE's: the module's weight quantizer object itself
    if cfg.mode == "delayed":
        # the module's weight scale (a [1] view); a private amax: the forward records it
        return Float8Quantizer(scale, torch.zeros(1, dtype=torch.float32, device=w.device),
                               spec.dtype)
    if cfg.mode == "current":
        return Float8CurrentScalingQuantizer(spec.dtype, w.device, force_pow_2_scales=spec.pow2,
                                             amax_epsilon=spec.eps)
    if cfg.mode == "mxfp8":
        q: Quantizer = MXFP8Quantizer(cfg.inp.dtype)  # the forward casts MXFP8 weights so
        q.optimize_for_gemm = True  # TE's _enable_weight_preswizzle: always for MXFP8
        return q
    if spec.mode == "nvfp4":
        q = nvfp4_quantizer(spec)
        q.optimize_for_gemm = True  # TE: only where its fused kernels emit swizzled scales
        q.optimize_for_gemm = q.emits_swizzled_scales_in_kernel(w.shape)
        return q
    return Float8BlockQuantizer(spec.dtype, rowwise=True, columnwise=True, amax_epsilon=spec.eps,
                                force_pow_2_scales=spec.pow2, block_scaling_dim=spec.block_dim)


def _fits(ws: Any, key: tuple, columnwise: bool) -> bool:
    """TE's _is_weight_workspace_valid plus what TE's quantizer identity implies: the same cast
    (recipe mode and specs) of a weight of the same dtype, shape and device; a block-scaled
    workspace holds the column-wise copy when the backward needs it."""
    if getattr(ws, "_te_lite_workspace_key", None) != key:
        return False
    if columnwise and hasattr(ws, "_columnwise_data") and ws._columnwise_data is None:
        return False
    if columnwise and hasattr(ws, "_columnwise_storage") and ws._columnwise_storage is None:
        return False  # a HybridQuantizedTensor without its column-wise direction
    return True


def _key(cfg: GemmConfig, w: torch.Tensor) -> tuple:
    # a custom weight quantizer by identity: another factory call (a new recipe object) makes
    # new quantizers, whose casts may differ
    q = cfg.custom[1] if cfg.mode == "custom" else None
    return (cfg.mode, cfg.inp, cfg.weight, q, w.dtype, tuple(w.shape), w.device)


def _refreshes_in_place(q: Quantizer, ws: Any) -> bool:
    """Whether q rewrites ws in place (every quantizer for its own torch.Tensor types; a custom
    reference storage only where its quantizer implements update_quantized)."""
    return isinstance(ws, QuantizedTensor) or type(q).update_quantized is not \
        Quantizer.update_quantized


@torch.no_grad()
def get_weight_workspace(
    workspaces: dict[str, QuantizedTensor],
    name: str,
    w: torch.Tensor,
    cfg: GemmConfig,
    scale: torch.Tensor,
    update: bool,
    columnwise: bool,
) -> WeightCast:
    """workspaces[name] for weight w under cfg: reused (update=False), re-quantized in place
    (update=True) or created on a miss. scale: delayed scaling's weight scale ([1] view)."""
    key = _key(cfg, w)
    src = w.detach()
    ws = workspaces.get(name)
    if ws is not None and not _fits(ws, key, columnwise):
        ws = None
    delayed = cfg.mode == "delayed"
    if ws is not None and update and cfg.mode == "custom":
        q = ws._quantizer
        # a refresh rewrites every direction the cast holds (a HybridQuantizer updates those its
        # usage asks for): a column-wise copy left stale by an inference refresh would otherwise
        # reach a later microbatch's dgrad
        q.set_usage(rowwise=True, columnwise=True)
        if not _refreshes_in_place(q, ws):
            ws = None  # re-quantized below (a reference storage without update_quantized)
    if ws is None:
        q = _quantizer(cfg, w, scale)
        # TE's usages: the column-wise copy only when the backward's dgrad needs it (a later
        # microbatch that needs it finds the entry unfit and replaces it); they stay the
        # workspace's own, so a refresh rewrites the copies it holds
        q.set_usage(rowwise=True, columnwise=columnwise)
        # TE's: a cached cast is a torch.Tensor (an internal quantizer makes bare storage)
        internal = getattr(q, "internal", False)
        q.internal = False
        try:
            ws = q.quantize(src)
        finally:
            q.internal = internal
        ws._te_lite_workspace_key = key
        workspaces[name] = ws
        return WeightCast(ws, q.amax.clone() if delayed else None)
    if not update:
        return WeightCast(ws, None)
    q = ws._quantizer
    if cfg.mode == "custom":
        q.update_quantized(src, ws)
        return WeightCast(ws, None)
    if delayed:
        q.scale = scale  # this forward's scale (a recompute's stashed one)
        q.amax.zero_()  # Float8Quantizer folds a running max into amax: this cast's alone
    ws.quantize_(src)
    return WeightCast(ws, q.amax.clone() if delayed else None)


@torch.no_grad()
def get_grouped_weight_workspace(
    workspaces: dict[str, Any],
    weight: torch.Tensor,
    gemm: int,
    w: torch.Tensor,
    cfg: GemmConfig,
    scale: torch.Tensor,
    update: bool,
    columnwise: bool,
) -> WeightCast:
    """GroupedLinear(single_grouped_weight=True): TE's one workspace for the [n, out, in] weight,
    workspaces["weight"], a GroupedTensor whose member `gemm` is expert `gemm`'s cast (w, the
    weight's slice). The experts' GEMMs run in order: expert 0's call decides for the forward
    (reuse, in-place refresh, or a new GroupedTensor on a miss) and each call then writes its own
    member, quantized with its own cast (delayed scaling: its own scale), into the grouped buffers,
    whose addresses a refresh keeps. The members are kept on the workspace (quantized_tensors), so
    the GEMM operands derived from them are reused as for a single weight (workspace_operands)."""
    from ..tensor.storage._grouped_members import record_member_stats
    from ..tensor.storage.grouped_tensor_storage import GroupedTensorStorage, _compact_layout

    key = _key(cfg, weight)
    ws = workspaces.get("weight")
    n = weight.shape[0]
    if gemm == 0:
        if ws is not None and (getattr(ws, "_te_lite_workspace_key", None) != key or (
                columnwise and cfg.mode in ("mxfp8", "block") and ws.columnwise_data is None)):
            ws = None
        if ws is None:
            q = _quantizer(cfg, w, scale)
            q.set_usage(rowwise=True, columnwise=columnwise)
            q.internal = False  # TE's: a cached grouped cast is a GroupedTensor
            ws = GroupedTensorStorage.make_grouped_tensor(
                n, None, None, n * weight.shape[1], weight.shape[2], q, weight.device,
                weight.dtype)
            ws._te_lite_workspace_key = key
            workspaces["weight"] = ws
            update = True
        ws._te_lite_refresh = update  # this forward's choice, for every expert's call
    elif ws is None or getattr(ws, "_te_lite_workspace_key", None) != key:
        raise RuntimeError(f"GroupedLinear: expert {gemm}'s weight cast ran before expert 0's "
                           "(module/_weight_workspace.py)")
    member = ws.quantized_tensors[gemm]
    if not ws._te_lite_refresh:
        return WeightCast(member, None)
    # this expert's cast, in the grouped layout (TE's group quantize keeps compact MXFP8 scales),
    # writing every copy the workspace holds (an inference refresh must not leave the column-wise
    # data of an earlier training step stale)
    q = _compact_layout(_quantizer(cfg, w, scale))
    q.set_usage(rowwise=True, columnwise=columnwise or ws.columnwise_data is not None)
    src = w.detach()
    q.update_quantized(src, member)
    record_member_stats(ws, gemm, src, member)
    return WeightCast(member, q.amax.clone() if cfg.mode == "delayed" else None)


def workspace_operands(ws: QuantizedTensor, cfg: GemmConfig, columnwise: bool,
                       derive: Callable[[Any, GemmConfig, bool], Any]) -> Any:
    """derive(ws, cfg, columnwise) (a module/_stored_operands.py reader), computed once per
    content of ws: reused while ws's buffers are the same tensors, unwritten since."""
    bufs = [getattr(ws, n) for n in ws._inner_names()]
    stamp = (cfg.mode, cfg.inp, cfg.weight, columnwise,
             tuple(None if t is None else (id(t), t.data_ptr(), t._version) for t in bufs))
    memo = ws.__dict__.get("_te_lite_operands")
    if memo is not None and memo[0] == stamp:
        return memo[1]
    out = derive(ws, cfg, columnwise)
    ws.__dict__["_te_lite_operands"] = (stamp, out)
    return out

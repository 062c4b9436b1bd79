"""TE's ZeRO / FSDP helpers for FP8 primary weights (transformer_engine.pytorch.tensor.utils):
quantize_master_weights (cast_master_weights_to_fp8, its older name) and
post_all_gather_processing.

Each rank holds a flat shard of every weight's fp32 master copy (or None: the shard is on another
rank) and a full copy of the FP8 model weight. A rank writes the FP8 bytes of its shard into its
slice of the model weight's bytes, with the scale every rank agrees on, so that an all-gather of
the slices gives the bytes of the whole weight quantized at once:
- delayed scaling: bytes with the quantizer's scale; the amaxes are reduced (MAX) over `group` and
  scale_inv becomes 1/scale;
- current scaling: the amax of each shard, reduced (MAX) over `group`, gives the scale of the whole
  weight; the shard is quantized with it;
- MXFP8 (TE's main branch): the amax of every 32-element block (row-wise: along the last dim;
  column-wise: along the rows) over the shard, reduced (MAX) over `group`; every rank then has the
  block scales of the whole weight and quantizes its elements with them.
As in TE, a master shard is first cast to the model weight's dtype (the value a non-FP8 weight
would be quantized from).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..quantization import ops
from .float8_tensor import Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor
from .mxfp8_tensor import MXFP8Quantizer, MXFP8Tensor
from .hybrid_tensor import HybridQuantizedTensor
from .quantized_tensor import QuantizedTensor, fp8_torch_dtype

__all__ = ["cast_master_weights_to_fp8", "post_all_gather_processing", "quantize_master_weights"]

_BLOCK = 32  # MXFP8 block length


def _all_reduce_max(t: torch.Tensor, group: Any) -> None:
    # A single process without torch.distributed has nothing to reduce with: the local amaxes are
    # the global ones (TE requires a process group; we allow group=None outside distributed runs).
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    elif group is not None:
        raise ValueError(
            "quantize_master_weights: group: expected None when torch.distributed is not "
            f"initialized, got {group!r}"
        )


def _end_offset(model_weight: torch.Tensor, master: torch.Tensor, start: Any) -> int:
    if start is None:
        raise ValueError("start_offset must not be None when master_weight is provided")
    if not isinstance(start, int) or start < 0:
        raise ValueError(f"start_offset must be a non-negative int, got {start!r}")
    end = start + master.numel()
    if end > model_weight.numel():
        raise ValueError(
            f"end_offset ({end}) exceeds model_weight numel ({model_weight.numel()}), "
            f"start_offset={start}, master_weight numel={master.numel()}"
        )
    return end


def _target_bytes(model_weight: Float8Tensor, shard: Any, start: int, end: int) -> torch.Tensor:
    """Where a shard's FP8 bytes go: the slice of the model weight's bytes, or the FSDP shard."""
    if shard is None:
        if model_weight._data is None:
            raise ValueError(
                "quantize_master_weights: model_weight: expected a Float8Tensor with row-wise "
                "data, got one without (_data is None)"
            )
        return model_weight._data.view(-1)[start:end]
    raw = shard._data if isinstance(shard, Float8Tensor) else shard
    if not isinstance(raw, torch.Tensor) or raw.numel() != end - start:
        got = raw.numel() if isinstance(raw, torch.Tensor) else type(raw).__name__
        raise ValueError(
            "quantize_master_weights: fsdp_shard_model_weights: expected a shard of "
            f"{end - start} elements, got {got}"
        )
    return raw.view(torch.uint8).view(-1)


def _reset_caches(model_weight: Float8Tensor, manual: bool) -> None:
    # TE drops the transpose cache unless the caller runs post_all_gather_processing itself.
    if not manual:
        model_weight._transpose = None
        model_weight._transpose_invalid = True


def _delayed(params: list, group: Any, manual: bool) -> None:
    for model_weight, master, start, shard in params:
        _reset_caches(model_weight, manual)
        q = model_weight._quantizer
        if master is None:
            if q.update_margin is not None:
                # one-entry amax history (Float8Quantizer): this rank saw no value of the new
                # weight, so it contributes nothing to the reduced amax
                q.amax.zero_()
            continue
        end = _end_offset(model_weight, master, start)
        fp8 = fp8_torch_dtype("quantize_master_weights", q.dtype)
        data, amax, _ = ops().quantize(master.reshape(-1), q.scale.reshape(1), fp8)
        _target_bytes(model_weight, shard, start, end).copy_(data.view(torch.uint8))
        with torch.no_grad():
            new = amax if q.update_margin is not None else torch.maximum(q.amax.reshape(1), amax)
            q.amax.copy_(new.reshape(q.amax.shape))
    amaxes = [p[0]._quantizer.amax for p in params]
    packed = torch.cat([a.reshape(1).float() for a in amaxes])
    _all_reduce_max(packed, group)
    with torch.no_grad():
        for (model_weight, *_), a, v in zip(params, amaxes, packed):
            a.copy_(v.reshape(a.shape))
            q = model_weight._quantizer
            model_weight._scale_inv.copy_(
                torch.reciprocal(q.scale.float()).reshape(model_weight._scale_inv.shape)
            )


def _current(params: list, group: Any, manual: bool) -> None:
    q0 = params[0][0]._quantizer
    for model_weight, *_ in params:
        q = model_weight._quantizer
        for name in ("dtype", "force_pow_2_scales", "amax_epsilon"):
            if getattr(q, name) != getattr(q0, name):
                raise ValueError(
                    f"All model weights must have the same {name}, expected "
                    f"{getattr(q0, name)} but got {getattr(q, name)}"
                )
    fp8 = fp8_torch_dtype("quantize_master_weights", q0.dtype)
    packed = torch.zeros(len(params), dtype=torch.float32)
    for i, (_, master, _, _) in enumerate(params):
        if master is not None and master.numel() > 0:
            packed[i] = ops().compute_amax(master.reshape(-1)).reshape(())
    _all_reduce_max(packed, group)
    for i, (model_weight, master, start, shard) in enumerate(params):
        _reset_caches(model_weight, manual)
        # the current-scaling quantizer's own scale computation, on the reduced amax
        scale, scale_inv = ops().compute_scale_from_amax(
            packed[i : i + 1], fp8, q0.amax_epsilon, q0.force_pow_2_scales
        )
        model_weight._scale_inv.copy_(scale_inv.reshape(model_weight._scale_inv.shape))
        if master is None:
            continue
        end = _end_offset(model_weight, master, start)
        data, _, _ = ops().quantize(master.reshape(-1), scale.reshape(1), fp8)
        _target_bytes(model_weight, shard, start, end).copy_(data.view(torch.uint8))


def _block_view(x: torch.Tensor, rows: int, cols: int, columnwise: bool) -> torch.Tensor:
    """[rows, cols] zero-padded to whole blocks, as [n_blocks_a, n_blocks_b, 32]: the 32 elements
    of each block (row-wise: along the last dim; column-wise: along the rows) on the last axis."""
    if columnwise:
        pr = -(-rows // _BLOCK) * _BLOCK
        padded = torch.nn.functional.pad(x, (0, 0, 0, pr - rows))
        return padded.reshape(pr // _BLOCK, _BLOCK, cols).transpose(1, 2)
    pc = -(-cols // _BLOCK) * _BLOCK
    return torch.nn.functional.pad(x, (0, pc - cols)).reshape(rows, pc // _BLOCK, _BLOCK)


def _mxfp8(params: list, group: Any, manual: bool) -> None:
    del manual  # MXFP8 keeps no derived cache (TE: nothing to post-process)
    shapes, local = [], []
    for model_weight, master, start, _ in params:
        if model_weight.dim() != 2:
            raise ValueError(
                "quantize_master_weights: model_weight must be 2D for MXFP8 scaling, got "
                f"{model_weight.dim()}D shape {tuple(model_weight.shape)}"
            )
        rows, cols = model_weight.shape
        full = torch.zeros(rows * cols, dtype=model_weight.dtype)
        owned = torch.zeros(rows * cols, dtype=torch.bool)
        if master is not None:
            end = _end_offset(model_weight, master, start)
            full[start:end] = master.reshape(-1).to(full.dtype)
            owned[start:end] = True
        full, owned = full.view(rows, cols), owned.view(rows, cols)
        shapes.append((rows, cols, full, owned))
        for colw in (False, True):
            local.append(_block_view(full.abs(), rows, cols, colw).amax(-1).reshape(-1))
    # the amaxes are values of the model dtype: reducing them in it loses nothing
    packed = torch.cat(local)
    _all_reduce_max(packed, group)
    pos = 0
    for (model_weight, master, start, shard), (rows, cols, full, owned) in zip(params, shapes):
        if shard is not None:
            raise NotImplementedError(
                "quantize_master_weights: fsdp_shard_model_weights with MXFP8 weights is not "
                "supported by transformer_engine_lite"
            )
        fp8 = fp8_torch_dtype("quantize_master_weights", model_weight._fp8_dtype)
        for colw, name in ((False, "_rowwise"), (True, "_columnwise")):
            blocks = _block_view(full, rows, cols, colw)
            n = blocks.shape[0] * blocks.shape[1]
            amax = packed[pos : pos + n].view(blocks.shape[:2])
            pos += n
            data = getattr(model_weight, name + "_data")
            if data is None:
                continue
            # The block scales come from the whole weight's block amaxes: each block gets its
            # reduced amax at one element this rank does not own (a block this rank owns entirely
            # already has it), so the kernel derives exactly the scale of a quantization of the
            # whole weight; the bytes this rank owns are then those of that quantization.
            fill = _block_view(~owned, rows, cols, colw)
            has_free = fill.any(-1)
            first = fill.int().argmax(-1, keepdim=True)
            x = blocks.clone()
            x.scatter_(-1, first, torch.where(has_free, amax, x.gather(-1, first).squeeze(-1))
                       .unsqueeze(-1))
            x2 = _unblock(x, rows, cols, colw)
            r, rs, c, cs = ops().quantize_mxfp8(x2, fp8, not colw, colw)
            q_data, q_scale = (c, cs) if colw else (r, rs)
            scale_inv = getattr(model_weight, name + "_scale_inv")
            scale_inv.view(torch.uint8).copy_(q_scale.view(torch.uint8))
            if master is not None:
                end = start + master.numel()
                data.view(torch.uint8).view(-1)[start:end].copy_(
                    q_data.view(torch.uint8).reshape(-1)[start:end]
                )


def _unblock(blocks: torch.Tensor, rows: int, cols: int, columnwise: bool) -> torch.Tensor:
    """Inverse of _block_view (padding dropped). The padded extents are spelled out: a -1 cannot
    be inferred when the weight is empty (0 rows or 0 columns)."""
    if columnwise:
        return blocks.transpose(1, 2).reshape(blocks.shape[0] * _BLOCK, cols)[:rows].contiguous()
    return blocks.reshape(rows, blocks.shape[1] * _BLOCK)[:, :cols].contiguous()


def quantize_master_weights(
    model_weights: list,
    master_weights: list,
    start_offsets: list,
    group: Any,
    fsdp_shard_model_weights: list | None = None,
    manual_post_all_gather_processing: bool = False,
) -> None:
    """Write each rank's master shards into its FP8 model weights (module docstring).
    model_weights: FP8 weights (Float8Tensor of delayed or current scaling, MXFP8Tensor, or a
    HybridQuantizedTensor of those / a high-precision direction, each direction written alone);
    master_weights: the flat master shard of each (None: on another rank); start_offsets: where
    each shard starts in its weight's flattened elements; group: the process group over which
    amaxes are reduced (the data-parallel group); fsdp_shard_model_weights: where to write each
    shard's bytes instead of the model weight's slice (FSDP); manual_post_all_gather_processing:
    keep derived caches; the caller runs post_all_gather_processing after its all-gather."""
    n = len(model_weights)
    for name, lst in (("master_weights", master_weights), ("start_offsets", start_offsets)):
        if len(lst) != n:
            raise ValueError(
                f"quantize_master_weights: {name}: expected {n} entries (one per model weight), "
                f"got {len(lst)}"
            )
    shards = [None] * n if fsdp_shard_model_weights is None else list(fsdp_shard_model_weights)
    if len(shards) != n:
        raise ValueError(
            f"quantize_master_weights: fsdp_shard_model_weights: expected {n} entries, got "
            f"{len(shards)}"
        )
    buckets: dict[str, list] = {"delayed": [], "current": [], "mxfp8": [], "identity": []}
    for w, m, s, sh in zip(model_weights, master_weights, start_offsets, shards):
        if isinstance(w, QuantizedTensor):
            w.clear_high_precision_init_val()  # no longer needed once masters exist (as TE)
        q = getattr(w, "_quantizer", None)
        if m is not None:
            m = m.detach().to(w.dtype)
        if isinstance(w, HybridQuantizedTensor):
            _route_hybrid(w, m, s, sh, buckets)
        elif isinstance(w, Float8Tensor) and isinstance(q, Float8Quantizer):
            buckets["delayed"].append((w, m, s, sh))
        elif isinstance(w, Float8Tensor) and isinstance(q, Float8CurrentScalingQuantizer):
            buckets["current"].append((w, m, s, sh))
        elif isinstance(w, MXFP8Tensor) and isinstance(q, MXFP8Quantizer):
            buckets["mxfp8"].append((w, m, s, sh))
        elif type(q).__name__ in ("Float8BlockQuantizer", "NVFP4Quantizer"):
            # TE casts these too (block / NVFP4 partial casts); not implemented here
            raise NotImplementedError(f"quantize_master_weights for {type(q).__name__} is not "
                                      "implemented by transformer_engine_lite")
        else:
            what = type(q).__name__ if q is not None else type(w).__name__
            raise ValueError(f"quantize_master_weights for {what} is not supported yet")
    with torch.no_grad():
        for name, fn in (("delayed", _delayed), ("current", _current), ("mxfp8", _mxfp8),
                         ("identity", _identity)):
            if buckets[name]:
                fn(buckets[name], group, manual_post_all_gather_processing)


def _route_hybrid(w: Any, m: Any, s: Any, sh: Any, buckets: dict[str, list]) -> None:
    """A HybridQuantizedTensor: each present direction into the bucket of its own format (TE's
    per-direction routing); the high-precision direction receives the master values."""
    q = w._quantizer
    if q.columnwise_source != "original" and w.columnwise_sub_storage is not None:
        # the columnwise copy would have to come from the reduced rowwise result
        raise NotImplementedError("quantize_master_weights: a HybridQuantizedTensor with "
                                  "columnwise_source='rowwise_dequantized' is not supported by "
                                  "transformer_engine_lite")
    if sh is not None:
        raise NotImplementedError("quantize_master_weights: fsdp_shard_model_weights with a "
                                  "HybridQuantizedTensor is not supported by "
                                  "transformer_engine_lite")
    if w.rowwise_sub_storage is None and w.columnwise_sub_storage is None:
        raise ValueError("quantize_master_weights: a HybridQuantizedTensor with neither "
                         "direction has nothing to write")
    for sub in (w.rowwise_sub_storage, w.columnwise_sub_storage):
        sq = getattr(sub, "_quantizer", None)
        if sub is None:
            continue
        if isinstance(sub, Float8Tensor) and isinstance(sq, Float8Quantizer):
            buckets["delayed"].append((sub, m, s, None))
        elif isinstance(sub, Float8Tensor) and isinstance(sq, Float8CurrentScalingQuantizer):
            buckets["current"].append((sub, m, s, None))
        elif isinstance(sub, MXFP8Tensor):
            buckets["mxfp8"].append((sub, m, s, None))
        elif not isinstance(sub, QuantizedTensor):
            buckets["identity"].append((sub, m, s, None))
        else:
            raise NotImplementedError(f"quantize_master_weights: a {type(sub).__name__} "
                                      "direction of a HybridQuantizedTensor is not supported by "
                                      "transformer_engine_lite")


def _identity(params: list, group: Any, manual: bool) -> None:
    """High-precision model weights (a hybrid's unquantized direction): the master values."""
    del group, manual
    for w, master, start, _ in params:
        if master is not None:
            end = _end_offset(w, master, start)
            w.view(-1)[start:end].copy_(master.reshape(-1))


def cast_master_weights_to_fp8(
    model_weights: list,
    master_weights: list,
    start_offsets: list,
    group: Any,
    fsdp_shard_model_weights: list | None = None,
    manual_post_all_gather_processing: bool = False,
) -> None:
    """TE's older name of quantize_master_weights (same arguments)."""
    quantize_master_weights(
        model_weights,
        master_weights,
        start_offsets,
        group,
        fsdp_shard_model_weights,
        manual_post_all_gather_processing,
    )


def post_all_gather_processing(model_weights: Any) -> None:
    """After the all-gather of FP8 weights' bytes: derived copies made from the old bytes are
    dropped. TE pre-builds a Float8Tensor's transpose where the GEMM needs it; our GEMMs take every
    layout and build it on demand, so the stale cache is what there is to handle. MXFP8 and plain
    tensors: nothing to do (as TE)."""
    if not isinstance(model_weights, list):
        model_weights = [model_weights]
    for w in model_weights:
        if isinstance(w, HybridQuantizedTensor):
            post_all_gather_processing([sub for sub in (w.rowwise_sub_storage,
                                                        w.columnwise_sub_storage)
                                        if isinstance(sub, QuantizedTensor)])
        elif isinstance(w, Float8Tensor):
            w._transpose = None
            w._transpose_invalid = True
        elif isinstance(w, MXFP8Tensor):
            pass
        elif isinstance(w, QuantizedTensor):
            raise ValueError(f"post_processing for {type(w)} is not supported")

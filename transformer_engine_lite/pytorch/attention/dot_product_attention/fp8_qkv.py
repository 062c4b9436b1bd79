"""TE's attention.dot_product_attention.utils.combine_and_quantize: q, k, v quantized to FP8
with one shared scale (re-exported by utils.py; TE's CP runner imports it from there)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["combine_and_quantize"]


def combine_and_quantize(
    qkv_layout: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qkv_quantizer: Any,
    used_in_forward: bool = True,
    used_in_backward: bool = False,
    keep_same_data_and_scale_inv_format: bool = False,
    combined_qkv: torch.Tensor | None = None,
    combined_kv: torch.Tensor | None = None,
) -> tuple[Any, Any, Any, str, None]:
    """(q_fp8, k_fp8, v_fp8, qkv_layout, None): Float8Tensors of q, k, v in q's nominal dtype
    sharing one scale, which qkv_quantizer (a Float8Quantizer or Float8CurrentScalingQuantizer)
    takes from all three together (current scaling: their joint amax), as TE's quantizes their
    concatenation. FP8 bytes depend only on the value and the scale, so packed layouts (TE
    quantizes the packed buffer) give the same bytes; the three come back as separate
    tensors. used_in_forward / used_in_backward / keep_same_data_and_scale_inv_format /
    combined_qkv / combined_kv steer TE's MXFP8 path and its packed-buffer reuse; per-tensor
    scaling has one data layout, and combined_* must then hold q, k, v's values (checked)."""
    from ...tensor import Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor

    del used_in_forward, used_in_backward, keep_same_data_and_scale_inv_format
    if not isinstance(qkv_quantizer, (Float8Quantizer, Float8CurrentScalingQuantizer)):
        raise NotImplementedError(
            "combine_and_quantize: qkv_quantizer: transformer_engine_lite combines per-tensor "
            "FP8 quantizers (Float8Quantizer, Float8CurrentScalingQuantizer), got "
            f"{type(qkv_quantizer).__name__} (TE's MXFP8 path needs the bhsd layouts, not here)"
        )
    for name, packed, parts in (("combined_qkv", combined_qkv, (q, k, v)),
                                ("combined_kv", combined_kv, (k, v))):  # fmt: skip
        if packed is not None and packed.numel() != sum(t.numel() for t in parts):
            raise ValueError(
                f"combine_and_quantize: {name}: expected the packed buffer of {len(parts)} "
                f"tensors ({sum(t.numel() for t in parts)} elements), got {tuple(packed.shape)}"
            )
    tensors = (q, k, v)
    flat = torch.cat([t.reshape(-1) for t in tensors])
    qkv_fp8 = qkv_quantizer(flat)
    data = qkv_fp8._data
    out, start = [], 0
    for t in tensors:
        n = t.numel()
        out.append(
            Float8Tensor(
                data=data[start : start + n].view(t.shape),
                fp8_scale_inv=qkv_fp8._scale_inv,
                fp8_dtype=qkv_fp8._fp8_dtype,
                dtype=t.dtype,
                quantizer=qkv_quantizer,
            )
        )
        start += n
    return out[0], out[1], out[2], qkv_layout, None

"""TE's fused-attention enum and probe
(transformer_engine.pytorch.cpp_extensions.fused_attn: FusedAttnBackend, get_fused_attn_backend).

TE's FusedAttention slot is, here, the GPU fused kernels ck and aotriton (see
attention/dot_product_attention/utils.py); both are F16/BF16 arbitrary-sequence-length kernels, so
the slot's sub-backend is F16_arbitrary_seqlen whenever it is available. This library has no FP8
attention (FP8 is never the answer) and no max-512 kernel (F16_max512_seqlen, TE 2.8's, never is
either). The values are TE's, not those of this library's C enum NVTE_Fused_Attn_Backend (which
numbers ck / aotriton / flash / unfused).
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["FusedAttnBackend", "fused_attn_bwd", "fused_attn_fwd"]


class FusedAttnBackend(IntEnum):
    """TE's sub-backends of FusedAttention (names and values); lookup by name works
    (FusedAttnBackend["FP8"]) and members compare equal to their ints."""

    No_Backend = -1
    F16_max512_seqlen = 0
    F16_arbitrary_seqlen = 1
    FP8 = 2

    @classmethod
    def cast(cls, backend: int) -> FusedAttnBackend:
        """The member of an int (e.g. get_attention_backend's fused_attention_backend)."""
        if isinstance(backend, cls):
            return backend
        try:
            return cls(int(backend))
        except (TypeError, ValueError):
            raise ValueError(
                f"FusedAttnBackend.cast: expected one of {[int(m) for m in cls]}, got {backend!r}"
            ) from None


def get_fused_attn_backend(
    is_training: bool,
    q_dtype: int,
    kv_dtype: int,
    qkv_layout: str,
    bias_type: str,
    attn_mask_type: str,
    softmax_type: str,
    attn_dropout: float,
    num_attn_heads: int,
    num_gqa_groups: int,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    head_dim_qk: int,
    head_dim_v: int,
    window_size_left: int,
    window_size_right: int,
    return_max_logit: bool = False,
    cuda_graph: bool = False,
    deterministic: bool = False,
    device: object = None,
) -> FusedAttnBackend:
    """TE's tex.get_fused_attn_backend (TE's arguments; dtypes as tex.DType, layout / bias / mask /
    softmax by TE's names): F16_arbitrary_seqlen when the C selection finds ck or aotriton
    eligible for this problem on `device` (this library's addition; None: torch's default device)
    under the current env switches, else
    No_Backend. softmax_type other than 'vanilla', return_max_logit and cuda_graph have no fused
    kernel here (No_Backend); every fused kernel has a deterministic backward; dropout counts
    only when is_training."""
    import torch

    from ...common import attention_selection as selection
    from ...common import capi

    for name, value in (("qkv_layout", qkv_layout), ("bias_type", bias_type),
                        ("attn_mask_type", attn_mask_type), ("softmax_type", softmax_type)):
        if not isinstance(value, str):
            raise TypeError(
                f"get_fused_attn_backend: {name}: expected TE's name (a str), got {value!r}"
            )
    try:
        q, kv = capi.DType(int(q_dtype)), capi.DType(int(kv_dtype))
    except ValueError:
        raise ValueError(
            f"get_fused_attn_backend: q_dtype / kv_dtype: not a DType: {q_dtype!r}, {kv_dtype!r}"
        ) from None
    del deterministic  # every fused kernel here has a deterministic backward
    if softmax_type != "vanilla" or return_max_logit or cuda_graph or q != kv:
        return FusedAttnBackend.No_Backend
    if q not in (capi.DType.Float16, capi.DType.BFloat16, capi.DType.Float32):
        return FusedAttnBackend.No_Backend
    dev = torch.get_default_device() if device is None else torch.device(device)
    device = 0 if dev.type == "cpu" else 1
    _, reasons = selection.select(
        "get_fused_attn_backend", device, int(q), qkv_layout, bias_type, attn_mask_type,
        float(attn_dropout) if is_training else 0.0, int(num_attn_heads), int(num_gqa_groups),
        int(max_seqlen_q), int(max_seqlen_kv), int(head_dim_qk), int(head_dim_v),
        int(window_size_left), int(window_size_right), selection.env_key(), log=False,
    )  # fmt: skip
    fused = dict(selection.PREFERENCE)
    if not reasons[fused["ck"]] or not reasons[fused["aotriton"]]:
        return FusedAttnBackend.F16_arbitrary_seqlen
    return FusedAttnBackend.No_Backend


def fused_attn_fwd(*args: object, **kwargs: object) -> object:
    """TE's functional FusedAttention forward (cuDNN's kernels, called with TE's aux-tensor
    protocol). Not implemented here: DotProductAttention (and te_lite's fused-attention op under
    it) is this library's entry to every attention kernel."""
    del args, kwargs
    raise NotImplementedError(
        "cpp_extensions.fused_attn_fwd: TE's functional FusedAttention API (cuDNN aux-tensor "
        "protocol) is not implemented by transformer_engine_lite; use DotProductAttention"
    )


def fused_attn_bwd(*args: object, **kwargs: object) -> object:
    """TE's functional FusedAttention backward: not implemented (see fused_attn_fwd)."""
    del args, kwargs
    raise NotImplementedError(
        "cpp_extensions.fused_attn_bwd: TE's functional FusedAttention API (cuDNN aux-tensor "
        "protocol) is not implemented by transformer_engine_lite; use DotProductAttention"
    )

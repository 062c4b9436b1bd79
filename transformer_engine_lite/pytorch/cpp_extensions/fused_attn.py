"""TE's fused-attention enum (transformer_engine.pytorch.cpp_extensions.fused_attn.FusedAttnBackend).

TE's FusedAttention slot is, here, the GPU fused kernels ck and aotriton (see
attention/dot_product_attention/utils.py); both are F16/BF16 arbitrary-sequence-length kernels, so
the slot's sub-backend is F16_arbitrary_seqlen whenever it is available. This library has no FP8
attention (FP8 is never the answer) and no max-512 kernel (F16_max512_seqlen, TE 2.8's, never is
either). The values are TE's, not those of this library's C enum NVTE_Fused_Attn_Backend (which
numbers ck / aotriton / flash / unfused).
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["FusedAttnBackend"]


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

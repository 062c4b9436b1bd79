"""TE-JAX's fused-attention backend probe: `FusedAttnHelper` (transformer_engine.jax.cpp_extensions)
and the `NVTE_Fused_Attn_Backend` enum / `get_fused_attn_backend` of TE's C module.

TE answers with a cuDNN sub-backend. Here the fused slot is this library's fused kernels (flash on
the host; CK / AOTriton on ROCm builds), all F16/BF16/FP32 arbitrary-sequence-length kernels, so
the answer is NVTE_F16_arbitrary_seqlen whenever the attention selection (the one `fused_attn`
runs, under the same NVTE_* switches) picks a fused kernel, and NVTE_No_Backend otherwise (no
kernel, or only the unfused math). There is no FP8 attention and no max-512 kernel here: those
values are never the answer. The values are TE's, not those of the C core's own backend enum.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import jax.numpy as jnp

from ...common import config

__all__ = ["FusedAttnHelper", "NVTE_Fused_Attn_Backend", "get_fused_attn_backend"]


class NVTE_Fused_Attn_Backend(IntEnum):  # noqa: N801 (TE's name)
    """TE's fused-attention sub-backends (names and values of TE's C enum)."""

    NVTE_No_Backend = -1
    NVTE_F16_max512_seqlen = 0
    NVTE_F16_arbitrary_seqlen = 1
    NVTE_FP8 = 2


def get_fused_attn_backend(is_training, q_dtype, kv_dtype, qkv_layout, bias_type, attn_mask_type,
                           softmax_type, dropout_probability, q_num_heads, kv_num_heads,
                           q_max_seqlen, kv_max_seqlen, head_dim_qk, head_dim_v,
                           window_size_left, window_size_right, deterministic=False
                           ) -> NVTE_Fused_Attn_Backend:
    """TE's C-module probe (TE's arguments: jnp dtypes or TE DTypes, layout / bias / mask /
    softmax as enums or TE's value strings). `deterministic` does not change the answer: every
    fused kernel here has a deterministic backward (the GPU flash kernel switches to it)."""
    from .. import attention as api  # the API module imports this package: resolve at call time
    from .misc import DType, te_dtype_to_jax_dtype

    del deterministic
    q_dtype, kv_dtype = (te_dtype_to_jax_dtype(d) if isinstance(d, DType) else jnp.dtype(d)
                         for d in (q_dtype, kv_dtype))
    if jnp.dtype(q_dtype) != jnp.dtype(kv_dtype) or jnp.dtype(q_dtype) not in (
            jnp.dtype(jnp.float32), jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16)):
        return NVTE_Fused_Attn_Backend.NVTE_No_Backend  # FP8 (or mixed) attention: no kernel
    window = (int(window_size_left), int(window_size_right))
    ok = api.is_fused_attn_kernel_available(
        bool(is_training), q_dtype, kv_dtype, qkv_layout, bias_type, attn_mask_type, softmax_type,
        float(dropout_probability) if is_training else 0.0, int(q_num_heads), int(kv_num_heads),
        int(q_max_seqlen), int(kv_max_seqlen), int(head_dim_qk), int(head_dim_v),
        None if window == (-1, -1) else window)
    return (NVTE_Fused_Attn_Backend.NVTE_F16_arbitrary_seqlen if ok
            else NVTE_Fused_Attn_Backend.NVTE_No_Backend)


@dataclass(frozen=True)
class FusedAttnHelper:
    """TE's helper: the problem's description, asked which fused backend runs it."""

    is_training: bool
    q_dtype: object
    kv_dtype: object
    qkv_layout: object
    attn_bias_type: object
    attn_mask_type: object
    softmax_type: object
    dropout_probability: float
    q_num_heads: int
    kv_num_heads: int
    q_max_seqlen: int
    kv_max_seqlen: int
    head_dim_qk: int
    head_dim_v: int
    window_size: tuple = (-1, -1)

    def is_fused_attn_kernel_available(self) -> bool:
        """Whether a fused kernel (not the unfused math) runs this problem."""
        return self.get_fused_attn_backend() != NVTE_Fused_Attn_Backend.NVTE_No_Backend

    def get_fused_attn_backend(self) -> NVTE_Fused_Attn_Backend:
        """The sub-backend get_fused_attn_backend names for this problem."""
        if self.window_size is None or len(self.window_size) != 2:
            raise ValueError(f"FusedAttnHelper: window_size: expected (left, right), got "
                             f"{self.window_size!r}")
        return get_fused_attn_backend(
            self.is_training, self.q_dtype, self.kv_dtype, self.qkv_layout, self.attn_bias_type,
            self.attn_mask_type, self.softmax_type, self.dropout_probability, self.q_num_heads,
            self.kv_num_heads, self.q_max_seqlen, self.kv_max_seqlen, self.head_dim_qk,
            self.head_dim_v, self.window_size[0], self.window_size[1],
            not self.is_non_deterministic_allowed())

    @staticmethod
    def is_non_deterministic_allowed() -> bool:
        """TE's switch NVTE_ALLOW_NONDETERMINISTIC_ALGO (default 1; 0 makes fused_attn run the
        GPU flash kernel's deterministic backward)."""
        value = config.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO")
        if value not in ("0", "1"):
            raise ValueError(f"NVTE_ALLOW_NONDETERMINISTIC_ALGO: expected '0' or '1', got "
                             f"{value!r}")
        return value == "1"

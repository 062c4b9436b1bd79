"""The random Hadamard transform (RHT) of NVFP4's column-wise copies (TE-JAX's
`transformer_engine.jax.quantize.hadamard`): a 16-point Hadamard matrix with TE's fixed random
signs, applied to groups of 16 along the last dim. The core applies the forward transform itself
(cpp_extensions.nvfp4); this module gives the sign vector / mask it takes and the matrix, whose
inverse recovers the source values when a transformed copy is dequantized on its own."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["apply_rht", "get_rht_matrix", "get_sign_from_vector", "get_wgrad_sign_vector"]

_BLOCK = 16


def get_wgrad_sign_vector() -> list[int]:
    """TE's fixed sign vector of the wgrad RHT (the same as the PyTorch front end's)."""
    return [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]


def get_sign_from_vector(vector) -> int:
    """Sign vector -> bit mask, bit i set where sign i is -1 (the core's rht_sign_mask)."""
    return sum(1 << i for i, v in enumerate(vector) if v == -1)


def _matrix_f32(sign_mask: int) -> np.ndarray:
    """diag(signs) @ H / 4, H Sylvester's 16x16 Hadamard matrix (H[i][j] = (-1)^popcount(i&j))."""
    i = np.arange(_BLOCK)
    h = np.array([[(-1) ** bin(a & b).count("1") for b in i] for a in i], np.float32)
    signs = np.where((sign_mask >> i) & 1, -1.0, 1.0).astype(np.float32)
    return (signs[:, None] * h) / np.float32(4.0)


def get_rht_matrix() -> jnp.ndarray:
    """TE-JAX's (16, 16) bfloat16 RHT matrix, the random signs applied (entries +-1/4, exact)."""
    return jnp.asarray(_matrix_f32(get_sign_from_vector(get_wgrad_sign_vector())), jnp.bfloat16)


def apply_rht(x, inverse: bool = False):
    """x with groups of 16 along its last dim multiplied by the RHT matrix (its inverse, the
    transpose since the matrix is orthogonal, when `inverse`), in float32, in x's dtype."""
    if x.shape[-1] % _BLOCK:
        raise ValueError(f"apply_rht: argument 'x': expected a last dim divisible by {_BLOCK}, got "
                         f"shape {tuple(x.shape)}")
    m = _matrix_f32(get_sign_from_vector(get_wgrad_sign_vector()))
    m = jnp.asarray(m.T if inverse else m)
    g = x.astype(jnp.float32).reshape(*x.shape[:-1], -1, _BLOCK)
    y = jnp.matmul(g, m, precision=jax.lax.Precision.HIGHEST)
    return y.reshape(x.shape).astype(x.dtype)

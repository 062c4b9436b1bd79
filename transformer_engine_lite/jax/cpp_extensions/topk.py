"""TE-JAX's `topk(x, k)`: the k largest entries of each row of x (last dim) and their indices,
largest first.

TE-JAX runs a radix-select CUDA kernel here; the lite core has no top-k kernel, so this is XLA's
top_k (jax.lax.top_k), which on the CPU is exact (a sort, ties broken by the lower index — the same
values and indices as TE's test expects from jax.lax.top_k). The point of the TE name is that TE-JAX
code (MoE routers) runs unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .misc import check_dtype, check_min_ndim

__all__ = ["topk"]

_TOPK_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


def topk(x, k: int):
    """(values, indices int32), each x.shape[:-1] + (k,)."""
    check_dtype("topk", "x", x.dtype, _TOPK_DTYPES)
    check_min_ndim("topk", "x", x.shape, 1)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"te_lite::topk: argument 'k': expected an int, got {type(k).__name__}")
    if not 0 < int(k) <= x.shape[-1]:
        raise ValueError(f"te_lite::topk: argument 'k': expected 1 <= k <= {x.shape[-1]} (x's "
                         f"last dim), got {k}")
    values, indices = jax.lax.top_k(x, int(k))
    return values, indices.astype(jnp.int32)

"""TE-JAX's LoRA scope (which projections of a layer carry a low-rank adaptation) and the
kernel initializer that draws a fused projection's slices independently."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["LoRAScope", "LoRAScopeError"]


class LoRAScope:  # TE-JAX's plain holder: which projections get a LoRA term
    """Which projections of a layer carry a low-rank adaptation (TE-JAX's LoRAScope)."""

    def __init__(self, qkv_proj: bool = False, output_proj: bool = False, mlp: bool = False):
        self.qkv_proj, self.output_proj, self.mlp = qkv_proj, output_proj, mlp

    def __eq__(self, other):
        if not isinstance(other, LoRAScope):
            return NotImplemented
        return (self.qkv_proj, self.output_proj, self.mlp) == (other.qkv_proj, other.output_proj,
                                                                other.mlp)

    def __repr__(self):
        return f"LoRAScope(qkv_proj={self.qkv_proj}, output_proj={self.output_proj}, mlp={self.mlp})"


class LoRAScopeError(ValueError, AssertionError):
    """An unknown LoRA scope name. A ValueError (the project's rule for a rejected value) that is
    also an AssertionError, because TE rejects it with `assert` and TE code catches that."""


_LORA_SCOPES = {"none": (0, 0, 0), "all": (1, 1, 1), "qkv_proj": (1, 0, 0), "output_proj": (0, 1, 0),
                "mlp": (0, 0, 1), "exclude_qkv_proj": (0, 1, 1), "exclude_output_proj": (1, 0, 1),
                "exclude_mlp": (1, 1, 0)}


def _canonicalize_lora_scope(scope: str | None) -> LoRAScope:
    """TE's low_rank_adaptation_scope names (case-insensitive, None = "none") -> LoRAScope."""
    s = "none" if scope is None else str(scope).lower()
    if s not in _LORA_SCOPES:
        raise LoRAScopeError(f"field 'low_rank_adaptation_scope': expected one of "
                             f"{list(_LORA_SCOPES)}, got {scope!r}")
    return LoRAScope(*(bool(v) for v in _LORA_SCOPES[s]))


def _lora_scope(scope: str | None) -> tuple[bool, bool, bool]:
    """(qkv_proj, output_proj, mlp) of a scope name."""
    ls = _canonicalize_lora_scope(scope)
    return ls.qkv_proj, ls.output_proj, ls.mlp


def _split_init(kernel_init, parts_init):
    """A kernel init for (hidden, n, features) drawing each of the n slices independently."""

    def init(key, shape, dtype):
        if len(shape) != 3 or shape[1] != len(parts_init):
            raise ValueError(f"expected a kernel of shape (hidden, {len(parts_init)}, features), "
                             f"got {shape}")
        keys = jax.random.split(key, len(parts_init))
        return jnp.stack([f(k, (shape[0], shape[2]), dtype) for f, k in zip(parts_init, keys)],
                         axis=-2, dtype=dtype)

    return init

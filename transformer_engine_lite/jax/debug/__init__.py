"""TE-JAX's debugging helpers (`transformer_engine.jax.debug`)."""

from . import experimental  # noqa: F401

"""transformer_engine_lite.jax: TE-JAX's API (`import transformer_engine_lite.jax as te`) on the C core.

Layers, as in pytorch/: primitives over the XLA FFI handlers (cpp_extensions, imported as `tex`) ->
functional API with jax.custom_vjp (dense, layernorm, layernorm_dense, layernorm_mlp, activation,
softmax, attention.fused_attn) -> Flax modules (`transformer_engine_lite.jax.flax`). FP8 through `autocast(enabled, recipe,
mesh_resource)`; delayed-scaling state in the Flax collection NVTE_FP8_COLLECTION_NAME ("fp8_metas").
Importing registers the handlers with XLA for the CPU (and the GPU platform of a GPU build).
"""

from __future__ import annotations

from . import cpp_extensions  # noqa: F401
from .cpp_extensions.base import register_targets as _register_targets

_register_targets()

from . import attention, quantize, sharding  # noqa: F401
from .activation import activation  # noqa: F401
from .dense import dense  # noqa: F401
from .layernorm import layernorm  # noqa: F401
from .layernorm_dense import layernorm_dense  # noqa: F401
from .layernorm_mlp import layernorm_mlp  # noqa: F401
from .quantize import (
    NVTE_FP8_COLLECTION_NAME,
    autocast,
    fp8_autocast,
    update_collections,
)
from .sharding import MeshResource
from .softmax import softmax  # noqa: F401


def __getattr__(name):
    if name == "flax":  # imported lazily: flax is only needed for the modules
        import importlib

        return importlib.import_module(".flax", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "NVTE_FP8_COLLECTION_NAME",
    "MeshResource",
    "attention",
    "autocast",
    "flax",
    "fp8_autocast",
    "quantize",
    "update_collections",
]

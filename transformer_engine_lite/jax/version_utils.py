"""JAX version helpers (TE-JAX's `transformer_engine.jax.version_utils`).

TE gates its Triton-kernel dispatch on the installed JAX version. The lite has no Triton kernels at
all (every kernel is the C core's, behind XLA FFI), so `is_triton_extension_supported()` is False
whatever JAX is installed: code and tests that need TE's Triton path skip rather than run
something that is not there. The version constants keep TE's values so messages read the same.
"""

from __future__ import annotations

from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version as _pkg_version

__all__ = [
    "TRITON_EXTENSION_MIN_JAX_VERSION",
    "is_triton_extension_supported",
    "jax_version_meet_requirement",
]

TRITON_EXTENSION_MIN_JAX_VERSION = "0.8.0"


def _parse(v: str) -> tuple:
    # Release part only ("0.7.2.dev2025" -> (0, 7, 2)): enough for >= checks against release floors.
    out = []
    for part in v.split("."):
        digits = "".join(ch for ch in part if ch.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


@lru_cache(maxsize=None)
def jax_version_meet_requirement(version: str) -> bool:
    """True if the installed JAX is at least `version` (release numbers compared)."""
    if not isinstance(version, str) or not _parse(version):
        raise ValueError(f"version must be a version string such as '0.8.0', got {version!r}")
    try:
        installed = _pkg_version("jax")
    except PackageNotFoundError:  # pragma: no cover - this module is only imported with jax
        import jax

        installed = jax.__version__
    return _parse(installed) >= _parse(version)


def is_triton_extension_supported() -> bool:
    """Always False: the lite dispatches no Triton kernels (see the module docstring)."""
    return False

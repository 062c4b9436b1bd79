"""transformer_engine_lite: fused transformer kernels in the shape of TransformerEngine, on CPUs too.

`import transformer_engine_lite` loads the core library only (no framework is imported). Framework
front ends are imported lazily: `transformer_engine_lite.pytorch`, `transformer_engine_lite.jax`.
NVTE_FRAMEWORK ("pytorch", "jax", "all", "none") limits which of them may be imported.
"""

from __future__ import annotations

import importlib

from .common import __version__, build_info, config, get_lib  # noqa: F401

_FRONT_ENDS = ("pytorch", "jax")


def _allowed_frameworks() -> tuple[str, ...]:
    value = (config.get("NVTE_FRAMEWORK") or "").strip().lower()
    if value in ("", "all"):
        return _FRONT_ENDS
    if value == "none":
        return ()
    chosen = tuple(v.strip() for v in value.split(",") if v.strip())
    unknown = [v for v in chosen if v not in _FRONT_ENDS]
    if unknown:
        raise ValueError(f"NVTE_FRAMEWORK: expected {_FRONT_ENDS}, 'all' or 'none', got {value!r}")
    return chosen


def __getattr__(name: str):
    if name in _FRONT_ENDS:
        if name not in _allowed_frameworks():
            raise ImportError(
                f"transformer_engine_lite.{name} is disabled by NVTE_FRAMEWORK="
                f"{config.get('NVTE_FRAMEWORK')!r}"
            )
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

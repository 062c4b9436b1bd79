"""Locates and loads libtransformer_engine_lite.so; reports what it was built with.

Search order: $NVTE_LIB_PATH (a file or folder), the installed package folder, then the CMake build
folder of a source checkout (build/cmake). Works on hosts with no GPU and no driver: the CPU backend
needs neither, and GPU runtimes are never loaded at import.
"""

from __future__ import annotations

import ctypes
import functools
import json
import sys
from pathlib import Path

from . import config

__version__ = "0.1.0"

LIB_NAME = "libtransformer_engine_lite.so"
_PKG_DIR = Path(__file__).resolve().parent.parent


def _candidates() -> list[Path]:
    env = config.get("NVTE_LIB_PATH")
    if env:
        # An explicit choice is the only candidate: silently loading another library would hide it.
        p = Path(env)
        return [p / LIB_NAME if p.is_dir() else p]
    return [
        _PKG_DIR / LIB_NAME,
        _PKG_DIR.parent / "build" / "cmake" / "transformer_engine_lite" / "common" / LIB_NAME,
    ]


def _preload_onednn() -> None:
    # PyPI's onednn-cpu-gomp puts libdnnl.so.3 under the Python prefix; the library's RPATH points at the
    # prefix it was built against, and preloading makes a relocated environment work too.
    for prefix in {sys.prefix, sys.base_prefix}:
        lib = Path(prefix) / "lib" / "libdnnl.so.3"
        if lib.exists():
            try:
                ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
            except OSError:
                pass
            return


CPU_ISA_LEVELS = ("baseline", "sse41", "avx2", "avx512_core", "avx512_core_bf16", "avx512_core_fp16",
                  "avx512_core_amx", "native", "all")


def _check_cpu_isa() -> None:
    # The C side reads NVTE_CPU_ISA inside kernels, where it cannot raise: a typo is caught here.
    value = config.get("NVTE_CPU_ISA")
    if value is not None and value.lower() not in CPU_ISA_LEVELS:
        raise ValueError(f"NVTE_CPU_ISA: expected one of {', '.join(CPU_ISA_LEVELS)}, got {value!r}")


@functools.lru_cache(maxsize=None)
def get_lib() -> ctypes.CDLL:
    """The loaded core library (loaded once)."""
    _check_cpu_isa()
    tried = []
    for path in _candidates():
        if path.is_file():
            _preload_onednn()
            try:
                lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                raise ImportError(f"transformer_engine_lite: cannot load {path}: {e}") from e
            lib.nvte_get_build_info.restype = ctypes.c_char_p
            lib.nvte_get_version.restype = ctypes.c_char_p
            return lib
        tried.append(str(path))
    hint = (
        "NVTE_LIB_PATH is set: expected it to name the library file or its folder"
        if config.get("NVTE_LIB_PATH")
        else "install the package (pip install --no-build-isolation -e .) or set NVTE_LIB_PATH"
    )
    raise ImportError(
        f"transformer_engine_lite: {LIB_NAME} not found; looked in: {', '.join(tried)}. {hint}."
    )


def lib_path() -> str:
    """Path of the loaded library file."""
    return get_lib()._name


@functools.lru_cache(maxsize=None)
def build_info() -> dict:
    """Version, compiled device backends, CPU features used and the CPU GEMM provider."""
    info = json.loads(get_lib().nvte_get_build_info().decode())
    info["library_path"] = lib_path()
    return info


get_lib()  # fail at import with a clear message rather than at the first op

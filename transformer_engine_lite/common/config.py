"""Every environment variable the project reads, with default and meaning (the README's table is checked
against this list by tests/python/test_config.py). Readers go through `get()` so parsing is uniform.

This module has no imports from the package, so build_tools can load it by path at build time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str | None
    scope: str  # "build" or "runtime"
    meaning: str


ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("NVTE_USE_CUDA", None, "build",
           "0 forbids the CUDA backend, 1 forces it; unset: CUDA when nvcc is found and the tree has "
           "CUDA kernels"),
    EnvVar("NVTE_USE_ROCM", None, "build", "1 forces the ROCm backend (hipified CUDA sources)"),
    EnvVar("NVTE_CUDA_ARCHS", "80;90", "build", "CUDA architectures of a CUDA build"),
    EnvVar("NVTE_ROCM_ARCH", "gfx942", "build", "AMD GPU architectures of a ROCm build"),
    EnvVar("NVTE_FRAMEWORK", None, "build+runtime",
           "pytorch, jax, pytorch,jax, all or none: framework extensions to build / front ends that "
           "may be imported; unset: whatever is importable"),
    EnvVar("NVTE_BUILD_DIR", "build/cmake", "build", "CMake build folder, reused between builds"),
    EnvVar("NVTE_WERROR", "0", "build", "1 compiles the library with -Werror"),
    EnvVar("DNNL_ROOT", None, "build",
           "prefix holding oneDNN's include/ and lib/ (default: the Python prefix, where PyPI's "
           "onednn-cpu-gomp and onednn-devel-cpu-gomp install)"),
    EnvVar("MAX_JOBS", None, "build", "parallel compile jobs (default: number of cores)"),
    EnvVar("NVTE_LIB_PATH", None, "runtime",
           "file or folder of libtransformer_engine_lite.so to load instead of the installed one"),
    EnvVar("OMP_NUM_THREADS", None, "runtime", "threads of the CPU kernels (OpenMP)"),
    EnvVar("TEST_LEVEL", "99", "ci", "how many configurations ci/*.sh run"),
    EnvVar("TEST_FILTER", None, "ci", "space-separated globs over test tags, e.g. 'core.test_gemm'"),
    EnvVar("TEST_SGPU", "1", "ci", "run single-process suites"),
    EnvVar("TEST_MGPU", "1", "ci", "run multi-process suites"),
    EnvVar("TEST_LIST_ONLY", "0", "ci", "1 prints the selected test tags instead of running them"),
    EnvVar("CTEST_TIMEOUT", "600", "ci", "per-test timeout of ctest, seconds"),
    EnvVar("PYTEST_TIMEOUT", "900", "ci", "faulthandler timeout of pytest, seconds"),
)

_BY_NAME = {v.name: v for v in ENV_VARS}


def get(name: str) -> str | None:
    """Value of a registered variable, or its default; unregistered names are a programming error."""
    if name not in _BY_NAME:
        raise KeyError(f"{name}: not a registered environment variable (add it to ENV_VARS)")
    value = os.environ.get(name)
    return value if value not in (None, "") else _BY_NAME[name].default


def markdown_table() -> str:
    """The README's env-var table."""
    rows = ["| variable | scope | default | meaning |", "|---|---|---|---|"]
    for v in ENV_VARS:
        rows.append(f"| `{v.name}` | {v.scope} | {v.default if v.default is not None else '—'} "
                    f"| {v.meaning} |")
    return "\n".join(rows)

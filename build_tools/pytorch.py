"""The PyTorch extension: transformer_engine_lite/pytorch/_C, the te_lite op bindings (csrc/*.cpp)
linked against libtransformer_engine_lite.so, which it finds at run time beside the package
($ORIGIN/..) or already loaded by transformer_engine_lite.common (NVTE_LIB_PATH, build folder).

CUDA op implementations are compiled (NVTE_TORCH_CUDA) only when the core is built with a GPU backend
and the installed torch has CUDA; otherwise the extension registers CPU implementations only.
"""

from __future__ import annotations

from pathlib import Path

from . import utils

EXT_NAME = "transformer_engine_lite.pytorch._C"
CSRC = utils.ROOT / "transformer_engine_lite" / "pytorch" / "csrc"


def torch_has_gpu() -> bool:
    import torch

    return bool(torch.version.cuda or getattr(torch.version, "hip", None))


def with_gpu_ops(backend: str) -> bool:
    """True if the extension should register CUDA implementations."""
    return backend in ("cuda", "rocm") and torch_has_gpu()


def extension(core_lib_dir: Path, backend: str):
    """The setuptools Extension; `core_lib_dir` holds the freshly built core library."""
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    gpu = with_gpu_ops(backend)
    sources = sorted(str(p.relative_to(utils.ROOT)) for p in CSRC.glob("*.cpp"))
    defines = ["-DNVTE_TORCH_CUDA=1"] if gpu else []
    cls = CUDAExtension if gpu else CppExtension
    return cls(
        name=EXT_NAME,
        sources=sources,
        include_dirs=[str(utils.COMMON / "include")],
        library_dirs=[str(core_lib_dir)],
        libraries=["transformer_engine_lite"],
        # The C++ standard is torch's own (C++17 up to torch 2.9, C++20 since), set by BuildExtension.
        extra_compile_args={"cxx": ["-O2", "-g0", *defines], "nvcc": ["-O2", *defines]},
        # The core library sits in the package folder, one level above pytorch/_C*.so.
        # A static-only libstdc++ stays private (see common/CMakeLists.txt).
        extra_link_args=["-Wl,-rpath,$ORIGIN/..", "-Wl,--exclude-libs,libstdc++.a"],
        # No Python C API is used: ops are registered with the dispatcher and loaded with
        # torch.ops.load_library, so one binary serves every CPython version (and torch_python is
        # not linked).
        py_limited_api=True,
    )


def build_ext_base():
    """torch's BuildExtension (adds torch's compile flags, builds sources in parallel with ninja)."""
    try:
        from torch.utils.cpp_extension import BuildExtension
    except ImportError as e:
        raise RuntimeError(
            "the pytorch extension is selected (NVTE_FRAMEWORK or an importable torch) but "
            f"torch.utils.cpp_extension cannot be imported ({e}); install torch and build with "
            "pip install --no-build-isolation, or set NVTE_FRAMEWORK=none"
        ) from e

    return BuildExtension

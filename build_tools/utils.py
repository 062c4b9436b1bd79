"""Build configuration: device backend detection and framework selection (ARCHITECTURE.md §8).

Environment variables (all optional):
  NVTE_USE_ROCM=1          force the ROCm backend
  NVTE_USE_CUDA=0|1        0 forbids CUDA; 1 forces it
  NVTE_CUDA_ARCHS          CUDA archs (default "80;90")
  NVTE_ROCM_ARCH           ROCm archs (default "gfx942")
  NVTE_FRAMEWORK           "pytorch", "jax", "pytorch,jax", "all" or "none" (default: importable ones)
  NVTE_BUILD_DIR           CMake build folder (default build/cmake), reused across builds
  NVTE_WERROR=1            compile with warnings as errors
  NVTE_WITH_CUBLASLT       CUDA builds: auto (default; tiled GEMM alone when cuBLASLt is missing), 1, 0
  NVTE_WITH_AOTRITON       GPU builds: auto (default; AOTriton images when triton is importable), 1, 0
  NVTE_AOTRITON_ARCHS      archs of the AOTriton images (default: gfx90a;gfx942[;gfx950] on ROCm,
                           sm_<arch> of NVTE_CUDA_ARCHS on CUDA)
  DNNL_ROOT                prefix of oneDNN (default: the Python prefix, where PyPI's onednn-* install)
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMON = ROOT / "transformer_engine_lite" / "common"
KNOWN_FRAMEWORKS = ("pytorch", "jax")


def _load_config():
    # The package's env-var registry, loaded by path: the package itself cannot be imported before the
    # library it loads has been built.
    spec = importlib.util.spec_from_file_location("_nvte_config", COMMON / "config.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


_CONFIG = _load_config()


def _flag(name: str) -> str | None:
    return _CONFIG.get(name)


def has_gpu_sources(kind: str) -> bool:
    """True if the tree holds kernels for `kind` ("cuda": *.cu under common/)."""
    if kind in ("cuda", "rocm"):  # ROCm builds hipify the CUDA sources
        return any(COMMON.rglob("*.cu"))
    return False


def hip_runtime_missing() -> str | None:
    """What an automatic ROCm build would lack (None when complete): the HIP runtime headers and the
    device libraries (ocml.bc) that common/rocm.cmake requires, under ROCM_PATH, `hipconfig
    --rocmpath`, /opt/rocm or /usr (Debian's libamdhip64-dev and rocm-device-libs)."""
    roots = [r for r in (_flag("ROCM_PATH"), "/opt/rocm", "/usr") if r]
    hipconfig = shutil.which("hipconfig")
    if hipconfig:
        try:
            out = subprocess.run([hipconfig, "--rocmpath"], capture_output=True, text=True,
                                 timeout=30, env={**os.environ, "HIP_PLATFORM": "amd"})
            if out.returncode == 0 and out.stdout.strip():
                roots.insert(0, out.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    if not any(Path(r, "include", "hip", "hip_runtime.h").is_file() for r in roots):
        return "no HIP runtime headers (include/hip/hip_runtime.h)"
    bitcode = [Path(r, *sub) for r in roots
               for sub in (("amdgcn", "bitcode"), ("lib", "amdgcn", "bitcode"))]
    bitcode += [d for r in roots for d in Path(r, "lib").glob("*/amdgcn/bitcode")]
    if not any((d / "ocml.bc").is_file() for d in bitcode):
        return "no ROCm device libraries (amdgcn/bitcode/ocml.bc)"
    return None


@dataclass(frozen=True)
class BackendChoice:
    backend: str  # "cpu", "cuda" or "rocm"
    reason: str


def detect_backend() -> BackendChoice:
    """NVTE_USE_ROCM=1 forces ROCm; else nvcc found -> CUDA; else hipcc (with the HIP runtime) -> ROCm;
    else CPU only.

    Auto-detection only picks a GPU backend when the tree has GPU kernels to build, so a machine with
    a toolkit but a CPU-only tree still builds; forcing one without kernels is an error.
    """
    use_rocm, use_cuda = _flag("NVTE_USE_ROCM"), _flag("NVTE_USE_CUDA")
    for name, value in (("NVTE_USE_ROCM", use_rocm), ("NVTE_USE_CUDA", use_cuda)):
        if value not in (None, "0", "1"):
            raise ValueError(f"{name}: expected 0 or 1, got {value!r}")
    if use_rocm == "1" and use_cuda == "1":
        raise ValueError("NVTE_USE_ROCM=1 and NVTE_USE_CUDA=1: expected at most one GPU backend")
    for forced, kind in ((use_rocm == "1", "rocm"), (use_cuda == "1", "cuda")):
        if forced:
            if not has_gpu_sources(kind):
                raise RuntimeError(
                    f"NVTE_USE_{kind.upper()}=1: expected GPU kernels (*.cu) in {COMMON}, got none; "
                    "this tree builds the CPU backend only"
                )
            return BackendChoice(kind, f"NVTE_USE_{kind.upper()}=1")
    if use_cuda != "0" and shutil.which("nvcc") and has_gpu_sources("cuda"):
        return BackendChoice("cuda", "nvcc found")
    if use_rocm != "0" and shutil.which("hipcc") and has_gpu_sources("rocm"):
        # An automatic build never fails for a missing optional GPU piece: without the HIP runtime
        # it builds the CPU backend and says why (NVTE_USE_ROCM=1 still fails in CMake, naming it).
        missing = hip_runtime_missing()
        if missing is None:
            return BackendChoice("rocm", "hipcc found")
        return BackendChoice(
            "cpu", f"hipcc found but {missing}; building the CPU backend only (for ROCm: apt-get "
                   "install libamdhip64-dev rocm-device-libs, or set ROCM_PATH)")
    if shutil.which("nvcc") or shutil.which("hipcc"):
        return BackendChoice("cpu", "GPU toolkit found but no GPU kernels in this tree")
    return BackendChoice("cpu", "no CUDA or ROCm toolkit found")


def cuda_archs() -> str:
    return _flag("NVTE_CUDA_ARCHS")


def rocm_archs() -> str:
    return _flag("NVTE_ROCM_ARCH")


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def select_frameworks() -> list[str]:
    """Frameworks whose extensions to build: NVTE_FRAMEWORK or, by default, the importable ones."""
    value = _flag("NVTE_FRAMEWORK")
    if value is None:
        return [f for f, mod in (("pytorch", "torch"), ("jax", "jax")) if _importable(mod)]
    value = value.strip().lower()
    if value == "none":
        return []
    if value == "all":
        return list(KNOWN_FRAMEWORKS)
    chosen = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in KNOWN_FRAMEWORKS]
    if unknown:
        raise ValueError(
            f"NVTE_FRAMEWORK: expected a comma list of {KNOWN_FRAMEWORKS}, 'all' or 'none', "
            f"got {value!r}"
        )
    return chosen


def cmake_args(build_type: str = "Release") -> list[str]:
    choice = detect_backend()
    args = [f"-DCMAKE_BUILD_TYPE={build_type}", f"-DNVTE_BACKEND={choice.backend}"]
    if choice.backend == "cuda":
        args.append(f"-DNVTE_CUDA_ARCHS={cuda_archs()}")  # gpu.cmake derives the CUDA archs
    if choice.backend == "rocm":
        args.append(f"-DNVTE_ROCM_ARCH={rocm_archs()}")
    if choice.backend == "cuda":
        cublaslt = (_flag("NVTE_WITH_CUBLASLT") or "auto").strip().lower()
        modes = {"auto": "AUTO", "1": "ON", "on": "ON", "0": "OFF", "off": "OFF"}
        if cublaslt not in modes:
            raise ValueError(f"NVTE_WITH_CUBLASLT: expected auto, 1 or 0, got {cublaslt!r}")
        args.append(f"-DNVTE_WITH_CUBLASLT={modes[cublaslt]}")
    if choice.backend in ("cuda", "rocm"):
        aot = (_flag("NVTE_WITH_AOTRITON") or "auto").strip().lower()
        modes = {"auto": "AUTO", "1": "ON", "on": "ON", "0": "OFF", "off": "OFF"}
        if aot not in modes:
            raise ValueError(f"NVTE_WITH_AOTRITON: expected auto, 1 or 0, got {aot!r}")
        # The Python that builds the AOTriton images is the one running setup.py (with triton).
        args += [f"-DNVTE_WITH_AOTRITON={modes[aot]}", f"-DPython3_EXECUTABLE={sys.executable}"]
    if _flag("NVTE_WERROR") == "1":
        args.append("-DNVTE_WERROR=ON")
    dnnl = _flag("DNNL_ROOT")
    if dnnl:
        args.append(f"-DDNNL_ROOT={dnnl}")
    return args


def build_dir() -> Path:
    path = Path(_flag("NVTE_BUILD_DIR"))
    return path if path.is_absolute() else ROOT / path


def core_lib_dir() -> Path:
    """Folder of the core library CMake builds (framework extensions link it from here)."""
    return build_dir() / "transformer_engine_lite" / "common"

"""Where each recipe runs (TE's is_*_available / check_*_support): every format on the CPU; on a
GPU, per compute capability and the library's GPU backends. Split from fp8.py, which re-exports
every public name here (TE serves them from transformer_engine.pytorch.fp8)."""

from __future__ import annotations

import torch

def _cuda_arch() -> tuple[int, int] | None:
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()


def _fp8_support() -> tuple[bool, str]:
    """(available, reason if not). CPU: every FP8 format is supported. CUDA: compute capability 8.9+
    (Ada, Hopper, Blackwell); ROCm: gfx94x/gfx95x. A GPU also needs the library's GPU backend."""
    arch = _cuda_arch()
    if arch is None:
        return True, ""
    from ..common import build_info

    backends = build_info().get("device_backends", [])
    if torch.version.hip:
        name = torch.cuda.get_device_properties(torch.cuda.current_device()).gcnArchName
        if "hip" not in backends and "rocm" not in backends:
            return False, "transformer_engine_lite was built without the ROCm backend"
        if not name.startswith(("gfx94", "gfx95")):
            return False, f"FP8 needs an MI300-class GPU (gfx94x/gfx95x), got {name}"
        return True, ""
    if "cuda" not in backends:
        return False, "transformer_engine_lite was built without the CUDA backend"
    if arch < (8, 9):
        return (
            False,
            f"Device compute capability 8.9 or higher required for FP8 execution, got {arch}",
        )
    return True, ""


def _mxfp8_support() -> tuple[bool, str]:
    ok, reason = _fp8_support()
    arch = _cuda_arch()
    if not ok or arch is None or torch.version.hip:
        return ok, reason
    if arch < (10, 0):
        return False, f"MXFP8 needs compute capability 10.0 or higher, got {arch}"
    return True, ""


def _answer(support: tuple[bool, str], return_reason: bool) -> bool | tuple[bool, str]:
    return support if return_reason else support[0]


def is_fp8_available(return_reason: bool = False) -> bool | tuple[bool, str]:
    """Whether per-tensor FP8 (DelayedScaling, Float8CurrentScaling) runs here; with
    return_reason=True, (available, reason if not) as TE. CPU: always."""
    return _answer(_fp8_support(), return_reason)


def is_mxfp8_available(return_reason: bool = False) -> bool | tuple[bool, str]:
    """Whether MXFP8BlockScaling runs here (CPU: yes; CUDA: compute capability 10.0+)."""
    return _answer(_mxfp8_support(), return_reason)


def _gpu_block_support(recipe: str, fmt: str) -> tuple[bool, str]:
    """CPU: yes (the core's CPU kernels). A GPU: where the library was built with a GPU backend
    whose block-scaled kernels (quantize and dequantize, build_info()["gpu_block_scaling"]) cover
    `fmt`. The GEMMs contract exactly decoded values in fp32 (cpp_extensions/block_gemm.py,
    nvfp4_gemm.py) on the GPU GEMM, so no FP8 / FP4 tensor cores are needed: any compute
    capability (TE needs sm_90 / sm_100 for its native GEMMs)."""
    if _cuda_arch() is None:
        return True, ""
    from ..common import build_info

    info = build_info()
    backends = info.get("device_backends", [])
    if not any(b in backends for b in ("cuda", "hip", "rocm")):
        return False, f"{recipe}: transformer_engine_lite was built without a GPU backend"
    if fmt not in info.get("gpu_block_scaling", []):
        return False, (f"{recipe}: this transformer_engine_lite build has no GPU dequantize for "
                       f"{fmt} (expected build_info()['gpu_block_scaling'] to list it; rebuild)")
    return True, ""


def _fp8_block_scaling_support() -> tuple[bool, str]:
    return _gpu_block_support("Float8BlockScaling", "fp8_block")


def is_fp8_block_scaling_available(return_reason: bool = False) -> bool | tuple[bool, str]:
    """Whether Float8BlockScaling (DeepSeek-style 1x128 / 128x128 blocks) quantizes here."""
    return _answer(_fp8_block_scaling_support(), return_reason)


def _nvfp4_support() -> tuple[bool, str]:
    return _gpu_block_support("NVFP4BlockScaling", "nvfp4")


def is_nvfp4_available(return_reason: bool = False) -> bool | tuple[bool, str]:
    """Whether NVFP4BlockScaling (E2M1 with E4M3 scales per 16 values) quantizes here."""
    return _answer(_nvfp4_support(), return_reason)


# TE's check_*_support: (available, reason) pairs (accelerate and Megatron-Core call them).
def check_fp8_support() -> tuple[bool, str]:
    return _fp8_support()


def check_mxfp8_support() -> tuple[bool, str]:
    return _mxfp8_support()


def check_fp8_block_scaling_support() -> tuple[bool, str]:
    return is_fp8_block_scaling_available(return_reason=True)  # type: ignore[return-value]


def check_nvfp4_support() -> tuple[bool, str]:
    return is_nvfp4_available(return_reason=True)  # type: ignore[return-value]

"""Float8BlockScaling / NVFP4BlockScaling availability on a GPU (pytorch/_availability.py), checked
on the CPU by standing in for the device query and the library's build_info: True where the build
has a GPU backend whose block-scaled kernels (quantize + dequantize) list the format, a reason
naming the recipe otherwise. The CPU answer (always True) is in test_fp8_state.py."""

from __future__ import annotations

import pytest

import transformer_engine_lite.common as common
import transformer_engine_lite.pytorch as te
from transformer_engine_lite.pytorch import _availability

CHECKS = {
    "Float8BlockScaling": (te.is_fp8_block_scaling_available, "fp8_block"),
    "NVFP4BlockScaling": (te.is_nvfp4_available, "nvfp4"),
}


def _on_gpu(monkeypatch, info: dict, arch=(9, 0)) -> None:
    monkeypatch.setattr(_availability, "_cuda_arch", lambda: arch)
    monkeypatch.setattr(common, "build_info", lambda: info)


@pytest.mark.parametrize("recipe", list(CHECKS))
@pytest.mark.parametrize("backend", ["cuda", "rocm"])
def test_available_with_gpu_kernels(monkeypatch, recipe, backend):
    check, _ = CHECKS[recipe]
    info = {"device_backends": ["cpu", backend], "gpu_block_scaling": ["fp8_block", "nvfp4"]}
    # The GEMMs contract decoded values in fp32: no FP8 tensor cores needed, any arch.
    for arch in ((8, 0), (9, 0), (10, 0)):
        _on_gpu(monkeypatch, info, arch)
        assert check() is True
        assert check(return_reason=True) == (True, "")


@pytest.mark.parametrize("recipe", list(CHECKS))
def test_unavailable_without_gpu_backend(monkeypatch, recipe):
    check, _ = CHECKS[recipe]
    _on_gpu(monkeypatch, {"device_backends": ["cpu"], "gpu_block_scaling": []})
    ok, why = check(return_reason=True)
    assert ok is False and check() is False
    assert recipe in why and "without a GPU backend" in why


@pytest.mark.parametrize("recipe", list(CHECKS))
def test_unavailable_without_the_formats_kernels(monkeypatch, recipe):
    # A GPU build older than the dequantize kernels has no "gpu_block_scaling" entry; a build
    # listing only the other format serves only that one.
    check, fmt = CHECKS[recipe]
    other = next(f for _, f in CHECKS.values() if f != fmt)
    for info in ({"device_backends": ["cpu", "cuda"]},
                 {"device_backends": ["cpu", "cuda"], "gpu_block_scaling": [other]}):
        _on_gpu(monkeypatch, info)
        ok, why = check(return_reason=True)
        assert ok is False
        assert recipe in why and fmt in why and "gpu_block_scaling" in why


def test_this_build_reports_its_gpu_block_formats():
    info = common.build_info()
    gpu = set(info["device_backends"]) - {"cpu"}
    # An extension built before the key existed (a copied library) cannot say; a fresh one must.
    if "gpu_block_scaling" not in info:
        pytest.skip("this library predates build_info()['gpu_block_scaling']")
    assert info["gpu_block_scaling"] == (["fp8_block", "nvfp4"] if gpu else [])

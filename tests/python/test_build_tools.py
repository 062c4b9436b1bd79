"""Backend detection and framework selection of build_tools/utils.py (ARCHITECTURE.md §8)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from build_tools import utils  # noqa: E402


@pytest.fixture
def toolkit(monkeypatch):
    """Pretend which compilers exist and whether the tree has GPU kernels."""

    def set_(nvcc=False, hipcc=False, kernels=False, hip_missing=None):
        found = {"nvcc": nvcc, "hipcc": hipcc}
        monkeypatch.setattr(utils.shutil, "which", lambda n: f"/usr/bin/{n}" if found.get(n) else None)
        monkeypatch.setattr(utils, "has_gpu_sources", lambda kind: kernels)
        monkeypatch.setattr(utils, "hip_runtime_missing", lambda: hip_missing)

    for var in ("NVTE_USE_CUDA", "NVTE_USE_ROCM", "NVTE_FRAMEWORK"):
        monkeypatch.delenv(var, raising=False)
    return set_


def test_cpu_without_toolkits(toolkit):
    toolkit()
    assert utils.detect_backend().backend == "cpu"


def test_nvcc_with_kernels_picks_cuda(toolkit):
    toolkit(nvcc=True, kernels=True)
    assert utils.detect_backend().backend == "cuda"


def test_nvcc_without_kernels_stays_cpu(toolkit):
    toolkit(nvcc=True, kernels=False)
    choice = utils.detect_backend()
    assert choice.backend == "cpu" and "no GPU kernels" in choice.reason


def test_use_cuda_0_falls_back_to_hipcc(toolkit, monkeypatch):
    toolkit(nvcc=True, hipcc=True, kernels=True)
    monkeypatch.setenv("NVTE_USE_CUDA", "0")
    assert utils.detect_backend().backend == "rocm"


def test_hipcc_without_hip_runtime_builds_cpu_and_says_why(toolkit):
    toolkit(hipcc=True, kernels=True, hip_missing="no HIP runtime headers (include/hip/hip_runtime.h)")
    choice = utils.detect_backend()
    assert choice.backend == "cpu"
    assert "hip_runtime.h" in choice.reason and "libamdhip64-dev" in choice.reason


def test_hip_runtime_missing_reports_a_missing_prefix(monkeypatch, tmp_path):
    monkeypatch.setattr(utils.shutil, "which", lambda n: None)
    monkeypatch.setattr(utils, "_flag", lambda n: str(tmp_path) if n == "ROCM_PATH" else None)
    (tmp_path / "include" / "hip").mkdir(parents=True)
    # /opt/rocm or /usr may hold a real installation on this machine: only check the message shape.
    missing = utils.hip_runtime_missing()
    assert missing is None or "hip_runtime.h" in missing or "ocml.bc" in missing
    (tmp_path / "include" / "hip" / "hip_runtime.h").write_text("")
    (tmp_path / "amdgcn" / "bitcode").mkdir(parents=True)
    (tmp_path / "amdgcn" / "bitcode" / "ocml.bc").write_bytes(b"")
    assert utils.hip_runtime_missing() is None


def test_forced_rocm_ignores_the_runtime_check(toolkit, monkeypatch):
    toolkit(hipcc=True, kernels=True, hip_missing="no HIP runtime headers")
    monkeypatch.setenv("NVTE_USE_ROCM", "1")  # CMake then names what is missing
    assert utils.detect_backend().backend == "rocm"


def test_use_rocm_forces_rocm(toolkit, monkeypatch):
    toolkit(nvcc=True, hipcc=False, kernels=True)
    monkeypatch.setenv("NVTE_USE_ROCM", "1")
    assert utils.detect_backend().backend == "rocm"


def test_forcing_a_backend_without_kernels_is_an_error(toolkit, monkeypatch):
    toolkit(nvcc=True, kernels=False)
    monkeypatch.setenv("NVTE_USE_CUDA", "1")
    with pytest.raises(RuntimeError, match="NVTE_USE_CUDA=1: expected GPU kernels"):
        utils.detect_backend()


@pytest.mark.parametrize("value", ["yes", "2", "true"])
def test_bad_flag_values(toolkit, monkeypatch, value):
    toolkit()
    monkeypatch.setenv("NVTE_USE_ROCM", value)
    with pytest.raises(ValueError, match="NVTE_USE_ROCM: expected 0 or 1"):
        utils.detect_backend()


def test_both_forced_is_an_error(toolkit, monkeypatch):
    toolkit(kernels=True)
    monkeypatch.setenv("NVTE_USE_ROCM", "1")
    monkeypatch.setenv("NVTE_USE_CUDA", "1")
    with pytest.raises(ValueError, match="at most one"):
        utils.detect_backend()


@pytest.mark.parametrize(
    "value,expected",
    [("none", []), ("all", ["pytorch", "jax"]), ("jax", ["jax"]), ("pytorch, jax", ["pytorch", "jax"])],
)
def test_framework_selection(toolkit, monkeypatch, value, expected):
    toolkit()
    monkeypatch.setenv("NVTE_FRAMEWORK", value)
    assert utils.select_frameworks() == expected


def test_framework_selection_rejects_unknown(toolkit, monkeypatch):
    toolkit()
    monkeypatch.setenv("NVTE_FRAMEWORK", "tensorflow")
    with pytest.raises(ValueError, match="NVTE_FRAMEWORK"):
        utils.select_frameworks()


def test_cmake_args_carry_backend_and_werror(toolkit, monkeypatch):
    toolkit()
    monkeypatch.setenv("NVTE_WERROR", "1")
    args = utils.cmake_args()
    assert "-DNVTE_BACKEND=cpu" in args and "-DNVTE_WERROR=ON" in args


@pytest.mark.parametrize(
    "kind,env,value,expected",
    [
        ("cuda", "NVTE_CUDA_ARCHS", None, "-DNVTE_CUDA_ARCHS=80;90"),
        ("cuda", "NVTE_CUDA_ARCHS", "90", "-DNVTE_CUDA_ARCHS=90"),
        ("rocm", "NVTE_ROCM_ARCH", "gfx90a;gfx940", "-DNVTE_ROCM_ARCH=gfx90a;gfx940"),
    ],
)
def test_cmake_args_carry_the_arch_list(toolkit, monkeypatch, kind, env, value, expected):
    toolkit(kernels=True)
    monkeypatch.setenv(f"NVTE_USE_{kind.upper()}", "1")
    if value is None:
        monkeypatch.delenv(env, raising=False)
    else:
        monkeypatch.setenv(env, value)
    args = utils.cmake_args()
    assert f"-DNVTE_BACKEND={kind}" in args and expected in args

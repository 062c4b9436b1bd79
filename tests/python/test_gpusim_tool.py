"""build_tools/gpusim.py: the CUDA (or hipified) sources rewritten for the gpusim harness."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "build_tools"))
import gpusim  # noqa: E402

KERNEL = """#include <cuda_runtime.h>
template <typename T>
__global__ void k(T *p) {
  __shared__ float tile[32][33];  // +1: banks
  __shared__ Pair<int, T> pair;
  extern __shared__ float dyn[];
  p[threadIdx.x] = tile[0][threadIdx.x];  // "__shared__ in a comment and a string"
}
void launch(float *p, cudaStream_t s) {
  k<float><<<dim3(2, 3), 64, 128, s>>>(p);
}
"""


def convert(tmp_path: Path, flavour: str, text: str = KERNEL) -> str:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "k.cu").write_text(text)
    out = gpusim.convert_tree(src, tmp_path / f"out_{flavour}", flavour, gpusim.EXTENSIONS)
    return out[0].read_text()


def test_cuda_flavour_rewrites_launches_and_shared(tmp_path):
    out = convert(tmp_path, "cuda")
    assert "GPUSIM_SHARED(tile, float[32][33]);  // +1: banks" in out
    assert "GPUSIM_SHARED(pair, Pair<int, T>);" in out
    assert "HIP_DYNAMIC_SHARED( float, dyn)" in out
    assert "hipLaunchKernelGGL(( k<float>), dim3(dim3(2, 3)), dim3(64), 128, s, p)" in out
    assert "cuda_runtime.h" in out and "cudaStream_t" in out  # no renames in the CUDA flavour
    assert "<<<" not in out


def test_rocm_flavour_hipifies_first(tmp_path):
    out = convert(tmp_path, "rocm")
    assert "hip/hip_runtime.h" in out and "hipStream_t" in out and "cudaStream_t" not in out
    assert "GPUSIM_SHARED(tile, float[32][33]);" in out


def test_unrewritten_shared_is_an_error_naming_the_line(tmp_path):
    bad = "__global__ void k() {\n  float x; __shared__ int s[4];\n}\n"
    with pytest.raises(ValueError, match=r"k\.cu:2: expected `__shared__ T name\[dims\];`"):
        convert(tmp_path, "cuda", bad)


def test_real_tree_converts_in_both_flavours(tmp_path):
    common = ROOT / "transformer_engine_lite" / "common"
    for flavour in ("cuda", "rocm"):
        r = subprocess.run([sys.executable, str(ROOT / "build_tools" / "gpusim.py"), "--flavour",
                            flavour, "--src", str(common), "--dst", str(tmp_path / flavour),
                            "--print-outputs"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        outs = [Path(p) for p in r.stdout.split()]
        assert any(p.name == "fused_attn.cu" for p in outs)
        assert not any("platform/gpusim" in p.as_posix() for p in outs)
        assert not any("<<<" in p.read_text() for p in outs if p.suffix == ".cu")

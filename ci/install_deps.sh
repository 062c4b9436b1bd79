#!/usr/bin/env bash
# Installs what building and testing need on a fresh machine of this kind, then the package itself
# (editable, so build/cmake is reused by later builds). Idempotent; quiet unless something fails.
# Python packages go into the virtual environment of ci/_venv.sh (TE_LITE_VENV, default build/venv),
# created here; Debian packages (gtest, ninja, qemu-user, the HIP toolchain, clang for fuzzing)
# through apt-get.
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$REPO_ROOT/ci/_venv.sh"
start=$SECONDS

# qemu-user: ci/isa_matrix.sh runs a subset as a Haswell CPU (no AVX-512, CPUID included).
if ! [ -e /usr/include/gtest/gtest.h ] || ! command -v ninja >/dev/null ||
    ! command -v qemu-x86_64 >/dev/null; then
  if command -v apt-get >/dev/null; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libgtest-dev ninja-build >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq qemu-user >/dev/null ||
      echo "ci/install_deps.sh: qemu-user not installed (the ISA matrix skips its qemu subset)" >&2
  fi
fi
# Debian's HIP 5.2 toolchain for ci/build_rocm.sh (hipcc pulls clang-15, llvm-15, clang-tools-15).
# Best effort: where apt has no such packages, build_rocm.sh fails with its own message.
if ! command -v hipcc >/dev/null || ! [ -e /usr/include/hip/hip_runtime.h ] ||
    ! compgen -G "/usr/lib/*/amdgcn/bitcode/ocml.bc" >/dev/null; then
  if command -v apt-get >/dev/null; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq hipcc libamdhip64-dev \
      rocm-device-libs >/dev/null || echo "ci/install_deps.sh: HIP toolchain not installed" >&2
  fi
fi
# clang with libFuzzer and the sanitizer runtimes for ci/fuzz.sh: bookworm's clang-15, whose
# libclang-common-15-dev holds libclang_rt.fuzzer (newer Debian: clang + libclang-rt-dev). Best
# effort: without it ci/fuzz.sh fails with a message naming these packages (NVTE_CI_FUZZ=0 skips it).
if ! compgen -G "/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a" >/dev/null ||
    ! compgen -G "/usr/bin/clang++*" >/dev/null; then
  if command -v apt-get >/dev/null; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang-15 libclang-common-15-dev \
      >/dev/null 2>&1 ||
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang libclang-rt-dev >/dev/null ||
      echo "ci/install_deps.sh: clang with libFuzzer not installed (ci/fuzz.sh needs it)" >&2
  fi
fi
# torch==2.13.0 is pinned: it is the CPU build on this machine's disk (a plain "torch" would pull
# several GB of CUDA wheels). oneDNN 3.2 (GNU OpenMP flavour, no SYCL) provides the CPU GEMM.
# pip's output goes to a log that is printed only when a step fails (a failed build must stop here,
# not leave an old library in place).
pip_quiet() {
  local log
  log=$(mktemp)
  if ! python -m pip "$@" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "ci/install_deps.sh: pip $* failed" >&2
    return 1
  fi
  rm -f "$log"
}
te_venv_create
te_venv_activate
pip_quiet install --disable-pip-version-check setuptools wheel torch==2.13.0 onednn-cpu-gomp \
  onednn-devel-cpu-gomp numpy ml_dtypes pytest matplotlib tqdm
# The JAX front end (CPU jaxlib; its XLA FFI headers build transformer_engine_lite/jax/csrc).
# Pinned: the primitives use jax internals (custom_partitioning, batching) checked on this version.
pip_quiet install --disable-pip-version-check jax==0.10.2 jaxlib==0.10.2 flax==0.12.8
# Triton: the AOTriton backend's kernels compiled ahead of time by GPU builds (gfx90a/gfx942 hsaco,
# sm_80/sm_90 cubins; no GPU needed) and run on the CPU by its interpreter in the tests. Pinned: the
# AOT build and the interpreter hooks of the tests are checked on this version.
pip_quiet install --disable-pip-version-check triton==3.9.0
# The build picks CUDA where nvcc is on PATH (build_tools/utils.py); its GEMM uses cuBLASLt, whose
# headers come from PyPI. Best effort: without it the build uses the tiled GEMM and says so.
backend=$(python -c "import sys; sys.path.insert(0, '$REPO_ROOT'); from build_tools import utils; print(utils.detect_backend().backend)")
if [ "$backend" = cuda ] && ! python -m pip show -q nvidia-cublas >/dev/null 2>&1; then
  pip_quiet install --disable-pip-version-check nvidia-cublas ||
    echo "ci/install_deps.sh: nvidia-cublas not installed; CUDA GEMMs will use the tiled kernel" >&2
fi
# Unmodified TE clients for tests/integration (ci/integration.sh), pinned. megatron-core's wheel
# declares Python >= 3.12, but its cp311 build runs on 3.11; its runtime needs (torch, numpy,
# packaging) are installed above, so it goes in without resolving dependencies.
pip_quiet install --disable-pip-version-check --no-deps --ignore-requires-python megatron-core==0.19.2
pip_quiet install --disable-pip-version-check accelerate==1.15.0 packaging
# HF transformers (tests/integration/test_hf_transformers.py: save_pretrained / from_pretrained of a
# model holding TE layers); it does not depend on torch, so pip resolves no CUDA wheels.
pip_quiet install --disable-pip-version-check transformers==5.24.0
pip_quiet install --disable-pip-version-check --no-build-isolation -e "$REPO_ROOT"
python -c "import transformer_engine_lite as te; i = te.build_info(); print('transformer_engine_lite', te.__version__, i['device_backends'], 'gpu_gemm', i['gpu_gemm'], 'cpu_isa', i['cpu_isa']['level'], 'onednn_isa', i['onednn_isa'], 'python', __import__('sys').prefix)"
python -c "import transformer_engine_lite.jax as te; print('transformer_engine_lite.jax:', len(te.cpp_extensions.registrations()), 'XLA FFI handlers')"
echo "ci/install_deps.sh: done in $((SECONDS - start)) s"

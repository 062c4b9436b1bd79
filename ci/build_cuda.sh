#!/usr/bin/env bash
# CUDA backend, compiled and checked without a GPU (ARCHITECTURE.md §9). Library in build/ci-cuda
# (reused between runs): NVTE_WERROR=ON, ptxas -v through the kernel_resources.py launcher, every
# symbol resolved at link time. Tags:
#   build.cuda.library     configure + build; fails on any error or warning
#                          (log: build/ci-cuda/build.log)
#   build.cuda.resources   per-kernel registers / spills / shared memory per arch, printed and
#                          written to build/ci-cuda/kernel_resources.txt
#   build.cuda.gpu_tests   tests/cpp/gpu built against it (-Werror) and run: they skip without a GPU
#   build.cuda.driverless  no libcuda/libcudart/libcublas dependency; imports, and GPU ops fail
#                          cleanly here
# NVTE_CUDA_ARCHS (default 80;90) picks the archs.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/_utils.sh"
BACKEND=cuda
BUILD=${NVTE_CI_CUDA_BUILD_DIR:-$REPO_ROOT/build/ci-cuda}
source "$(dirname "${BASH_SOURCE[0]}")/_gpu_build.sh"

configure_prereqs() {
  command -v nvcc >/dev/null || {
    echo "ci/build_cuda.sh: expected nvcc on PATH (CUDA toolkit), got none" >&2
    return 1
  }
  # cuBLASLt comes from PyPI (headers + libraries), where the GEMM's CMake looks for it.
  if [ -e "$REPO_ROOT/transformer_engine_lite/common/gemm/cublaslt.cmake" ] &&
      ! python -m pip show -q nvidia-cublas >/dev/null 2>&1; then
    python -m pip install -q --disable-pip-version-check nvidia-cublas 2>&1 \
      | grep -v "Running pip as the 'root'" || true
  fi
}

# ptxas -v output of each nvcc call is kept beside its object by the capture launcher, so the table
# is complete after an incremental build too; --no-undefined: a missing launcher fails the link.
configure_library() {
  local launcher="$(command -v python);$REPO_ROOT/build_tools/kernel_resources.py;capture"
  cmake -S "$REPO_ROOT" -B "$BUILD" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DNVTE_BACKEND=cuda "-DNVTE_CUDA_ARCHS=${NVTE_CUDA_ARCHS:-80;90}" -DNVTE_WERROR=ON \
    -DNVTE_PTXAS_VERBOSE=ON "-DCMAKE_CUDA_COMPILER_LAUNCHER=$launcher" \
    -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--no-undefined
}

# The CUDA runtime is linked statically and finds the driver (libcuda) only when first used;
# cuBLASLt is opened at the first GEMM.
no_runtime_dependency() {
  local needed
  needed=$(readelf -d "$LIB_DIR/libtransformer_engine_lite.so" | grep NEEDED) || return 1
  if echo "$needed" | grep -Eq 'libcuda\.so|libcudart\.so|libcublas'; then
    echo "ci: expected no libcuda/libcudart/libcublas dependency, got:" >&2
    echo "$needed" >&2
    return 1
  fi
}

cuda_driverless() { ensure_library && no_runtime_dependency && driverless; }

run_tagged build.cuda.library ensure_library
run_tagged build.cuda.resources kernel_table
run_tagged build.cuda.gpu_tests gpu_tests
run_tagged build.cuda.driverless cuda_driverless
finish_tests build.cuda

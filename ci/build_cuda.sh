#!/usr/bin/env bash
# CUDA backend, compiled and checked without a GPU (ARCHITECTURE.md §9). Library in build/ci-cuda
# (reused between runs): NVTE_WERROR=ON, ptxas -v through the kernel_resources.py launcher, every
# symbol resolved at link time. Tags:
#   build.cuda.library     configure + build; fails on any error or warning
#                          (log: build/ci-cuda/build.log)
#   build.cuda.resources   per-kernel registers / spills / shared memory per arch, printed and
#                          written to build/ci-cuda/kernel_resources.txt
#   build.cuda.aotriton     the AOTriton images of the build (build_tools/aotriton.py: every Triton
#                          attention variant for every target arch) and their resource table
#                          (written to build/ci-cuda/aotriton_resources.txt)
#   build.cuda.aotriton_launch  the AOTriton glue run against a stand-in driver (tests/cpp/aotriton)
#   build.cuda.aotriton_reproducible  a rebuild of one arch's images with an empty Triton cache is
#                          byte-identical
#   build.cuda.gpu_tests   tests/cpp/gpu built against it (-Werror) and run: they skip without a GPU
#   build.cuda.driverless  no libcuda/libcudart/libcublas dependency; imports, and GPU ops fail
#                          cleanly here
#   build.cuda.cublaslt_optional  configure only, with cuBLASLt hidden: NVTE_WITH_CUBLASLT=AUTO (the
#                          default) falls back to the tiled GEMM with one line; ON fails, naming it
#   build.cuda.gpu_check_dry_run  ci/gpu_check.sh --dry-run: the lent-GPU check up to its first
#                          device use (its own sm_90 build in build/gpu-check, gtest and pytest
#                          collection, sanitizer cases, timing cases), so the command cannot rot;
#                          ~4 min on 2 cores (logs: build/gpu_check/out)
# This build asks for cuBLASLt explicitly (NVTE_WITH_CUBLASLT=ON): its path must compile here.
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
    -DNVTE_WITH_CUBLASLT=ON \
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

# A machine without cuBLASLt: no Python to find PyPI's wheel, no root; the toolkit has no cuBLAS here
# (if a toolkit does ship it, AUTO finds it and the check accepts that too).
cublaslt_optional() {
  local dir out
  dir=$(mktemp -d)
  out=$(cmake -S "$REPO_ROOT" -B "$dir/auto" "${GENERATOR[@]}" -DNVTE_BACKEND=cuda \
    -DNVTE_WITH_ONEDNN=OFF -DPython3_EXECUTABLE=/nonexistent 2>&1) || {
    echo "$out" | tail -20
    echo "ci: NVTE_WITH_CUBLASLT=AUTO failed to configure without cuBLASLt" >&2
    rm -rf "$dir"
    return 1
  }
  echo "$out" | grep 'cuBLASLt:'
  if echo "$out" | grep -q 'cuBLASLt: not found'; then
    if cmake -S "$REPO_ROOT" -B "$dir/on" "${GENERATOR[@]}" -DNVTE_BACKEND=cuda \
        -DNVTE_WITH_ONEDNN=OFF -DPython3_EXECUTABLE=/nonexistent -DNVTE_WITH_CUBLASLT=ON \
        > "$dir/on.log" 2>&1; then
      echo "ci: NVTE_WITH_CUBLASLT=ON configured without cuBLASLt (expected an error)" >&2
      rm -rf "$dir"
      return 1
    fi
    grep -m1 -A1 'NVTE_WITH_CUBLASLT=ON: expected cuBLASLt' "$dir/on.log"
  fi
  rm -rf "$dir"
}

run_tagged build.cuda.library ensure_library
run_tagged build.cuda.resources kernel_table
run_tagged build.cuda.gpu_tests gpu_tests
run_tagged build.cuda.aotriton aotriton_images
run_tagged build.cuda.aotriton_launch aotriton_launch
run_tagged build.cuda.aotriton_reproducible aotriton_reproducible
run_tagged build.cuda.driverless cuda_driverless
run_tagged build.cuda.cublaslt_optional cublaslt_optional
run_tagged build.cuda.gpu_check_dry_run bash "$REPO_ROOT/ci/gpu_check.sh" --dry-run
finish_tests build.cuda

#!/usr/bin/env bash
# ROCm backend, compiled and checked without a GPU (ARCHITECTURE.md §9): the CUDA sources hipified
# into build/ci-rocm (reused between runs) and compiled by Debian's HIP 5.2 toolchain (clang-15,
# what hipcc runs; HIP_PLATFORM=amd) for gfx90a (OCP FP8) and gfx940 (FNUZ FP8) with
# NVTE_WERROR=ON. Tags:
#   build.rocm.library     hipify + configure + build; fails on any error or warning
#                          (log: build/ci-rocm/build.log, with the -Rpass-analysis resource remarks)
#   build.rocm.resources   per-kernel VGPR/AGPR/SGPR, spills, LDS, scratch per arch from the code
#                          objects, printed and written to build/ci-rocm/kernel_resources.txt
#   build.rocm.aotriton     the AOTriton images of the build (build_tools/aotriton.py: every Triton
#                          attention variant for every target arch) and their resource table
#                          (written to build/ci-rocm/aotriton_resources.txt)
#   build.rocm.aotriton_launch  the AOTriton glue run against a stand-in driver (tests/cpp/aotriton)
#   build.rocm.gpu_tests   tests/cpp/gpu hipified, built against it (-Werror) and run: they skip
#   build.rocm.driverless  imports on this GPU-less host, and GPU ops fail cleanly
# NVTE_ROCM_ARCH overrides the archs (Debian's clang 15 knows up to gfx940, not gfx942).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/_utils.sh"
BACKEND=rocm
BUILD=${NVTE_CI_ROCM_BUILD_DIR:-$REPO_ROOT/build/ci-rocm}
source "$(dirname "${BASH_SOURCE[0]}")/_gpu_build.sh"
export HIP_PLATFORM=amd  # Debian's hipcc/hipconfig target NVIDIA when nvcc is installed

configure_prereqs() {
  local rocm=${ROCM_PATH:-/opt/rocm}
  if ! command -v hipcc >/dev/null ||
      ! any_exists /usr/include/hip/hip_runtime.h "$rocm/include/hip/hip_runtime.h" ||
      ! any_exists /usr/lib/*/amdgcn/bitcode/ocml.bc "$rocm"/amdgcn/bitcode/ocml.bc; then
    install_rocm_packages || return 1
  fi
  python -c 'import importlib.util as u, sys; sys.exit(u.find_spec("torch") is None)' || {
    echo "ci/build_rocm.sh: expected PyTorch (its hipify engine) to be installed" >&2
    return 1
  }
}

any_exists() {
  local f
  for f in "$@"; do [ -e "$f" ] && return 0; done
  return 1
}

# Debian's HIP toolchain (hipcc pulls clang-15, llvm-15, clang-tools-15).
install_rocm_packages() {
  command -v apt-get >/dev/null || {
    echo "ci/build_rocm.sh: expected hipcc and the HIP headers, or apt-get to install them" >&2
    return 1
  }
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq hipcc libamdhip64-dev \
      rocm-device-libs >/dev/null
}

configure_library() {
  cmake -S "$REPO_ROOT" -B "$BUILD" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DNVTE_BACKEND=rocm "-DNVTE_ROCM_ARCH=${NVTE_ROCM_ARCH:-gfx90a;gfx940}" -DNVTE_WERROR=ON \
    -DNVTE_PTXAS_VERBOSE=ON
}

run_tagged build.rocm.library ensure_library
run_tagged build.rocm.resources kernel_table
run_tagged build.rocm.gpu_tests gpu_tests
run_tagged build.rocm.aotriton aotriton_images
run_tagged build.rocm.aotriton_launch aotriton_launch
# Not run for ROCm: one gfx942 image (attn_bwd_dkdv fp16 d128, any-stride variant) differed
# between two builds from empty caches in CI; the AMD path is not reproducible yet (see README).
run_tagged build.rocm.driverless driverless
finish_tests build.rocm

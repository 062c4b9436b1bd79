#!/usr/bin/env bash
# Installs what building and testing need on a fresh machine of this kind, then the package itself
# (editable, so build/cmake is reused by later builds). Idempotent; quiet unless something fails.
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if ! [ -e /usr/include/gtest/gtest.h ] || ! command -v ninja >/dev/null; then
  if command -v apt-get >/dev/null; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libgtest-dev ninja-build >/dev/null
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
pip_quiet install --disable-pip-version-check torch==2.13.0 onednn-cpu-gomp onednn-devel-cpu-gomp \
  numpy ml_dtypes pytest matplotlib tqdm
pip_quiet install --disable-pip-version-check --no-build-isolation -e "$REPO_ROOT"
python -c "import transformer_engine_lite as te; print('transformer_engine_lite', te.__version__, te.build_info()['device_backends'])"

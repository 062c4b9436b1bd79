#!/usr/bin/env bash
# The README's test command: installs everything, builds once, runs every suite, then compiles the CUDA
# and ROCm backends with warnings as errors (build.cuda.*, build.rocm.*: no GPU needed); exits non-zero
# on any failure. TEST_FILTER / TEST_LEVEL (see ci/_utils.sh) narrow what runs.
set -u
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$REPO_ROOT/ci/install_deps.sh" || exit 1
rc=0
bash "$REPO_ROOT/ci/core.sh" || rc=1
bash "$REPO_ROOT/ci/python.sh" || rc=1
bash "$REPO_ROOT/ci/pytorch.sh" || rc=1
bash "$REPO_ROOT/ci/build_cuda.sh" || rc=1
bash "$REPO_ROOT/ci/build_rocm.sh" || rc=1
echo "ci/run_all.sh: $([ $rc -eq 0 ] && echo all suites passed || echo some suites FAILED)"
exit $rc

#!/usr/bin/env bash
# Core C++ suites: configure + build tests/cpp against the installed library, run each test executable
# under ctest as tag core.<executable> (e.g. core.test_quantize).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/_utils.sh"

BUILD=${NVTE_TEST_BUILD_DIR:-$REPO_ROOT/build/tests-cpp}
LIB_DIR=$(python -c "import os, transformer_engine_lite.common as c; print(os.path.dirname(c.lib_path()))") || {
  echo "ci/core.sh: transformer_engine_lite is not installed" >&2
  exit 1
}

if [ "${TEST_LIST_ONLY:-0}" != 1 ]; then
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S "$REPO_ROOT/tests/cpp" -B "$BUILD" "${generator[@]}" -DTE_LIB_DIR="$LIB_DIR" >/dev/null || exit 1
  cmake --build "$BUILD" --parallel "$(nproc)" || exit 1
fi

for src in "$REPO_ROOT"/tests/cpp/test_*.cpp; do
  name=$(basename "$src" .cpp)
  # Test names carry their executable as prefix (TEST_PREFIX in tests/cpp/CMakeLists.txt); -j runs the
  # cases of one executable on both cores.
  run_tagged "core.$name" ctest --test-dir "$BUILD" -R "^${name}\\." -j "$(nproc)" \
    --timeout "$CTEST_TIMEOUT" --output-on-failure --no-tests=error
done
run_tagged core.c_api_headers ctest --test-dir "$BUILD" -R '^CApi\.' --output-on-failure --no-tests=error

finish_tests core

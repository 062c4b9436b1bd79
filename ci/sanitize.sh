#!/usr/bin/env bash
# The core library and its C++ tests built with AddressSanitizer + UndefinedBehaviorSanitizer (leak
# checking on) in their own build folders (build/sanitize, build/sanitize-tests; CPU backend only,
# reused between runs), then every gtest executable run once under them. Any sanitizer report fails
# the tag (halt_on_error; UBSan does not recover). Both are compiled at -O1 (NVTE_CXX_OPT,
# NVTE_TEST_OPT; -O3 and -O2 elsewhere), the level ASan recommends: the checks are inserted before
# optimisation, so none is lost (-O3 can only drop accesses it proves safe), and the results are the
# same bits (-ffp-contract=off, no fast-math); the build, ~90% of this suite at -O3, takes half the
# CPU time (the attention kernels a quarter), the runs about twice as long. Tags:
#   sanitize.build          library + tests, -fsanitize=address,undefined
#   sanitize.<test exe>     one per tests/cpp/test_*.cpp (all its cases in one process)
# Uninstrumented dependencies (oneDNN, libgomp) run as they are; ASan still checks every access our
# code makes into their buffers.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/_utils.sh"

LIB_BUILD=${NVTE_SANITIZE_BUILD_DIR:-$REPO_ROOT/build/sanitize}
TESTS_BUILD=$LIB_BUILD-tests
SAN_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g1"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

build() {
  local log=$LIB_BUILD.log
  mkdir -p "$LIB_BUILD"
  {
    cmake -S "$REPO_ROOT" -B "$LIB_BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DNVTE_BACKEND=cpu -DNVTE_CXX_OPT=-O1 "-DCMAKE_CXX_FLAGS=$SAN_FLAGS" "-DCMAKE_C_FLAGS=$SAN_FLAGS" \
      "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address,undefined" &&
      cmake --build "$LIB_BUILD" --parallel "$(nproc)" &&
      cmake -S "$REPO_ROOT/tests/cpp" -B "$TESTS_BUILD" "${generator[@]}" \
        "-DTE_LIB_DIR=$LIB_BUILD/transformer_engine_lite/common" -DNVTE_TEST_OPT=-O1 \
        "-DCMAKE_CXX_FLAGS=$SAN_FLAGS" \
        "-DCMAKE_C_FLAGS=$SAN_FLAGS" "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined" &&
      cmake --build "$TESTS_BUILD" --parallel "$(nproc)"
  } > "$log" 2>&1 || {
    tail -40 "$log"
    echo "ci/sanitize.sh: the sanitizer build failed (log: $log)" >&2
    return 1
  }
}

# One executable, all cases; the sanitizers' reports go to the output, which is shown on failure.
run_exe() {
  local exe=$1 out
  out=$(OMP_NUM_THREADS=2 "$TESTS_BUILD/$exe" --gtest_brief=1 2>&1) || {
    echo "$out" | grep -E -A30 'ERROR: (Address|Leak)Sanitizer|runtime error:' | head -60
    echo "$out" | tail -15
    echo "ci/sanitize.sh: $exe failed under ASan/UBSan" >&2
    return 1
  }
  if echo "$out" | grep -qE 'ERROR: (Address|Leak)Sanitizer|runtime error:'; then
    echo "$out" | grep -E -A30 'ERROR: (Address|Leak)Sanitizer|runtime error:' | head -60
    return 1
  fi
  echo "  $exe: $(echo "$out" | grep -E '^\[==========\]' | tail -1)"
}

run_tagged sanitize.build build
for src in "$REPO_ROOT"/tests/cpp/test_*.cpp; do
  name=$(basename "$src" .cpp)
  run_tagged "sanitize.$name" run_exe "$name"
done
finish_tests sanitize

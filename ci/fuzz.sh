#!/usr/bin/env bash
# libFuzzer harnesses of the C API (tests/fuzz/fuzz_*.cpp) under AddressSanitizer +
# UndefinedBehaviorSanitizer. The core (CPU backend) is built with clang and
# -fsanitize=fuzzer-no-link,address,undefined in its own build folder, the harnesses with
# -fsanitize=fuzzer,address,undefined (build/fuzz/{lib,harnesses}, reused between runs). Then, per
# harness: the committed corpus (tests/fuzz/corpus/<harness>/, regressions/ included) is replayed
# once with per-op status counts, and libFuzzer runs for a fixed time from a copy of it (the repo is
# never written): -max_total_time=$NVTE_FUZZ_SECONDS -seed=1 -timeout=10 -rss_limit_mb=2048.
# Any crash, sanitizer report, timeout, leak or contract violation (tests/fuzz/fuzz_common.h) fails
# the tag; the input is kept under build/fuzz/run/<harness>/ and the log says how to replay it.
# Tags:
#   fuzz.build        the sanitized core + the harnesses
#   fuzz.<harness>    one per tests/fuzz/fuzz_*.cpp (replay, then the timed run)
# Environment: NVTE_FUZZ_SECONDS (default 20; 0 = replay only), NVTE_CI_FUZZ=0 skips the suite (for
# machines without clang; CI installs it through ci/install_deps.sh).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/_utils.sh"

FUZZ_DIR=$REPO_ROOT/build/fuzz
LIB_BUILD=$FUZZ_DIR/lib
HARNESS_BUILD=$FUZZ_DIR/harnesses
RUN_DIR=$FUZZ_DIR/run
CORPUS=$REPO_ROOT/tests/fuzz/corpus
FUZZ_SECONDS=${NVTE_FUZZ_SECONDS:-20}
CORE_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g1"
# Reports of the harness processes: leaks on, and the first error ends the run.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OMP_NUM_THREADS=1  # oneDNN's threads: one keeps executions comparable between runs
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
HARNESSES=()
for src in "$REPO_ROOT"/tests/fuzz/fuzz_*.cpp; do HARNESSES+=("$(basename "$src" .cpp)"); done
SUMMARY=()

if [ "${NVTE_CI_FUZZ:-1}" = 0 ]; then
  echo "ci/fuzz.sh: skipped (NVTE_CI_FUZZ=0)"
  exit 0
fi

# clang with libFuzzer: clang++ if it has the runtime, else the newest clang++-N that has it.
find_clang() {
  local probe cxx
  probe=$(mktemp -d)
  printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char *, unsigned long) { return 0; }\n' \
    >"$probe/p.cpp"
  for cxx in clang++ clang++-19 clang++-18 clang++-17 clang++-16 clang++-15 clang++-14; do
    command -v "$cxx" >/dev/null || continue
    if "$cxx" -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" >/dev/null 2>&1; then
      rm -rf "$probe"
      echo "$cxx"
      return 0
    fi
  done
  rm -rf "$probe"
  return 1
}

build() {
  local log=$FUZZ_DIR/build.log cxx cc gomp
  mkdir -p "$FUZZ_DIR"
  cxx=$(find_clang) || {
    echo "ci/fuzz.sh: no clang++ with libFuzzer found (Debian: apt-get install clang-15" \
      "libclang-common-15-dev, which ci/install_deps.sh installs; NVTE_CI_FUZZ=0 skips this suite)" >&2
    return 1
  }
  cc=${cxx/clang++/clang}
  # The core's OpenMP: clang without libomp takes GNU's runtime (-fopenmp=libgomp links libgomp and
  # compiles the pragmas away, so the fuzzing build of the kernels is serial).
  gomp=$(gcc -print-file-name=libgomp.so 2>/dev/null || "$cxx" -print-file-name=libgomp.so)
  echo "  compiler: $("$cxx" --version | head -1) ($cxx)"
  {
    cmake -S "$REPO_ROOT" -B "$LIB_BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DNVTE_BACKEND=cpu "-DCMAKE_C_COMPILER=$cc" "-DCMAKE_CXX_COMPILER=$cxx" \
      "-DCMAKE_CXX_FLAGS=$CORE_FLAGS" "-DCMAKE_C_FLAGS=$CORE_FLAGS" \
      "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address,undefined" \
      -DOpenMP_CXX_FLAGS=-fopenmp=libgomp -DOpenMP_CXX_LIB_NAMES=gomp "-DOpenMP_gomp_LIBRARY=$gomp" &&
      cmake --build "$LIB_BUILD" --parallel "$(nproc)" &&
      cmake -S "$REPO_ROOT/tests/fuzz" -B "$HARNESS_BUILD" "${generator[@]}" \
        -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_COMPILER=$cxx" \
        "-DTE_LIB_DIR=$LIB_BUILD/transformer_engine_lite/common" &&
      cmake --build "$HARNESS_BUILD" --parallel "$(nproc)"
  } >"$log" 2>&1 || {
    tail -40 "$log"
    echo "ci/fuzz.sh: the fuzzing build failed (log: $log)" >&2
    return 1
  }
}

# Replays the committed corpus (seeds + regressions/) once: every input must pass, and the counts
# show the seeds reach successful calls.
replay() {
  local name=$1 exe=$2 out
  local files=()
  while IFS= read -r -d '' f; do files+=("$f"); done < <(find "$CORPUS/$name" -type f -print0 | sort -z)
  if [ "${#files[@]}" -eq 0 ]; then
    echo "ci/fuzz.sh: no committed corpus in tests/fuzz/corpus/$name" >&2
    return 1
  fi
  out=$(cd "$RUN_DIR/$name" && NVTE_FUZZ_STATS=1 "$exe" -timeout=10 -rss_limit_mb=2048 "${files[@]}" 2>&1) || {
    echo "$out" | grep -v '^Running:\|^Executed' | tail -60
    echo "ci/fuzz.sh: $name failed on a committed input (replay one: $exe FILE)" >&2
    return 1
  }
  local ok  # successful calls of the harness's ops (handle setup is counted in fuzz_tensor only)
  ok=$(echo "$out" | awk -v h="$name" '/^fuzz-stats/ && (h == "fuzz_tensor" ||
    $2 !~ /^nvte_set_tensor_(param|device):$/) {s += $3} END {print s + 0}')
  echo "$out" | grep '^fuzz-stats' | sed 's/^fuzz-stats /    /'
  if [ "$ok" -eq 0 ]; then
    echo "ci/fuzz.sh: the committed corpus of $name reaches no successful call" >&2
    return 1
  fi
  echo "  replay: ${#files[@]} committed inputs, $ok successful calls"
}

run_harness() {
  local name=$1 exe=$HARNESS_BUILD/$1 dir=$RUN_DIR/$1 log rc execs
  rm -rf "$dir"
  mkdir -p "$dir/corpus"
  replay "$name" "$exe" || return 1
  [ "$FUZZ_SECONDS" -gt 0 ] || return 0
  cp -r "$CORPUS/$name/." "$dir/corpus/"
  log=$dir/fuzz.log
  (cd "$dir" && "$exe" corpus -max_total_time="$FUZZ_SECONDS" -seed=1 -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$dir/" >"$log" 2>&1)
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  local found
  found=$(find "$dir" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
    -o -name 'oom-*' -o -name 'slow-unit-*' \) | head -5)
  if [ "$rc" -ne 0 ] || [ -n "$found" ]; then
    grep -v '^#\|^INFO:\|^\s*NEW_FUNC\|^"' "$log" | tail -60
    echo "ci/fuzz.sh: $name failed (exit $rc) after ${execs:-?} executions; input(s): ${found:-none}" >&2
    echo "  replay: $exe ${found%%$'\n'*}   (keep it: tests/fuzz/corpus/$name/regressions/)" >&2
    SUMMARY+=("$name: FAILED after ${execs:-?} executions")
    return 1
  fi
  local units
  units=$(find "$dir/corpus" -type f | wc -l)
  echo "  $name: $execs executions in $FUZZ_SECONDS s, corpus $(find "$CORPUS/$name" -type f | wc -l) -> $units inputs"
  SUMMARY+=("$name: $execs executions in $FUZZ_SECONDS s")
}

build_start=$SECONDS
run_tagged fuzz.build build
[ "${TEST_LIST_ONLY:-0}" = 1 ] || echo "  build: $((SECONDS - build_start)) s"
if [[ " ${_TE_FAILED[*]} " == *" fuzz.build "* ]]; then
  finish_tests fuzz
  exit 1
fi
for name in "${HARNESSES[@]}"; do
  run_tagged "fuzz.$name" run_harness "$name"
done
if [ "${TEST_LIST_ONLY:-0}" != 1 ] && [ "${#SUMMARY[@]}" -gt 0 ]; then
  echo "::: fuzz executions (-seed=1, ${FUZZ_SECONDS} s each)"
  printf '    %s\n' "${SUMMARY[@]}"
fi
finish_tests fuzz

#!/usr/bin/env bash
# The README's test command: installs everything (into the virtual environment of ci/_venv.sh), builds
# once, runs every suite (core, python, pytorch, jax, integration: Megatron-Core and accelerate
# unmodified through the transformer_engine alias), the CPU-level matrix (ci/isa_matrix.sh), the C++ suites under ASan + UBSan
# (ci/sanitize.sh), the libFuzzer harnesses of the C API (ci/fuzz.sh), the GPU kernels executed on
# the CPU at warp 32 and 64 (ci/gpusim.sh), then compiles the CUDA and ROCm backends with warnings as
# errors (build.cuda.*, build.rocm.*, incl. ci/gpu_check.sh --dry-run: no GPU needed); exits non-zero
# on any failure. pytorch || jax, integration || fuzz and isa_matrix || sanitize run two at a time
# (suite_pair).
# TEST_FILTER / TEST_LEVEL (see ci/_utils.sh) narrow what runs.
set -u
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
start=$SECONDS
bash "$REPO_ROOT/ci/install_deps.sh" || exit 1
rc=0
times=()
failed=()
LOGS=$REPO_ROOT/build/ci_logs
mkdir -p "$LOGS"
# suite NAME: runs ci/NAME.sh, records its time; its output is also kept in build/ci_logs/NAME.log so
# that the digest at the end can quote a failed suite's failures (CI shows only a log's tail).
suite() {
  local start=$SECONDS
  bash "$REPO_ROOT/ci/$1.sh" 2>&1 | tee "$LOGS/$1.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { rc=1; failed+=("$1"); }
  times+=("$1 $((SECONDS - start)) s")
}
# suite_pair A B: two suites at once, where each leaves a core idle much of the time (pytest
# processes run the core's kernels on one OpenMP thread, libFuzzer is single-threaded, qemu and the
# level matrix's Python start-ups are serial); none of them times anything. Their output is kept in
# build/ci_logs/NAME.log and printed after both end, A first, so the log reads as if sequential;
# each suite's own time is recorded. NVTE_CI_SERIAL=1 runs them one after the other.
suite_pair() {
  if [ "${NVTE_CI_SERIAL:-0}" = 1 ]; then
    suite "$1"
    suite "$2"
    return
  fi
  local logs=$LOGS start=$SECONDS name pid
  local -A pids
  for name in "$1" "$2"; do
    (s=$SECONDS; bash "$REPO_ROOT/ci/$name.sh" > "$logs/$name.log" 2>&1; r=$?
      echo "$((SECONDS - s))" > "$logs/$name.time"; exit $r) &
    pids[$name]=$!
  done
  for name in "$1" "$2"; do
    wait "${pids[$name]}" || { rc=1; failed+=("$name"); }
  done
  for name in "$1" "$2"; do
    cat "$logs/$name.log"
    times+=("$name $(cat "$logs/$name.time") s")
  done
  times+=("($1 || $2: $((SECONDS - start)) s)")
}
suite core
suite python
suite_pair pytorch jax
suite_pair integration fuzz
suite_pair isa_matrix sanitize
suite gpusim
suite build_cuda
suite build_rocm
# The digest: for each failed suite, its failed tags and the lines that name a failing test
# (pytest's "FAILED file::case", gtest's "[  FAILED  ]", Python tracebacks' last line), at most 40.
for name in "${failed[@]}"; do
  echo "ci/run_all.sh: FAILED suite $name; its failures (full log: build/ci_logs/$name.log):"
  grep -E '^    FAILED: |^FAILED |^ERROR |\[  FAILED  \]|^E  +[A-Za-z]*(Error|Exception)|Timeout|Segmentation|Aborted' \
    "$LOGS/$name.log" | head -40 | sed 's/^/  | /'
done
printf 'ci/run_all.sh: suite times: %s\n' "$(IFS=,; echo "${times[*]}")"
echo "ci/run_all.sh: $([ $rc -eq 0 ] && echo all suites passed || echo "suites FAILED: ${failed[*]}")" \
  "in $((SECONDS - start)) s"
exit $rc

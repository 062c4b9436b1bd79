#!/usr/bin/env bash
# Shared steps of ci/build_cuda.sh and ci/build_rocm.sh (sourced after _utils.sh, not run). The
# caller sets BACKEND (cuda|rocm), BUILD (library build folder, reused between runs) and defines
# configure_library (the backend's cmake configure line). No GPU is needed: GPU code is proven by
# compiling it with warnings as errors, GPU gtests skip without a device, and the library must load
# and fail GPU ops cleanly on a host without a driver.

GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
LIB_DIR=$BUILD/transformer_engine_lite/common
TESTS_BUILD=$BUILD-tests
_LIBRARY_STATUS=""  # "", "ok" or "failed": the library is built once per run, whichever step asks
_GPU_TESTS_STATUS=""  # "ok" once gpu_tests has built tests/cpp against it

# Console filter of a build log: ROCm's kernel-resource remarks (3 lines for the first of each
# kernel: remark, source line, caret) stay in the log file only; the table has the same figures.
_quiet_remarks() {
  awk '/remark: Function Name:/ {skip = 2; next}
       skip > 0 {skip--; next}
       /\[-Rpass-analysis=kernel-resource-usage\]/ {next}
       {print}'
}

# run_logged LOG CMD...: runs CMD, appends its output to LOG, shows it minus remarks; then fails if
# CMD failed or if its output has a warning (-Werror covers the compilers; this also catches CMake,
# linker and ptxas warnings).
run_logged() {
  local log=$1 rc
  shift
  "$@" > "$log.part" 2>&1
  rc=$?
  cat "$log.part" >> "$log"
  _quiet_remarks < "$log.part"
  if [ $rc -ne 0 ]; then
    echo "ci: '$*' failed (exit $rc); full output: $log" >&2
    return $rc
  fi
  if _quiet_remarks < "$log.part" | grep -Eiq '\bwarning\b'; then
    echo "ci: warnings in the output of '$*' (expected none):" >&2
    _quiet_remarks < "$log.part" | grep -Ei '\bwarning\b' | head -20 >&2
    return 1
  fi
}

# The library, configured and built once per run (later steps reuse the result).
ensure_library() {
  if [ -z "$_LIBRARY_STATUS" ]; then
    _LIBRARY_STATUS=failed
    mkdir -p "$BUILD"
    : > "$BUILD/build.log"
    if configure_prereqs && run_logged "$BUILD/build.log" configure_library &&
        run_logged "$BUILD/build.log" cmake --build "$BUILD" --parallel "$(nproc)"; then
      _LIBRARY_STATUS=ok
    fi
  fi
  if [ "$_LIBRARY_STATUS" != ok ]; then
    echo "ci: the $BACKEND library did not build (see $BUILD/build.log)" >&2
    return 1
  fi
}

kernel_table() {
  ensure_library || return 1
  python "$REPO_ROOT/build_tools/kernel_resources.py" table --backend "$BACKEND" \
    --build-dir "$BUILD" --out "$BUILD/kernel_resources.txt" || return 1
  echo "ci: table written to $BUILD/kernel_resources.txt"
}

# tests/cpp/gpu against this library with -Werror, then every test_gpu_* executable once: each case
# skips without a device (a process per executable, not per case: ctest would start ~2,000).
gpu_tests() {
  ensure_library || return 1
  local log=$TESTS_BUILD/build.log exe n=0 out ran skipped
  mkdir -p "$TESTS_BUILD"
  : > "$log"
  run_logged "$log" cmake -S "$REPO_ROOT/tests/cpp" -B "$TESTS_BUILD" "${GENERATOR[@]}" \
    -DTE_LIB_DIR="$LIB_DIR" -DNVTE_TEST_GPU=ON -DNVTE_TEST_GPU_BACKEND="$BACKEND" \
    -DNVTE_TEST_CPU=OFF "-DNVTE_TEST_AOTRITON_DIR=$(aotriton_dir_if_built)" || return 1
  run_logged "$log" cmake --build "$TESTS_BUILD" --parallel "$(nproc)" || return 1
  _GPU_TESTS_STATUS=ok
  for exe in "$TESTS_BUILD"/test_gpu_*; do
    [ -x "$exe" ] || continue
    n=$((n + 1))
    out=$("$exe" --gtest_brief=1 2>&1) || {
      echo "$out" | tail -30
      echo "ci: $(basename "$exe") failed" >&2
      return 1
    }
    ran=$(echo "$out" | grep -E '^\[==========\] [0-9]+ tests? from' | grep -oE '[0-9]+' | head -1)
    skipped=$(echo "$out" | grep -E '^\[  SKIPPED \] [0-9]+' | grep -oE '[0-9]+' | head -1)
    echo "$(basename "$exe"): ${ran:-0} cases, ${skipped:-0} skipped (no device), exit 0"
  done
  if [ $n -eq 0 ]; then
    echo "ci: expected GPU test executables (tests/cpp/gpu/test_gpu_*.cpp), got none" >&2
    return 1
  fi
}

# ---- AOTriton: the Triton attention kernels compiled ahead of time by the library build
# (build_tools/aotriton.py, run by gpu.cmake when triton is importable, which install_deps.sh
# ensures in CI: a build without them fails here).
AOT_DIR=$LIB_DIR/aotriton
aotriton_dir_if_built() { [ -f "$AOT_DIR/index.json" ] && echo "$AOT_DIR"; }

# The images exist for every target arch, with the per-image resource table.
aotriton_images() {
  ensure_library || return 1
  [ -f "$AOT_DIR/index.json" ] || {
    echo "ci: expected AOTriton images in $AOT_DIR (is triton installed? see $BUILD/build.log)" >&2
    return 1
  }
  python "$REPO_ROOT/build_tools/kernel_resources.py" aotriton --index "$AOT_DIR/index.json" \
    --build-dir "$BUILD" --out "$BUILD/aotriton_resources.txt" || return 1
  echo "ci: table written to $BUILD/aotriton_resources.txt"
}

# The glue, unchanged, against the stand-in driver: every launch compared with the index.
aotriton_launch() {
  [ "$_GPU_TESTS_STATUS" = ok ] && [ -x "$TESTS_BUILD/test_aotriton_launch" ] || {
    echo "ci: expected test_aotriton_launch built by the gpu_tests step (with AOTriton images)" >&2
    return 1
  }
  local out
  out=$("$TESTS_BUILD/test_aotriton_launch" --gtest_brief=1 2>&1) || {
    echo "$out" | tail -40
    return 1
  }
  echo "$out" | grep -E '^\[==========\]|PASSED|SKIPPED' | tail -3
}

# A second build with an empty Triton cache is byte-identical: every image of one arch (gfx942,
# else the last in the index; all of them would double the time and prove nothing more, the
# compile path per backend being the same).
aotriton_reproducible() {
  ensure_library || return 1
  local arch
  arch=$(python -c "import json, sys; a = json.load(open(sys.argv[1]))['archs']
print('gfx942' if 'gfx942' in a else a[-1])" "$AOT_DIR/index.json") || return 1
  python "$REPO_ROOT/build_tools/aotriton.py" verify --out "$AOT_DIR" --archs "$arch"
}

# The GPU-built library on this driverless host: imports, reports its archs, runs CPU tensors, and
# answers GPU ops with NVTE_ERROR_UNSUPPORTED naming the op.
driverless() {
  ensure_library || return 1
  NVTE_LIB_PATH=$LIB_DIR PYTHONPATH=$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH} \
    run_pytest "$REPO_ROOT/tests/python/test_gpu_build.py" -rs || return 1
  NVTE_LIB_PATH=$LIB_DIR PYTHONPATH=$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH} python -c \
    'import transformer_engine_lite as te; i = te.build_info()
print("build info:", i["device_backends"], i["gpu_fp8"])'
}

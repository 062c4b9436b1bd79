#!/usr/bin/env bash
# gpusim: the GPU kernels executed on the CPU (README "Kernels on the CPU: gpusim"). The library is
# built with NVTE_BACKEND=gpusim in both platform flavours, so both branches of the platform code
# run, and every GPU gtest (tests/cpp/gpu) and gpusim's own tests (tests/cpp/gpusim) run against it:
#   cuda flavour  the CUDA sources as written, 32-lane warps;
#   rocm flavour  the sources hipified (as the ROCm build compiles them), 64-lane warps.
# Both builds check the kernels' memory accesses (NVTE_GPUSIM_CHECK: shared-memory races between
# barriers, uninitialised shared reads, shared and global bounds) and run under UBSan; the runtime
# always checks barrier and warp divergence, lanes, shared-memory limits and stack overflows. Any
# report fails the tag. Tags (FLAVOUR = cuda | rocm):
#   gpusim.FLAVOUR.build     library + tests, -Werror (log: build/gpusim/FLAVOUR.log)
#   gpusim.FLAVOUR.<exe>     one per test executable, all its cases in one process; a skipped
#                            case fails the tag unless it is an AOTriton one (GPU code objects,
#                            which only a GPU runs)
#   gpusim.asan              the runtime and its own tests under ASan + UBSan: the fiber-switch
#                            annotations, shared-memory red zones, global heap bounds
# GPUSIM_WORKERS (default: all cores) host threads run blocks; NVTE_GPUSIM_BUILD_DIR (default
# build/gpusim) holds the builds, reused between runs.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/_utils.sh"

ROOT_BUILD=${NVTE_GPUSIM_BUILD_DIR:-$REPO_ROOT/build/gpusim}
UBSAN_FLAGS="-fsanitize=undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g1"
ASAN_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g1"
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
declare -A BUILT

# build FLAVOUR: library (access checks + UBSan) and the GPU + gpusim tests against it.
build() {
  local flavour=$1 lib=$ROOT_BUILD/$1 log=$ROOT_BUILD/$1.log
  mkdir -p "$ROOT_BUILD"
  BUILT[$flavour]=failed
  {
    cmake -S "$REPO_ROOT" -B "$lib" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DNVTE_BACKEND=gpusim "-DNVTE_GPUSIM_FLAVOUR=$flavour" -DNVTE_GPUSIM_CHECK=ON \
      -DNVTE_WERROR=ON "-DCMAKE_CXX_FLAGS=$UBSAN_FLAGS" "-DCMAKE_C_FLAGS=$UBSAN_FLAGS" \
      "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=undefined" &&
      cmake --build "$lib" --parallel "$(nproc)" &&
      cmake -S "$REPO_ROOT/tests/cpp" -B "$lib-tests" "${generator[@]}" \
        "-DTE_LIB_DIR=$lib/transformer_engine_lite/common" -DNVTE_TEST_CPU=OFF \
        -DNVTE_TEST_GPU=ON "-DNVTE_TEST_GPU_BACKEND=gpusim-$flavour" -DNVTE_GPUSIM_CHECK=ON \
        "-DCMAKE_CXX_FLAGS=$UBSAN_FLAGS" "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=undefined" &&
      cmake --build "$lib-tests" --parallel "$(nproc)"
  } > "$log" 2>&1 || {
    grep -E -B2 -A8 'error|warning' "$log" | head -60
    echo "ci/gpusim.sh: the $flavour-flavour build failed (log: $log)" >&2
    return 1
  }
  if grep -Eiq '\bwarning\b' "$log"; then
    grep -Ei -A4 '\bwarning\b' "$log" | head -30
    echo "ci/gpusim.sh: warnings in the $flavour-flavour build (expected none; log: $log)" >&2
    return 1
  fi
  BUILT[$flavour]=ok
}

# run_exe FLAVOUR EXE: every case passes, and none is skipped but AOTriton's.
run_exe() {
  local flavour=$1 exe=$2 dir=$ROOT_BUILD/$1-tests out json
  [ "${BUILT[$flavour]:-}" = ok ] || {
    echo "ci/gpusim.sh: the $flavour-flavour build did not succeed" >&2
    return 1
  }
  json=$dir/$exe.json
  # The cuda flavour runs the flash attention forward on the (emulated) tensor-core path, the rocm
  # flavour on the fp32 FMA kernel, the default: each kernel is executed once, at no extra cost.
  local mma=0
  [ "$flavour" = cuda ] && mma=1
  out=$(NVTE_GPU_FLASH_ATTN_TENSOR_CORES=$mma "$dir/$exe" --gtest_brief=1 \
    "--gtest_output=json:$json" 2>&1) || {
    echo "$out" | grep -E -A12 '^gpusim:|runtime error:|Failure' | head -60
    echo "$out" | tail -8
    echo "ci/gpusim.sh: $exe failed on gpusim ($flavour flavour)" >&2
    return 1
  }
  if echo "$out" | grep -qE '^gpusim: kernel|runtime error:'; then
    echo "$out" | grep -E -A6 '^gpusim: kernel|runtime error:' | head -40
    return 1
  fi
  python - "$json" <<'PY' || return 1
import json, re, sys
report = json.load(open(sys.argv[1]))
ran = skipped = 0
bad = []
for suite in report["testsuites"]:
    for case in suite["testsuite"]:
        ran += 1
        if case.get("result") == "SKIPPED":
            skipped += 1
            if not re.search(r"aotriton", suite["name"], re.I):
                bad.append(f"{suite['name']}.{case['name']}")
print(f"  {ran} cases, {ran - skipped} executed, {skipped} skipped (AOTriton: GPU code objects)")
if bad:
    print("ci/gpusim.sh: expected every non-AOTriton case to execute, these skipped:", *bad[:20],
          sep="\n  ", file=sys.stderr)
    sys.exit(1)
PY
}

# The runtime alone (it is all test_gpusim links) and its tests, under ASan + UBSan.
asan() {
  local lib=$ROOT_BUILD/asan log=$ROOT_BUILD/asan.log out
  {
    cmake -S "$REPO_ROOT" -B "$lib" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DNVTE_BACKEND=gpusim -DNVTE_GPUSIM_FLAVOUR=rocm "-DCMAKE_CXX_FLAGS=$ASAN_FLAGS" \
      "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address,undefined" &&
      cmake --build "$lib" --parallel "$(nproc)" --target nvte_gpusim &&
      cmake -S "$REPO_ROOT/tests/cpp" -B "$lib-tests" "${generator[@]}" \
        "-DTE_LIB_DIR=$lib/transformer_engine_lite/common" -DNVTE_TEST_GPUSIM_RUNTIME_ONLY=ON \
        -DNVTE_TEST_GPU=ON -DNVTE_TEST_GPU_BACKEND=gpusim-rocm "-DCMAKE_CXX_FLAGS=$ASAN_FLAGS" \
        "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined" &&
      cmake --build "$lib-tests" --parallel "$(nproc)"
  } > "$log" 2>&1 || {
    grep -E -B2 -A8 'error' "$log" | head -40
    echo "ci/gpusim.sh: the ASan build failed (log: $log)" >&2
    return 1
  }
  out=$(ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 "$lib-tests/test_gpusim" --gtest_brief=1 2>&1) || {
    echo "$out" | tail -40
    return 1
  }
  echo "  $(echo "$out" | grep -E '^\[==========\]' | tail -1)"
}

for flavour in cuda rocm; do
  run_tagged "gpusim.$flavour.build" build "$flavour"
  for src in "$REPO_ROOT"/tests/cpp/gpu/test_gpu_*.cpp "$REPO_ROOT"/tests/cpp/gpusim/test_*.cu; do
    name=$(basename "${src%.*}")
    run_tagged "gpusim.$flavour.$name" run_exe "$flavour" "$name"
  done
done
run_tagged gpusim.asan asan
finish_tests gpusim

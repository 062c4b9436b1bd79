#!/usr/bin/env bash
# The steps of ci/gpu_check.sh (sourced by it, not run): step_build, step_gtest, step_sanitizer,
# step_pytorch, step_jax, step_aotriton, step_timing. Each runs with its output appended to its log,
# bounds every command by the step's time (t_run), says what it found in one line (note) and returns
# 0 (ok), 3 (not available here) or another status (failed). Both modes share them: MODE=dry stops
# each one before its first use of the device.

# ------------------------------------------------------------------------------------ build
probe_env() {
  local torch jax triton gpu="(dry run: device not queried)"
  echo "machine: $(uname -srm), $JOBS cores; python $PY ($("$PY" --version 2>&1))"
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -n 1)"
  echo "cmake: $(cmake --version | head -n 1); ninja: $(ninja --version 2>/dev/null || echo none)"
  echo "compute-sanitizer: $( (command -v compute-sanitizer >/dev/null &&
    compute-sanitizer --version | tail -n 1) || echo none)"
  torch=$("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null)
  jax=$("$PY" -c 'import jax, jaxlib; print(jax.__version__)' 2>/dev/null)
  triton=$("$PY" -c 'import triton; print(triton.__version__)' 2>/dev/null)
  FRAMEWORKS=""
  [ -n "$torch" ] && FRAMEWORKS=pytorch
  [ -n "$jax" ] && FRAMEWORKS=${FRAMEWORKS:+$FRAMEWORKS,}jax
  FRAMEWORKS=${FRAMEWORKS:-none}
  if [ "$MODE" = run ]; then
    gpu="no nvidia-smi"
    command -v nvidia-smi >/dev/null &&
      gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 |
        head -n 1)
  fi
  ENV_LINE="gpu: $gpu; torch ${torch:-absent}; jax ${jax:-absent}; triton ${triton:-absent}; $JOBS cores"
  echo "$ENV_LINE"
}

# oneDNN is the CPU GEMM (the CPU side of every GEMM comparison); the GPU path itself never uses
# it. GPU_CHECK_ONEDNN=auto (default): DNNL_ROOT, else the Python prefix (PyPI's onednn-cpu-gomp,
# as in CI), else the wheels --pack carried (37 MiB), else none; carry: the carried wheels; off:
# none. Without it the CPU GEMM fails, and so does every comparison with it (gtest GpuGemm* skip,
# the front ends' Linear / MLP / layer parity fail): the summary says so.
ONEDNN=ON DNNL_ROOT_ARG=${DNNL_ROOT:-} ONEDNN_NOTE=""
pick_onednn() {
  local prefix mode=${GPU_CHECK_ONEDNN:-auto} wheels=0
  prefix=$("$PY" -c 'import sys; print(sys.prefix)')
  compgen -G "$CARRY/onednn_cpu_gomp-*.whl" >/dev/null &&
    compgen -G "$CARRY/onednn_devel_cpu_gomp-*.whl" >/dev/null && wheels=1
  case $mode in
    auto | carry | off) ;;
    *) echo "GPU_CHECK_ONEDNN: expected auto, carry or off, got '$mode'"; return 1 ;;
  esac
  if [ "$mode" = off ]; then
    ONEDNN=OFF DNNL_ROOT_ARG=""
    ONEDNN_NOTE="oneDNN: off (GPU_CHECK_ONEDNN=off: no CPU GEMM to compare with)"
  elif [ "$mode" = auto ] && [ -n "$DNNL_ROOT_ARG" ]; then
    ONEDNN_NOTE="oneDNN: DNNL_ROOT=$DNNL_ROOT_ARG"
  elif [ "$mode" = auto ] && [ -e "$prefix/include/dnnl.hpp" ] &&
      compgen -G "$prefix/lib/libdnnl.so*" >/dev/null; then
    DNNL_ROOT_ARG=""
    ONEDNN_NOTE="oneDNN: $prefix"
  elif [ "$wheels" = 1 ]; then
    DNNL_ROOT_ARG=$BUILD/onednn
    # Headers and one copy of the library (the wheel holds three identical 52 MiB files).
    "$PY" - "$DNNL_ROOT_ARG" "$CARRY"/onednn_*cpu_gomp-*.whl <<'PYEOF' || return 1
import os, shutil, sys, zipfile
from pathlib import Path
dst = Path(sys.argv[1])
for whl in sys.argv[2:]:
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            rest = name.partition(".data/data/")[2]
            if rest.startswith("include/") or rest == "lib/libdnnl.so.3":
                out = dst / rest
                out.parent.mkdir(parents=True, exist_ok=True)
                with z.open(name) as f, open(out, "wb") as g:
                    shutil.copyfileobj(f, g)
                os.chmod(out, 0o755 if rest.startswith("lib/") else 0o644)
PYEOF
    ONEDNN_NOTE="oneDNN: carried wheels"
  elif [ "$mode" = carry ]; then
    echo "GPU_CHECK_ONEDNN=carry: expected the oneDNN wheels in $CARRY (ci/gpu_check.sh --pack)"
    return 1
  else
    ONEDNN=OFF
    ONEDNN_NOTE="oneDNN: none (no CPU GEMM to compare with; carry it: ci/gpu_check.sh --pack)"
  fi
  echo "$ONEDNN_NOTE"
}

configure_core() {  # configure_core AUTO|OFF (the AOTriton images)
  t_run env "NVTE_AOTRITON_ARCHS=sm_$ARCH" cmake -S "$REPO_ROOT" -B "$LIB_BUILD" "${GEN[@]}" \
    -DCMAKE_BUILD_TYPE=Release -DNVTE_BACKEND=cuda "-DNVTE_CUDA_ARCHS=$ARCH" \
    -DNVTE_WITH_CUBLASLT=AUTO "-DNVTE_WITH_AOTRITON=$1" "-DPython3_EXECUTABLE=$PY" \
    "-DNVTE_WITH_ONEDNN=$ONEDNN" ${DNNL_ROOT_ARG:+"-DDNNL_ROOT=$DNNL_ROOT_ARG"}
}

build_core() {
  local out=$BUILD/core-build.txt
  if configure_core AUTO > "$out" 2>&1 &&
      t_run cmake --build "$LIB_BUILD" --parallel "$JOBS" >> "$out" 2>&1; then
    cat "$out"
    [ -f "$AOT_DIR/index.json" ] && AOT_STATE=built
    return 0
  fi
  cat "$out"
  # Triton's ahead-of-time compile is the one part another toolchain version may refuse (CI pins
  # triton 3.9.0; the GPU image brings its own): the rest is still worth checking without it.
  grep -qE 'FAILED: .*aotriton|AOTriton: build_tools/aotriton.py' "$out" || return 1
  echo "gpu_check: the AOTriton images failed to build with this triton; building without them"
  AOT_STATE=failed
  configure_core OFF && t_run cmake --build "$LIB_BUILD" --parallel "$JOBS"
}

# The extensions through setup.py itself (the README's build), into the staged package: no pip, no
# build isolation, nothing written into the source tree. Its CMake step reuses the build above
# (same arguments; NVTE_WITH_ONEDNN and DNNL_ROOT stay in CMake's cache).
build_python() {
  local aot=auto
  [ "$AOT_STATE" = failed ] && aot=0
  rm -rf "$SITE"  # te_lite_ops.py loads the newest _C*.so: no stale one may stay
  (cd "$REPO_ROOT" && t_run env NVTE_BUILD_DIR="$LIB_BUILD" NVTE_USE_CUDA=1 NVTE_CUDA_ARCHS="$ARCH" \
    NVTE_WITH_CUBLASLT=auto NVTE_WITH_AOTRITON=$aot NVTE_AOTRITON_ARCHS="sm_$ARCH" \
    NVTE_FRAMEWORK="$FRAMEWORKS" MAX_JOBS="$JOBS" ${DNNL_ROOT_ARG:+DNNL_ROOT="$DNNL_ROOT_ARG"} \
    "$PY" setup.py build --build-base "$BUILD/setup" --build-lib "$SITE") || return 1
  t_run env "${STAGED[@]}" "$PY" - "$SITE" "$ARCH" <<'PYEOF' || return 1
import json, sys
from pathlib import Path
import transformer_engine_lite as te
site, arch = Path(sys.argv[1]).resolve(), sys.argv[2]
info = te.build_info()
keys = ("device_backends", "gpu_archs", "aotriton_archs", "gpu_gemm", "gemm_cpu", "library_path")
print("staged build_info:", json.dumps({k: info.get(k) for k in keys}))
for what, path in (("package", te.__file__), ("core library", info["library_path"])):
    assert site in Path(path).resolve().parents, f"{what}: expected under {site}, got {path}"
assert "cuda" in info["device_backends"], info["device_backends"]
assert info["gpu_archs"] == [f"sm_{arch}"], info["gpu_archs"]
try:
    import torch
    import transformer_engine_lite.pytorch  # noqa: F401  (loads the staged _C*.so)
    cuda_ops = torch._C._dispatch_has_kernel_for_dispatch_key("te_lite::gemm", "CUDA")
    print("torch extension:", "CUDA and CPU ops" if cuda_ops else "CPU ops only", "(torch",
          torch.__version__ + ")")
    assert cuda_ops or not torch.version.cuda, "torch has CUDA but the extension has no CUDA ops"
except ImportError as e:
    print("torch extension: not checked:", e)
PYEOF
}

# tests/cpp/gpu (+ the AOTriton glue test) against this library, as ci/_gpu_build.sh builds them.
# GTest: the system's, else the googletest sources --pack carried (GPU_CHECK_GTEST=carry forces
# them, to check that path where a system GTest exists).
build_gtests() {
  local args=(-DTE_LIB_DIR="$LIB_DIR" -DNVTE_TEST_GPU=ON -DNVTE_TEST_GPU_BACKEND=cuda
    -DNVTE_TEST_CPU=OFF) out=$BUILD/tests-configure.txt
  [ "$AOT_STATE" = built ] && args+=("-DNVTE_TEST_AOTRITON_DIR=$AOT_DIR")
  if [ "${GPU_CHECK_GTEST:-auto}" = carry ]; then
    gtest_from_carry || return 1
    args+=("-DGTest_ROOT=$BUILD/gtest")
  fi
  if ! t_capture "$out" cmake -S "$REPO_ROOT/tests/cpp" -B "$TESTS_BUILD" "${GEN[@]}" "${args[@]}"; then
    grep -q 'GTest' "$out" && [ "${GPU_CHECK_GTEST:-auto}" != carry ] || return 1
    gtest_from_carry || return 1
    rm -f "$TESTS_BUILD/CMakeCache.txt"
    t_run cmake -S "$REPO_ROOT/tests/cpp" -B "$TESTS_BUILD" "${GEN[@]}" "${args[@]}" \
      "-DGTest_ROOT=$BUILD/gtest" || return 1
  fi
  t_run cmake --build "$TESTS_BUILD" --parallel "$JOBS"
}

gtest_from_carry() {
  [ -f "$CARRY/googletest.tar.gz" ] || {
    echo "gpu_check: no GTest here and none carried (run ci/gpu_check.sh --pack here first)"
    return 1
  }
  [ -f "$BUILD/gtest/include/gtest/gtest.h" ] && return 0
  rm -rf "$BUILD/googletest-src" "$BUILD/googletest-build"
  mkdir -p "$BUILD/googletest-src" && tar -xzf "$CARRY/googletest.tar.gz" -C "$BUILD/googletest-src" &&
    t_run cmake -S "$BUILD/googletest-src/googletest" -B "$BUILD/googletest-build" "${GEN[@]}" \
      -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF "-DCMAKE_INSTALL_PREFIX=$BUILD/gtest" &&
    t_run cmake --build "$BUILD/googletest-build" --target install --parallel "$JOBS"
}

step_build() {
  local failed=() t=$SECONDS
  probe_env
  pick_onednn || return 1
  build_core || { note "the library did not build (sm_$ARCH)"; return 1; }
  echo "gpu_check: library built in $((SECONDS - t)) s"
  # The extensions and the gtests side by side: both only read the library built above (setup.py's
  # own CMake step finds it up to date), and neither keeps 16 cores busy alone.
  rm -f "$BUILD/python-build.txt" "$BUILD/.python_ok" "$BUILD/gtests-build.txt" "$BUILD/.gtests_ok"
  t=$SECONDS
  if [ "$FRAMEWORKS" != none ]; then
    (build_python && touch "$BUILD/.python_ok"
      echo "gpu_check: extensions done after $((SECONDS - t)) s") > "$BUILD/python-build.txt" 2>&1 &
  fi
  (build_gtests && touch "$BUILD/.gtests_ok"
    echo "gpu_check: gtests done after $((SECONDS - t)) s") > "$BUILD/gtests-build.txt" 2>&1 &
  wait
  cat "$BUILD/python-build.txt" "$BUILD/gtests-build.txt" 2>/dev/null
  [ -f "$BUILD/.python_ok" ] && PY_OK=1
  [ -f "$BUILD/.gtests_ok" ] && GTEST_OK=1
  if [ "$FRAMEWORKS" = none ]; then
    failed+=("no torch or jax to build extensions for")
  elif [ "$PY_OK" != 1 ]; then
    failed+=("Python extensions")
  fi
  [ "$GTEST_OK" = 1 ] || failed+=("GPU gtests")
  local gemm aot="AOTriton: $AOT_STATE"
  gemm=$(grep -o '"gpu_gemm": \[[^]]*\]' "$BUILD/python-build.txt" 2>/dev/null | tail -n 1)
  if [ "$AOT_STATE" = built ]; then
    aot="AOTriton: $(grep -c "\"arch\": \"sm_$ARCH\"" "$AOT_DIR/index.json") sm_$ARCH images"
  fi
  # An automatic build falls back to the tiled GEMM without cuBLASLt; the check needs it proven.
  case $gemm in *cublaslt*) ;; *) failed+=("no cuBLASLt (${gemm:-gpu_gemm unknown})") ;; esac
  if [ ${#failed[@]} -gt 0 ]; then
    note "sm_$ARCH; FAILED: $(IFS=,; echo "${failed[*]}"); $aot; $ONEDNN_NOTE"
    return 1
  fi
  note "sm_$ARCH, $FRAMEWORKS; ${gemm:-}; $aot; $ONEDNN_NOTE"
}

# ------------------------------------------------------------------------------------ gtest
gpu_test_exes() {
  local exe
  for exe in "$TESTS_BUILD"/test_gpu_*; do [ -f "$exe" ] && [ -x "$exe" ] && echo "$exe"; done
}

# gtest_counts FILE...: "P passed, F failed, S skipped" over gtest outputs.
gtest_counts() {
  cat "$@" | awk '/^\[  PASSED  \] [0-9]+ tests?\./ {p += $4}
    /^\[  FAILED  \] [0-9]+ tests?,/ {f += $4}
    /^\[  SKIPPED \] [0-9]+ tests?,/ {s += $4}
    END {printf "%d passed, %d failed, %d skipped", p, f, s}'
}

# Every GPU gtest but the AOTriton cases (the aotriton step runs those), the executables side by
# side (the CPU references run on the host: 16 cores, few per executable).
step_gtest() {
  [ "$GTEST_OK" = 1 ] || { note "the GPU gtests did not build (build.log)"; return 1; }
  local exes=() exe n=0 rc=0 pids=() omp out total=0 reasons
  mapfile -t exes < <(gpu_test_exes)
  [ ${#exes[@]} -gt 0 ] || { note "expected tests/cpp/gpu executables, got none"; return 1; }
  if [ "$MODE" = dry ]; then
    for exe in "${exes[@]}"; do
      n=$("$exe" --gtest_list_tests --gtest_filter='-Aotriton/*' | grep -c '^  ')
      echo "$(basename "$exe"): $n cases"
      total=$((total + n))
    done
    note "dry run: $total cases in ${#exes[@]} executables listed, not run"
    return 0
  fi
  omp=$((JOBS / ${#exes[@]}))
  [ "$omp" -ge 1 ] || omp=1
  mkdir -p "$BUILD/gtest-out"
  rm -f "$BUILD"/gtest-out/*.txt
  for exe in "${exes[@]}"; do
    OMP_NUM_THREADS=$omp t_run "$exe" --gtest_filter='-Aotriton/*' \
      > "$BUILD/gtest-out/$(basename "$exe").txt" 2>&1 &
    pids+=($!)
  done
  local i summary=()
  for i in "${!exes[@]}"; do
    wait "${pids[$i]}"
    case $? in 0) ;; 124 | 137) rc=124 ;; *) [ $rc -eq 124 ] || rc=1 ;; esac
    out=$BUILD/gtest-out/$(basename "${exes[$i]}").txt
    echo "----- $(basename "${exes[$i]}"): $(gtest_counts "$out")"
    cat "$out"
    summary+=("$(basename "${exes[$i]}" | sed 's/^test_gpu_//'): $(gtest_counts "$out")")
  done
  printf '%s\n' "${summary[@]}"
  # A skip for want of a device means the device was not used: a failure here, not a pass.
  reasons=$(cat "$BUILD"/gtest-out/*.txt | grep -A1 -E ': Skipped$' | grep -vE ': Skipped$|^--$' |
    sort | uniq -c | sort -rn)
  [ -n "$reasons" ] && { echo "skip reasons:"; echo "$reasons"; }
  if echo "$reasons" | grep -q 'no GPU device'; then
    note "the tests saw no GPU device"
    return 1
  fi
  note "$(gtest_counts "$BUILD"/gtest-out/*.txt) in ${#exes[@]} executables" \
    "$([ -n "$reasons" ] && echo "(skips: $(echo "$reasons" | head -n 2 | sed 's/^ *//' | paste -sd';'))")"
  return $rc
}

# ------------------------------------------------------------------------------------ sanitizer
# sanitizer_cases EXE PATTERNS: the first case of each ':'-separated pattern, ':'-joined.
sanitizer_cases() {
  local exe=$1 pat name cases=()
  IFS=: read -ra pats <<< "$2"
  for pat in "${pats[@]}"; do
    name=$("$exe" --gtest_list_tests --gtest_filter="$pat" |
      awk '/^[^ ]/ {suite = $1} /^  / {print suite $1; exit}')
    [ -n "$name" ] || { echo "$(basename "$exe"): pattern '$pat' selects no case" >&2; return 1; }
    cases+=("$name")
  done
  (IFS=:; echo "${cases[*]}")
}

# sanitize EXE CASES: memcheck then racecheck over CASES; every case must run and pass.
sanitize() {
  local exe=$1 cases=$2 tool out n rc=0
  n=$(echo "$cases" | tr ':' '\n' | wc -l)
  for tool in memcheck racecheck; do
    out=$BUILD/sanitizer/$(basename "$exe").$tool.txt
    t_run "$SAN" --tool "$tool" --error-exitcode 99 --print-limit 20 "$exe" \
      --gtest_filter="$cases" > "$out" 2>&1
    case $? in 0) ;; 124 | 137) return 124 ;; *) rc=1 ;; esac
    grep -qE "^\[  PASSED  \] $n tests?\." "$out" || rc=1  # a skip would sanitize nothing
  done
  return $rc
}

step_sanitizer() {
  [ "$GTEST_OK" = 1 ] || { note "the GPU gtests did not build (build.log)"; return 1; }
  local name exe cases rc=0 pids=() names=() i out
  SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [ "$MODE" = run ] && ! [ -x "$SAN" ]; then
    note "compute-sanitizer not found (PATH, /usr/local/cuda/bin)"
    return 1
  fi
  mkdir -p "$BUILD/sanitizer"
  rm -f "$BUILD"/sanitizer/*.txt
  for name in $(printf '%s\n' "${!SAN_FILTER[@]}" | sort); do
    exe=$TESTS_BUILD/$name
    [ -x "$exe" ] || { echo "$name: expected the executable, got none"; rc=1; continue; }
    cases=$(sanitizer_cases "$exe" "${SAN_FILTER[$name]}") || { rc=1; continue; }
    echo "$name: $cases"
    [ "$MODE" = dry ] && continue
    # One executable per process, side by side (each holds its own context on the device).
    sanitize "$exe" "$cases" &
    pids+=($!)
    names+=("$name")
  done
  if [ "$MODE" = dry ]; then
    [ -x "$SAN" ] || echo "compute-sanitizer: not on this machine (the GPU machine has it)"
    if [ $rc -eq 0 ]; then
      note "dry run: every pattern selects its case; not run"
    else
      note "a pattern of SAN_FILTER selects no case (sanitizer.log)"
    fi
    return $rc
  fi
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    case $? in 0) ;; 124 | 137) rc=124 ;; *) [ $rc -eq 124 ] || rc=1 ;; esac
    for out in "$BUILD/sanitizer/${names[$i]}".*.txt; do
      echo "----- $(basename "$out" .txt)"
      cat "$out"
    done
  done
  local summary
  summary=$(grep -hE '(ERROR|RACECHECK) SUMMARY' "$BUILD"/sanitizer/*.txt | sort | uniq -c |
    sed 's/^ *//' | paste -sd';')
  note "memcheck + racecheck over ${#names[@]} families: ${summary:-no summary lines}"
  return $rc
}

# ------------------------------------------------------------------------------------ front ends
has_framework() { [[ ",$FRAMEWORKS," == *",$1,"* ]]; }

# run_parity FILE [PYTEST ARGS...]: the GPU parity tests of FILE; GPU_CHECK_STRICT=1 makes "no
# device" a failure instead of a skip. Dry run: collection only.
run_parity() {
  local file=$1 out=$BUILD/pytest.txt rc
  shift
  if [ "$MODE" = dry ]; then
    t_capture "$out" env "${STAGED[@]}" "$PY" -m pytest --collect-only -q -p no:cacheprovider \
      "$REPO_ROOT/$file" "$@"
    rc=$?
    note "dry run: $(grep -E 'tests? collected' "$out" | tail -n 1)"
    return $rc
  fi
  t_capture "$out" env "${STAGED[@]}" GPU_CHECK_STRICT=1 OMP_NUM_THREADS="$JOBS" "$PY" -m pytest \
    -q -rs -p no:cacheprovider "$REPO_ROOT/$file" "$@"
  rc=$?
  note "$(tail -n 1 "$out")"
  return $rc
}

step_pytorch() {
  has_framework pytorch || { note "torch is not importable: the PyTorch front end is not checked"; return 3; }
  [ "$PY_OK" = 1 ] || { note "the extensions did not build (build.log)"; return 1; }
  run_parity tests/pytorch/test_gpu_parity.py -k "not aotriton"
}

step_jax() {
  has_framework jax || { note "jax is not importable: the JAX front end is not checked"; return 3; }
  [ "$PY_OK" = 1 ] || { note "the extensions did not build (build.log)"; return 1; }
  # Whether the XLA FFI library has GPU handlers at all (a host-only question, no device).
  local n
  n=$(t_run env "${STAGED[@]}" JAX_PLATFORMS=cpu "$PY" -c '
from transformer_engine_lite.jax.cpp_extensions import base
r = base.registrations()
print(len(r), sum("gpu" in e for e in r.values()))') || { note "the JAX extension does not load"; return 1; }
  echo "XLA FFI handlers (all, with a GPU entry): $n"
  if [ "${n#* }" = 0 ]; then
    note "not available: the JAX front end has no GPU handlers in this build"
    return 3
  fi
  # No GEMM autotuning in XLA's GPU compiler: seconds per compile, and the check times nothing.
  XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" run_parity tests/jax/test_gpu_parity.py
}

# ------------------------------------------------------------------------------------ aotriton
step_aotriton() {
  case $AOT_STATE in
    none) note "not available: no AOTriton images (triton is not importable here)"; return 3 ;;
    failed) note "the sm_$ARCH images did not build with this triton (build.log)"; return 1 ;;
  esac
  [ "$GTEST_OK" = 1 ] || { note "the GPU gtests did not build (build.log)"; return 1; }
  local attn=$TESTS_BUILD/test_gpu_fused_attn images out=$BUILD/aotriton.txt n
  images=$(grep -c "\"arch\": \"sm_$ARCH\"" "$AOT_DIR/index.json")
  echo "index: $images images for sm_$ARCH"
  # The glue against the stand-in driver: launches checked against the index (host only).
  t_run "$TESTS_BUILD/test_aotriton_launch" --gtest_brief=1 || { note "test_aotriton_launch failed"; return 1; }
  if [ "$MODE" = dry ]; then
    n=$("$attn" --gtest_list_tests --gtest_filter='Aotriton/*' | grep -c '^  ')
    [ "$n" -gt 0 ] || { note "expected Aotriton/* gtest cases, got none"; return 1; }
    run_parity tests/pytorch/test_gpu_parity.py -k aotriton || return 1
    note "dry run: $images sm_$ARCH images, launch test passed, $n device cases listed"
    return 0
  fi
  # On the device every case must run on the Triton kernels: a skip says the selection did not
  # pick aotriton for sm_$ARCH, which is a failure of this build here.
  t_capture "$out" env NVTE_LOG_AOTRITON_CONFIG=1 "$attn" --gtest_filter='Aotriton/*'
  local rc=$? counts
  counts=$(gtest_counts "$out")
  case $counts in *" 0 skipped") ;; *) rc=1 ;; esac
  run_parity tests/pytorch/test_gpu_parity.py -k aotriton || rc=1
  note "gtest: $counts; pytest (vs flash kernel): $(cat "$NOTE_FILE" 2>/dev/null)"
  return $rc
}

# ------------------------------------------------------------------------------------ timing
step_timing() {
  has_framework pytorch || { note "not available: torch is not importable"; return 3; }
  [ "$PY_OK" = 1 ] || { note "the extensions did not build (build.log)"; return 1; }
  if [ "$MODE" = dry ]; then
    # Parsed and compiled in memory (py_compile would write a .pyc into the source tree).
    "$PY" -c 'import sys; compile(open(sys.argv[1]).read(), sys.argv[1], "exec")' \
      "$REPO_ROOT/benchmarks/bench_gpu.py" || return 1
    echo "dry run: nothing timed; the cases of benchmarks/bench_gpu.py:"
    echo
    t_run env "${STAGED[@]}" "$PY" "$REPO_ROOT/benchmarks/bench_gpu.py" --list || return 1
    note "dry run: bench_gpu.py compiles, cases listed"
    return 0
  fi
  # Alone on the device and last: nothing else runs while it times.
  t_run env "${STAGED[@]}" "$PY" "$REPO_ROOT/benchmarks/bench_gpu.py" \
    --repeat "${GPU_CHECK_REPEAT:-20}"
  local rc=$?
  note "$([ $rc -eq 0 ] && echo "table in timing.md" || echo "bench_gpu.py failed (timing.md)")"
  return $rc
}

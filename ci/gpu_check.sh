#!/usr/bin/env bash
# One prepared command for a lent GPU (ARCHITECTURE.md §9, issue #21): builds the library for one
# arch with the machine's own torch, jax and triton (no downloads, no build isolation), then proves
# the stack on the device in six steps, each under its own time limit, later steps running when an
# earlier one failed:
#   build      core for sm_$GPU_CHECK_ARCH only (cuBLASLt, AOTriton images of that arch alone), the
#              PyTorch and JAX extensions (setup.py build into a staged package, not the source
#              tree), tests/cpp/gpu + the AOTriton glue test
#   gtest      every GPU gtest on the device (GPU vs CPU backend; bytes where the CPU is exact)
#   sanitizer  compute-sanitizer memcheck and racecheck, one case per op family
#   pytorch    tests/pytorch/test_gpu_parity.py: modules on cuda == on cpu (fwd + bwd, bf16 and
#              each FP8 recipe), tolerances from tests/pytorch/utils.py
#   jax        tests/jax/test_gpu_parity.py: the same through the XLA FFI GPU handlers
#   aotriton   the sm_90 cubins through the glue: gtests vs the CPU and the reference, and against
#              the CUDA flash kernel (pytest)
#   timing     benchmarks/bench_gpu.py: median of N with CUDA events, ours vs torch (written last)
# Logs (8 files, the most a device call brings back): build.log gtest.log sanitizer.log pytorch.log
# jax.log aotriton.log timing.md summary.txt in ${OUT:-build/gpu_check/out}. Exit status 1 if a step
# failed or timed out; a step that cannot run here says why and reports "not available". The steps
# themselves are in ci/_gpu_check_steps.sh; this file holds the settings, --pack and the runner.
#
#   bash ci/gpu_check.sh            on the GPU machine: about 9 minutes on an H100 with 16 cores
#   bash ci/gpu_check.sh --dry-run  everything up to the first device use: the same build, gtest
#                                   and pytest collection, sanitizer filters, timing-case list (CI:
#                                   build.cuda.gpu_check_dry_run in ci/build_cuda.sh)
#   bash ci/gpu_check.sh --pack     here, with PyPI: what the GPU machine lacks (oneDNN wheels,
#                                   googletest sources) into build/gpu_check_carry; name that folder
#                                   in the device call's `carry`
# Env: OUT, GPU_CHECK_ARCH (90), GPU_CHECK_BUILD (build/gpu-check), GPU_CHECK_CARRY
# (build/gpu_check_carry), GPU_CHECK_REPEAT (timing: 20 runs per case), GPU_CHECK_ONEDNN
# (auto|carry|off) and GPU_CHECK_GTEST (auto|carry): where oneDNN and GTest come from (carry forces
# the carried copies, to check that path on a machine that has its own).
set -u
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODE=run
case "${1:-}" in
  "") ;;
  --dry-run) MODE=dry ;;
  --pack) MODE=pack ;;
  -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; exit 0 ;;
  *) echo "ci/gpu_check.sh: expected no argument, --dry-run or --pack, got '$1'" >&2; exit 2 ;;
esac

# Python: the README's virtual environment where it exists (CI, a developer's machine), else the
# machine's own python3 (the GPU machine has no build/venv: its torch and jax are what is checked).
source "$REPO_ROOT/ci/_venv.sh"
if [ "$TE_LITE_VENV" != none ] && [ -x "$TE_LITE_VENV/bin/python" ]; then
  te_venv_activate || exit 1
fi
PY=$(command -v python3 || command -v python) || {
  echo "ci/gpu_check.sh: expected python3 on PATH, got none" >&2
  exit 1
}
ARCH=${GPU_CHECK_ARCH:-90}
BUILD=${GPU_CHECK_BUILD:-$REPO_ROOT/build/gpu-check}
CARRY=${GPU_CHECK_CARRY:-$REPO_ROOT/build/gpu_check_carry}
JOBS=$(nproc)
LIB_BUILD=$BUILD/cmake
LIB_DIR=$LIB_BUILD/transformer_engine_lite/common
AOT_DIR=$LIB_DIR/aotriton
TESTS_BUILD=$BUILD/tests
SITE=$BUILD/site  # the staged package: Python sources + the three libraries built here
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)

# Seconds per step on the device. 530 in all: with the machine's start, one 600 s call holds it.
BUDGET_BUILD=210 BUDGET_GTEST=80 BUDGET_SANITIZER=60 BUDGET_PYTORCH=45 BUDGET_JAX=75
BUDGET_AOTRITON=25 BUDGET_TIMING=35
if [ "$MODE" = dry ]; then
  # The build from scratch on a 2-core CI machine; the rest only lists and collects.
  BUDGET_BUILD=1500 BUDGET_GTEST=60 BUDGET_SANITIZER=60 BUDGET_PYTORCH=120 BUDGET_JAX=120
  BUDGET_AOTRITON=120 BUDGET_TIMING=60
fi

# compute-sanitizer's cases, one or two per op family: each ':'-separated pattern runs its first
# match. Middle sizes (129x257, s70, d128: several blocks, full and partial tiles), bf16 / FP8 /
# MXFP8; the GEMM once through cuBLASLt (E4M3) and once through our tiled kernel (E5M2 x E5M2,
# which cuBLASLt does not take). Racecheck instruments every shared-memory access (~100x slower),
# hence no large case. A pattern that selects nothing fails the step: the dry run in CI keeps these
# in step with tests/cpp/gpu.
declare -A SAN_FILTER=(
  [test_gpu_activation]='*GpuActivationTest.*/swiglu_fwd_bfloat16_to_mxfp8_float8_e4m3'
  [test_gpu_block_gemm]='*BlockScaledGemmGpu.*/fp8block_M33_N40_K200_w2d:*BlockScaledGemmGpu.*/nvfp4_M33_N40_K200_w1d'
  [test_gpu_block_scaling]='*BlockQuantizeGpu.*/bfloat16_float8_e4m3_129x257_1d_both:*BlockQuantizeGpu.*/bfloat16_float8_e4m3_129x257_2d_both:*BlockDequantizeGpu.*/float8_e4m3_129x257_2d_colwise_to_bfloat16'
  [test_gpu_cast]='*QuantizeGpu.*/bfloat16_float8_e4m3_129x257_both_mx:*CastTransposeGpu.*/bfloat16_float8_e4m3_129x257'
  [test_gpu_cross_entropy]='*GpuCrossEntropyTest.*/3x1000_bfloat16_w2'
  [test_gpu_fused_attn]='*GpuFusedAttn.*/bfloat16_bshd_causal_b2h4g2_s70x70_d128x128'
  [test_gpu_fused_attn_sinks]='*GpuSinks.*/11'
  [test_gpu_fused_rope]='*GpuFusedRopeTest.*/sbhd_bfloat16_s7b3h2d16r16:*GpuFusedRopePositions.*/thd_bfloat16_start_cp2r0'
  [test_gpu_fused_router]='*GpuFusedRouterTest.*/sigmoid_bias_33x64_k6_g8of3_bfloat16:*GpuFusedRouterAuxLoss.*'
  [test_gpu_mma]='*GpuMma.Random/bf16'
  [test_gpu_gemm]='*GpuGemmTest.*/plain_float8_e4m3_x_float8_e4m3_to_bfloat16_*_TN_129x257x65:*GpuGemmTest.*/plain_float8_e5m2_x_float8_e5m2_to_bfloat16_*_TN_129x257x65'
  [test_gpu_permutation]='*GpuIndexPermutationTest.*/700x3x19_drop101_bfloat16'
  [test_gpu_normalization]='*GpuNormTest.*/LayerNorm_bfloat16_wx_300x96_mxfp8_float8_e4m3:*GpuNormBwdTest.*/LayerNorm_bfloat16_wx_300x96'
  [test_gpu_ordered_gemm]='*OrderedGemmGpu.*/b1_33x129x300:*OrderedGemmGpuEdges.NonFiniteInputs'
  [test_gpu_nvfp4_gemm]='*Nvfp4BlockGemmGpu.*/33x129x200:*Nvfp4BlockGemmGpuEdges.ExtremeTermsAndCancellation'
  [test_gpu_nvfp4]='*Nvfp4QuantizeGpu.*/bfloat16_144x36_both_1d_4over6_rowscaled:*Nvfp4QuantizeGpu.*/bfloat16_144x36_both_2d_rht_sr:*Nvfp4DequantizeGpu.*/to_bfloat16_144x36_rowwise_1d_rowscaled'
  [test_gpu_softmax]='*GpuSoftmaxTest.*/scaled_bfloat16_1x1x3x2049'
)

# ------------------------------------------------------------------------------------ --pack
if [ "$MODE" = pack ]; then
  mkdir -p "$CARRY" || exit 1
  ver=$("$PY" -m pip show onednn-cpu-gomp 2>/dev/null | awk '/^Version:/ {print $2}')
  ver=${ver:-2023.2.0}
  # py2.py3-none-manylinux1 wheels: the same files serve the GPU machine's Python 3.12.
  "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform manylinux1_x86_64 -d "$CARRY" "onednn-cpu-gomp==$ver" "onednn-devel-cpu-gomp==$ver" ||
    exit 1
  [ -d /usr/src/googletest ] || {
    echo "ci/gpu_check.sh --pack: expected googletest sources in /usr/src/googletest" \
      "(apt-get install libgtest-dev), got none" >&2
    exit 1
  }
  tar -czf "$CARRY/googletest.tar.gz" -C /usr/src googletest || exit 1
  du -b "$CARRY"/* | awk '{printf "%8.1f MiB  %s\n", $1 / 1048576, $2; t += $1}
    END {printf "%8.1f MiB  in all (a device call carries 64 MiB with the tree)\n", t / 1048576}'
  exit 0
fi

# The CUDA flash attention's tensor-core forward is opt-in until a device has run it (README, "GPU
# check"): this check is what proves it, so every step runs it.
export NVTE_GPU_FLASH_ATTN_TENSOR_CORES=1

OUT=${OUT:-$REPO_ROOT/build/gpu_check/out}
mkdir -p "$OUT" "$BUILD" || exit 1
OUT=$(cd "$OUT" && pwd)
LOGS=(build.log gtest.log sanitizer.log pytorch.log jax.log aotriton.log timing.md summary.txt)
for f in "${LOGS[@]}"; do rm -f "$OUT/$f"; done

# ------------------------------------------------------------------------------------ runner
STEPS=()
declare -A STATUS NOTE ELAPSED
STEP_DEADLINE=0
NOTE_FILE=$BUILD/.step_note
# What the build step made, for the later steps (AOT_STATE: built | failed | none).
PY_OK=0 GTEST_OK=0 AOT_STATE=none FRAMEWORKS=none ENV_LINE=""
# The staged package and nothing else: PYTHONSAFEPATH keeps the source tree (the working directory
# of `python -m pytest`) off sys.path, where its own, other build would be imported instead.
STAGED=(PYTHONSAFEPATH=1 "PYTHONPATH=$SITE" "NVTE_LIB_PATH=$SITE/transformer_engine_lite"
  XLA_PYTHON_CLIENT_PREALLOCATE=false)

# t_run CMD...: CMD bounded by what is left of the current step's time (TERM, then KILL 10 s later).
t_run() {
  local left=$((STEP_DEADLINE - SECONDS))
  if [ "$left" -le 0 ]; then
    echo "gpu_check: no time left in this step for: $*"
    return 124
  fi
  timeout -k 10 "$left" "$@"
}

# t_capture FILE CMD...: t_run CMD with its output in FILE too (for the step's note); CMD's status.
t_capture() {
  local file=$1 rc
  shift
  t_run "$@" > "$file" 2>&1
  rc=$?
  cat "$file"
  return $rc
}

# note TEXT: the step's line in the summary (the last call wins).
note() {
  echo "$*" > "$NOTE_FILE"
  echo "gpu_check: $*"
}

# run_step NAME LOG LIMIT FUNC: FUNC's output appended to LOG. FUNC returns 0 (ok), 3 (not
# available here; its note says why), 124/137 (time limit) or anything else (failed).
run_step() {
  local name=$1 log=$2 limit=$3 fn=$4 rc start=$SECONDS status
  STEPS+=("$name")
  rm -f "$NOTE_FILE"
  STEP_DEADLINE=$((SECONDS + limit))
  echo "::: $name (limit $limit s, log $(basename "$log"))"
  case $log in *.log) echo "=== $name ($MODE), $(date -u +%FT%TZ), limit $limit s" >> "$log" ;; esac
  "$fn" >> "$log" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    3) status="not available" ;;
    124 | 137) status=TIMEOUT ;;
    *) status=FAILED ;;
  esac
  STATUS[$name]=$status
  ELAPSED[$name]=$((SECONDS - start))
  NOTE[$name]=$(cat "$NOTE_FILE" 2>/dev/null)
  echo "::: $name: $status (${ELAPSED[$name]} s) ${NOTE[$name]}"
  if [ "$status" = FAILED ] || [ "$status" = TIMEOUT ]; then
    tail -n 25 "$log" | sed 's/^/    /'
  fi
}

write_summary() {
  local file=$1 s n_ok=0 n_bad=0 n_na=0
  {
    echo "ci/gpu_check.sh ($MODE), $(date -u +%FT%TZ), $((SECONDS - START)) s"
    echo "$ENV_LINE"
    echo
    printf '%-10s %-14s %6s  %s\n' step status seconds note
    for s in "${STEPS[@]}"; do
      printf '%-10s %-14s %6s  %s\n' "$s" "${STATUS[$s]}" "${ELAPSED[$s]}" "${NOTE[$s]}"
      case ${STATUS[$s]} in
        ok) n_ok=$((n_ok + 1)) ;;
        "not available") n_na=$((n_na + 1)) ;;
        *) n_bad=$((n_bad + 1)) ;;
      esac
    done
    echo
    echo "gpu_check: $n_ok ok, $n_bad failed, $n_na not available"
  } > "$file"
  echo
  cat "$file"
  [ "$n_bad" -eq 0 ]
}

source "$REPO_ROOT/ci/_gpu_check_steps.sh"

START=$SECONDS
run_step build "$OUT/build.log" "$BUDGET_BUILD" step_build
run_step gtest "$OUT/gtest.log" "$BUDGET_GTEST" step_gtest
run_step sanitizer "$OUT/sanitizer.log" "$BUDGET_SANITIZER" step_sanitizer
run_step pytorch "$OUT/pytorch.log" "$BUDGET_PYTORCH" step_pytorch
run_step jax "$OUT/jax.log" "$BUDGET_JAX" step_jax
run_step aotriton "$OUT/aotriton.log" "$BUDGET_AOTRITON" step_aotriton
run_step timing "$OUT/timing.md" "$BUDGET_TIMING" step_timing
write_summary "$OUT/summary.txt"

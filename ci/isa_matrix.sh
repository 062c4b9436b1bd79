#!/usr/bin/env bash
# The suites at every CPU level this machine can run (issue: "runs on any machine"). Each level caps
# the library's own kernels and oneDNN with one variable, NVTE_CPU_ISA (platform/cpu_isa.h; oneDNN is
# capped through dnnl::set_max_cpu_isa), then runs:
#   isa.<level>.info     build_info() reports that level for our kernels and for oneDNN
#   isa.<level>.core     the numerics gtests (GEMM, NVFP4 block GEMM, quantize, dequantize, current
#                        scaling, recipe, transpose, normalization, activation, softmax, fused
#                        attention, RoPE)
#   isa.<level>.pytorch  PyTorch smoke subset: Linear / LayerNormMLP / TransformerLayer fwd+bwd in
#                        bf16 and under each FP8 recipe, against the fp64 references
#   isa.<level>.jax      JAX smoke subset: dense / layernorm_mlp values and gradients in bf16 and
#                        under each FP8 recipe, FP8 bytes and state equal to the PyTorch path,
#                        attention (every layout family, dropout) equal to PyTorch bit for bit
# Levels (NVTE_CI_ISA_LEVELS): avx2 avx512_core avx512_core_bf16 avx512_core_fp16 native; a level
# above this CPU's is reported as skipped (a cap cannot raise a CPU); the CPU's own level runs only
# its .info tag when native is in the list (the suites at that level are native's, run once). Also:
#   isa.native.gemm_fp32   test_gemm with every operand widened to fp32 (NVTE_CPU_GEMM_COMPUTE=fp32),
#                          the path AVX2 CPUs take, proven on whatever CPU CI has
#   isa.qemu_haswell.*     a subset under `qemu-x86_64 -cpu Haswell` (NVTE_CI_QEMU=1): a CPU whose
#                          CPUID has no AVX-512, so the load-time detection is exercised as on a real
#                          AVX2 machine (info, GEMM, quantize, normalization, softmax, attention)
# Each tag prints its time; the summary gives the matrix's total.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/_utils.sh"
matrix_start=$SECONDS

BUILD=${NVTE_TEST_BUILD_DIR:-$REPO_ROOT/build/tests-cpp}
CORE_TESTS=(test_gemm test_nvfp4_gemm test_quantize test_dequantize test_block_scaling test_nvfp4 test_nvfp4_4over6 test_current_scaling test_recipe test_transpose
            test_ordered_gemm
            test_normalization test_activation test_softmax test_fused_attn test_fused_rope)
ORDER=(baseline avx2 avx512_core avx512_core_bf16 avx512_core_fp16 avx512_core_amx)
LEVELS=${NVTE_CI_ISA_LEVELS:-avx2 avx512_core avx512_core_bf16 avx512_core_fp16 native}

rank() {
  local i
  for i in "${!ORDER[@]}"; do [ "${ORDER[$i]}" = "$1" ] && { echo "$i"; return 0; }; done
  echo "ci/isa_matrix.sh: unknown level '$1' (expected one of ${ORDER[*]} native)" >&2
  return 1
}

if [ "${TEST_LIST_ONLY:-0}" != 1 ]; then
  LIB_DIR=$(python -c "import os, transformer_engine_lite.common as c; print(os.path.dirname(c.lib_path()))") || {
    echo "ci/isa_matrix.sh: transformer_engine_lite is not installed" >&2
    exit 1
  }
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  # Reuses ci/core.sh's build (same folder and options): nothing recompiles after core.sh.
  cmake -S "$REPO_ROOT/tests/cpp" -B "$BUILD" "${generator[@]}" -DTE_LIB_DIR="$LIB_DIR" >/dev/null || exit 1
  cmake --build "$BUILD" --parallel "$(nproc)" >/dev/null || exit 1
  DETECTED=$(python -c "import transformer_engine_lite as te; print(te.build_info()['cpu_isa']['detected'])") || exit 1
  echo "ci/isa_matrix.sh: this CPU is $DETECTED; levels: $LEVELS"
fi

# gtests: one process per executable (the level is read once per process).
run_gtests() {
  local exe filter=${GTEST_FILTER_OVERRIDE:-*} prefix=("$@") out
  for exe in "${CORE_TESTS[@]}"; do
    out=$("${prefix[@]}" "$BUILD/$exe" --gtest_brief=1 "--gtest_filter=$(core_filter "$exe")" 2>&1) || {
      echo "$out" | tail -40
      echo "ci: $exe failed (NVTE_CPU_ISA=${NVTE_CPU_ISA:-unset})" >&2
      return 1
    }
    if echo "$out" | grep -qE '^\[==========\] 0 tests'; then
      echo "ci: $exe ran no test (filter '$(core_filter "$exe")' matched nothing)" >&2
      return 1
    fi
    echo "  $exe: $(echo "$out" | grep -E '^\[==========\]' | tail -1)"
  done
}
core_filter() { echo '*'; }

# build_info() must report the level for our kernels and for oneDNN.
check_info() {
  local want=$1
  python - "$want" <<'PY'
import sys
import transformer_engine_lite as te
want = sys.argv[1]
info = te.build_info()
isa = info["cpu_isa"]
level = isa["detected"] if want == "native" else want
onednn = {"baseline": "sse41"}.get(level, level)
print(f"  cpu_isa {isa}, onednn_isa {info['onednn_isa']}")
assert isa["level"] == level, f"cpu_isa level: expected {level}, got {isa['level']}"
if want != "native" and info["onednn_isa"] is not None:
    assert info["onednn_isa"] == onednn, f"onednn_isa: expected {onednn}, got {info['onednn_isa']}"
PY
}

run_pytorch_smoke() {
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} run_pytest "$REPO_ROOT/tests/pytorch/test_modules.py" \
    "$REPO_ROOT/tests/pytorch/test_attention_modules.py" \
    -k "test_linear or test_layernorm_mlp or test_fp8_recipes_vs_reference or test_fp8_linear_matches_emulation or test_transformer_layer"
}

run_jax_smoke() {
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} run_pytest "$REPO_ROOT/tests/jax/test_functional.py" \
    "$REPO_ROOT/tests/jax/test_vs_pytorch.py" \
    -k "test_dense or test_layernorm_mlp or fp8 or delayed or pytorch"
}

# at_level LEVEL CMD...: CMD with the level's caps (native: none).
at_level() {
  local level=$1
  shift
  if [ "$level" = native ]; then
    (unset NVTE_CPU_ISA ONEDNN_MAX_CPU_ISA; "$@")
  else
    (unset ONEDNN_MAX_CPU_ISA; export NVTE_CPU_ISA=$level; "$@")
  fi
}

for level in $LEVELS; do
  if [ "${TEST_LIST_ONLY:-0}" != 1 ] && [ "$level" != native ]; then
    r=$(rank "$level") || exit 2
    if [ "$r" -gt "$(rank "$DETECTED")" ]; then
      echo "::: isa.$level skipped: this CPU is $DETECTED (a cap cannot add instructions)"
      continue
    fi
    # The CPU's own level, capped to itself, is native: cpu_isa_level() is the same and oneDNN is
    # not capped (apply_isa_cap in gemm_onednn_cpu.cpp returns when level == detected), so the
    # suites would run the same code twice. Only the cap's report is checked; native runs them.
    if [ "$r" -eq "$(rank "$DETECTED")" ] && [[ " $LEVELS " == *" native "* ]]; then
      run_tagged "isa.$level.info" at_level "$level" check_info "$level"
      echo "::: isa.$level.{core,pytorch,jax}: this CPU's own level, run once as isa.native.*"
      continue
    fi
  fi
  run_tagged "isa.$level.info" at_level "$level" check_info "$level"
  run_tagged "isa.$level.core" at_level "$level" run_gtests
  run_tagged "isa.$level.pytorch" at_level "$level" run_pytorch_smoke
  run_tagged "isa.$level.jax" at_level "$level" run_jax_smoke
done

gemm_fp32() { (export NVTE_CPU_GEMM_COMPUTE=fp32; CORE_TESTS=(test_gemm); run_gtests); }
run_tagged isa.native.gemm_fp32 at_level native gemm_fp32

# qemu-user as a Haswell: CPUID without AVX-512. TCG is ~10-50x slower, so a subset.
qemu_filter() {
  case "$1" in
    # every operand pair into fp32, and bf16 x bf16 into every output: each clone's load and store
    # paths once, without the full pair x output product (its fp64 references dominate under TCG)
    test_gemm) echo '*AllDtypes*_to_float32_*:*AllDtypes*bfloat16_x_bfloat16_to_*:*GemmOneDnnWorkarounds*:*Empty*' ;;
    # the odd small shapes (row and column tails) for every FP8 output, one large shape (~9 s each)
    test_normalization)
      echo '*/*_float8_e4m3_*7x33*:*/*_float8_e4m3_*64x96*:*/LayerNorm_float8_e4m3_xbfloat16_129x257_with_transpose' ;;
    test_fused_attn) echo '*/bfloat16_bshd_causal_*:*/float32_thd_padding_causal_*' ;;
    *) echo '*' ;;
  esac
}
qemu_info() {
  # (TCG's warnings about CPUID bits it does not emulate, e.g. TSX, are dropped.)
  qemu-x86_64 -cpu Haswell "$(command -v python)" 2> >(grep -v "TCG doesn't support" >&2) -c '
import transformer_engine_lite as te
isa = te.build_info()["cpu_isa"]
print("  under qemu -cpu Haswell:", isa, "onednn_isa", te.build_info()["onednn_isa"])
assert isa["detected"] == "avx2" and isa["clone"] == "x86-64-v3", isa'
}
qemu_core() {
  (core_filter() { qemu_filter "$1"; }
   CORE_TESTS=(test_gemm test_quantize test_normalization test_softmax test_fused_attn)
   unset NVTE_CPU_ISA ONEDNN_MAX_CPU_ISA
   run_gtests qemu-x86_64 -cpu Haswell)
}
if [ "${NVTE_CI_QEMU:-1}" = 1 ]; then
  if command -v qemu-x86_64 >/dev/null || [ "${TEST_LIST_ONLY:-0}" = 1 ]; then
    run_tagged isa.qemu_haswell.info qemu_info
    run_tagged isa.qemu_haswell.core qemu_core
  else
    echo "::: isa.qemu_haswell skipped: qemu-x86_64 not installed (apt-get install qemu-user)"
  fi
fi

[ "${TEST_LIST_ONLY:-0}" = 1 ] || echo "ci/isa_matrix.sh: matrix took $((SECONDS - matrix_start)) s"
finish_tests isa

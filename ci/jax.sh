#!/usr/bin/env bash
# JAX front-end suites: each tests/jax/test_*.py as tag jax.<file> on one host device (TEST_SGPU),
# and the test_distributed*.py files (sharded = unsharded on 8 forced host devices:
# XLA_FLAGS=--xla_force_host_platform_device_count=8) as jax.<file> (TEST_MGPU).
# The attention numerics suite (test_attention.py) runs once per attention backend configuration
# (configure_fused_attn_env, as ci/pytorch.sh) as jax.test_attention.<mode>: auto and unfused from
# TEST_LEVEL 1, ck, aotriton and flash from TEST_LEVEL 3. On the CPU, flash selects what auto selects
# and ck / aotriton (not built for the host) what unfused selects, so those three modes run only the
# mode-dependent cases (the switches are those of the mode; the selection follows them): the numerics
# of both paths already ran under auto and unfused (the GPU paths are ci/gpu_check.sh's jax step).
# TEST_FILTER globs select tags, TEST_LEVEL as in ci/_utils.sh (level < 2 skips the 8-device suites).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/_utils.sh"

# One OpenMP thread for the core's kernels; XLA's own CPU thread pool does the rest.
run_single() { OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} run_pytest "$@"; }
run_devices() {
  XLA_FLAGS="${XLA_FLAGS:-} --xla_force_host_platform_device_count=8" \
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} run_pytest "$@"
}

for f in "$REPO_ROOT"/tests/jax/test_*.py; do
  [ -e "$f" ] || continue
  name=$(basename "$f" .py)
  case "$name" in
    test_distributed*)
      [ "$TEST_MGPU" = 1 ] && [ "$TEST_LEVEL" -ge 2 ] && run_tagged "jax.$name" run_devices "$f"
      ;;
    test_attention)
      if [ "$TEST_SGPU" = 1 ]; then
        for mode in $(attention_modes); do
          sel=()
          case "$mode" in
            auto | unfused) ;;
            *) sel=(-k "mode_env_consistent or selection_follows_ci_mode") ;;
          esac
          run_tagged "jax.$name.$mode" run_attn_mode "$mode" run_single "$f" "${sel[@]}"
        done
      fi
      ;;
    *)
      [ "$TEST_SGPU" = 1 ] && run_tagged "jax.$name" run_single "$f"
      ;;
  esac
done
finish_tests jax

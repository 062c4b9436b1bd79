#!/usr/bin/env bash
# JAX front-end suites: each tests/jax/test_*.py as tag jax.<file> on one host device (TEST_SGPU),
# and test_distributed.py (sharded = unsharded on 8 forced host devices:
# XLA_FLAGS=--xla_force_host_platform_device_count=8) as jax.test_distributed (TEST_MGPU).
# TEST_FILTER globs select tags, TEST_LEVEL as in ci/_utils.sh (level < 2 skips the 8-device suite).
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
  if [ "$name" = test_distributed ]; then
    [ "$TEST_MGPU" = 1 ] && [ "$TEST_LEVEL" -ge 2 ] && run_tagged "jax.$name" run_devices "$f"
  else
    [ "$TEST_SGPU" = 1 ] && run_tagged "jax.$name" run_single "$f"
  fi
done
finish_tests jax

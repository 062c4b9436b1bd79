#!/usr/bin/env bash
# PyTorch front-end suites: each tests/pytorch/test_*.py as tag pytorch.<file> (single process,
# TEST_SGPU), and test_distributed.py / test_userbuffers_distributed.py under `torchrun
# --nproc_per_node=2` (gloo) as pytorch.<file> (TEST_MGPU). The backend-numerics suite
# (test_attention.py) runs once per attention backend configuration (configure_fused_attn_env)
# as pytorch.test_attention.<mode>: auto and unfused from TEST_LEVEL 1, ck, aotriton and flash
# from TEST_LEVEL 3; the module and argument suites (test_attention_modules.py,
# test_attention_args.py) do not depend on the mode and run once.
# The aotriton mode also runs the AOTriton kernels themselves, on the CPU under Triton's interpreter
# (test_aotriton_interp.py: numerics vs fp64 and vs the CPU flash kernel, dropout masks bit for bit):
# the backend's CPU-side proof, where test_attention.py's GPU-only cases skip.
# TEST_FILTER globs select tags (see ci/_utils.sh).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/_utils.sh"

# One OpenMP thread for the tiny-matrix suites and for two ranks sharing the cores: more threads
# than free cores make every op spin-wait (milliseconds per op instead of microseconds).
run_single() { OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} run_pytest "$@"; }
run_torchrun() {
  # -m pytest under torchrun: every rank runs the file; torchrun fails if any rank fails.
  # (--standalone: a free rendezvous port, so concurrent runs do not collide).
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} python -m torch.distributed.run --standalone \
    --nproc_per_node=2 -m pytest -q -p no:cacheprovider -o faulthandler_timeout="$PYTEST_TIMEOUT" "$@"
}

for f in "$REPO_ROOT"/tests/pytorch/test_*.py; do
  [ -e "$f" ] || continue
  name=$(basename "$f" .py)
  if [ "$name" = test_aotriton_interp ]; then
    continue  # in pytorch.test_attention.aotriton
  elif [ "$name" = test_attention ]; then
    if [ "$TEST_SGPU" = 1 ]; then
      for mode in $(attention_modes); do
        extra=()
        [ "$mode" = aotriton ] && extra=("$REPO_ROOT/tests/pytorch/test_aotriton_interp.py")
        run_tagged "pytorch.$name.$mode" run_attn_mode "$mode" run_single "$f" "${extra[@]}"
      done
    fi
  elif [ "$name" = test_distributed ] || [ "$name" = test_userbuffers_distributed ]; then
    [ "$TEST_MGPU" = 1 ] && run_tagged "pytorch.$name" run_torchrun "$f"
  else
    [ "$TEST_SGPU" = 1 ] && run_tagged "pytorch.$name" run_single "$f"
  fi
done
finish_tests pytorch

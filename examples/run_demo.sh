#!/usr/bin/env bash
# The README's first command: installs dependencies and the package (ci/install_deps.sh, idempotent),
# then trains a small GPT with the PyTorch modules in bf16 and under each FP8 recipe on the CPU
# (examples/pytorch/train_gpt.py: ~5 minutes on 2 AMX cores, NVFP4 half of it; longer on AVX2; loss table
# printed, plot written to examples/pytorch/out/loss.png). Arguments go to train_gpt.py (e.g. --quick,
# --steps N). With --quick, the JAX twin (examples/jax/train_gpt.py --quick, ~25 s) runs after it.
# Everything runs in the virtual environment ci/_venv.sh names (default build/venv).
#   bash examples/run_demo.sh --core   # instead: the tour of the core C API (examples/core_demo.py)
#   bash examples/run_demo.sh --jax    # instead: the JAX/Flax GPT demo (examples/jax/train_gpt.py)
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$REPO_ROOT/ci/install_deps.sh"
source "$REPO_ROOT/ci/_venv.sh"  # the environment install_deps.sh installed into
te_venv_activate
case "${1:-}" in
  --core) shift; exec python "$REPO_ROOT/examples/core_demo.py" "$@" ;;
  --jax) shift; exec python "$REPO_ROOT/examples/jax/train_gpt.py" "$@" ;;
esac
python "$REPO_ROOT/examples/pytorch/train_gpt.py" "$@"
# quick mode is the demo's smoke test: it covers the JAX front end's example as well
for arg in "$@"; do
  if [ "$arg" = "--quick" ]; then
    exec python "$REPO_ROOT/examples/jax/train_gpt.py" --quick
  fi
done

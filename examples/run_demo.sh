#!/usr/bin/env bash
# The README's first command: installs dependencies and the package (ci/install_deps.sh, idempotent),
# then trains a small GPT with the PyTorch modules in bf16 and under each FP8 recipe on the CPU
# (examples/pytorch/train_gpt.py: ~2.5 minutes on 2 AMX cores, ~8 on 2 AVX2 cores; loss table
# printed, plot written to examples/pytorch/out/loss.png). Arguments go to train_gpt.py (e.g. --quick,
# --steps N). Everything runs in the virtual environment ci/_venv.sh names (default build/venv).
#   bash examples/run_demo.sh --core   # instead: the tour of the core C API (examples/core_demo.py)
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$REPO_ROOT/ci/install_deps.sh"
source "$REPO_ROOT/ci/_venv.sh"  # the environment install_deps.sh installed into
te_venv_activate
if [ "${1:-}" = "--core" ]; then
  shift
  exec python "$REPO_ROOT/examples/core_demo.py" "$@"
fi
exec python "$REPO_ROOT/examples/pytorch/train_gpt.py" "$@"

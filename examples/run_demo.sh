#!/usr/bin/env bash
# The README's first command: installs dependencies and the package (ci/install_deps.sh, idempotent),
# then runs the CPU tour of the core library (examples/core_demo.py, well under a minute).
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$REPO_ROOT/ci/install_deps.sh"
python "$REPO_ROOT/examples/core_demo.py" "$@"

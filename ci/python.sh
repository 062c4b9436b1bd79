#!/usr/bin/env bash
# Python suites of the core binding (loader, build info, ctypes C API): tag python.<file>.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/_utils.sh"
for f in "$REPO_ROOT"/tests/python/test_*.py; do
  [ -e "$f" ] || continue
  run_tagged "python.$(basename "$f" .py)" run_pytest "$f"
done
finish_tests python

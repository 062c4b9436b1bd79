#!/usr/bin/env bash
# The virtual environment of the README commands (sourced, not run). Every ci/*.sh and the demo run
# inside it, so a package installed by hand into the system Python cannot hide a missing install step:
#   TE_LITE_VENV  folder of the venv (default build/venv; relative paths are from the repo root);
#                 "none" uses whatever python is on PATH instead (your own environment).
# te_venv_create makes it (python -m venv: no system site-packages) if it does not exist;
# te_venv_activate enters it (a no-op when it is already active or TE_LITE_VENV=none).
_TE_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TE_LITE_VENV=${TE_LITE_VENV:-build/venv}
if [ "$TE_LITE_VENV" != none ]; then
  case "$TE_LITE_VENV" in
    /*) ;;
    *) TE_LITE_VENV=$_TE_REPO/$TE_LITE_VENV ;;
  esac
fi
export TE_LITE_VENV

te_venv_create() {
  [ "$TE_LITE_VENV" = none ] && return 0
  [ -x "$TE_LITE_VENV/bin/python" ] && return 0
  local py
  py=$(command -v python3.11 || command -v python3) || {
    echo "ci/_venv.sh: expected python3 on PATH, got none" >&2
    return 1
  }
  # Outside any active venv's python: a venv made from another venv would inherit its packages'
  # absence but also its base; the base interpreter is what we want.
  "$py" -m venv "$TE_LITE_VENV" || {
    echo "ci/_venv.sh: python -m venv $TE_LITE_VENV failed (Debian: apt-get install python3-venv)" >&2
    return 1
  }
  echo "ci: created virtual environment $TE_LITE_VENV ($("$TE_LITE_VENV/bin/python" --version))"
}

te_venv_activate() {
  [ "$TE_LITE_VENV" = none ] && return 0
  [ "${VIRTUAL_ENV:-}" = "$TE_LITE_VENV" ] && return 0
  if ! [ -x "$TE_LITE_VENV/bin/python" ]; then
    echo "ci/_venv.sh: no virtual environment at $TE_LITE_VENV; run ci/install_deps.sh first" >&2
    return 1
  fi
  # shellcheck disable=SC1091
  source "$TE_LITE_VENV/bin/activate"
}

#!/usr/bin/env bash
# Shared helpers of the ci/*.sh suites (sourced, not run).
#   TEST_LEVEL   1..99 (default 99): higher runs more configurations
#   TEST_SGPU / TEST_MGPU  gate single- and multi-process suites (both default 1 when neither is set)
#   TEST_FILTER  space-separated globs matched against test tags ("core.test_gemm", "pytorch.*");
#                empty = run everything
#   TEST_LIST_ONLY=1  print the tags that would run, run nothing
#   CTEST_TIMEOUT / PYTEST_TIMEOUT  per-test timeouts in seconds (defaults 600 / 900)
# configure_fused_attn_env MODE sets the attention backend switches of one CI configuration
# (MODE = auto | ck | aotriton | flash | unfused; see reference table below) and exports
# NVTE_ATTN_CI_MODE=MODE so tests know which configuration they run under. Call it in a subshell:
# it changes the environment. Unknown modes are an error (return 2).
#   mode      NVTE_FLASH_ATTN  NVTE_FUSED_ATTN  NVTE_FUSED_ATTN_CK  NVTE_FUSED_ATTN_AOTRITON
#   auto      unset            unset            unset               unset
#   aotriton  0                unset            0                   unset
#   ck        0                unset            unset               0
#   flash     unset            0                0                   0
#   unfused   0                0                unset               unset
# NVTE_UNFUSED_ATTN is unset (enabled) in every mode: the unfused path is the fallback and reference.
# Failures are collected; call `finish_tests` last: it prints "N passed, N failed" and returns non-zero
# if anything failed. A tag registered twice aborts (it would make TEST_FILTER ambiguous).

# Every suite runs in the README's virtual environment (ci/_venv.sh; made by ci/install_deps.sh).
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
te_venv_activate || exit 1

TEST_LEVEL=${TEST_LEVEL:-99}
if [ -z "${TEST_SGPU:-}" ] && [ -z "${TEST_MGPU:-}" ]; then TEST_SGPU=1; TEST_MGPU=1; fi
TEST_SGPU=${TEST_SGPU:-0}
TEST_MGPU=${TEST_MGPU:-0}
TEST_FILTER=${TEST_FILTER:-}
CTEST_TIMEOUT=${CTEST_TIMEOUT:-600}
PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-900}
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

_TE_PASSED=()
_TE_FAILED=()
declare -A _TE_SEEN_TAGS

# tag_selected TAG: true if TEST_FILTER is empty or one of its globs matches TAG.
tag_selected() {
  local tag=$1 pat
  [ -z "$TEST_FILTER" ] && return 0
  for pat in $TEST_FILTER; do
    # shellcheck disable=SC2053
    [[ $tag == $pat ]] && return 0
  done
  return 1
}

# run_tagged TAG COMMAND...: runs COMMAND under TAG unless filtered out; records the result.
run_tagged() {
  local tag=$1
  shift
  if [ -n "${_TE_SEEN_TAGS[$tag]:-}" ]; then
    echo "ci: duplicate test tag '$tag'" >&2
    exit 2
  fi
  _TE_SEEN_TAGS[$tag]=1
  tag_selected "$tag" || return 0
  if [ "${TEST_LIST_ONLY:-0}" = 1 ]; then
    echo "$tag"
    return 0
  fi
  echo "::: running $tag"
  local start=$SECONDS
  if "$@"; then
    _TE_PASSED+=("$tag")
    echo "::: $tag passed ($((SECONDS - start)) s)"
  else
    _TE_FAILED+=("$tag")
    echo "::: $tag FAILED ($((SECONDS - start)) s)"
  fi
}

finish_tests() {
  [ "${TEST_LIST_ONLY:-0}" = 1 ] && return 0
  local suite=${1:-tests}
  echo "::: $suite summary"
  local t
  for t in "${_TE_FAILED[@]}"; do echo "    FAILED: $t"; done
  echo "${#_TE_PASSED[@]} passed, ${#_TE_FAILED[@]} failed"
  [ "${#_TE_FAILED[@]}" -eq 0 ]
}

configure_fused_attn_env() {
  local mode=${1:-}
  unset NVTE_FLASH_ATTN NVTE_FUSED_ATTN NVTE_FUSED_ATTN_CK NVTE_FUSED_ATTN_AOTRITON NVTE_UNFUSED_ATTN
  case "$mode" in
    auto) ;;
    aotriton) export NVTE_FLASH_ATTN=0 NVTE_FUSED_ATTN_CK=0 ;;
    ck) export NVTE_FLASH_ATTN=0 NVTE_FUSED_ATTN_AOTRITON=0 ;;
    flash) export NVTE_FUSED_ATTN=0 NVTE_FUSED_ATTN_CK=0 NVTE_FUSED_ATTN_AOTRITON=0 ;;
    unfused) export NVTE_FLASH_ATTN=0 NVTE_FUSED_ATTN=0 ;;
    *)
      echo "configure_fused_attn_env: expected auto, ck, aotriton, flash or unfused, got '$mode'" >&2
      return 2
      ;;
  esac
  export NVTE_ATTN_CI_MODE=$mode
}

# attention_modes: the configure_fused_attn_env modes TEST_LEVEL selects (auto and unfused from 1,
# ck, aotriton and flash from 3). run_attn_mode MODE CMD...: CMD under MODE's switches, in a subshell
# so they do not leak into later tags.
attention_modes() {
  [ "$TEST_LEVEL" -ge 1 ] && echo auto unfused
  [ "$TEST_LEVEL" -ge 3 ] && echo ck aotriton flash
  return 0
}
run_attn_mode() {
  local mode=$1
  shift
  (configure_fused_attn_env "$mode" && "$@")
}

# pytest wrapper: exit code 5 (no test collected) counts as a failure of the tag, never a silent pass.
run_pytest() {
  python -m pytest -q -p no:cacheprovider -o faulthandler_timeout="$PYTEST_TIMEOUT" "$@"
}

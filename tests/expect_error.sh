#!/usr/bin/env bash
# Runs a command and checks how it ended, for ctest tests of the binaries.
#
#   expect_error.sh [--status N] REGEX -- COMMAND [ARGS...]
#       passes when COMMAND fails (exit status N if given, else any non-zero)
#       and a line of its stderr matches the extended regex REGEX.
#   expect_error.sh --success REGEX -- COMMAND [ARGS...]
#       passes when COMMAND exits 0 and a line of its stdout or stderr
#       matches REGEX.
#
# On failure it prints the command, its exit status, stdout and stderr.
set -u
mode=fail
status=
if [[ ${1:-} == --success ]]; then mode=ok; shift; fi
if [[ ${1:-} == --status ]]; then status=$2; shift 2; fi
if [[ $# -lt 3 || $2 != -- ]]; then
  echo "usage: $0 [--status N | --success] REGEX -- COMMAND [ARGS...]" >&2
  exit 64
fi
regex=$1
shift 2

out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
"$@" >"$out" 2>"$err"
rc=$?

problem=
if [[ $mode == ok ]]; then
  if [[ $rc -ne 0 ]]; then problem="expected exit status 0, got $rc"
  elif ! cat "$out" "$err" | grep -Eq -- "$regex"; then problem="no output line matches: $regex"
  fi
else
  if [[ $rc -eq 0 ]]; then problem="expected a failure, but it exited 0"
  elif [[ -n $status && $rc -ne $status ]]; then problem="expected exit status $status, got $rc"
  elif ! grep -Eq -- "$regex" "$err"; then problem="no stderr line matches: $regex"
  fi
fi

if [[ -n $problem ]]; then
  echo "FAILED: $problem"
  printf 'command:'; printf ' %q' "$@"; echo
  echo "exit status: $rc"
  echo "---- stdout ----"; cat "$out"
  echo "---- stderr ----"; cat "$err"
  exit 1
fi
echo "ok ($mode, exit status $rc): $regex"

#!/usr/bin/env bash
# A failed parallel launch must end on every rank, non-zero, with the error:
#   expect_all_ranks.sh N REGEX -- COMMAND [ARGS...]
# passes when COMMAND exits non-zero within 60 s and, for every rank r in
# 0..N-1, a stderr line matches "error: rank r (host H): REGEX" (extended regex).
#   expect_all_ranks.sh --once N REGEX -- COMMAND [ARGS...]
# an input error, reported once for the job: passes when COMMAND exits 2
# within 60 s with exactly one "error: rank r (host H): ..." line, rank 0's,
# matching REGEX, and no internal "[check ...]" text.
set -u
once=0
if [[ ${1:-} == --once ]]; then
  once=1
  shift
fi
if [[ $# -lt 4 || $3 != -- ]]; then
  echo "usage: $0 [--once] N REGEX -- COMMAND [ARGS...]" >&2
  exit 64
fi
n=$1 regex=$2
shift 3
err=$(mktemp) out=$(mktemp)
trap 'rm -f "$err" "$out"' EXIT
start=$SECONDS
timeout 60 "$@" >"$out" 2>"$err"
rc=$?
took=$((SECONDS - start))
problem=
if [[ $rc -eq 0 ]]; then problem="expected a failure, but it exited 0"
elif [[ $rc -eq 124 ]]; then problem="it hung: killed after 60 s"
elif [[ $once -eq 1 ]]; then
  reports=$(grep -cE '^error: rank [0-9]+ \(host [^)]*\)' "$err")
  if [[ $rc -ne 2 ]]; then problem="expected exit status 2 (an input error), got $rc"
  elif [[ $reports -ne 1 ]]; then problem="expected one error line for the job, got $reports"
  elif ! grep -Eq -- "^error: rank 0 \(host [^)]*\): $regex" "$err"; then
    problem="rank 0's error line does not match: $regex"
  elif grep -q '\[check `' "$err"; then problem="the message carries internal check text"
  fi
else
  for ((r = 0; r < n; r++)); do
    grep -Eq -- "error: rank $r \(host [^)]*\): $regex" "$err" || problem+="rank $r did not report the error; "
  done
fi
if [[ -n $problem ]]; then
  echo "FAILED: $problem"
  printf 'command:'; printf ' %q' "$@"; echo
  echo "exit status: $rc after ${took} s ($n ranks)"
  echo "---- stdout ----"; cat "$out"
  echo "---- stderr ----"; cat "$err"
  exit 1
fi
if [[ $once -eq 1 ]]; then echo "ok: exit status 2 after ${took} s; one report for $n ranks: $regex"
else echo "ok: exit status $rc after ${took} s; all $n ranks reported: $regex"; fi
grep -E "^error: rank 0 " "$err"

#!/usr/bin/env bash
# A failed parallel launch must end on every rank, non-zero, with the error:
#   expect_all_ranks.sh N REGEX -- COMMAND [ARGS...]
# passes when COMMAND exits non-zero within 60 s and, for every rank r in
# 0..N-1, a stderr line matches "error: rank r (host H): REGEX" (extended regex).
set -u
if [[ $# -lt 4 || $3 != -- ]]; then
  echo "usage: $0 N REGEX -- COMMAND [ARGS...]" >&2
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
else
  for ((r = 0; r < n; r++)); do
    grep -Eq -- "error: rank $r \(host [^)]*\): $regex" "$err" || problem+="rank $r did not report the error; "
  done
fi
if [[ -n $problem ]]; then
  echo "FAILED: $problem"
  printf 'command:'; printf ' %q' "$@"; echo
  echo "exit status: $rc after ${took} s"
  echo "---- stdout ----"; cat "$out"
  echo "---- stderr ----"; cat "$err"
  exit 1
fi
echo "ok: exit status $rc after ${took} s; all $n ranks reported: $regex"
grep -E "^error: rank 0 " "$err"

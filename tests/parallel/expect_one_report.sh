#!/usr/bin/env bash
# An input error of a parallel launch is reported once per job and ends every
# rank with exit status 2:
#   expect_one_report.sh N REGEX -- COMMAND [ARGS...]
# passes when COMMAND exits 2 within 60 s and exactly one stderr line is an
# "error: rank r (host H): ..." line, and it matches REGEX (extended regex),
# from rank 0 (or from the rank given by ADGT_EXPECT_RANK).
set -u
if [[ $# -lt 4 || $3 != -- ]]; then
  echo "usage: $0 N REGEX -- COMMAND [ARGS...]" >&2
  exit 64
fi
n=$1 regex=$2
shift 3
want_rank=${ADGT_EXPECT_RANK:-0}
err=$(mktemp) out=$(mktemp)
trap 'rm -f "$err" "$out"' EXIT
start=$SECONDS
timeout 60 "$@" >"$out" 2>"$err"
rc=$?
took=$((SECONDS - start))
problem=
reports=$(grep -cE '^error: rank [0-9]+ \(host [^)]*\)' "$err")
if [[ $rc -eq 124 ]]; then problem="it hung: killed after 60 s"
elif [[ $rc -ne 2 ]]; then problem="expected exit status 2 (an input error), got $rc"
elif [[ $reports -ne 1 ]]; then problem="expected one error line for the job, got $reports"
elif ! grep -Eq -- "^error: rank $want_rank \(host [^)]*\): $regex" "$err"; then
  problem="rank $want_rank's error line does not match: $regex"
elif grep -q '\[check `' "$err"; then problem="the message carries internal check text"
fi
if [[ -n $problem ]]; then
  echo "FAILED: $problem"
  printf 'command:'; printf ' %q' "$@"; echo
  echo "exit status: $rc after ${took} s ($n ranks)"
  echo "---- stdout ----"; cat "$out"
  echo "---- stderr ----"; cat "$err"
  exit 1
fi
echo "ok: exit status 2 after ${took} s; one report for $n ranks:"
grep -E "^error: rank " "$err"

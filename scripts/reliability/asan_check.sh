#!/usr/bin/env bash
# The sanitizer build (docs/reliability.md, "Fuzzing and
# corruption campaigns"): configures BUILD (default build-asan) without CUDA
# and with -DADGT_SANITIZE=address,undefined (host code only; -O1 -g), builds
# adgt-train and adgt_unit_tests, runs the unit tests and the config fuzz set
# (scripts/reliability/fuzz_configs.py) under AddressSanitizer and UBSan with
# halt_on_error. Exits non-zero on any failure or sanitizer report.
#
#   scripts/reliability/asan_check.sh [BUILD] [FUZZ_CASES]     (defaults: build-asan 1000)
#   JOBS=2 (make -j), SKIP_BUILD=1 (use BUILD as it is), UNIT_FILTER='[config]' (a Catch2 filter)
#
# Sanitizer options: halt_on_error=1 everywhere (the first report ends the
# process, which the fuzz classifier then counts as a crash). Leak detection
# is on for the fuzz set (adgt-train --print-config runs no MPI and leaks
# nothing) and off for the unit tests (Open MPI's and OpenBLAS's one-time
# allocations at exit are reported as leaks; none is ours to free). No
# suppression file is needed for the code paths run here; MPI itself is not
# instrumented (Debian's libmpi is built without sanitizers).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-asan}
cases=${2:-1000}
jobs=${JOBS:-2}
[[ $build = /* ]] || build=$root/$build

if [[ -z ${SKIP_BUILD:-} ]]; then
  cmake -S "$root" -B "$build" -DCMAKE_CUDA_COMPILER=NOTFOUND -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g -march=x86-64-v3 -fno-math-errno" \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g" -DADGT_SANITIZE=address,undefined >"$build.cmake.log" 2>&1 ||
    { tail -30 "$build.cmake.log"; echo "FAIL: cmake (log: $build.cmake.log)"; exit 1; }
  nice make -C "$build" -j"$jobs" adgt-train adgt_unit_tests >"$build.make.log" 2>&1 ||
    { grep -m20 -B2 -A6 'error' "$build.make.log"; echo "FAIL: build (log: $build.make.log)"; exit 1; }
fi

export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}
export OMP_NUM_THREADS=1
common=halt_on_error=1:abort_on_error=0:print_stacktrace=1
status=0

echo "== unit tests under ASan+UBSan, each test case in its own process ($build/tests/adgt_unit_tests)"
# One process per test case: halt_on_error ends only the case with a report.
unit=$build/tests/adgt_unit_tests
: >"$build.unit.log"
failed=()
mapfile -t names < <("$unit" --list-test-names-only ${UNIT_FILTER:+"$UNIT_FILTER"} | sed '/^$/d')
for name in "${names[@]}"; do
  spec=$(printf '%s' "$name" | sed 's/[][,\\]/\\&/g')  # Catch2 test-spec escapes
  ASAN_OPTIONS=$common:detect_leaks=0:detect_stack_use_after_return=1 UBSAN_OPTIONS=$common \
    timeout 600 "$unit" "$spec" >"$build.unit.one" 2>&1
  rc=$?
  { echo "---- $name (exit $rc)"; cat "$build.unit.one"; } >>"$build.unit.log"
  if [[ $rc -ne 0 ]]; then
    why=$(grep -m1 -oE 'ERROR: AddressSanitizer: [a-z-]+|runtime error: .*|FAILED' "$build.unit.one" || echo "exit $rc")
    where=$(grep -m1 -oE '^/[^ ]+:[0-9]+' "$build.unit.one")
    failed+=("$name: $why ${where}")
  fi
done
echo "${#names[@]} test cases, ${#failed[@]} failed (log: $build.unit.log)"
for f in "${failed[@]}"; do echo "  $f"; done
[[ ${#failed[@]} -eq 0 ]] || status=1

echo "== config fuzz set ($cases cases) under ASan+UBSan"
ASAN_OPTIONS=$common:detect_leaks=1 UBSAN_OPTIONS=$common \
  /usr/bin/python3 "$root/scripts/reliability/fuzz_configs.py" --bin "$build/apps/adgt-train" \
    -n "$cases" --timeout 60 --jobs "$jobs" --out "$build/fuzz_configs" || status=1

[[ $status -eq 0 ]] && echo "PASS: unit tests and $cases fuzz cases clean under ASan+UBSan" || echo "FAIL"
exit $status

#!/usr/bin/env bash
# The test suite: install what is missing, build, run the tests through ctest.
#   scripts/test.sh            every test (what CI and the README's command run)
#   scripts/test.sh --quick    the quick tier (ctest -L quick: unit cases, the kernel
#                              emulation, CLI and config errors, short single-process
#                              runs, a few 2-4-rank layouts; tests/tiers/quick.cmake)
# Further arguments go to ctest (e.g. -R layouts, --schedule-random).
set -euo pipefail
cd "$(dirname "$0")/.."
tier=()
if [[ "${1:-}" == --quick ]]; then
  tier=(-L quick)
  shift
fi
scripts/install_deps.sh
scripts/build.sh
source scripts/openblas_env.sh
cd build
# One machine: Open MPI's ob1 messaging layer (over shared memory), not a probe of
# the cm layer's network libraries (PSM, OFI) in every process, single-process
# runs included (0.2 s of each of some thousand launches; docs/testing.md).
export OMPI_MCA_pml="${OMPI_MCA_pml:-ob1}"
# OpenMP (and OpenBLAS, its OpenMP build) threads sleep at a barrier instead of
# spinning: two tests share the two cores, and a spinning thread beside a busy
# core made a 2-thread test 2.7x slower (3.1 s alone; 16.3 s active, 6.1 s
# passive beside one busy loop; no difference when alone; docs/testing.md).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
# The dry runs' profile cache (docs/simulator.md, "The profile cache") in the
# build tree: the tests neither read a profile the user's runs left in
# ~/.cache/adgt nor leave theirs there.
export XDG_CACHE_HOME="${ADGT_TEST_CACHE_HOME:-$PWD/test-cache}"
# Each test process gets at most 2 OpenMP/BLAS threads (tests set their own where they need fewer).
OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" ctest --output-on-failure -j"${CTEST_JOBS:-2}" "${tier[@]}" "$@"

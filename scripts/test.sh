#!/usr/bin/env bash
# The whole test suite: install what is missing, build, run every test through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
source scripts/openblas_env.sh
cd build
# Each test process gets at most 2 OpenMP/BLAS threads (tests set their own where they need fewer).
OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" ctest --output-on-failure -j"${CTEST_JOBS:-2}" "$@"

#!/usr/bin/env bash
# Gradient-compression codecs on this CPU (docs/compression.md): per codec the
# encode and decode time per MB of fp32 gradient (one thread), bytes per
# element and the ratio against fp32, and the round trip's relative error
# (checked against the codec's bound in the same run).
#   scripts/bench_compression.sh [BUILD_DIR]   (default: build)
set -euo pipefail
build=${1:-build}
exec env OMP_NUM_THREADS=1 "$build/tests/adgt_unit_tests" "[.compressbench]"

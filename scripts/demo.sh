#!/usr/bin/env bash
# The main job: install what is missing, build, prepare the King James Bible
# corpus and train the tiny LLaMA model on the CPU for a few hundred steps,
# then plot loss and throughput. Extra arguments go to adgt-train
# (e.g. --set train.steps=50).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
scripts/prepare_data.sh data/kjv
source scripts/openblas_env.sh
# One OpenMP/BLAS thread pool sized to the machine.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
RUN_DIR=runs/tiny
rm -f "$RUN_DIR/metrics.jsonl"
build/apps/adgt-train --config configs/tiny.yaml --set log.dir="$RUN_DIR" \
  --set checkpoint.dir="$RUN_DIR/checkpoints" "$@"
/usr/bin/python3 scripts/plot_metrics.py "$RUN_DIR" --out "$RUN_DIR/loss.png"
echo "loss plot:        $RUN_DIR/loss.png"

#!/usr/bin/env bash
# Does topology placement pay? (docs/placement.md) Trains the tiny model at
# tp=4 dp=2 on 8 CPU ranks emulating 2 nodes x 4 (configs/clusters/
# emulated-2node.yaml: intra-node links 10x faster than inter-node), with the
# emulated launcher handing ranks out round-robin, twice:
#   parallel.placement=launcher  (each tp group spans both nodes)
#   parallel.placement=topology  (each tp group inside one node)
# and prints each run's median step time after the first step (from
# metrics.jsonl) and their ratio. The driver also checks that both runs give
# the same losses bit for bit (placement never changes a number).
#
#   scripts/plan/placement_bench.sh [BUILD_DIR] [STEPS]
# BUILD_DIR defaults to build/ (adgt-train and data/kjv-byte from it).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
steps=${2:-8}
data=$build/data/kjv-byte
if [[ ! -f $data/train.bin ]]; then
  ADGT_TOKENIZER=byte "$root/scripts/prepare_data.sh" "$data" "$build/apps/adgt-data"
fi
train=$build/apps/adgt-train
[[ -x $train ]] || { echo "no $train; build first (scripts/build.sh)" >&2; exit 1; }
work=$build/placement_bench
out=$(python3 "$root/tests/placement/compare_placement.py" --train "$train" \
  --mpirun "$root/tests/parallel/mpirun.sh" --data "$data" \
  --model "$root/tests/emulate/model.yaml" \
  --cluster "$root/configs/clusters/emulated-2node.yaml" --work "$work" \
  --set model.n_layers=2 --set train.steps="$steps" --only launcher --only topology)
echo "$out"
python3 - "$out" <<'PY'
import re, sys
t = dict(re.findall(r"^(\w+): tp groups .*median step ([0-9.]+) ms", sys.argv[1], re.M))
l, p = float(t["launcher"]), float(t["topology"])
print(f"placement bench (tp=4 dp=2, 2 emulated nodes x 4, round-robin launcher): "
      f"launcher {l:.1f} ms/step, topology {p:.1f} ms/step, launcher/topology {l / p:.2f}x")
PY

#!/usr/bin/env bash
# The simulator's speed against the issue's bounds, measured in one run:
# a LLaMA-70B step on 1024 H100s (bound 2 s) and a sweep of every feasible
# layout of 70B on 256 H100s (bound 60 s); and the planner (parallel.auto)
# for 70B on 1024 H100s (bound 10 s).
#   scripts/sim/bench_sim.sh build/apps/adgt-sim [build/apps/adgt-train]
set -euo pipefail
sim=${1:?usage: $0 PATH/TO/adgt-sim [PATH/TO/adgt-train]}
train=${2:-$(dirname "$sim")/adgt-train}
root=$(cd "$(dirname "$0")/../.." && pwd)
t0=$(date +%s.%N)
"$sim" --config "$root/configs/llama-70b.yaml" --cluster dgx-h100 --set train.dtype=bf16 \
  --set parallel.tp=8 --set parallel.pp=8 --set parallel.dp=16 --set parallel.zero=1 \
  --set parallel.sequence_parallel=true --set parallel.schedule=interleaved \
  --set parallel.virtual_stages=2 --set train.recompute=selective > /dev/null
t1=$(date +%s.%N)
"$sim" --config "$root/configs/llama-70b.yaml" --cluster dgx-h100 --set train.dtype=bf16 \
  --gpus 256 --sweep --all --top 3
t2=$(date +%s.%N)
# The planner (parallel.auto): 70B on 1024 simulated H100s, bound 10 s.
"$train" --config "$root/configs/llama-70b.yaml" --set train.dtype=bf16 --set parallel.auto=true \
  --dry-run --cluster dgx-h100 --gpus 1024 | sed -n '1,4p;/layouts fit/p'
t3=$(date +%s.%N)
awk -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" 'BEGIN {
  printf "70B plan on 1024 GPUs: %.1f s (bound 10 s, %s)\n", d - c, (d - c <= 10 ? "ok" : "OVER");
  printf "70B step on 1024 GPUs: %.3f s (bound 2 s, %s)\n", b - a, (b - a <= 2 ? "ok" : "OVER");
  printf "70B sweep on 256 GPUs: %.1f s (bound 60 s, %s)\n", c - b, (c - b <= 60 ? "ok" : "OVER") }'

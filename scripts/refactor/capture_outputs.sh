#!/usr/bin/env bash
# The deterministic text outputs of adgt-train, adgt-sim and adgt-schedule on
# the shipped configs (--print-config, --print-schedule for five schedules at
# pp 4, adgt-sim --sweep and one pp 4 layout on dgx-h100, --dry-run on
# dgx-h100 for the small models), one file each under OUT. Run it with two
# builds and compare: a change that must not change behaviour leaves every
# file byte-identical except the simulator's own run time ("sim_seconds" and
# the sweep's "; N s"): compare with
#   norm() { sed -E 's/"sim_seconds":[0-9.e-]+//; s/; [0-9.]+ s$//' "$1"; }
#   for f in OUT_A/*; do diff <(norm "$f") <(norm "OUT_B/${f##*/}") || echo "$f"; done
# usage: capture_outputs.sh APPS_DIR OUT   (APPS_DIR holds adgt-train, adgt-sim, adgt-schedule)
set -uo pipefail
cd "$(dirname "$0")/../.."
B=$1 O=$2
mkdir -p "$O"
export OMP_NUM_THREADS=1
for c in configs/*.yaml; do
  n=$(basename "$c" .yaml)
  "$B/adgt-train" --config "$c" --print-config > "$O/$n.print-config" 2>&1; echo "rc $?" >> "$O/$n.print-config"
  "$B/adgt-sim" --config "$c" --cluster dgx-h100 --gpus 64 --sweep --top 8 > "$O/$n.sim-sweep" 2>&1; echo "rc $?" >> "$O/$n.sim-sweep"
  "$B/adgt-sim" --config "$c" --cluster dgx-h100 --set parallel.pp=4 --set parallel.tp=2 \
    --set train.device=cuda --set train.dtype=bf16 --json > "$O/$n.sim-pp4" 2>&1; echo "rc $?" >> "$O/$n.sim-pp4"
  for s in 1f1b zb-h1 interleaved greedy zb-v; do
    v=1; [[ $s == interleaved || $s == zb-v ]] && v=2
    "$B/adgt-train" --config "$c" --set parallel.pp=4 --set parallel.schedule=$s --set parallel.virtual_stages=$v \
      --print-schedule > "$O/$n.sched-$s" 2>&1; echo "rc $?" >> "$O/$n.sched-$s"
  done
done
for c in tiny tiny-moe gpt-small; do
  timeout 300 "$B/adgt-train" --config configs/$c.yaml --dry-run --cluster dgx-h100 --set train.device=cuda \
    --set train.dtype=bf16 > "$O/$c.dryrun-h100" 2>&1; echo "rc $?" >> "$O/$c.dryrun-h100"
done
"$B/adgt-schedule" > "$O/schedule-table" 2>&1; echo "rc $?" >> "$O/schedule-table"
"$B/adgt-schedule" --print greedy --pp 4 --m 8 > "$O/schedule-print" 2>&1; echo "rc $?" >> "$O/schedule-print"
echo "capture_outputs: $(ls "$O" | wc -l) files in $O"

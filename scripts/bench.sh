#!/usr/bin/env bash
# The timing claims, as benchmarks (not tests): every speed-up, capacity,
# detection step and accuracy figure measured on this host's clocks, each
# with its bound, run one after another and printed as one table. The ctest
# suite checks the same behaviour on the emulation's model clock (counted
# compute: the same decisions under any load, docs/emulation.md "Clocks");
# what is here depends on the machine and its load, so run it on a quiet one.
# docs/testing.md lists what moved here from the suite and why.
#
#   scripts/bench.sh [--build DIR] [--out DIR] [--only NAME,...] [--list]
#
# Needs a build (scripts/build.sh) and the byte-level corpus the suite
# prepares (DIR/data/kjv-byte: ctest -R layouts_prepare_bytes, or
# ADGT_TOKENIZER=byte scripts/prepare_data.sh DIR/data/kjv-byte DIR/apps/adgt-data).
# Exit status: 1 if any benchmark missed its bound.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$ROOT/build
OUT=""
ONLY=""
LIST=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) BUILD=$(cd "$2" && pwd); shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --list) LIST=1; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown argument '$1' (see --help)" >&2; exit 64 ;;
  esac
done
PY=/usr/bin/python3  # Debian's, with numpy and h5py (the suite's ADGT_PYTHON)
TRAIN=$BUILD/apps/adgt-train
SIM=$BUILD/apps/adgt-sim
DATA=$BUILD/data/kjv-byte
MPIRUN=$ROOT/tests/parallel/mpirun.sh
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

# name | the claim and its bound | the figure: a grep -E pattern of its log | command
# (run from $ROOT; WORK is its own folder)
BENCHES=(
  "emulate-comm|wall-clock emulation: every message and collective within model x 1.3 + 3 ms|emulated comm:|timeout 120 $MPIRUN 4 $BUILD/tests/adgt_emulated_comm_test tests/emulate/two_nodes.yaml --strict"
  "adapt-onset|a 2x slow rank from step 30 flagged within 20 steps (virtual clock)|detected at step|$PY tests/adapt/schedule_adapt_test.py --case onset --clock virtual --train $TRAIN --mpirun $MPIRUN --data $DATA --work WORK"
  "adapt-link|a 4x slow link from step 30 flagged within 20 steps, none before (virtual clock)|detected at step|$PY tests/adapt/schedule_adapt_test.py --case link-messages --clock virtual --train $TRAIN --mpirun $MPIRUN --data $DATA --work WORK"
  "adapt-mitigation|a 1.5x slow stage of 16 layers (d_model 256): the layer moves mitigate >= 60% (virtual clock)|mitigat|$PY scripts/adapt/bench_adapt.py --train $TRAIN --data $DATA --work WORK --reps 1 --steps 60 --set model.n_layers=16 --set model.d_model=256 --set model.ffn_hidden=1024 --set model.seq_len=128 --bound 0.6"
  "experts-train|skewed MoE: imbalance < 1/3 of static, half-speed rows 0.3-0.7x; expert time speed-up printed (virtual clock)|^check:|$PY scripts/adapt/bench_experts_train.py --check --clock virtual --reps 1 --steps 60 --train $TRAIN --data $DATA --work WORK"
  "replan-straggler|a 16x straggler read >= 2x, the slowest, and switched away from (virtual clock)|^straggler:|$PY tests/plan/replan_test.py --clock virtual --train $TRAIN --mpirun $MPIRUN --data $DATA --work WORK"
  "replan-link|a 16x slow link read >= 8x, its ranks not slow, one switch (virtual clock)|^link:|$PY tests/plan/replan_test.py --case link --clock virtual --train $TRAIN --mpirun $MPIRUN --data $DATA --work WORK"
  "compress-slow|50 Mbit/s link: the controller compresses, < 1/4 of the bytes (virtual clock, measured codecs)|step 40:|$PY tests/compress/controller_train.py --link slow --clock virtual --train $TRAIN --mpirun $MPIRUN --data $DATA --model tests/compress/model.yaml --work WORK"
  "compress-fast|100 Gbit/s link: every bucket off or bf16 (virtual clock, measured codecs)|step 40:|$PY tests/compress/controller_train.py --link fast --clock virtual --train $TRAIN --mpirun $MPIRUN --data $DATA --model tests/compress/model.yaml --work WORK"
  "sim-validate|simulator vs 4 measured layouts: mean 15%, each 25% after one host factor in 0.8-1.6 (virtual clock)|^host factor|$PY scripts/sim/validate_cpu.py --quick --train $TRAIN --sim $SIM --mpirun $MPIRUN --data $DATA --work WORK"
  "zero-overlap|ZeRO-3 dp4, a unit's gather <= its forward's compute: prefetch 1 exposes <= 25% of the gathers' time (model clock)|exposes .* of the gather time|$PY scripts/bench_zero_overlap.py --train $TRAIN --mpirun $MPIRUN --data $DATA"
  "cp-overlap|cp2/cp4 ring, a K/V block's transfer 0.75x its block's attention: exposed cp <= 20% of the transfers' time; all-to-all reported (model clock)|exposes at most|$PY scripts/bench_cp_overlap.py --train $TRAIN --mpirun $MPIRUN --data $DATA"
  "watchdog|SIGSTOP/SIGKILL of a rank: every survivor names it, the job ends (4 trials, 5 s deadline)|job end|$PY scripts/reliability/chaos.py --train $TRAIN --data $DATA --work WORK --signal both --trials 4 --ranks 4 --layout tp=2,dp=2 --timeout 5"
)

if [[ $LIST -eq 1 ]]; then
  for b in "${BENCHES[@]}"; do IFS='|' read -r name claim _ <<<"$b"; printf '%-18s %s\n' "$name" "$claim"; done
  exit 0
fi
for f in "$TRAIN" "$SIM" "$BUILD/tests/adgt_emulated_comm_test"; do
  [[ -x $f ]] || { echo "bench.sh: $f is missing: build first (scripts/build.sh)" >&2; exit 66; }
done
[[ -f $DATA/train.bin ]] || {
  echo "bench.sh: $DATA/train.bin is missing: ADGT_TOKENIZER=byte scripts/prepare_data.sh $DATA $BUILD/apps/adgt-data" >&2
  exit 66
}
OUT=${OUT:-$(mktemp -d /tmp/adgt-bench.XXXXXX)}
mkdir -p "$OUT"
cd "$ROOT" || exit 70

rows=()
failed=0
for b in "${BENCHES[@]}"; do
  IFS='|' read -r name claim pattern cmd <<<"$b"
  if [[ -n $ONLY && ",$ONLY," != *",$name,"* ]]; then continue; fi
  work=$OUT/$name
  rm -rf "$work"
  mkdir -p "$work"
  echo "== $name: $claim" >&2
  t0=$(date +%s.%N)
  ${cmd//WORK/$work} >"$work.log" 2>&1
  rc=$?
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')
  # The figure: the benchmark's last line matching its pattern (else its last line).
  figure=$(grep -E "$pattern" "$work.log" | tail -n 1)
  [[ -n $figure ]] || figure=$(grep -v -E '^\s*$' "$work.log" | tail -n 1)
  figure=$(echo "$figure" | sed 's/^ *//' | cut -c1-220)
  status=PASS
  if [[ $rc -ne 0 ]]; then status=FAIL; failed=1; fi
  rows+=("$name|$status|$secs|$claim|$figure")
  echo "   $status in ${secs} s: $figure" >&2
done

echo
echo "adgt benchmarks, $(date -u +%Y-%m-%dT%H:%MZ), $(getconf _NPROCESSORS_ONLN) cores, logs in $OUT"
printf '%-18s %-6s %6s  %s\n' benchmark status s "claim / measured"
for r in "${rows[@]}"; do
  IFS='|' read -r name status secs claim figure <<<"$r"
  printf '%-18s %-6s %6s  %s\n' "$name" "$status" "$secs" "$claim"
  printf '%-18s %-6s %6s    %s\n' "" "" "" "$figure"
done
exit $failed

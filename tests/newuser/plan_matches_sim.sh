#!/usr/bin/env bash
# The README's planner command (70B on 256 H100s) plans bf16 on the GPUs'
# memory model, says so, and its chosen layout's predicted MFU is what adgt-sim
# predicts for that layout on the same inputs (within 1%):
#   plan_matches_sim.sh ADGT_TRAIN ADGT_SIM CONFIG
set -u
train=$1 sim=$2 config=$3
fail() { echo "FAIL: $*"; exit 1; }
plan=$("$train" --config "$config" --set parallel.auto=true --dry-run --cluster dgx-h100 --gpus 256 2>&1) ||
  { echo "$plan"; fail "the dry run failed"; }
grep -q '^train.device=auto: estimated as cuda (the GPUs of --cluster dgx-h100)' <<<"$plan" || fail "no device line: $plan"
grep -q '^  precision: bf16 on cuda (MFU against H100-SXM5-80GB.s bf16 peak' <<<"$plan" || fail "the plan is not bf16 on cuda: $plan"
grep -q 'attention saves log-sum-exps (train.device cuda)' <<<"$plan" || fail "the memory estimate is not the CUDA backend's"
row=$(grep -E '^  1 +tp=.*<- chosen$' <<<"$plan") || fail "no chosen row: $plan"
echo "chosen: $row"
layout=$(sed -E 's/^  1 +//; s/ +[0-9.e+-]+ +[0-9.e+-]+ +[0-9.]+%.*$//' <<<"$row")
plan_mfu=$(grep -oE '[0-9.]+%' <<<"$row" | head -1 | tr -d %)
sets=()
for tok in $layout; do
  case $tok in
    tp=*) sets+=(--set "parallel.tp=${tok#tp=}") ;;
    pp=*) sets+=(--set "parallel.pp=${tok#pp=}") ;;
    dp=*) sets+=(--set "parallel.dp=${tok#dp=}") ;;
    zero=*) sets+=(--set "parallel.zero=${tok#zero=}") ;;
    sp=1) sets+=(--set parallel.sequence_parallel=true) ;;
    sp=0) sets+=(--set parallel.sequence_parallel=false) ;;
    v=*) sets+=(--set "parallel.virtual_stages=${tok#v=}") ;;
    mb=*) sets+=(--set "train.micro_batch=${tok#mb=}") ;;
    rc=*) sets+=(--set "train.recompute=${tok#rc=}") ;;
    gpipe|1f1b|interleaved|zb-h1|zb-v|greedy) sets+=(--set "parallel.schedule=$tok") ;;
    *) fail "unknown layout field '$tok' in: $layout" ;;
  esac
done
out=$("$sim" --config "$config" --cluster dgx-h100 "${sets[@]}" 2>&1) || { echo "$out"; fail "adgt-sim failed"; }
grep -q '^precision: *bf16 on cuda' <<<"$out" || fail "adgt-sim is not bf16 on cuda: $out"
sim_mfu=$(sed -nE 's/^TFLOP\/s per GPU: .*[(]MFU ([0-9.]+)%.*/\1/p' <<<"$out")
[[ -n $sim_mfu ]] || fail "no MFU from adgt-sim: $out"
awk -v a="$plan_mfu" -v b="$sim_mfu" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b > 0 && d / b <= 0.01) }' ||
  fail "the plan's MFU $plan_mfu% and adgt-sim's $sim_mfu% differ by more than 1%"
echo "ok: plan MFU $plan_mfu%, adgt-sim $sim_mfu% for $layout (bf16 on cuda)"

#!/usr/bin/env bash
# One forecast: a run on an emulated cluster (emulate.cluster, no --cluster)
# is predicted by --dry-run on that cluster with the costs adgt-sim gives it,
# so the two agree. On the emulation's model clock both profiles count FLOPs,
# so the agreement is exact (4 significant digits, the dry run's print). On
# the wall clock the dry run says the emulated ranks share this host's cores:
#   forecast_agree.sh ADGT_TRAIN ADGT_SIM MODEL_YAML CLUSTER_YAML
set -u
train=$1 sim=$2 model=$3 cluster=$4
fail() { echo "FAIL: $*"; exit 1; }
args=(--config "$model" --set "emulate.cluster=$cluster" --set emulate.clock=model
      --set parallel.dp=4 --set parallel.grad_compression=auto)
dry=$("$train" "${args[@]}" --dry-run 2>&1) || { echo "$dry"; fail "the dry run failed"; }
line=$(grep '^predicted step:' <<<"$dry") || fail "no predicted step: $dry"
grep -q 'adgt-sim, profile of backend cpu' <<<"$line" || fail "the dry run did not profile the CPU ranks: $line"
grep -q 'cpu-here' <<<"$line" && fail "the dry run predicted on cpu-here, not the run's emulated cluster: $line"
dry_s=$(sed -E 's/^predicted step: +([0-9.e+-]+) s .*/\1/' <<<"$line")
out=$("$sim" "${args[@]}" 2>&1) || { echo "$out"; fail "adgt-sim failed"; }
sim_s=$(sed -nE 's/^step time: +([0-9.e+-]+) s$/\1/p' <<<"$out")
[[ -n $sim_s ]] || fail "no step time from adgt-sim: $out"
grep -q '^costs: *profile of backend cpu' <<<"$out" || fail "adgt-sim did not profile the CPU ranks: $out"
same=$(awk -v a="$dry_s" -v b="$sim_s" 'BEGIN { printf "%d", sprintf("%.4g", a) == sprintf("%.4g", b) }')
[[ $same == 1 ]] || fail "--dry-run predicts $dry_s s, adgt-sim $sim_s s"
# On the wall clock the emulated ranks share this host's cores, priced as the
# launch plan prices them; on the model clock each has a core.
grep -q "emulated ranks share this host's" <<<"$dry" && fail "the model clock's dry run shares cores: $dry"
wall=$("$train" --config "$model" --set "emulate.cluster=$cluster" --set parallel.dp=4 --dry-run 2>&1) ||
  { echo "$wall"; fail "the wall-clock dry run failed"; }
grep -qE "^  cores: the 4 emulated ranks share this host's [0-9]+ cores" <<<"$wall" ||
  fail "the wall-clock dry run does not share this host's cores: $wall"
echo "ok: --dry-run $dry_s s, adgt-sim $sim_s s on the run's emulated cluster; the wall clock shares the host's cores"

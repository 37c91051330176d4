#!/usr/bin/env bash
# Run inside tests/slurm/with_slurm.sh --fake-gpus N: submits
# scripts/slurm/adgt-train.sbatch (2 tasks, one fake GPU each) with
# tests/slurm/fake_train.sh as the trainer, sends the batch script the
# time-limit signal (SIGUSR1), and checks that every rank "checkpointed", the
# job requeued itself, and the second run resumed with --resume auto.
# With a third argument `elastic` the template runs the trainer under
# scripts/adgt-elastic (ELASTIC=1): the signal goes batch script -> adgt-elastic
# -> srun -> ranks, and both runs start through adgt-elastic's srun.
#   sbatch_requeue_check.sh SBATCH_TEMPLATE FAKE_TRAIN [elastic]
set -euo pipefail
template=$1 fake=$2 mode=${3:-plain}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/adgt-sbatch.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
export FAKE_TRAIN_DIR=$work

job=$(sbatch --parsable --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 \
        --export=ALL,TRAIN="$fake",CONFIG=configs/tiny.yaml,ELASTIC=$([[ $mode == elastic ]] && echo 1 || echo 0),ELASTIC_BIN="$root/scripts/adgt-elastic" "$template" --set train.steps=5)
echo "submitted job $job"
for _ in $(seq 300); do [[ -f ready.0 && -f ready.1 ]] && break; sleep 0.1; done
[[ -f ready.0 && -f ready.1 ]] || { echo "FAILED: the ranks did not start"; cat ./*.out events 2>/dev/null; exit 1; }
scancel --batch --signal=USR1 "$job"
state=
for _ in $(seq 600); do
  state=$(scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2 || true)
  restarts=$(scontrol show job "$job" 2>/dev/null | grep -o 'Restarts=[0-9]*' | cut -d= -f2 || true)
  [[ $state == COMPLETED && ${restarts:-0} -ge 1 ]] && break
  [[ $state == FAILED || $state == CANCELLED || $state == TIMEOUT ]] && break
  sleep 0.1
done
echo "---- job output ----"; cat ./*.out
echo "---- events ----"; sort events
problem=
[[ $state == COMPLETED ]] || problem+="job state $state; "
[[ ${restarts:-0} -eq 1 ]] || problem+="restarts ${restarts:-0}, want 1; "
for r in 0 1; do
  grep -q "^checkpoint rank $r$" events || problem+="rank $r did not get SIGUSR1; "
  grep -q "^resumed rank $r$" events || problem+="rank $r did not run again; "
done
if [[ $mode == elastic ]]; then
  grep -q "args: --config configs/tiny.yaml --set train.steps=5 --resume auto --set parallel.auto=true" events ||
    problem+="wrong trainer arguments; "
  grep -q "adgt-elastic: launch 1: 2 ranks on" ./*.out || problem+="adgt-elastic did not launch; "
else
  grep -q "args: --config configs/tiny.yaml --resume auto --set train.steps=5" events || problem+="wrong trainer arguments; "
fi
grep -q "requeueing job $job" ./*.out || problem+="the script did not requeue; "
if [[ -n $problem ]]; then echo "FAILED: $problem"; exit 1; fi
echo "sbatch template: ok (signal forwarded to both ranks, requeued once, resumed)"

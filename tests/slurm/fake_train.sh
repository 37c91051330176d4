#!/usr/bin/env bash
# Stands in for adgt-train in the sbatch template's test: the first run waits
# for SIGUSR1, then "saves a checkpoint" and exits 0 like adgt-train; a
# requeued run (SLURM_RESTART_COUNT >= 1) "resumes" and finishes at once.
# $FAKE_TRAIN_DIR collects one line per event.
set -u
dir=${FAKE_TRAIN_DIR:?}
me=${SLURM_PROCID:-?}
if [[ " $* " == *" --print-config "* ]]; then  # scripts/adgt-elastic asks for the run's directories
  printf 'log:\n  dir: %s/log\ncheckpoint:\n  dir: %s/ckpt\nparallel:\n  tp: 1\n  pp: 1\n' "$dir" "$dir"
  exit 0
fi
echo "start rank $me restart ${SLURM_RESTART_COUNT:-0} args: $*" >>"$dir/events"
if [[ ${SLURM_RESTART_COUNT:-0} -ge 1 ]]; then
  echo "resumed rank $me" >>"$dir/events"
  exit 0
fi
trap 'echo "checkpoint rank $me" >>"$dir/events"; exit 0' USR1
: >"$dir/ready.$me"
for _ in $(seq 600); do sleep 0.1; done
echo "no signal rank $me" >>"$dir/events"
exit 3

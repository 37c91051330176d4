#!/usr/bin/env bash
# The same training run launched by mpirun and by srun (inside the private
# Slurm cluster of tests/slurm/with_slurm.sh) gives the same losses, bit for bit.
#   srun_vs_mpirun.sh ADGT_TRAIN DATA_DIR WORK_DIR   (run inside with_slurm.sh)
set -euo pipefail
train=$1 data=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
export OMP_NUM_THREADS=1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
args=(--config "$here/model.yaml" --set "data.train=$data/train.bin" --set "data.val=$data/val.bin"
      --set parallel.tp=2 --set parallel.dp=2 --set parallel.zero=1 --set parallel.sequence_parallel=true
      --set train.steps=8 --set checkpoint.interval=0)
"$here/../parallel/mpirun.sh" 4 "$train" "${args[@]}" --set "log.dir=$work/mpirun" \
  --set "checkpoint.dir=$work/mpirun/ckpt" > "$work/mpirun.log" 2>&1 || { cat "$work/mpirun.log"; exit 1; }
srun -n 4 --mpi=pmix "$train" "${args[@]}" --set "log.dir=$work/srun" \
  --set "checkpoint.dir=$work/srun/ckpt" > "$work/srun.log" 2>&1 || { cat "$work/srun.log"; exit 1; }
grep -q "launcher srun" "$work/srun.log" || { echo "FAILED: the srun run's rank table does not show srun"; cat "$work/srun.log"; exit 1; }
a=$(grep -o '"loss":[^,]*' "$work/mpirun/metrics.jsonl")
b=$(grep -o '"loss":[^,]*' "$work/srun/metrics.jsonl")
echo "mpirun: $(echo $a | tr '\n' ' ')"
echo "srun:   $(echo $b | tr '\n' ' ')"
[[ -n $a && $a == "$b" ]] || { echo "FAILED: losses differ between mpirun and srun"; exit 1; }
echo "srun vs mpirun: identical losses over $(echo "$a" | wc -l) steps"

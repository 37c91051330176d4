#!/usr/bin/env bash
# Run inside tests/slurm/with_slurm.sh: the collectives test and the mesh check
# as Open MPI ranks started by srun (PMIx), and a launch without PMIx refused.
#   srun_checks.sh COLLECTIVES_TEST MESH_CHECK
set -euo pipefail
coll=$1 mesh=$2
export OMP_NUM_THREADS=1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none

echo "== srun -n 4 --mpi=pmix collectives test"
out=$(srun -n 4 --mpi=pmix "$coll" --expect-launcher srun)
echo "$out"
grep -q "^collectives: ok on 4 ranks (launcher srun)" <<<"$out"

echo "== srun -n 4 --mpi=pmix adgt-mesh-check --tp 2 --dp 2"
out=$(srun -n 4 --mpi=pmix "$mesh" --tp 2 --dp 2)
echo "$out"
grep -q "^mesh-check: ok (4 ranks, launcher srun)" <<<"$out"

echo "== srun -n 2 without --mpi=pmix is refused with a named error"
set +e
err=$(srun -n 2 --mpi=none "$mesh" --dp 2 2>&1 >/dev/null)
rc=$?
set -e
echo "$err" | grep "^error: " | sort
if [[ $rc -eq 0 ]] || ! grep -q "^error: rank 0 (host .*): launch: srun started 2 tasks without PMIx (PMIX_RANK is not set).*srun --mpi=pmix" <<<"$err" ||
   ! grep -q "^error: rank 1 (host .*): launch: srun started 2 tasks without PMIx" <<<"$err"; then
  echo "FAILED: expected a non-zero exit and the PMIx error (exit status $rc):"
  echo "$err"
  exit 1
fi
echo "srun checks: ok"

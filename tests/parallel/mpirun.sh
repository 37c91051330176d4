#!/usr/bin/env bash
# Runs PROGRAM on N local ranks with Open MPI's mpirun, set up to be reliable on
# a small machine or in a container:
#   tests/parallel/mpirun.sh N PROGRAM [ARGS...]
# --oversubscribe and --bind-to none: more ranks than cores; OMP_NUM_THREADS=1
# per rank; shared memory (vader) without single-copy (CMA needs ptrace rights
# that containers often lack); the ob1 messaging layer (pml); --allow-run-as-root
# only when running as root.
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 N PROGRAM [ARGS...]" >&2
  exit 64
fi
n=$1
shift
args=(-np "$n" --oversubscribe --bind-to none
      --mca btl self,vader --mca btl_vader_single_copy_mechanism none)
if [[ $(id -u) -eq 0 ]]; then args+=(--allow-run-as-root); fi
export OMP_NUM_THREADS=1
# hwloc's PCI discovery in every rank (reading each device's config space
# through sysfs) is a tenth of an 8-rank test run's time; the tests place
# nothing by PCI locality (adgt reads no hwloc topology). A caller's setting wins.
export HWLOC_COMPONENTS="${HWLOC_COMPONENTS:--pci,-linuxio}"
# The ob1 point-to-point layer over those transports: without it Open MPI first
# probes the cm layer's network libraries (PSM, OFI), 0.2 s of every launch here.
export OMPI_MCA_pml="${OMPI_MCA_pml:-ob1}"
exec mpirun "${args[@]}" "$@"

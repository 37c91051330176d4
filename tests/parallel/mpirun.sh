#!/usr/bin/env bash
# Runs PROGRAM on N local ranks with Open MPI's mpirun, set up to be reliable on
# a small machine or in a container:
#   tests/parallel/mpirun.sh N PROGRAM [ARGS...]
# --oversubscribe and --bind-to none: more ranks than cores; OMP_NUM_THREADS=1
# per rank; shared memory (vader) without single-copy (CMA needs ptrace rights
# that containers often lack); the ob1 messaging layer (pml); --allow-run-as-root
# only when running as root; a session directory of its own (below).
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
# Open MPI 4.1 keeps every job's session files under one directory per host
# and user ($TMPDIR/ompi.HOST.UID), made by the first job to start and removed
# by the last to end: a launch that meets another's end can find it made and
# gone again ("mkdir ...: File exists", orte_session_dir failed). The suite
# starts jobs side by side, so each launch gets a base of its own, named for
# this process, which stays mpirun's (exec: tests signal mpirun and find its
# ranks as its children). Bases of launches that are gone are removed here,
# by the next launch. A caller's setting wins.
if [[ -z "${OMPI_MCA_orte_tmpdir_base:-}" ]]; then
  tmp=${TMPDIR:-/tmp}
  prefix="$tmp/adgt-mpirun.$(id -u)."
  for old in "$prefix"*; do
    [[ -d $old ]] || continue
    pid=${old#"$prefix"}
    [[ $pid =~ ^[0-9]+$ && $pid != "$$" ]] || continue
    kill -0 "$pid" 2>/dev/null || rm -rf "$old" 2>/dev/null || true  # another launch may be removing it too
  done
  base="$prefix$$"
  rm -rf "$base"  # one left by a process that had this number before
  mkdir -m 700 "$base"
  export OMPI_MCA_orte_tmpdir_base=$base
fi
exec mpirun "${args[@]}" "$@"

#!/usr/bin/env bash
# Installs the Debian packages adgt needs to build, test and run its demo,
# skipping those already present. Needs root (or sudo) only when something is missing.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config
  libyaml-cpp-dev libcli11-dev libhdf5-dev libopenmpi-dev openmpi-bin
  catch2 libopenblas-openmp-dev libsentencepiece-dev nlohmann-json3-dev
  bible-kjv                                    # the default corpus (King James Bible)
  python3-torch python3-h5py python3-numpy python3-matplotlib python3-yaml  # tests and plots (/usr/bin/python3)
  slurmctld slurmd slurm-client munge         # tests/slurm/with_slurm.sh: a private one-node Slurm cluster
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PKGS[@]} packages present"
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"

#!/usr/bin/env bash
# Installs the Debian packages adgt needs to build, test and run its demo,
# skipping those already present. Needs root (or sudo) only when something is missing.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config
  libyaml-cpp-dev libcli11-dev libhdf5-dev libopenmpi-dev openmpi-bin
  catch2 libopenblas-openmp-dev libsentencepiece-dev nlohmann-json3-dev
  zlib1g-dev libzstd-dev                       # compressed corpus files (.gz, .zst)
  libpcre2-dev                                 # tokenizer.json pre-tokenizer regexes
  libboost-context-dev                         # the CUDA emulation's fibers (tests/tools/cuda_sim)
  bible-kjv                                    # the default corpus (King James Bible)
  python3-torch python3-h5py python3-numpy python3-matplotlib python3-yaml  # tests and plots (/usr/bin/python3)
  slurmctld slurmd slurm-client munge         # tests/slurm/with_slurm.sh: a private one-node Slurm cluster
)

# Unpacks the members of PyPI wheel SPEC whose names start with PREFIX ("":
# all, and a LICENSE beside them) into DEST once (DEST/WHEEL_VERSION records
# SPEC); extra pip arguments follow. Needs pip and the network the first
# time; without them it warns with WITHOUT (what is then missing) and goes on.
#   unpack_wheel SPEC DEST PREFIX WITHOUT [pip args...]
unpack_wheel() {
  local spec=$1 dest=$2 prefix=$3 without=$4
  shift 4
  if [[ "$(cat "$dest/WHEEL_VERSION" 2>/dev/null)" == "$spec" ]]; then
    echo "install_deps: $spec present ($dest)"
    return 0
  fi
  local tmp
  tmp="$(mktemp -d)"
  if ! python3 -m pip download -q --no-deps --only-binary=:all: "$@" -d "$tmp" "$spec"; then
    echo "install_deps: warning: could not download $spec (pip or the network missing); $without" >&2
    rm -rf "$tmp"
    return 0
  fi
  rm -rf "$dest"
  mkdir -p "$dest"
  python3 - "$tmp" "$dest" "$prefix" <<'PYEOF'
import glob, sys, zipfile
tmp, dest, prefix = sys.argv[1:4]
with zipfile.ZipFile(glob.glob(tmp + "/*.whl")[0]) as z:
    z.extractall(dest, [n for n in z.namelist() if n.startswith(prefix)])
    lic = [n for n in z.namelist() if n.endswith("LICENSE.txt") or n.endswith("LICENSE")]
    if prefix and lic:
        z.extract(lic[0], dest)
PYEOF
  echo "$spec" >"$dest/WHEEL_VERSION"
  rm -rf "$tmp"
  echo "install_deps: $spec unpacked in $dest"
}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# cudnn-frontend: the header-only C++ graph API over cuDNN that the CUDA
# backend's cuDNN attention is written against (kernels/cuda/cudnn_attention.cpp;
# cuDNN itself ships with the CUDA toolkit). From PyPI's nvidia-cudnn-frontend
# wheel, whose include/ is unpacked into .deps/cudnn-frontend/include (ignored
# by git, outside build/; CMake looks there, or in CUDNN_FRONTEND_INCLUDE_DIR).
unpack_wheel nvidia-cudnn-frontend==1.16.0 "$ROOT/.deps/cudnn-frontend" include/ \
  "the build will have no cuDNN attention (train.attention=cudnn then refuses, naming this script)"

# HuggingFace `tokenizers`, the test oracle of the tokenizer.json reader
# (tests/data/hf_tokenizer_parity.py): its abi3 wheel unpacked into
# .deps/python for Debian's /usr/bin/python3 (no system site-packages touched).
unpack_wheel tokenizers==0.23.3 "$ROOT/.deps/python" "" "the tokenizer parity test will fail" \
  --python-version 3.11 --platform manylinux_2_17_x86_64

# Apache Arrow's C++ library for Parquet corpus files (core/data/parquet_source.cpp;
# Debian has no libarrow): the pyarrow wheel's libarrow/libparquet and their
# headers (pyarrow/include), unpacked whole into .deps/pyarrow, where CMake
# looks (or -DADGT_ARROW_ROOT). The same package is the tests' Parquet writer
# (tests/data/parquet_inputs.py, PYTHONPATH=.deps/pyarrow). Pinned: the C++
# API and the libraries' soname (libarrow.so.2600) move with the version.
unpack_wheel pyarrow==26.0.1 "$ROOT/.deps/pyarrow" pyarrow/ \
  "the build will read no .parquet input (adgt-data prepare refuses them, naming this script)" \
  --python-version 3.11 --platform "manylinux_2_28_$(uname -m)"

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

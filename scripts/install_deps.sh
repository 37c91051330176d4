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
  bible-kjv                                    # the default corpus (King James Bible)
  python3-torch python3-h5py python3-numpy python3-matplotlib python3-yaml  # tests and plots (/usr/bin/python3)
  slurmctld slurmd slurm-client munge         # tests/slurm/with_slurm.sh: a private one-node Slurm cluster
)

# cudnn-frontend: the header-only C++ graph API over cuDNN that the CUDA
# backend's cuDNN attention is written against (kernels/cuda/cudnn_attention.cpp;
# cuDNN itself ships with the CUDA toolkit). From PyPI's nvidia-cudnn-frontend
# wheel, whose include/ is unpacked into .deps/cudnn-frontend/include (ignored
# by git, outside build/; CMake looks there, or in CUDNN_FRONTEND_INCLUDE_DIR).
# Needs pip and the network once; without them the build has no cuDNN
# attention (train.attention=cudnn then refuses, naming this script).
CUDNN_FE_VERSION=1.16.0
install_cudnn_frontend() {
  local root dest
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  dest="$root/.deps/cudnn-frontend"
  if [[ -f "$dest/include/cudnn_frontend.h" && "$(cat "$dest/VERSION" 2>/dev/null)" == "$CUDNN_FE_VERSION" ]]; then
    echo "install_deps: cudnn-frontend $CUDNN_FE_VERSION present ($dest)"
    return 0
  fi
  local tmp
  tmp="$(mktemp -d)"
  if ! python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" \
      "nvidia-cudnn-frontend==$CUDNN_FE_VERSION"; then
    echo "install_deps: warning: could not download nvidia-cudnn-frontend $CUDNN_FE_VERSION (pip or" \
      "the network missing); the build will have no cuDNN attention" >&2
    rm -rf "$tmp"
    return 0
  fi
  rm -rf "$dest"
  mkdir -p "$dest"
  python3 - "$tmp" "$dest" <<'PYEOF'
import glob, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
whl = glob.glob(tmp + "/nvidia_cudnn_frontend-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.startswith("include/")]
    z.extractall(dest, names)
    lic = [n for n in z.namelist() if n.endswith("LICENSE.txt") or n.endswith("LICENSE")]
    if lic:
        z.extract(lic[0], dest)
PYEOF
  echo "$CUDNN_FE_VERSION" >"$dest/VERSION"
  rm -rf "$tmp"
  echo "install_deps: cudnn-frontend $CUDNN_FE_VERSION headers in $dest/include"
}
install_cudnn_frontend

# HuggingFace `tokenizers`, the test oracle of the tokenizer.json reader
# (tests/data/hf_tokenizer_parity.py): its abi3 wheel unpacked into
# .deps/python for Debian's /usr/bin/python3 (ignored by git; no system
# site-packages touched). Needs pip and the network once; without them that
# test fails naming this script.
TOKENIZERS_VERSION=0.23.3
install_tokenizers_oracle() {
  local root dest
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  dest="$root/.deps/python"
  if [[ -f "$dest/tokenizers/__init__.py" && "$(cat "$dest/TOKENIZERS_VERSION" 2>/dev/null)" == "$TOKENIZERS_VERSION" ]]; then
    echo "install_deps: tokenizers $TOKENIZERS_VERSION present ($dest)"
    return 0
  fi
  local tmp
  tmp="$(mktemp -d)"
  if ! python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
      --platform manylinux_2_17_x86_64 -d "$tmp" "tokenizers==$TOKENIZERS_VERSION"; then
    echo "install_deps: warning: could not download tokenizers $TOKENIZERS_VERSION (pip or the network" \
      "missing); the tokenizer parity test will fail" >&2
    rm -rf "$tmp"
    return 0
  fi
  rm -rf "$dest"
  mkdir -p "$dest"
  python3 -c 'import sys, zipfile, glob; zipfile.ZipFile(glob.glob(sys.argv[1] + "/tokenizers-*.whl")[0]).extractall(sys.argv[2])' \
    "$tmp" "$dest"
  echo "$TOKENIZERS_VERSION" >"$dest/TOKENIZERS_VERSION"
  rm -rf "$tmp"
  echo "install_deps: tokenizers $TOKENIZERS_VERSION in $dest"
}
install_tokenizers_oracle

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

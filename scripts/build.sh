#!/usr/bin/env bash
# Configures and builds adgt into ./build (Release). CUDA sources compile when nvcc is found.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"${JOBS:-2}"

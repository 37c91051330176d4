#!/usr/bin/env bash
# The one-call GPU check of the CUDA backend (issue 4; docs/cuda.md).
#
# The GPU machine has nvcc, CMake and PyTorch but none of the Debian libraries
# adgt links (OpenBLAS, yaml-cpp, HDF5, sentencepiece, ...), so the test binary
# is built HERE and carried there with those libraries, packed in one archive.
# cuBLAS is too large to carry: the GPU machine's own libcublas.so.13 is used.
#
#   scripts/device/check.sh bundle   # here, no GPU needed (~10 min the first
#                                    # time on 2 cores): builds build-cuda's
#                                    # adgt_unit_tests (sm_90), packs it with
#                                    # its non-system libraries into
#                                    # build-devbundle/bundle.tar.gz, and runs
#                                    # the bundled binary's [cuda] tests here
#                                    # (they skip without a GPU)
#   scripts/device/check.sh run      # on the GPU machine, in one device call:
#       run(command="bash scripts/device/check.sh run",
#           carry=["build-devbundle"], timeout_s=540)
#                                    # unpacks, finds cuBLAS and the driver,
#                                    # runs every CUDA-vs-CPU test and the
#                                    # benchmark; logs under $OUT, table last
#   scripts/device/check.sh paths    # checks the files this script relies on
#                                    # (registered with ctest, tests/cuda.cmake)
#
# Environment: JOBS (bundle build jobs, default 2), BENCH_BATCH (sequences per
# step of the 1.3B comparison, default 8), CHECK_BUDGET_S (seconds the run
# stage may take in all, default 470).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$ROOT/build-cuda"
BUNDLE_DIR="$ROOT/build-devbundle"
BUNDLE="$BUNDLE_DIR/bundle.tar.gz"
BIN_NAME=adgt_unit_tests

die() { echo "check.sh: $*" >&2; exit 1; }

# Files in the repository the script and the tests read.
REPO_FILES=(
  CMakeLists.txt
  kernels/CMakeLists.txt
  kernels/cuda/cuda_backend.hpp
  tests/unit/cuda_backend_test.cpp
  tests/unit/cuda_attention_test.cpp
  tests/unit/cuda_model_test.cpp
  scripts/device/torch_llama_bench.py
  configs/tiny.yaml
)

check_paths() {
  local missing=0 f
  for f in "${REPO_FILES[@]}"; do
    if [[ ! -f "$ROOT/$f" ]]; then
      echo "check.sh: missing $ROOT/$f" >&2
      missing=1
    fi
  done
  return $missing
}

# Libraries never bundled: glibc's (the GPU machine's newer glibc runs a binary
# built against this machine's 2.36), CUDA's (the GPU machine's own), and the
# C++ runtime (newer there; kept in lib-fallback/ in case it is missing).
skip_lib() {
  case "$1" in
    linux-vdso.so* | ld-linux*.so* | libc.so* | libm.so* | libdl.so* | libpthread.so* | \
      librt.so* | libresolv.so* | libutil.so* | libcuda.so* | libcublas*.so* | libcudart.so* | \
      libnvidia*.so*) return 0 ;;
  esac
  return 1
}

cmd_bundle() {
  check_paths || die "repository files missing"
  command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] ||
    die "nvcc not found: the bundle needs the CUDA toolkit on this machine"
  export PATH="/usr/local/cuda/bin:$PATH"
  if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90
  fi
  grep -q '^CMAKE_CUDA_COMPILER:.*nvcc' "$BUILD/CMakeCache.txt" ||
    die "$BUILD was configured without CUDA; remove it and run again"
  cmake --build "$BUILD" -j"${JOBS:-2}" --target "$BIN_NAME"
  local bin="$BUILD/tests/$BIN_NAME"
  [[ -x "$bin" ]] || die "build did not produce $bin"

  local stage
  stage="$(mktemp -d)"
  mkdir -p "$stage/lib" "$stage/lib-fallback"
  cp "$bin" "$stage/"
  local name path
  while read -r name path; do
    [[ -n "$path" && -f "$path" ]] || continue
    if skip_lib "$name"; then continue; fi
    case "$name" in
      libstdc++.so* | libgcc_s.so*) cp -L "$path" "$stage/lib-fallback/$name" ;;
      *) cp -L "$path" "$stage/lib/$name" ;;
    esac
  done < <(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }')
  ldd "$bin" | grep -q 'not found' && die "$bin has unresolved libraries here: $(ldd "$bin" | grep 'not found')"
  {
    echo "built: $(date -u +%FT%TZ) on $(uname -n), $(ldd --version 2>&1 | sed -n 1p)"
    echo "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?') $(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l) changed files"
    echo "nvcc: $(nvcc --version | tail -1)"
    echo "bundled:"
    (cd "$stage" && du -b "$BIN_NAME" lib/* lib-fallback/*)
  } >"$stage/MANIFEST"
  mkdir -p "$BUNDLE_DIR"
  tar -C "$stage" -czf "$BUNDLE.tmp" .
  mv "$BUNDLE.tmp" "$BUNDLE"
  cp "$stage/MANIFEST" "$BUNDLE_DIR/MANIFEST"
  rm -rf "$stage"
  local bytes
  bytes=$(stat -c %s "$BUNDLE")
  echo "check.sh: $BUNDLE: $((bytes / 1048576)) MiB (a device call carries 64 MiB in all)"
  ((bytes < 56 * 1048576)) || die "bundle too large to carry"

  # Exercise the bundle here as far as it goes: unpacked, run from its own
  # libraries; without a GPU the [cuda] cases check the no-GPU behaviour and skip.
  local t
  t="$(mktemp -d)"
  tar -C "$t" -xzf "$BUNDLE"
  (cd "$ROOT" && LD_LIBRARY_PATH="$t/lib" ADGT_SOURCE_DIR="$ROOT" OMP_NUM_THREADS=2 \
    "$t/$BIN_NAME" "[cuda]")
  rm -rf "$t"
  echo "check.sh: bundle ready; on the GPU machine: bash scripts/device/check.sh run (carry build-devbundle)"
}

# The first directory holding libcublas.so.13 and libcublasLt.so.13.
find_cublas() {
  local d cands=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib
                 /usr/local/cuda-13.0/lib64 /usr/lib/x86_64-linux-gnu)
  local py
  for py in python3 /opt/torch/.venv/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    while read -r d; do cands+=("$d"); done < <("$py" - <<'EOF' 2>/dev/null || true
import os
try:
    import nvidia
    for root in list(nvidia.__path__):
        for dirpath, _, files in os.walk(root):
            if "libcublas.so.13" in files:
                print(dirpath)
except Exception:
    pass
EOF
)
  done
  for d in "${cands[@]}"; do
    if [[ -e "$d/libcublas.so.13" && -e "$d/libcublasLt.so.13" ]]; then
      echo "$d"
      return 0
    fi
  done
  d="$(find /usr /opt -name libcublas.so.13 2>/dev/null | head -1 || true)"
  [[ -n "$d" ]] && dirname "$d"
}

cmd_run() {
  local out="${OUT:-$ROOT/build-devcheck}"
  mkdir -p "$out"
  [[ -f "$BUNDLE" ]] || die "$BUNDLE not found: run 'scripts/device/check.sh bundle' on the \
build machine first and name build-devbundle in the device call's carry"
  check_paths || die "repository files missing"
  local t0=$SECONDS
  {
    echo "== machine"
    uname -a
    ldd --version 2>&1 | sed -n 1p
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1 || true
    command -v nvcc >/dev/null && nvcc --version | tail -1
    echo "== bundle"
    cat "$BUNDLE_DIR/MANIFEST" 2>/dev/null || true
  } 2>&1 | tee "$out/machine.txt"

  local b=/tmp/adgt-bundle
  rm -rf "$b"
  mkdir -p "$b"
  tar -C "$b" -xzf "$BUNDLE"

  local cublas
  cublas="$(find_cublas || true)"
  [[ -n "$cublas" ]] || die "libcublas.so.13 not found on this machine (looked in the CUDA toolkit and PyTorch's nvidia packages)"
  local ld="$b/lib:$cublas"
  local d
  for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu; do
    [[ -d "$d" ]] && ld="$ld:$d"
  done
  # The C++ runtime: the machine's own unless it is missing or older than ours.
  if ! ldconfig -p 2>/dev/null | grep -q 'libstdc++.so.6 '; then
    ld="$ld:$b/lib-fallback"
  fi
  export LD_LIBRARY_PATH="$ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export ADGT_SOURCE_DIR="$ROOT" OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
  echo "== libraries (cuBLAS from $cublas)" | tee -a "$out/machine.txt"
  ldd "$b/$BIN_NAME" 2>&1 | tee -a "$out/machine.txt"
  if ldd "$b/$BIN_NAME" | grep -q 'not found'; then
    if ldd "$b/$BIN_NAME" | grep 'not found' | grep -q 'libstdc++\|libgcc_s\|GLIBCXX'; then
      export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$b/lib-fallback"
    fi
  fi
  ldd "$b/$BIN_NAME" | grep -q 'not found' && die "unresolved libraries (see machine.txt)"

  cd "$ROOT"
  # Order: correctness first (every op, the flash kernels, whole training
  # steps against the CPU), then the 1.3B comparison with PyTorch (the
  # figure issue 4 is judged by), then the kernel tables. Each stage has its
  # own timeout so one hang cannot eat the call (~8 minutes in all).
  local left
  left() { local l=$((${CHECK_BUDGET_S:-470} - (SECONDS - t0))); ((l > 20)) && echo $l || echo 20; }
  local trc=0 arc=0 trc2=0 brc=0 prc=0 krc=0
  set +e
  # 0. Before anything long: compute-sanitizer (memcheck, then racecheck) over
  # the small op cases, the embedding backward and the flash kernels, with
  # ADGT_CUDA_SYNC=1 so a fault is named at its op. A finding stops the check
  # with the sanitizer's report (the rest would only repeat the fault).
  echo "== 0. compute-sanitizer memcheck and racecheck (small op, embedding and flash cases)"
  local san
  san="$(command -v compute-sanitizer || true)"
  [[ -z "$san" && -x /usr/local/cuda/bin/compute-sanitizer ]] && san=/usr/local/cuda/bin/compute-sanitizer
  if [[ -n "$san" ]]; then
    local tool srs
    for tool in memcheck racecheck; do
      ADGT_CUDA_SYNC=1 timeout 75 "$san" --tool "$tool" --error-exitcode 99 "$b/$BIN_NAME" \
        "cuda backend: memory and elementwise ops,cuda backend: embedding forward and deterministic backward,cuda backend: bf16 embedding*,cuda backend: bf16 rmsnorm*,cuda attention: bf16 flash forward and backward against the CPU" \
        2>&1 | tail -n 200 >"$out/sanitizer_$tool.log"
      srs=${PIPESTATUS[0]}
      echo "compute-sanitizer $tool: exit $srs ($(grep -cE '^========= (Invalid|Race|Error)' "$out/sanitizer_$tool.log") findings)"
      if ((srs == 99)); then
        grep -E '^=========' "$out/sanitizer_$tool.log" | head -40
        echo "check.sh: compute-sanitizer $tool found errors; stopping (report: $out/sanitizer_$tool.log)"
        return 1
      fi
    done
  else
    echo "compute-sanitizer not found; skipped"
  fi

  echo "== 1. CUDA-vs-CPU tests (every op fp32/fp64/bf16, flash attention, training steps)"
  timeout 200 "$b/$BIN_NAME" "[cuda]" -d yes 2>&1 | tee "$out/cuda_tests.log"
  trc=${PIPESTATUS[0]}
  if grep -q 'no CUDA device visible' "$out/cuda_tests.log"; then
    echo "check.sh: the test binary saw no GPU (is libcuda.so.1 on LD_LIBRARY_PATH?): FAIL"
    trc=1
  fi

  echo "== 3a. adgt: 1.3B bf16 training steps"
  ADGT_BENCH_JSON="$out/adgt_bench.json" ADGT_BENCH_BATCH="${BENCH_BATCH:-8}" \
    timeout "$(left)" "$b/$BIN_NAME" "cuda: 1.3B bf16 training-step benchmark" 2>&1 |
    tee "$out/adgt_bench.log"
  brc=${PIPESTATUS[0]}

  echo "== 3b. PyTorch: the same model (torch.compile, SDPA, autocast bf16)"
  local py=python3
  command -v "$py" >/dev/null || py=/opt/torch/.venv/bin/python3
  PYTHONUNBUFFERED=1 timeout "$(left)" "$py" "$ROOT/scripts/device/torch_llama_bench.py" \
    --batch "${BENCH_BATCH:-8}" --steps 10 --warmup 3 --json "$out/torch_bench.json" 2>&1 |
    tee "$out/torch_bench.log"
  prc=${PIPESTATUS[0]}

  echo "== 4. kernel benchmarks (bf16 memory-bound kernels vs copy bandwidth, GEMMs, attention)"
  timeout "$(left)" "$b/$BIN_NAME" "cuda backend: bf16 benchmark" 2>&1 | tee "$out/bench.log"
  krc=${PIPESTATUS[0]}
  timeout "$(left)" "$b/$BIN_NAME" "cuda attention: bf16 benchmark" 2>&1 | tee -a "$out/bench.log"
  ((krc == 0)) && krc=${PIPESTATUS[0]}
  if (( $(left) > 90 )); then  # the fp32 tables of the first version, when time is left
    ADGT_BENCH_SKIP_LARGE=1 timeout "$(left)" "$b/$BIN_NAME" "cuda backend: benchmark" 2>&1 |
      tee "$out/bench_fp32.log"
  fi
  set -e
  nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv >>"$out/machine.txt" 2>&1 || true

  echo
  echo "================ summary ($((SECONDS - t0)) s) ================"
  grep -E '^(device:|\|)' "$out/bench.log" "$out/bench_fp32.log" 2>/dev/null | cut -d: -f2- ||
    echo "(no kernel tables)"
  echo "tests: $(grep -E 'test cases|All tests passed' "$out/cuda_tests.log" | tail -1) (exit $trc)"
  grep -E 'FAILED|failed' "$out/cuda_tests.log" | head -20 || true
  "$py" - "$out/adgt_bench.json" "$out/torch_bench.json" <<'PYEOF' || true
import json, sys
def load(p):
    try:
        return json.load(open(p))
    except Exception as e:
        return {"error": str(e)}
a, t = load(sys.argv[1]), load(sys.argv[2])
print("| 1.3B bf16 training | batch | step ms | tokens/s | TFLOP/s | MFU (of 989) |")
print("|---|---|---|---|---|---|")
for name, r in (("adgt", a), ("PyTorch compile+SDPA", t)):
    if "tokens_per_s" in r:
        print(f"| {name} | {r.get('batch')} | {r.get('step_ms', r.get('step_ms_median', 0)):.1f} | "
              f"{r['tokens_per_s']:.0f} | {r.get('tflops', 0):.1f} | {100 * r.get('mfu', 0):.1f}% |")
    else:
        print(f"| {name} | failed: {r.get('error', '?')} | | | | |")
if "tokens_per_s" in a and "tokens_per_s" in t:
    note = "" if a.get("batch") == t.get("batch") else " (different batch sizes)"
    print(f"adgt / PyTorch tokens/s: {a['tokens_per_s'] / t['tokens_per_s']:.2f}x{note}")
PYEOF
  echo "exits: tests $trc, adgt bench $brc, torch bench $prc, kernel benches $krc"
  echo "logs: $out/{machine.txt,cuda_tests.log,adgt_bench.*,torch_bench.*,bench.log,bench_fp32.log}"
  [[ $trc -eq 0 && $brc -eq 0 && $prc -eq 0 && $krc -eq 0 ]]
}

case "${1:-}" in
  bundle) cmd_bundle ;;
  run) cmd_run ;;
  paths) check_paths && echo "check.sh: all paths present" ;;
  *) echo "usage: $0 bundle|run|paths" >&2; exit 2 ;;
esac

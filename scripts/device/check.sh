#!/usr/bin/env bash
# The one-call GPU check of the CUDA backend (docs/cuda.md).
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
#   scripts/device/check.sh rehearse # here, after bundle: stage 5 (several
#                                    # ranks on one device) from the unpacked
#                                    # bundle, with its own relocated Open MPI,
#                                    # on the emulated device (no GPU)
#
# The bundle also carries adgt-train, Open MPI's launcher and plugins
# (relocated with OPAL_PREFIX: the GPU machine has no MPI) and a 1 MB
# byte-level corpus, for stage 5 (4 ranks sharing the GPU: tp2 dp2 ZeRO-1 SP,
# pp2 zb-h1 dp2, ep2 MoE, pp2 zb-v dp2, and in fp8 ep2 MoE (padded expert
# GEMMs) and tp2 SP with parallel.fp8_allgather, and context parallelism cp2
# in ring and all-to-all mode (bf16), each against the single GPU process; then SIGKILL
# of one of 4 ranks mid-run, which every survivor's watchdog must name within
# 30 s; scripts/device/multirank_check.py) and stage 6 (LLaMA-7B, seq 4096,
# micro-batch 1, selective recompute, bf16, a few steps: tokens/s, MFU of 989
# TFLOP/s, peak device memory against --dry-run). NCCL (200 MB) is not
# carried: PyTorch's libnccl.so.2 on the GPU machine is used, like cuBLAS.
#
# Environment: JOBS (bundle build jobs, default 2), CHECK_BUILD_DIR (an existing
# CUDA build instead of build-cuda), CHECK_NO_BUILD=1 (bundle that build's
# binaries without rebuilding), CHECK_BUNDLE_DIR (instead of build-devbundle), BENCH_BATCH (sequences per
# step of the 1.3B comparison, default 8), CHECK_BUDGET_S (seconds the run
# stage may take in all, default 470), CHECK_QUICK=1 (a re-check: stages 0, 1,
# 5, 5b, 6 and the 1.3B step, without the PyTorch comparison, the 1.3B
# variants and the kernel tables; ~150 s).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${CHECK_BUILD_DIR:-$ROOT/build-cuda}"  # CHECK_BUILD_DIR: an existing CUDA build instead
BUNDLE_DIR="${CHECK_BUNDLE_DIR:-$ROOT/build-devbundle}"  # CHECK_BUNDLE_DIR: elsewhere (ctest)
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
  scripts/device/multirank_check.py
  scripts/device/llama7b_table.py
  configs/tiny.yaml
  configs/llama-7b.yaml
  tests/layouts/model.yaml
  tests/moe/model.yaml
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
      libnvidia*.so* | libnccl.so* | libcudnn*.so*) return 0 ;;
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
  # CHECK_NO_BUILD=1 (ctest): the build's binaries as they are, no rebuild.
  # adgt_parallel_nccl_test (NcclComm, one rank: stage 5b) when the build has NCCL.
  local targets=("$BIN_NAME" adgt-train adgt-data)
  # (the listing read whole first: grep -q stopping early would end cmake with
  # SIGPIPE, which pipefail turns into "no NCCL test" -- the first GPU run's bundle)
  local help
  help="$(cmake --build "$BUILD" --target help 2>/dev/null || true)"
  if grep -q 'adgt_parallel_nccl_test' <<<"$help"; then
    targets+=(adgt_parallel_nccl_test)
  fi
  [[ ${CHECK_NO_BUILD:-0} == 1 ]] || cmake --build "$BUILD" -j"${JOBS:-2}" --target "${targets[@]}"
  local bin="$BUILD/tests/$BIN_NAME" train="$BUILD/apps/adgt-train"
  local nccl_test="$BUILD/tests/adgt_parallel_nccl_test"
  [[ -x "$nccl_test" ]] || nccl_test=""
  [[ -x "$bin" && -x "$train" ]] || die "build did not produce $bin and $train"

  local stage
  stage="$(mktemp -d)"
  mkdir -p "$stage/lib" "$stage/lib-fallback"
  cp "$bin" "$train" ${nccl_test:+"$nccl_test"} "$stage/"
  # Open MPI's launcher and plugins in Debian's layout under ompi/usr, found
  # there through OPAL_PREFIX (the GPU machine has no MPI of its own).
  local ompi_lib=/usr/lib/x86_64-linux-gnu/openmpi
  mkdir -p "$stage/ompi/usr/bin" "$stage/ompi$ompi_lib/lib" "$stage/ompi/usr/share"
  cp "$(readlink -f "$(command -v orterun || command -v mpirun)")" "$stage/ompi/usr/bin/orterun"
  # orted: a single process's MPI_Init (singleton) starts one
  cp "$(readlink -f "$(command -v orted)")" "$stage/ompi/usr/bin/orted"
  cp -a "$ompi_lib/lib/openmpi3" "$stage/ompi$ompi_lib/lib/"
  cp -a /usr/share/openmpi "$stage/ompi/usr/share/"
  local name path f
  for f in "$bin" "$train" ${nccl_test:+"$nccl_test"} "$stage/ompi/usr/bin/orterun" "$stage/ompi/usr/bin/orted" \
    "$stage/ompi$ompi_lib/lib/openmpi3"/*.so; do
    while read -r name path; do
      [[ -n "$path" && -f "$path" ]] || continue
      if skip_lib "$name"; then continue; fi
      case "$name" in
        libstdc++.so* | libgcc_s.so*) cp -L "$path" "$stage/lib-fallback/$name" ;;
        *) cp -L "$path" "$stage/lib/$name" ;;
      esac
    done < <(ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }')
  done
  ldd "$bin" | grep -q 'not found' && die "$bin has unresolved libraries here: $(ldd "$bin" | grep 'not found')"
  # A 1 MB byte-level corpus (the King James text's start) for stages 5 and 6.
  local text
  text="$(mktemp)"
  if [[ -f "$ROOT/data/kjv/kjv.txt" ]]; then head -c 1048576 "$ROOT/data/kjv/kjv.txt" >"$text"
  elif command -v bible >/dev/null; then  # whole, then cut (head would end bible with SIGPIPE)
    bible gen1:1-rev22:21 | sed -E 's/^ +[0-9]+ //; s/^ +//' >"$text.full"
    head -c 1048576 "$text.full" >"$text"
    rm -f "$text.full"
  fi
  [[ -s "$text" ]] || die "no corpus text: run scripts/prepare_data.sh first (data/kjv/kjv.txt)"
  "$BUILD/apps/adgt-data" prepare --input "$text" --out "$stage/data" --tokenizer byte >/dev/null
  rm -f "$text"
  {
    echo "built: $(date -u +%FT%TZ) on $(uname -n), $(ldd --version 2>&1 | sed -n 1p)"
    echo "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?') $(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l) changed files"
    echo "nvcc: $(nvcc --version | tail -1)"
    echo "bundled:"
    (cd "$stage" && du -b "$BIN_NAME" adgt-train lib/* lib-fallback/* && du -sb ompi data)
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

# The directory of library $1 inside PyTorch's nvidia-* packages (the first
# Python that has them), or else the first one under /usr and /opt.
find_nvidia_lib() {
  local py d
  for py in python3 /opt/torch/.venv/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    d="$("$py" -c '
import os, sys
try:
    import nvidia
    for root in list(nvidia.__path__):
        for dirpath, _, files in os.walk(root):
            if sys.argv[1] in files:
                print(dirpath)
                raise SystemExit
except Exception:
    pass
' "$1" 2>/dev/null || true)"
    [[ -n "$d" ]] && { echo "$d"; return 0; }
  done
  d="$(find /usr /opt -name "$1" 2>/dev/null | head -1 || true)"
  [[ -n "$d" ]] && dirname "$d"
}

# The first directory holding libcudnn.so.9 (cuDNN attention; the binary links
# it). The CUDA toolkit's when it has one, else PyTorch's nvidia-cudnn package
# (nvidia/cudnn/lib, beside libcudnn_graph/_engines_*/... that libcudnn.so.9
# loads from its own folder). Not carried: the engine libraries are ~500 MB.
find_cudnn() {
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
           /usr/lib/x86_64-linux-gnu; do
    [[ -e "$d/libcudnn.so.9" && -e "$d/libcudnn_graph.so.9" ]] && { echo "$d"; return 0; }
  done
  find_nvidia_lib libcudnn.so.9
}

# The first directory holding libnccl.so.2 (PyTorch's nvidia-nccl package, or a
# CUDA installation's), for adgt-train.
find_nccl() {
  find_nvidia_lib libnccl.so.2
}

# Stages 5 and 6 from the unpacked bundle $1, on device $2 (cuda,
# or emulated for the rehearsal), logs under $3. Sets mrc and src.
run_layout_stages() {
  local b=$1 device=$2 out=$3
  export OPAL_PREFIX="$b/ompi/usr"
  local mpirun="$b/ompi/usr/bin/orterun --oversubscribe --bind-to none --mca btl self,vader"
  mpirun+=" --mca btl_vader_single_copy_mechanism none"
  [[ $(id -u) -eq 0 ]] && mpirun+=" --allow-run-as-root"
  local py=python3
  command -v "$py" >/dev/null || py=/opt/torch/.venv/bin/python3
  echo "== 5. several ranks on one device ($device): tp2 dp2 ZeRO-1 SP, pp2 zb-h1 dp2, ep2 MoE, dp2 ZeRO-3, pp2 zb-v dp2; fp8 ep2 MoE, fp8 tp2 SP fp8_allgather; vs one process"
  OMP_NUM_THREADS="${STAGE5_THREADS:-2}" PYTHONUNBUFFERED=1 timeout "${STAGE5_S:-180}" "$py" \
    "$ROOT/scripts/device/multirank_check.py" --train "$b/adgt-train" --mpirun "$mpirun" \
    --data "$b/data" --work "$out/multirank" --device "$device" 2>&1 | tee "$out/multirank.log"
  mrc=${PIPESTATUS[0]}
  [[ $device == cuda ]] || return 0
  echo "== 6. LLaMA-7B on one GPU: seq 4096, micro-batch 1, selective recompute, bf16, 4 steps"
  local sets=(--set train.device=cuda --set train.dtype=bf16 --set train.micro_batch=1
              --set train.global_batch=1 --set model.seq_len=4096 --set train.recompute=selective
              --set train.steps=4 --set train.warmup_steps=1 --set train.eval_interval=0
              --set checkpoint.at_end=false --set checkpoint.interval=0 --set log.interval=1
              --set data.train="$b/data/train.bin" --set data.val="$b/data/val.bin"
              --set log.dir="$out/llama7b" --set checkpoint.dir="$out/llama7b_ckpt")
  "$b/adgt-train" --config "$ROOT/configs/llama-7b.yaml" "${sets[@]}" --dry-run >"$out/llama7b_dryrun.txt" 2>&1
  # The step needs the dry run's total on one GPU (126 GiB: an H200 holds it,
  # an 80 GB H100 does not): on a smaller card the stage is skipped, said so.
  local need have
  need=$(sed -nE 's/^ *total +([0-9.]+) GiB.*/\1/p' "$out/llama7b_dryrun.txt" | head -1)
  have=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  if [[ -n $need && -n $have ]] && awk -v n="$need" -v h="$have" 'BEGIN { exit !(n * 1024 > h) }'; then
    echo "-- 6. skipped: the dry run needs $need GiB, this GPU has $have MiB (the stage needs an H200)" |
      tee "$out/llama7b.log"
    src=0
    return 0
  fi
  OMP_NUM_THREADS=16 timeout "${STAGE6_S:-240}" "$b/adgt-train" --config "$ROOT/configs/llama-7b.yaml" \
    "${sets[@]}" 2>&1 | tee "$out/llama7b.log"
  src=${PIPESTATUS[0]}
  "$py" "$ROOT/scripts/device/llama7b_table.py" "$out/llama7b/metrics.jsonl" "$out/llama7b.log" \
    "$out/llama7b_dryrun.txt" | tee -a "$out/llama7b.log" || true
  # 6'. The same steps in FP8 (train.dtype fp8, docs/fp8.md; STAGE6_FP8=0
  # skips it): its dry run adds the weight codes and their transposes.
  [[ ${STAGE6_FP8:-1} == 1 ]] || return 0
  echo "== 6'. LLaMA-7B on one GPU in fp8 (the same steps)"
  local f8=("${sets[@]}" --set train.dtype=fp8 --set log.dir="$out/llama7b_fp8")
  "$b/adgt-train" --config "$ROOT/configs/llama-7b.yaml" "${f8[@]}" --dry-run >"$out/llama7b_fp8_dryrun.txt" 2>&1
  need=$(sed -nE 's/^ *total +([0-9.]+) GiB.*/\1/p' "$out/llama7b_fp8_dryrun.txt" | head -1)
  if [[ -n $need && -n $have ]] && awk -v n="$need" -v h="$have" 'BEGIN { exit !(n * 1024 > h) }'; then
    echo "-- 6'. skipped: the fp8 dry run needs $need GiB, this GPU has $have MiB" | tee "$out/llama7b_fp8.log"
    return 0
  fi
  OMP_NUM_THREADS=16 timeout "${STAGE6_S:-240}" "$b/adgt-train" --config "$ROOT/configs/llama-7b.yaml" \
    "${f8[@]}" 2>&1 | tee "$out/llama7b_fp8.log"
  "$py" "$ROOT/scripts/device/llama7b_table.py" "$out/llama7b_fp8/metrics.jsonl" "$out/llama7b_fp8.log" \
    "$out/llama7b_fp8_dryrun.txt" fp8 | tee -a "$out/llama7b_fp8.log" || true
}

cmd_rehearse() {
  [[ -f "$BUNDLE" ]] || die "$BUNDLE not found: run 'scripts/device/check.sh bundle' first"
  local b out="${OUT:-$ROOT/build-devcheck}/rehearse"
  b="$(mktemp -d)"
  mkdir -p "$out"
  tar -C "$b" -xzf "$BUNDLE"
  # Only the bundle's libraries (and the system's C runtime): what the GPU machine will have.
  export LD_LIBRARY_PATH="$b/lib"
  local mrc=0 src=0
  STAGE5_THREADS=1 STAGE5_S=600 run_layout_stages "$b" emulated "$out"
  rm -rf "$b"
  ((mrc == 0)) && echo "check.sh: rehearsal ok" || die "rehearsal: stage 5 failed (exit $mrc)"
}

# The run's logs into one archive in $OUT (checkpoints and token files left out).
pack_logs() {
  [[ -n "${CHECK_PACK_FROM:-}" && -d "$CHECK_PACK_FROM" ]] || return 0
  tar -C "$(dirname "$CHECK_PACK_FROM")" --exclude='*.h5' --exclude='*.bin' --exclude='*.idx' \
    -czf "$CHECK_PACK_TO/check_logs.tgz" "$(basename "$CHECK_PACK_FROM")" 2>/dev/null || true
  cp "$CHECK_PACK_FROM/summary.txt" "$CHECK_PACK_TO/" 2>/dev/null || true
}

cmd_run() {
  # On the device machine ($OUT set): the logs (20-odd files and folders) are
  # written to /tmp/adgt-check and packed at exit, whatever the exit, into
  # $OUT/check_logs.tgz beside $OUT/summary.txt (a device call brings back at
  # most 8 files).
  local out
  if [[ -n "${OUT:-}" ]]; then
    out=/tmp/adgt-check
    rm -rf "$out"
    CHECK_PACK_FROM=$out CHECK_PACK_TO=$OUT
    trap pack_logs EXIT
  else
    out="$ROOT/build-devcheck"
  fi
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

  local cublas nccl
  cublas="$(find_cublas || true)"
  [[ -n "$cublas" ]] || die "libcublas.so.13 not found on this machine (looked in the CUDA toolkit and PyTorch's nvidia packages)"
  nccl="$(find_nccl || true)"
  local cudnn
  cudnn="$(find_cudnn || true)"
  local ld="$b/lib:$cublas${cudnn:+:$cudnn}${nccl:+:$nccl}"
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
  # The CPU rows of the tables (the tiny.yaml CPU step): OpenBLAS picked its
  # Prescott kernels there without it (the first run, 2026-12-04).
  export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"
  # The bundled PMIx's zlib compression plugin does not load there (undefined
  # symbol pmix_output_info); it is not needed, only its warning is silenced.
  export PMIX_MCA_pcompress_base_silence_warning=1
  echo "== libraries (cuBLAS from $cublas; cuDNN from ${cudnn:-nowhere})" | tee -a "$out/machine.txt"
  [[ -n "$cudnn" ]] && (cd "$cudnn" && ls libcudnn*.so* | tr '\n' ' '; echo) >>"$out/machine.txt" 2>&1
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
  # figure the GPU work is judged by), then the kernel tables. Each stage has its
  # own timeout so one hang cannot eat the call (~8 minutes in all).
  local left
  left() { local l=$((${CHECK_BUDGET_S:-470} - (SECONDS - t0))); ((l > 20)) && echo $l || echo 20; }
  local trc=0 arc=0 trc2=0 brc=0 prc=0 krc=0 mrc=0 src=0 nrc=0
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

  if ldd "$b/adgt-train" | grep -q 'not found'; then
    echo "check.sh: adgt-train has unresolved libraries (libnccl.so.2: ${nccl:-not found}); stages 5-6 skipped"
    ldd "$b/adgt-train" | grep 'not found'
    mrc=1 src=1
  else
    run_layout_stages "$b" cuda "$out"
  fi

  # 5b. NcclComm on one rank (the machine has one GPU): communicator set-up,
  # its stream and events, every collective on exact integer data
  # (tests/parallel/nccl_test.cpp; ctest parallel_nccl_np1 skips without a GPU).
  if [[ -x "$b/adgt_parallel_nccl_test" ]]; then
    echo "== 5b. NcclComm, one rank (adgt_parallel_nccl_test)"
    local orun="$b/ompi/usr/bin/orterun --oversubscribe --bind-to none --mca btl self,vader"
    [[ $(id -u) -eq 0 ]] && orun+=" --allow-run-as-root"
    OPAL_PREFIX="$b/ompi/usr" timeout 90 $orun -np 1 "$b/adgt_parallel_nccl_test" 2>&1 |
      tee "$out/nccl_np1.log"
    nrc=${PIPESTATUS[0]}
  else
    echo "-- 5b. NcclComm: no adgt_parallel_nccl_test in the bundle (built without NCCL)"
  fi

  echo "== 3a. adgt: 1.3B bf16 training steps (train.attention=auto: the faster of flash and cuDNN)"
  ADGT_BENCH_JSON="$out/adgt_bench.json" ADGT_BENCH_BATCH="${BENCH_BATCH:-8}" \
    timeout "$(left)" "$b/$BIN_NAME" "cuda: 1.3B bf16 training-step benchmark" 2>&1 |
    tee "$out/adgt_bench.log"
  brc=${PIPESTATUS[0]}
  # The same steps with the layers' linears in FP8 (train.dtype fp8,
  # tensorwise scaling; docs/fp8.md): tokens/s against 3a's.
  echo "== 3a'. adgt: 1.3B fp8 training steps (cuBLASLt FP8 GEMMs)"
  ADGT_BENCH_FP8=1 ADGT_BENCH_JSON="$out/adgt_bench_fp8.json" ADGT_BENCH_BATCH="${BENCH_BATCH:-8}" \
    timeout "$(left)" "$b/$BIN_NAME" "cuda: 1.3B bf16 training-step benchmark" 2>&1 |
    tee "$out/adgt_bench_fp8.log"

  # CHECK_QUICK=1 (a re-check after a change, when the full tables have run
  # before): no PyTorch comparison, no 1.3B variants, no kernel tables.
  local py=python3  # (the summary's too)
  command -v "$py" >/dev/null || py=/opt/torch/.venv/bin/python3
  if [[ ${CHECK_QUICK:-0} == 1 ]]; then
  echo "-- CHECK_QUICK=1: 3b (PyTorch), 3c (1.3B variants) and 4 (kernel tables) skipped"
  else
  echo "== 3b. PyTorch: the same model (torch.compile, SDPA, autocast bf16)"
  PYTHONUNBUFFERED=1 timeout "$(left)" "$py" "$ROOT/scripts/device/torch_llama_bench.py" \
    --batch "${BENCH_BATCH:-8}" --steps 10 --warmup 3 --json "$out/torch_bench.json" 2>&1 |
    tee "$out/torch_bench.log"
  prc=${PIPESTATUS[0]}

  # 3c. The 1.3B model with each attention kernel, and with five projection
  # GEMMs instead of two (train.fused_projections=false), 4 timed steps each.
  local variant
  for variant in flash cudnn unfused; do
    (( $(left) > 60 )) || { echo "-- 3c. $variant: skipped (time)"; continue; }
    echo "== 3c. adgt: 1.3B bf16, $variant"
    ADGT_BENCH_JSON="$out/adgt_bench_$variant.json" ADGT_BENCH_BATCH="${BENCH_BATCH:-8}" \
      ADGT_BENCH_STEPS=4 ADGT_BENCH_ATTENTION="$([[ $variant == unfused ]] && echo auto || echo $variant)" \
      ADGT_BENCH_FUSED="$([[ $variant == unfused ]] && echo 0 || echo 1)" \
      timeout "$(( $(left) < 90 ? $(left) : 90 ))" "$b/$BIN_NAME" "cuda: 1.3B bf16 training-step benchmark" 2>&1 |
      tee "$out/adgt_bench_$variant.log" | grep -E '^(adgt|\||cuda attention|warning)' || true
  done

  echo "== 4. kernel benchmarks (bf16 memory-bound kernels vs copy bandwidth, GEMMs, attention)"
  timeout "$(left)" "$b/$BIN_NAME" "cuda backend: bf16 benchmark" 2>&1 | tee "$out/bench.log"
  krc=${PIPESTATUS[0]}
  timeout "$(left)" "$b/$BIN_NAME" "cuda attention: bf16 benchmark" 2>&1 | tee -a "$out/bench.log"
  ((krc == 0)) && krc=${PIPESTATUS[0]}
  # flash vs cuDNN SDPA: hd 64/128, T 2048/4096/8192, forward and backward
  # TFLOP/s, their agreement, and auto's pick (~30 s).
  timeout 120 "$b/$BIN_NAME" "cuda attention: flash vs cudnn benchmark" 2>&1 | tee -a "$out/bench.log"
  ((krc == 0)) && krc=${PIPESTATUS[0]}
  if (( $(left) > 90 )); then  # the fp32 tables of the first version, when time is left
    ADGT_BENCH_SKIP_LARGE=1 timeout "$(left)" "$b/$BIN_NAME" "cuda backend: benchmark" 2>&1 |
      tee "$out/bench_fp32.log"
  fi
  if (( $(left) > 60 )); then  # does restricting split-K to fp32 partials cost speed?
    echo "-- the bf16 GEMM rows again with any cuBLASLt reduction scheme (ADGT_LT_ANY_REDUCTION=1)"
    ADGT_LT_ANY_REDUCTION=1 timeout "$(left)" "$b/$BIN_NAME" "cuda backend: bf16 benchmark" 2>&1 |
      tee "$out/bench_lt_any.log" | grep -E '^\| (GEMM|linear)' || true
  fi
  fi  # CHECK_QUICK
  set -e
  nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv >>"$out/machine.txt" 2>&1 || true

  {
  echo
  echo "================ summary ($((SECONDS - t0)) s) ================"
  grep -E '^(device:|\|)' "$out/bench.log" "$out/bench_fp32.log" 2>/dev/null | cut -d: -f2- ||
    echo "(no kernel tables)"
  [[ -s "$out/bench_lt_any.log" ]] &&
    { echo "bf16 GEMMs with any split-K reduction (above: fp32 partials only):";
      grep -E '^\| (GEMM|linear)' "$out/bench_lt_any.log" || true; }
  echo "tests: $(grep -E 'test cases|All tests passed' "$out/cuda_tests.log" | tail -1) (exit $trc)"
  grep -E 'FAILED|failed' "$out/cuda_tests.log" | head -20 || true
  "$py" - "$out/adgt_bench.json" "$out/torch_bench.json" "$out"/adgt_bench_{flash,cudnn,unfused,fp8}.json <<'PYEOF' || true
import json, sys
def load(p):
    try:
        return json.load(open(p))
    except Exception as e:
        return {"error": str(e)}
a, t = load(sys.argv[1]), load(sys.argv[2])
variants = [("adgt attention=flash", load(sys.argv[3])), ("adgt attention=cudnn", load(sys.argv[4])),
            ("adgt unfused projections", load(sys.argv[5])), ("adgt fp8 (train.dtype fp8)", load(sys.argv[6]))]
print("| 1.3B bf16 training | batch | step ms | tokens/s | TFLOP/s | MFU (of 989) |")
print("|---|---|---|---|---|---|")
best = "adgt (auto: %s)" % a.get("attention", "?")
for name, r in [(best, a)] + variants + [("PyTorch compile+SDPA", t)]:
    if "tokens_per_s" in r:
        print(f"| {name} | {r.get('batch')} | {r.get('step_ms', r.get('step_ms_median', 0)):.1f} | "
              f"{r['tokens_per_s']:.0f} | {r.get('tflops', 0):.1f} | {100 * r.get('mfu', 0):.1f}% |")
    else:
        print(f"| {name} | failed: {r.get('error', '?')} | | | | |")
if "tokens_per_s" in a and "tokens_per_s" in t:
    note = "" if a.get("batch") == t.get("batch") else " (different batch sizes)"
    print(f"adgt / PyTorch tokens/s: {a['tokens_per_s'] / t['tokens_per_s']:.2f}x{note}")
f8 = variants[3][1]
if "tokens_per_s" in a and "tokens_per_s" in f8:
    print(f"adgt fp8 / bf16 tokens/s: {f8['tokens_per_s'] / a['tokens_per_s']:.2f}x "
          f"(loss {f8.get('loss', 0):.4f} vs {a.get('loss', 0):.4f})")
PYEOF
  grep -E '^[|]' "$out/multirank.log" 2>/dev/null || echo "(no stage-5 table)"
  grep -E '^[|]|^-- 6\.|^energy per token' "$out/llama7b.log" 2>/dev/null || echo "(no stage-6 table)"
  grep -E '^[|] seq|^-- 6' "$out/llama7b_fp8.log" 2>/dev/null || echo "(no stage-6' fp8 row)"
  grep -E '^start-up:' "$out/llama7b.log" 2>/dev/null || true
  # NVML over the 1.3B benchmark's timed steps, against the power model.
  grep -hE '^[|] power W' "$out/adgt_bench.log" "$out/adgt_bench_fp8.log" 2>/dev/null || echo "(no 1.3B telemetry)"
  # Telemetry (docs/telemetry.md): NVML's reading of the 7B steps, the run's
  # J/token and throttled share; the power model's presets are to be
  # calibrated from these (docs/power.md).
  grep -E '^telemetry:|^ *energy:|^ *throttled:' "$out/llama7b.log" 2>/dev/null || echo "(no stage-6 telemetry)"
  grep -oE '[|] power [0-9.]+ W sm [0-9.]+ MHz' "$out/llama7b.log" 2>/dev/null | tail -1 || true
  # The power controller on NVML (docs/power.md): its start-up line and any
  # decision it logged (a throttled window) during the 7B steps.
  grep -E '^power controller:|^power at step' "$out/llama7b.log" 2>/dev/null || echo "(no power controller line)"
  echo "exits: tests $trc, adgt bench $brc, torch bench $prc, kernel benches $krc, multirank $mrc, llama-7b $src, nccl np1 $nrc"
  echo "logs: $out/{machine.txt,cuda_tests.log,adgt_bench.*,torch_bench.*,bench.log,bench_fp32.log,nccl_np1.log}${OUT:+ (packed into \$OUT/check_logs.tgz)}"
  } 2>&1 | tee "$out/summary.txt"
  [[ $trc -eq 0 && $brc -eq 0 && $prc -eq 0 && $krc -eq 0 && $mrc -eq 0 && $src -eq 0 && $nrc -eq 0 ]]
}

case "${1:-}" in
  bundle) cmd_bundle ;;
  run) cmd_run ;;
  paths) check_paths && echo "check.sh: all paths present" ;;
  rehearse) cmd_rehearse ;;
  *) echo "usage: $0 bundle|run|rehearse|paths" >&2; exit 2 ;;
esac

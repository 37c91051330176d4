#!/usr/bin/env bash
# CPU speed benchmark (not a test): adgt-train against the PyTorch reference
# (tests/torch/train_ref.py) on the same model, batch, sequence length, token
# count and thread count, in one run; prints both tokens/s and adgt/PyTorch.
#
#   scripts/bench_cpu.sh [--steps N] [--threads N] [--rounds R] [--config FILE] [--build DIR] [--out DIR]
#
# Defaults: 20 steps, 1 round, 2 threads (OMP_NUM_THREADS and torch.set_num_threads),
# configs/tiny.yaml, build/, a fresh directory under /tmp. Both sides train in
# float32 from a random init; tokens come from the config's data.train when it
# exists (adgt-train needs it), and PyTorch falls back to random ids otherwise.
# adgt's figure is the median tokens_per_s of metrics.jsonl (logged every step),
# skipping the first record; PyTorch's is its median over all steps but the
# first; with R rounds (adgt, PyTorch, adgt, ...) the medians pool all rounds.
# OPENBLAS_CORETYPE is passed through as set in the environment (both sides use
# OpenBLAS: Debian's torch through libblas.so.3). Run it on a quiet machine:
# other processes on the same cores distort both.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
STEPS=20
ROUNDS=1
THREADS=2
CONFIG=configs/tiny.yaml
BUILD=build
OUT=""
PY=${ADGT_PYTHON:-/usr/bin/python3}

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "bench_cpu.sh: unknown argument '$1'" >&2; usage 2 >&2 ;;
  esac
done
if [ "$STEPS" -lt 3 ]; then
  echo "bench_cpu.sh: --steps $STEPS is too few; the first step is skipped, use at least 3" >&2
  exit 2
fi

cd "$ROOT"
TRAIN_BIN=$BUILD/apps/adgt-train
if [ ! -x "$TRAIN_BIN" ]; then
  echo "bench_cpu.sh: $TRAIN_BIN not found; build first (cmake -B $BUILD && cmake --build $BUILD -j2) or pass --build DIR" >&2
  exit 1
fi
[ -f "$CONFIG" ] || { echo "bench_cpu.sh: config $CONFIG not found" >&2; exit 1; }
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/adgt-bench.XXXXXX)
mkdir -p "$OUT"

export OMP_NUM_THREADS=$THREADS
# One shape for both sides, read from the run file (keys as in core/config.hpp).
SHAPE=$("$PY" - "$CONFIG" <<'EOF'
import sys
sys.path.insert(0, "tests/torch")
from llama_ref import read_yaml
y = read_yaml(sys.argv[1])
m, t = y.get("model", {}), y.get("train", {})
print(" ".join(f"{k}={m.get(k)}" for k in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads",
                                             "ffn_hidden", "seq_len")),
      f"micro_batch={t.get('micro_batch')} global_batch={t.get('global_batch', t.get('micro_batch'))}",
      f"warmup_steps={t.get('warmup_steps', 20)}")
EOF
)
echo "bench_cpu: $CONFIG: $SHAPE"
# A short run must not end inside the warm-up (adgt-train rejects that); the
# learning rate does not change the speed.
WARMUP=$(echo "$SHAPE" | sed -n 's/.*warmup_steps=\([0-9]*\).*/\1/p')
[ -n "$WARMUP" ] && [ "$WARMUP" -le "$STEPS" ] || WARMUP=$STEPS
echo "bench_cpu: $STEPS steps, OMP_NUM_THREADS=$THREADS, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-<unset>}, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "bench_cpu: logs in $OUT"
if awk -v l="$(cut -d' ' -f1 /proc/loadavg)" 'BEGIN { exit !(l > 0.5) }'; then
  echo "bench_cpu: warning: the machine is busy (1-minute load above 0.5); the figures will be noisy"
fi

run_adgt() {  # $1: the round's directory
  "$TRAIN_BIN" --config "$CONFIG" \
    --set train.steps="$STEPS" --set train.warmup_steps="$WARMUP" --set train.device=cpu \
    --set train.eval_interval=0 --set log.dir="$1/adgt" --set log.interval=1 \
    --set checkpoint.interval=0 --set checkpoint.dir="$1/adgt/checkpoints" > "$1/adgt.log" 2>&1 || {
    echo "bench_cpu: adgt-train failed; the end of $1/adgt.log:" >&2
    tail -20 "$1/adgt.log" >&2
    exit 1
  }
}
run_torch() {
  "$PY" tests/torch/train_ref.py --config "$CONFIG" --steps "$STEPS" --warmup-steps "$WARMUP" \
    --threads "$THREADS" --json "$1/torch.json" > "$1/torch.log" 2>&1 || {
    echo "bench_cpu: train_ref.py failed; the end of $1/torch.log:" >&2
    tail -20 "$1/torch.log" >&2
    exit 1
  }
}

# Rounds alternate adgt and PyTorch so that a change in background load hits both.
for r in $(seq 1 "$ROUNDS"); do
  D=$OUT/round$r
  mkdir -p "$D"
  echo "bench_cpu: round $r/$ROUNDS: adgt-train ..."
  run_adgt "$D"
  echo "bench_cpu: round $r/$ROUNDS: tests/torch/train_ref.py ..."
  run_torch "$D"
done

# Per-step tokens/s, the first step of every run skipped; the median of all.
read -r ADGT_TPS TORCH_TPS <<<"$("$PY" - "$OUT" "$ROUNDS" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
adgt, torch = [], []
for r in range(1, rounds + 1):
    d = f"{out}/round{r}"
    recs = [json.loads(l) for l in open(f"{d}/adgt/metrics.jsonl") if l.strip()]
    a = [x["tokens_per_s"] for x in recs if "tokens_per_s" in x][1:]  # skip the first logged step
    t = [x["tokens_per_s"] for x in json.load(open(f"{d}/torch.json"))["steps"]][1:]
    if not a or not t:
        sys.exit(f"{d}: no per-step tokens/s after the first step")
    print(f"bench_cpu: round {r}: adgt median {statistics.median(a):.0f}, "
          f"PyTorch median {statistics.median(t):.0f} tokens/s", file=sys.stderr)
    adgt += a
    torch += t
print(f"{statistics.median(adgt):.1f} {statistics.median(torch):.1f}")
EOF
)"

echo
printf '%-30s %12s\n' "implementation" "tokens/s"
printf '%-30s %12.0f\n' "adgt-train (CPU, fp32)" "$ADGT_TPS"
printf '%-30s %12.0f\n' "PyTorch $("$PY" -c 'import torch; print(torch.__version__)') (fp32)" "$TORCH_TPS"
awk -v a="$ADGT_TPS" -v t="$TORCH_TPS" 'BEGIN { printf "ratio adgt/PyTorch: %.2f\n", a / t }'
echo "bench_cpu: load after the run $(cut -d' ' -f1-3 /proc/loadavg)"

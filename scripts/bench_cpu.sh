#!/usr/bin/env bash
# CPU speed benchmark (not a test): adgt-train against the PyTorch reference
# (tests/torch/train_ref.py) on the same model, batch, sequence length, token
# count and thread count, in one run; prints both tokens/s and adgt/PyTorch.
#
#   scripts/bench_cpu.sh [--steps N] [--threads N] [--config FILE] [--build DIR] [--out DIR]
#
# Defaults: 20 steps, 2 threads (OMP_NUM_THREADS and torch.set_num_threads),
# configs/tiny.yaml, build/, a fresh directory under /tmp. Both sides train in
# float32 from a random init; tokens come from the config's data.train when it
# exists (adgt-train needs it), and PyTorch falls back to random ids otherwise.
# adgt's figure is the median tokens_per_s of metrics.jsonl (logged every step),
# skipping the first record; PyTorch's is its median over all steps but the
# first. OPENBLAS_CORETYPE is passed through as set in the environment.
# Run it on a quiet machine: other processes on the same cores distort both.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
STEPS=20
THREADS=2
CONFIG=configs/tiny.yaml
BUILD=build
OUT=""
PY=${ADGT_PYTHON:-/usr/bin/python3}

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
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

# ---- adgt
echo "bench_cpu: running adgt-train ..."
if ! "$TRAIN_BIN" --config "$CONFIG" \
    --set train.steps="$STEPS" --set train.warmup_steps="$WARMUP" --set train.device=cpu --set train.eval_interval=0 \
    --set log.dir="$OUT/adgt" --set log.interval=1 \
    --set checkpoint.interval=0 --set checkpoint.dir="$OUT/adgt/checkpoints" \
    > "$OUT/adgt.log" 2>&1; then
  echo "bench_cpu: adgt-train failed; the end of $OUT/adgt.log:" >&2
  tail -20 "$OUT/adgt.log" >&2
  exit 1
fi
ADGT_TPS=$("$PY" - "$OUT/adgt/metrics.jsonl" <<'EOF'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
tps = [r["tokens_per_s"] for r in recs if "tokens_per_s" in r][1:]  # skip the first logged step
if not tps:
    sys.exit(f"{sys.argv[1]}: no tokens_per_s records after the first")
print(f"{statistics.median(tps):.1f}")
EOF
)

# ---- PyTorch
echo "bench_cpu: running tests/torch/train_ref.py ..."
if ! "$PY" tests/torch/train_ref.py --config "$CONFIG" --steps "$STEPS" --warmup-steps "$WARMUP" \
    --threads "$THREADS" --json "$OUT/torch.json" > "$OUT/torch.log" 2>&1; then
  echo "bench_cpu: train_ref.py failed; the end of $OUT/torch.log:" >&2
  tail -20 "$OUT/torch.log" >&2
  exit 1
fi
TORCH_TPS=$(awk '$1 == "tokens_per_s" { v = $2 } END { print v }' "$OUT/torch.log")
[ -n "$TORCH_TPS" ] || { echo "bench_cpu: no tokens_per_s line in $OUT/torch.log" >&2; exit 1; }

echo
printf '%-30s %12s\n' "implementation" "tokens/s"
printf '%-30s %12.0f\n' "adgt-train (CPU, fp32)" "$ADGT_TPS"
printf '%-30s %12.0f\n' "PyTorch $("$PY" -c 'import torch; print(torch.__version__)') (fp32)" "$TORCH_TPS"
awk -v a="$ADGT_TPS" -v t="$TORCH_TPS" 'BEGIN { printf "ratio adgt/PyTorch: %.2f\n", a / t }'
echo "bench_cpu: load after the run $(cut -d' ' -f1-3 /proc/loadavg)"

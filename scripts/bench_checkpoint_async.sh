#!/usr/bin/env bash
# Asynchronous checkpoint benchmark (checkpoint.async; docs/reliability.md,
# "Asynchronous checkpoints"): the training stall of an asynchronous save
# against the time of a synchronous save of the same state.
#
#   scripts/bench_checkpoint_async.sh [BUILD_DIR] [WORK_DIR]
#   env: RANKS=1 (1: one process; 2: dp=2 with ZeRO-1), STEPS=8, INTERVAL=3,
#        MODEL="model.d_model=1024 ..." (--set items; default ~95M parameters),
#        PYTHON (with h5py and numpy; default /usr/bin/python3)
#
# Two runs of adgt-train with the same config, data and seed, one with
# checkpoint.async=false and one with true (checkpoint.at_end=false, saves at
# steps INTERVAL, 2*INTERVAL, ...), so every save holds the same state in both
# (checked: the checkpoints' meta/pieces, with every piece's crc32, are equal).
# From each run's metrics.jsonl ({"event":"checkpoint"} records):
#   sync stall   the whole save at the step boundary (copy to host, write,
#                fsync, commit);
#   async stall  what the step boundaries spent on the save: the copy to host
#                memory, the begin phase, the polls (one all-reduce each), the
#                wait for the writer (only when it had not finished by the next
#                save or the end) and the commit (index, COMPLETE, rename);
#   write        the background write of the rank file (fsync included);
#   slowdown     the extra time of the steps that ran while the write was in
#                flight, against the median step of the synchronous run (the
#                writer shares the cores and the memory bus with training).
# The target: async stall <= 10% of the sync save.
# BUILD_DIR (default build) needs apps/adgt-train and the byte corpus
# BUILD/data/kjv-byte (ctest -R layouts_prepare_bytes). WORK_DIR (default
# BUILD/bench_checkpoint_async) must be on the disk to measure (~4 GB).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$here/build}" && pwd)
work=${2:-$build/bench_checkpoint_async}
ranks=${RANKS:-1}
steps=${STEPS:-8}
interval=${INTERVAL:-3}
model=${MODEL:-"model.d_model=1024 model.n_layers=8 model.n_heads=16 model.n_kv_heads=8 model.ffn_hidden=2816"}
py=${PYTHON:-$( [[ -x /usr/bin/python3 ]] && echo /usr/bin/python3 || echo python3)}
train=$build/apps/adgt-train
data=$build/data/kjv-byte
[[ -x $train ]] || { echo "missing $train: cmake --build $build --target adgt-train" >&2; exit 2; }
[[ -f $data/train.bin ]] || { echo "missing $data: ctest --test-dir $build -R layouts_prepare_bytes" >&2; exit 2; }
mkdir -p "$work"
work=$(cd "$work" && pwd)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / ranks > 0 ? $(nproc) / ranks : 1 ))}

sets=(data.train=$data/train.bin data.val=$data/val.bin train.steps=$steps train.micro_batch=1
      train.global_batch=$ranks train.warmup_steps=1 train.eval_interval=0 log.interval=1
      checkpoint.interval=$interval checkpoint.at_end=false checkpoint.keep=0 $model)
[[ $ranks -gt 1 ]] && sets+=(parallel.dp=$ranks parallel.zero=1)
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
for mode in sync async; do
  rm -rf "$work/$mode"
  cmd=("$train" --config "$here/tests/layouts/model.yaml")
  for s in "${sets[@]}" log.dir=$work/$mode checkpoint.dir=$work/$mode/ckpt \
           checkpoint.async=$([[ $mode == async ]] && echo true || echo false); do
    cmd+=(--set "$s")
  done
  [[ $ranks -gt 1 ]] && cmd=("$here/tests/parallel/mpirun.sh" "$ranks" "${cmd[@]}")
  echo "== $mode: ${cmd[*]}"
  "${cmd[@]}" | grep -E "^(training|checkpoint)" || true
done

echo "load average now: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
"$py" - "$work" "$interval" "$ranks" <<'EOF'
import json, os, statistics, sys
import h5py, numpy as np
work, interval = sys.argv[1], int(sys.argv[2])
def recs(mode):
    with open(os.path.join(work, mode, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]
sync, asyn = recs("sync"), recs("async")
sck = {r["step"]: r for r in sync if r.get("event") == "checkpoint"}
ack = {r["step"]: r for r in asyn if r.get("event") == "checkpoint"}
# A step's own seconds (the save after it excluded): tokens per step / tokens_per_s.
tokens = 32 * int(sys.argv[3])
step_s = {m: {r["step"]: tokens / r["tokens_per_s"] for r in rs if "loss" in r} for m, rs in (("sync", sync), ("async", asyn))}
if sorted(sck) != sorted(ack) or not sck:
    sys.exit(f"FAIL: saves of the sync run {sorted(sck)} vs the async run {sorted(ack)}")
nparams = None
for s in sorted(sck):
    pieces = []
    for m in ("sync", "async"):
        with h5py.File(os.path.join(work, m, "ckpt", f"step_{s}", "checkpoint.h5"), "r") as f:
            p = f["meta/pieces"]
            pieces.append([p[k][...].tobytes() for k in ("tensor", "rank", "start", "count", "crc32")])
            nparams = sum(f["model"][k].size for k in f["model"])
    if pieces[0] != pieces[1]:
        sys.exit(f"FAIL: step_{s}: the async checkpoint's pieces (crc32s) differ from the sync one's")
size = sum(os.path.getsize(os.path.join(work, "sync", "ckpt", f"step_{min(sck)}", x))
           for x in os.listdir(os.path.join(work, "sync", "ckpt", f"step_{min(sck)}")))
# The median step of the sync run (the first excluded).
base = statistics.median(v for k, v in step_s["sync"].items() if k > 1)
print(f"\nmodel: {nparams / 1e6:.1f}M parameters; checkpoint {size / 1e9:.2f} GB; median step {base:.3f} s")
print(f"{'save':>6} {'sync s':>8} {'async stall s':>14} {'ratio':>7} {'copy':>6} {'begin':>6} {'polls':>6} "
      f"{'wait':>6} {'commit':>7} {'write s':>8} {'commit step':>11} {'slowdown s':>10}")
for s in sorted(sck):
    a = ack[s]
    inflight = [k for k in step_s["async"] if s < k <= a["committed_step"]]
    slow = sum(step_s["async"][k] - base for k in inflight)
    print(f"{s:>6} {sck[s]['stall_s']:>8.3f} {a['stall_s']:>14.3f} {a['stall_s'] / sck[s]['stall_s']:>7.1%} "
          f"{a['copy_s']:>6.3f} {a['begin_s']:>6.3f} {a['poll_s']:>6.3f} {a['wait_s']:>6.3f} {a['commit_s']:>7.3f} "
          f"{a['write_s']:>8.3f} {a['committed_step']:>11} {slow:>10.3f}")
first = min(sck)
r = ack[first]["stall_s"] / sck[first]["stall_s"]
print(f"\nsave of step {first}: async stall {ack[first]['stall_s']:.3f} s = {r:.1%} of the sync save "
      f"{sck[first]['stall_s']:.3f} s (target <= 10%: {'met' if r <= 0.10 else 'NOT met'}); "
      f"checkpoints equal (every piece's crc32)")
EOF

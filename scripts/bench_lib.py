"""What the model-clock benchmarks share (bench_zero_overlap.py,
bench_cp_overlap.py): the build's paths as argument defaults, the run file's
training part, and one emulated adgt-train run under mpirun returning its
step records."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# After a benchmark's model: section: a short run of one-sequence
# micro-batches, logged every step, no checkpoints, byte-level tokens.
TRAIN = """train:
  steps: {steps}
  micro_batch: 1
  global_batch: {gb}
  warmup_steps: 1
  eval_interval: 0
  seed: 3
log:
  interval: 1
checkpoint:
  interval: 0
data:
  tokenizer: byte
"""


def add_build_args(ap):
    """--train, --mpirun, --data with the build tree's defaults."""
    ap.add_argument("--train", default=os.path.join(ROOT, "build", "apps", "adgt-train"))
    ap.add_argument("--mpirun", default=os.path.join(ROOT, "tests", "parallel", "mpirun.sh"))
    ap.add_argument("--data", default=os.path.join(ROOT, "build", "data", "kjv-byte"))


def run_train(args, config, ranks, out, sets, label, timeout=1800):
    """adgt-train on `ranks` ranks (one thread each) with `config`, the
    corpus, log.dir=out and the --set list `sets`; exits naming `label` if
    the run fails. Returns metrics.jsonl's step records (those with a loss)."""
    cmd = [args.mpirun, str(ranks), args.train, "--config", config]
    for s in [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin", f"log.dir={out}"] + sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                       timeout=timeout)
    if p.returncode != 0:
        print(" ".join(cmd))
        sys.exit(f"FAIL: {label} exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, filter(str.strip, f)) if "loss" in r and "step" in r]

#!/usr/bin/env python3
"""Data-parallel gradient reduction overlapped with the backward, measured.

Runs adgt-train under mpirun with pipeline and data parallelism (default
pp=2 x dp=2, 1F1B) on a model whose gradients are large next to its compute
(by default 8 layers, d_model 512, ffn 1376, 32 tokens per micro-batch), twice per round: with the
reduction started at each chunk's ReduceGrads instruction (the default) and
with parallel.overlap=false, where every bucket starts only after the step's last
instruction, as before the schedule placed it. For each run, over steps 3..:

  exposed    the median of the trainer's `dp_wait_s`: the time a rank waited
             for the data-parallel reduction after its step's last
             instruction, averaged over the ranks (`dp_wait_max_s`: the
             slowest rank's)
  step       the median step time

Rounds alternate the two modes so machine noise falls on both. The losses of
the two modes must be identical (the reduction is the same ring in the same
order; only its timing moves): the script checks that, bit for bit.

usage: bench_dp_overlap.py [--train BIN] [--mpirun WRAPPER] [--data DIR] [--pp 2] [--dp 2]
                           [--m 4] [--schedule 1f1b|interleaved|...] [--rounds 2] [--steps 8]
                           [--layers 8] [--d-model 512] [--ffn 1376]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench_lib import TRAIN

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = """model:
  vocab_size: 256
  d_model: {d_model}
  n_layers: {layers}
  n_heads: 8
  n_kv_heads: 8
  ffn_hidden: {ffn}
  seq_len: 32
""" + TRAIN


def run(args, work, cfg, name, overlap):
    out = os.path.join(work, name)
    sets = [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
            f"log.dir={out}", f"checkpoint.dir={out}/ckpt", f"parallel.pp={args.pp}",
            f"parallel.dp={args.dp}", f"parallel.schedule={args.schedule}", "parallel.adapt=off"]
    if args.schedule == "interleaved":
        sets.append("parallel.virtual_stages=2")
    cmd = [args.mpirun, str(args.pp * args.dp), args.train, "--config", cfg]
    for s in sets:
        cmd += ["--set", s]
    cmd += ["--set", f"parallel.overlap={'true' if overlap else 'false'}"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
        sys.exit(f"FAIL: {name} exited {r.returncode}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        recs = [json.loads(l) for l in f if l.strip() and '"loss"' in l]
    tail = recs[2:] or recs  # the first steps warm up
    return ([q["loss"] for q in recs], statistics.median(q["dp_wait_s"] for q in tail),
            statistics.median(q["dp_wait_max_s"] for q in tail),
            statistics.median(args.tokens / q["tokens_per_s"] for q in tail))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", default=os.path.join(ROOT, "build", "apps", "adgt-train"))
    ap.add_argument("--mpirun", default=os.path.join(ROOT, "tests", "parallel", "mpirun.sh"))
    ap.add_argument("--data", default=os.path.join(ROOT, "build", "data", "kjv-byte"))
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--m", type=int, default=4, help="micro-batches per step")
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=1376)
    args = ap.parse_args()
    gb = args.m * args.dp
    args.tokens = gb * 32
    work = tempfile.mkdtemp(prefix="bench_dp_overlap_")
    cfg = os.path.join(work, "model.yaml")
    with open(cfg, "w") as f:
        f.write(MODEL.format(steps=args.steps, gb=gb, d_model=args.d_model, ffn=args.ffn,
                             layers=args.layers))
    print(f"dp reduction overlap: {args.layers} layers, d_model {args.d_model}, ffn {args.ffn}, "
          f"pp={args.pp} dp={args.dp} m={args.m} {args.schedule}, "
          f"{os.cpu_count()} cores, medians over steps 3..{args.steps}")
    print(f"{'round':>5} {'mode':>10}  {'exposed mean (ms)':>17}  {'max (ms)':>8}  {'step (ms)':>9}",
          flush=True)
    res = {True: [], False: []}
    losses = {}
    for k in range(args.rounds):
        for overlap in (False, True):
            l, wait, wmax, step = run(args, work, cfg, f"r{k}_{'on' if overlap else 'off'}", overlap)
            res[overlap].append((wait, step, wmax))
            losses.setdefault(overlap, l)
            if l != losses[overlap]:
                sys.exit("FAIL: two runs of one mode logged different losses")
            print(f"{k:>5} {'overlap' if overlap else 'at end':>10}  {1e3 * wait:17.2f}  "
                  f"{1e3 * wmax:8.2f}  {1e3 * step:9.1f}", flush=True)
    if losses[True] != losses[False]:
        sys.exit("FAIL: overlapping the reduction changed the losses")
    on = statistics.median(r[0] for r in res[True])
    off = statistics.median(r[0] for r in res[False])
    son = statistics.median(r[1] for r in res[True])
    soff = statistics.median(r[1] for r in res[False])
    ratio = f"{on / off:.2f}x" if off > 0 else "n/a"
    print(f"exposed dp reduction: {1e3 * off:.2f} ms at the end of the step -> {1e3 * on:.2f} ms "
          f"overlapped ({ratio}); step {1e3 * soff:.1f} -> {1e3 * son:.1f} ms "
          f"({son / soff:.2f}x); losses bit-identical")


if __name__ == "__main__":
    main()

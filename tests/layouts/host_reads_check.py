#!/usr/bin/env python3
"""A training step waits for the device a constant number of times: on the
emulated device (which counts what a CUDA run would synchronise on: to_host,
sum_squares, synchronize) a single-process step reads the device twice (the
step's losses, the gradient norm's partial sums), whatever the number of
micro-batches or of parameter tensors. Before the losses were deferred and
the norms batched, it was one read per micro-batch plus one per tensor.

usage: host_reads_check.py --train BIN --data DIR --work DIR
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def reads(args, name, sets):
    out = os.path.join(args.work, name)
    shutil.rmtree(out, ignore_errors=True)
    cmd = [args.train, "--config", os.path.join(HERE, "model.yaml")]
    for s in [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin", f"log.dir={out}",
              f"checkpoint.dir={out}/ckpt", "checkpoint.at_end=false", "train.device=emulated",
              "train.steps=3", "train.warmup_steps=1"] + sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        sys.exit(f"FAIL: {name}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(l)["host_reads"] for l in f if '"loss"' in l]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    cases = {"2 micro-batches, 2 layers": ["train.global_batch=4"],
             "8 micro-batches, 2 layers": ["train.global_batch=16"],
             "8 micro-batches, 4 layers": ["train.global_batch=16", "model.n_layers=4"]}
    got = {name: reads(args, f"case{i}", sets) for i, (name, sets) in enumerate(cases.items())}
    for name, r in got.items():
        print(f"{name}: host reads per step {r}")
    if any(x != 2 for r in got.values() for x in r):
        sys.exit("FAIL: a step should read the device exactly twice (losses, gradient norm)")
    print("ok: two host reads per step")


if __name__ == "__main__":
    main()

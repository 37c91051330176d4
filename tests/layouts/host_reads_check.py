#!/usr/bin/env python3
"""A training step waits for the device a constant number of times: on the
emulated device (which counts what a CUDA run would synchronise on: to_host,
sum_squares, synchronize) a single-process step reads the device twice (the
step's losses, the gradient norm's partial sums), whatever the number of
micro-batches or of parameter tensors. Before the losses were deferred and
the norms batched, it was one read per micro-batch plus one per tensor.

A mixture-of-experts layer adds exactly one read per forward (its routing
plan's counts, which size the expert GEMMs) and none in its backward: the
routing (softmax, top-k, capacity, send order, router backward) runs on the
device. Before, it read the router logits in the forward and the combine
weights' gradient in the backward, and the CUDA combine read its row indices.

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
    # MoE: 2 + one per MoE layer and micro-batch (micro_batch 2).
    moe = ["model.n_experts=4", "model.moe_top_k=2", "model.expert_ffn_hidden=32"]
    moe_cases = {"MoE, 2 micro-batches, 2 layers": (moe + ["train.global_batch=4"], 2 + 2 * 2),
                 "MoE, 4 micro-batches, 2 layers, capacity, aux-free":
                     (moe + ["train.global_batch=8", "model.moe_capacity_factor=1.0",
                             "model.moe_aux_free=true"], 2 + 2 * 4),
                 "MoE every 2nd of 4 layers, 2 micro-batches":
                     (moe + ["train.global_batch=4", "model.n_layers=4", "model.moe_every=2"], 2 + 2 * 2)}
    for i, (name, (sets, want)) in enumerate(moe_cases.items()):
        r = reads(args, f"moe{i}", sets)
        print(f"{name}: host reads per step {r} (expected {want})")
        if any(x != want for x in r):
            sys.exit(f"FAIL: {name}: a step should read the device {want} times "
                     "(losses, gradient norm, one routing plan per MoE layer forward)")
    print("ok: one host read per MoE layer forward")


if __name__ == "__main__":
    main()

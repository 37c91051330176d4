#!/usr/bin/env python3
"""In-memory layout switch against fresh runs from the same state
(docs/reliability.md, "In-memory layout switch").

Run A trains on 8 CPU ranks and switches its layout in memory at step
boundaries, as asked by the control file <log.dir>/switch; it also saves a
(synchronous) checkpoint at every switch boundary, before the switch. For each
switch, run B_k resumes from that checkpoint directly in the target layout
and trains to the next switch. The in-memory switch must give the fresh
run's losses (within --tol; the same layout sums in the same order, so they
are expected bit for bit) and the same parameters and AdamW moments at the
next checkpoint (bitwise, over every tensor of the checkpoint).

  switch_test.py --train adgt-train --mpirun tests/parallel/mpirun.sh \\
      --data DIR --work DIR --case dense|moe|zero|zero23|cp
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)

CASES = {
    # The acceptance sequence: tp2/pp2/dp2 -> tp1/pp4/dp2 -> tp2/pp1/dp4.
    "dense": dict(
        config=os.path.join(TESTS, "layouts", "model.yaml"),
        base=["model.n_layers=4"],
        layouts=[
            ["parallel.tp=2", "parallel.pp=2", "parallel.dp=2"],
            ["parallel.tp=1", "parallel.pp=4", "parallel.dp=2"],
            ["parallel.tp=2", "parallel.pp=1", "parallel.dp=4"],
        ]),
    # ZeRO-1 chunks in and out, sequence parallelism and an interleaved schedule.
    "zero": dict(
        config=os.path.join(TESTS, "layouts", "model.yaml"),
        base=["model.n_layers=4"],
        layouts=[
            ["parallel.tp=2", "parallel.pp=1", "parallel.dp=4", "parallel.zero=1"],
            ["parallel.tp=1", "parallel.pp=2", "parallel.dp=4", "parallel.zero=1",
             "parallel.schedule=interleaved", "parallel.virtual_stages=2"],
            ["parallel.tp=4", "parallel.pp=1", "parallel.dp=2", "parallel.zero=0",
             "parallel.sequence_parallel=true", "parallel.schedule=1f1b",
             "parallel.virtual_stages=1"],
        ]),
    # ZeRO-3 out of and ZeRO-2 into the switch (docs/zero.md: through whole tensors).
    "zero23": dict(
        config=os.path.join(TESTS, "layouts", "model.yaml"),
        base=["model.n_layers=4"],
        layouts=[
            ["parallel.tp=2", "parallel.pp=1", "parallel.dp=4", "parallel.zero=3"],
            ["parallel.tp=1", "parallel.pp=2", "parallel.dp=4", "parallel.zero=1"],
            ["parallel.tp=1", "parallel.pp=1", "parallel.dp=8", "parallel.zero=2"],
        ]),
    # Context parallelism in and out (docs/context-parallel.md), with ZeRO-1 over dp x cp.
    "cp": dict(
        config=os.path.join(TESTS, "layouts", "model.yaml"),
        base=["model.n_layers=4"],
        layouts=[
            ["parallel.tp=2", "parallel.cp=2", "parallel.pp=1", "parallel.dp=2"],
            ["parallel.tp=1", "parallel.cp=4", "parallel.pp=1", "parallel.dp=2", "parallel.zero=1"],
            ["parallel.tp=2", "parallel.cp=1", "parallel.pp=2", "parallel.dp=2", "parallel.zero=0"],
        ]),
    # FP8 with delayed scaling (docs/fp8.md): the amax histories, named state
    # by layer, go through the switch with the weights.
    "fp8": dict(
        config=os.path.join(TESTS, "layouts", "model.yaml"),
        base=["model.n_layers=4", "train.dtype=fp8", "train.fp8_recipe=delayed"],
        layouts=[
            ["parallel.tp=2", "parallel.pp=2", "parallel.dp=2"],
            ["parallel.tp=1", "parallel.pp=4", "parallel.dp=2", "parallel.zero=1"],
            ["parallel.tp=2", "parallel.pp=1", "parallel.dp=4"],
        ]),
    # Mixture of experts: ep2 -> ep4, with the aux-loss-free selection biases.
    "moe": dict(
        config=os.path.join(TESTS, "moe", "model.yaml"),
        base=["model.moe_aux_free=true"],
        layouts=[
            ["parallel.tp=2", "parallel.dp=4", "parallel.ep=2"],
            ["parallel.tp=2", "parallel.dp=4", "parallel.ep=4"],
            ["parallel.tp=1", "parallel.dp=8", "parallel.ep=4", "train.micro_batch=1"],
        ]),
}


# --exchange: how the switch's pieces travel between the processes of a node
# (docs/reliability.md): the environment that asks for it, and how the switch
# record's "exchange" begins.
# "fallback": rank 5's cross-memory reads count as refused, so every rank
# must take the window (the way a host that refuses them on some process takes).
EXCHANGE_ENV = {"window": {"ADGT_SWITCH_SHARED": "window"},
                "messages": {"ADGT_SWITCH_SHARED": "0"},
                "fallback": {"ADGT_TEST_CROSS_MEMORY_REFUSED": "5"}}
EXCHANGE_LOG = {"cross": "cross-memory", "window": "shared-memory window", "messages": "messages",
                "fallback": "shared-memory window (8 processes on this node; cross-memory reads refused"}


def run(args, out, sets, steps, resume=None, switch_text=None):
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    if switch_text:
        with open(os.path.join(out, "switch"), "w") as f:
            f.write(switch_text)
    cmd = [args.mpirun, "8", args.train, "--config", CASES[args.case]["config"]]
    if resume:
        cmd += ["--resume", resume]
    for s in CASES[args.case]["base"] + sets + [
            f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
            f"log.dir={out}", f"checkpoint.dir={out}/ckpt", f"train.steps={steps}",
            f"checkpoint.interval={args.every}", "checkpoint.keep=0", "train.device=cpu"]:
        cmd += ["--set", s]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.update(EXCHANGE_ENV.get(args.exchange, {}))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if p.returncode != 0:
        print(" ".join(cmd))
        print(p.stdout[-4000:], p.stderr[-4000:])
        sys.exit(f"FAIL: {out} exited {p.returncode}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        recs = [json.loads(l) for l in f if l.strip()]
    return recs, p.stdout


def losses(recs):
    return {r["step"]: r["loss"] for r in recs if "loss" in r and "event" not in r}


def tensors(step_dir):
    out = {}
    with h5py.File(os.path.join(step_dir, "checkpoint.h5"), "r") as h:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and name.split("/")[0] in ("model", "optim", "state"):
                out[name] = obj[...]
        h.visititems(visit)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--case", choices=sorted(CASES), default="dense")
    ap.add_argument("--every", type=int, default=3, help="steps between switches")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--exchange", choices=["auto"] + sorted(EXCHANGE_LOG), default="auto",
                    help="the way the pieces must travel (auto: whatever the host allows)")
    args = ap.parse_args()
    layouts = CASES[args.case]["layouts"]
    k = args.every
    steps = k * len(layouts)
    work = os.path.join(args.work, args.case if args.exchange == "auto" else f"{args.case}-{args.exchange}")
    # Run A: every switch in memory, asked for up front by step.
    text = "".join(f"@{k * (i + 1)} " + " ".join(l) + "\n" for i, l in enumerate(layouts[1:]))
    a_recs, a_out = run(args, os.path.join(work, "A"), layouts[0], steps, switch_text=text)
    switches = [r for r in a_recs if r.get("event") == "switch"]
    if len(switches) != len(layouts) - 1 or any("refused" in r for r in switches):
        sys.exit(f"FAIL: run A logged switches {switches}; wanted {len(layouts) - 1} applied")
    a_loss = losses(a_recs)
    worst = 0.0
    for i, r in enumerate(switches):
        at = k * (i + 1)
        if r["step"] != at:
            sys.exit(f"FAIL: switch {i + 1} at step {r['step']}, asked for {at}")
        print(f"switch at step {at}: {r['from']} -> {r['to']}: {r['seconds']:.3f} s, "
              f"{r['moved_bytes'] / 1e6:.2f} MB between ranks, {r['moves']} moves, "
              f"by {r['exchange']}")
        if args.exchange != "auto" and not r["exchange"].startswith(EXCHANGE_LOG[args.exchange]):
            sys.exit(f"FAIL: the switch went by {r['exchange']!r}, asked for {args.exchange}")
        # Run B: a fresh run resumed from A's checkpoint of that boundary, in the target layout.
        # (train.steps as A's: the learning-rate schedule depends on it.)
        b_recs, _ = run(args, os.path.join(work, f"B{i + 1}"), layouts[i + 1], steps,
                        resume=os.path.join(work, "A", "ckpt", f"step_{at}"))
        b_loss = losses(b_recs)
        for s in range(at + 1, at + k + 1):
            d = abs(a_loss[s] - b_loss[s])
            worst = max(worst, d)
            print(f"  step {s}: in-memory {a_loss[s]:.9f}  fresh {b_loss[s]:.9f}  |diff| {d:.3g}")
            if d > args.tol:
                sys.exit(f"FAIL: step {s} after switch {i + 1}: loss {a_loss[s]} differs from the "
                         f"fresh run's {b_loss[s]} by {d} > {args.tol}")
        ta = tensors(os.path.join(work, "A", "ckpt", f"step_{at + k}"))
        tb = tensors(os.path.join(work, f"B{i + 1}", "ckpt", f"step_{at + k}"))
        if sorted(ta) != sorted(tb):
            sys.exit(f"FAIL: step {at + k}: the checkpoints hold different tensors")
        diff = [n for n in ta if not np.array_equal(ta[n], tb[n])]
        if diff:
            n = diff[0]
            sys.exit(f"FAIL: step {at + k}: {len(diff)} tensors differ from the fresh run's, e.g. "
                     f"{n} by up to {np.max(np.abs(ta[n] - tb[n]))}")
        print(f"  step {at + k}: all {len(ta)} tensors (weights, AdamW moments, named state) bitwise equal")
    print(f"PASS: {args.case}: {len(switches)} in-memory switches match fresh runs "
          f"(largest loss difference {worst:.3g})")


if __name__ == "__main__":
    main()

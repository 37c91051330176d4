#!/usr/bin/env python3
"""The in-memory layout switch against a synchronous save plus load of the
same state (issue 17: switch time <= 10% of save + load; docs/reliability.md).

8 CPU ranks train a ~27M-parameter model (d_model 512, 8 layers, FFN 1536,
byte vocabulary) in tp2/pp2/dp2 for one step, save a synchronous checkpoint
at that boundary and then switch to tp1/pp4/dp2 in memory; a second run
resumes from that checkpoint in tp1/pp4/dp2 (the load a switch through disk
would need). Per repetition: the switch's seconds (its metrics record), the
save's stall (its checkpoint record) and the load (adgt-train's "loaded in").

  scripts/reliability/bench_switch.py --train build/apps/adgt-train \\
      --data build/data/kjv-byte [--reps 3] [--work DIR]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODEL = os.path.join(ROOT, "tests", "layouts", "model.yaml")
MPIRUN = os.path.join(ROOT, "tests", "parallel", "mpirun.sh")
BIG = ["model.d_model=512", "model.n_layers=8", "model.n_heads=8", "model.n_kv_heads=8",
       "model.ffn_hidden=1536", "model.seq_len=64", "train.micro_batch=1",
       "train.global_batch=8", "train.steps=2", "train.warmup_steps=1", "checkpoint.at_end=false", "checkpoint.keep=0",
       "train.device=cpu"]


def run(args, out, sets, resume=None, switch=None):
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    if switch:
        with open(os.path.join(out, "switch"), "w") as f:
            f.write(switch)
    cmd = [MPIRUN, "8", args.train, "--config", MODEL]
    if resume:
        cmd += ["--resume", resume]
    for s in BIG + sets + [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
                           f"log.dir={out}", f"checkpoint.dir={out}/ckpt"]:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        sys.exit(f"FAILED: {out} exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    return recs, p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", default="/tmp/adgt-bench-switch")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for rep in range(args.reps):
        a, _ = run(args, os.path.join(args.work, f"A{rep}"),
                   ["parallel.tp=2", "parallel.pp=2", "parallel.dp=2", "checkpoint.interval=1"],
                   switch="@1 parallel.tp=1 parallel.pp=4\n")
        sw = [r for r in a if r.get("event") == "switch" and "refused" not in r]
        ck = [r for r in a if r.get("event") == "checkpoint" and r.get("step") == 1]
        if not sw or not ck:
            sys.exit(f"FAILED: run A logged no switch or no step-1 checkpoint: {sw} {ck}")
        _, out = run(args, os.path.join(args.work, f"B{rep}"),
                     ["parallel.tp=1", "parallel.pp=4", "parallel.dp=2", "checkpoint.interval=0"],
                     resume=os.path.join(args.work, f"A{rep}", "ckpt", "step_1"))
        m = re.search(r"loaded in ([0-9.]+) s", out)
        if not m:
            sys.exit("FAILED: run B printed no load time")
        rows.append((sw[0]["seconds"], ck[0]["stall_s"], float(m.group(1)), sw[0]["moved_bytes"]))
        print(f"rep {rep}: switch {rows[-1][0]:.3f} s ({rows[-1][3] / 1e6:.0f} MB between ranks), "
              f"save {rows[-1][1]:.3f} s, load {rows[-1][2]:.3f} s", flush=True)
    sw, sv, ld = (statistics.median(r[i] for r in rows) for i in range(3))
    print(f"median of {args.reps}: switch {sw:.3f} s; save {sv:.3f} s + load {ld:.3f} s = "
          f"{sv + ld:.3f} s; switch / (save + load) = {sw / (sv + ld):.3f} (target <= 0.10)")


if __name__ == "__main__":
    main()

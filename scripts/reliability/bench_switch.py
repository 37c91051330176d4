#!/usr/bin/env python3
"""The in-memory layout switch against a synchronous save plus load of the
same state (the target: switch time <= 10% of save + load; docs/reliability.md).

8 CPU ranks train a ~27M-parameter model (d_model 512, 8 layers, FFN 1536,
byte vocabulary) in tp2/pp2/dp2 for one step, save a synchronous checkpoint
at that boundary and then switch to tp1/pp4/dp2 in memory; a second run
resumes from that checkpoint in tp1/pp4/dp2 (the load a switch through disk
would need). Per repetition: the switch's seconds (its metrics record) for
each way the pieces can travel between the processes of a node (--exchange:
cross-memory reads, the shared-memory window, messages), the save's stall
(its checkpoint record) and the load (adgt-train's "loaded in"), all in the
same run.

  scripts/reliability/bench_switch.py --train build/apps/adgt-train \\
      --data build/data/kjv-byte [--reps 3] [--work DIR] [--exchange cross,window,messages] [--cold]
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


EXCHANGE_ENV = {"cross": "", "window": "window", "messages": "0"}


def run(args, out, sets, resume=None, switch=None, exchange="cross"):
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
                       env=dict(os.environ, OMP_NUM_THREADS="1",
                                ADGT_SWITCH_SHARED=EXCHANGE_ENV[exchange]))
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
    ap.add_argument("--exchange", default="cross,window,messages")
    ap.add_argument("--cold", action="store_true",
                    help="also load with the page cache dropped (root), as a new job would read the files")
    args = ap.parse_args()
    ways = args.exchange.split(",")
    rows = []
    for rep in range(args.reps):
        sw, phases, how = {}, {}, {}
        for way in ways:
            a, _ = run(args, os.path.join(args.work, f"A{rep}-{way}"),
                       ["parallel.tp=2", "parallel.pp=2", "parallel.dp=2", "checkpoint.interval=1"],
                       switch="@1 parallel.tp=1 parallel.pp=4\n", exchange=way)
            rec = [r for r in a if r.get("event") == "switch" and "refused" not in r]
            ck = [r for r in a if r.get("event") == "checkpoint" and r.get("step") == 1]
            if not rec or not ck:
                sys.exit(f"FAILED: run A logged no switch or no step-1 checkpoint: {rec} {ck}")
            if way == ways[0]:
                save, moved, first = ck[0]["stall_s"], rec[0]["moved_bytes"], f"A{rep}-{way}"
            sw[way], how[way] = rec[0]["seconds"], rec[0]["exchange"]
            phases[way] = rec[0].get("phases_max_s", {})
        loads = []
        for cold in ([False, True] if args.cold else [False]):
            if cold:  # the files as a new job on another node reads them: not in the page cache
                subprocess.run(["sync"], check=True)
                try:
                    with open("/proc/sys/vm/drop_caches", "w") as f:
                        f.write("3\n")
                except OSError as e:
                    sys.exit(f"FAILED: --cold needs to drop the page cache (root): {e}")
            _, out = run(args, os.path.join(args.work, f"B{rep}"),
                         ["parallel.tp=1", "parallel.pp=4", "parallel.dp=2", "checkpoint.interval=0"],
                         resume=os.path.join(args.work, first, "ckpt", "step_1"))
            m = re.search(r"loaded in ([0-9.]+) s", out)
            if not m:
                sys.exit("FAILED: run B printed no load time")
            loads.append(float(m.group(1)))
        rows.append((sw, save, loads[0], loads[-1]))
        print(f"rep {rep}: save {save:.3f} s, load {loads[0]:.3f} s"
              + (f" (from disk, page cache dropped: {loads[1]:.3f} s)" if args.cold else "")
              + f", {moved / 1e6:.0f} MB between ranks", flush=True)
        for way in ways:
            top = sorted(phases[way].items(), key=lambda kv: -kv[1])[:4]
            print(f"  switch by {how[way]}: {sw[way]:.3f} s (slowest phases: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in top) + ")", flush=True)
    sv = statistics.median(r[1] for r in rows)
    ld = statistics.median(r[2] for r in rows)
    lc = statistics.median(r[3] for r in rows)
    print(f"median of {args.reps}: save {sv:.3f} s + load {ld:.3f} s = {sv + ld:.3f} s"
          + (f"; with the load from disk {sv + lc:.3f} s" if args.cold else ""))
    for way in ways:
        t = statistics.median(r[0][way] for r in rows)
        print(f"  switch by {way}: {t:.3f} s; switch / (save + load) = {t / (sv + ld):.3f}"
              + (f", with the load from disk {t / (sv + lc):.3f}" if args.cold else "")
              + " (target <= 0.10)")

if __name__ == "__main__":
    main()

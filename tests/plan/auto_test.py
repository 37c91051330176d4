#!/usr/bin/env python3
"""parallel.auto on 8 CPU ranks of an emulated 2-node cluster (docs/planner.md).

  --case launch: the planner's table is printed, the rank table shows the
      chosen layout, LOG/plan.json records it, and the losses are bit for bit
      those of a run with the same layout written by hand (planning never
      changes the numbers).
  --case constraint: parallel.pp=2 given by --set is kept by the plan.
  --case infeasible: parallel.pp=3 (no plan of 8 ranks has 3 stages): every
      rank exits non-zero, rank 0 names the constraint and the nearest plans.
  --case resume: a checkpoint of the 8-rank plan resumed with parallel.auto on
      4 ranks: a plan for 4 ranks, and the losses of the steps after the
      checkpoint those of the uninterrupted 8-rank run (checkpoints are
      universal; a different layout sums in another order: within 1e-4).
"""
import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODEL = os.path.join(ROOT, "scripts", "plan", "plan_model.yaml")
CLUSTER = os.path.join(ROOT, "configs", "clusters", "emulated-2node.yaml")
sys.path.insert(0, os.path.join(ROOT, "scripts", "plan"))
from plan_layout import layout_sets  # noqa: E402



def run(args, log, sets, expect_ok=True, ranks=8, extra=()):
    common = [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
              f"train.steps={args.steps}", f"log.dir={log}", f"checkpoint.dir={log}/ckpt",
              f"emulate.cluster={CLUSTER}"]
    flags = sum([["--set", s] for s in common + sets], [])
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    m = os.path.join(log, "metrics.jsonl")
    if os.path.exists(m):
        os.remove(m)
    p = subprocess.run(["timeout", "120", args.mpirun, str(ranks), args.train, "--config", MODEL]
                       + flags + list(extra), capture_output=True, text=True, env=env)
    if expect_ok and p.returncode != 0:
        sys.exit(f"FAILED: adgt-train exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def losses(log):
    out = []
    with open(os.path.join(log, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if "loss" in j and "step" in j and j.get("kind", "train") == "train":
                out.append((j["step"], j["loss"]))
    return out


def chosen_layout(stdout):
    m = re.search(r"^\s+1\s+(tp=.+?)\s{2,}[\d.e+-]+\s.*<- chosen$", stdout, re.M)
    if not m:
        sys.exit("FAILED: no plan table with a chosen row in the output:\n" + stdout[-3000:])
    return m.group(1).strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--case", required=True, choices=["launch", "constraint", "infeasible", "resume"])
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)

    if args.case == "infeasible":
        p = run(args, os.path.join(args.work, "bad"), ["parallel.pp=3"], expect_ok=False)
        problems = []
        if p.returncode == 0:
            problems.append("it exited 0")
        if p.returncode == 124:
            problems.append("it hung")
        for r in range(8):
            if not re.search(rf"error: rank {r} \(host [^)]*\): .*parallel\.auto", p.stderr):
                problems.append(f"rank {r} did not report the error")
        for want in [r"no plan for 8 ranks of emulated-2node keeps parallel\.pp=3",
                     r"nearest feasible plans:", r"changes parallel\.pp to [248]"]:
            if not re.search(want, p.stderr):
                problems.append(f"stderr lacks /{want}/")
        if problems:
            sys.exit("FAILED: " + "; ".join(problems) + "\n" + p.stderr[-3000:])
        print("parallel.auto infeasible constraint: every rank stopped, rank 0 named the nearest plans")
        return

    if args.case == "resume":
        args.steps = 4
        full = os.path.join(args.work, "full")
        run(args, full, ["checkpoint.interval=2"])
        plan8 = json.load(open(os.path.join(full, "plan.json")))
        ck = os.path.join(full, "ckpt", "step_2")
        part = os.path.join(args.work, "resumed")
        p = run(args, part, [], ranks=4, extra=["--resume", ck])
        plan4 = json.load(open(os.path.join(part, "plan.json")))
        if plan4["world"] != 4 or f"resumed from {ck}" not in p.stdout:
            sys.exit(f"FAILED: no 4-rank plan resumed from {ck}:\n{p.stdout[-2000:]}")
        a = dict(losses(full))
        b = dict(losses(part))
        if sorted(b) != [3, 4]:
            sys.exit(f"FAILED: the resumed run logged steps {sorted(b)}, want [3, 4]")
        diff = max(abs(a[s] - b[s]) / abs(a[s]) for s in b)
        print(f"8 ranks: {plan8['layout']}; resumed on 4 ranks: {plan4['layout']}; "
              f"losses of steps 3-4 differ by {diff:.2e} (relative; bound 1e-4)")
        if diff > 1e-4:
            sys.exit(f"FAILED: {a} vs {b}")
        return
    sets = ["parallel.pp=2"] if args.case == "constraint" else ["checkpoint.at_end=true"]
    log = os.path.join(args.work, "auto")
    p = run(args, log, sets)
    layout = chosen_layout(p.stdout)
    print(p.stdout.split("rank table:")[0])
    plan = json.load(open(os.path.join(log, "plan.json")))
    if plan["layout"] != layout:
        sys.exit(f"FAILED: plan.json says {plan['layout']}, the table chose {layout}")
    want = layout_sets(layout)
    lay = dict(s.split("=", 1) for s in want)
    m = re.search(r"rank table: tp=(\d+) x dp=(\d+) x pp=(\d+)", p.stdout)
    if not m or (m.group(1), m.group(2), m.group(3)) != (lay["parallel.tp"], lay["parallel.dp"],
                                                         lay["parallel.pp"]):
        sys.exit(f"FAILED: the rank table does not show the chosen {layout}:\n{p.stdout[-2000:]}")
    events = [json.loads(l) for l in open(os.path.join(log, "metrics.jsonl"))]
    logged = [e for e in events if e.get("event") == "plan"]
    if len(logged) != 1 or logged[0]["plan"]["layout"] != layout:
        sys.exit(f"FAILED: metrics.jsonl does not record the plan once: {logged}")
    if args.case == "launch":
        import glob
        import h5py
        ck = sorted(glob.glob(os.path.join(log, "ckpt", "step_*", "checkpoint.h5")))
        if not ck:
            sys.exit("FAILED: no checkpoint written")
        with h5py.File(ck[-1], "r") as f:
            rec = json.loads(f["state/plan/chosen"][()].decode()
                             if isinstance(f["state/plan/chosen"][()], bytes)
                             else f["state/plan/chosen"][()])
        if rec["layout"] != layout:
            sys.exit(f"FAILED: the checkpoint's state/plan/chosen says {rec['layout']}")
    if args.case == "constraint":
        if lay["parallel.pp"] != "2" or plan["constraints"] != ["parallel.pp"]:
            sys.exit(f"FAILED: parallel.pp=2 not kept: {layout}, constraints {plan['constraints']}")
        print(f"parallel.auto kept parallel.pp=2: {layout}")
        return
    hand = os.path.join(args.work, "hand")
    run(args, hand, want + ["parallel.auto=false"])
    a, b = losses(log), losses(hand)
    if not a or a != b:
        sys.exit(f"FAILED: losses differ from the hand-set layout {layout}:\n auto {a}\n hand {b}")
    print(f"parallel.auto chose {layout}; losses equal the hand-set run's bit for bit: {a}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Two adgt-train binaries, the same numbers: a check for changes that must not
change behaviour (a refactor, a move between rooms).

Each layout (tensor/data parallel with ZeRO and sequence parallelism, pipeline
schedules, MoE with expert parallelism and replicas) trains 20 steps of a
~100k-parameter model with BASE and with NEW; the per-step losses must be
equal (==) and every tensor of the final checkpoint array_equal. Not in ctest:
it needs a second build (e.g. `git worktree add ../base <commit>` and build it).

usage: bitwise_layouts.py --base BIN --new BIN --data DIR --work DIR [NAME ...]
  --data: byte-level shards (ADGT_TOKENIZER=byte scripts/prepare_data.sh DIR)
  --base-done: reuse BASE's results already under WORK/base
Exit 0 when every layout matches; prints 'N passed, M failed'.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MPIRUN = os.path.join(ROOT, "tests", "parallel", "mpirun.sh")
DENSE = os.path.join(ROOT, "tests", "layouts", "model.yaml")
PIPE = os.path.join(ROOT, "tests", "pipeline", "model.yaml")
MOE = os.path.join(ROOT, "tests", "moe", "model.yaml")


def layouts():
    out = []
    for tp, dp in [(2, 1), (1, 2), (2, 2), (4, 2), (2, 4), (8, 1)]:
        for z in (0, 1):
            for sp in ((0, 1) if tp > 1 else (0,)):
                out.append((f"tp{tp}dp{dp}z{z}sp{sp}", DENSE, tp * dp,
                            [f"parallel.tp={tp}", f"parallel.dp={dp}", f"parallel.zero={z}",
                             f"parallel.sequence_parallel={'true' if sp else 'false'}"]))
    for name, sets, n in [
        ("pp2_1f1b", ["parallel.pp=2", "parallel.schedule=1f1b"], 2),
        ("pp4_zbh1", ["parallel.pp=4", "parallel.schedule=zb-h1"], 4),
        ("pp2_interleaved", ["parallel.pp=2", "parallel.schedule=interleaved", "parallel.virtual_stages=2"], 2),
        ("pp2_greedy_dp2", ["parallel.pp=2", "parallel.dp=2", "parallel.schedule=greedy",
                            "train.global_batch=8"], 4),
        ("pp4_zbv", ["parallel.pp=4", "parallel.schedule=zb-v", "parallel.virtual_stages=2"], 4),
        ("pp2_tp2_gpipe", ["parallel.pp=2", "parallel.tp=2", "parallel.schedule=gpipe"], 4),
        ("pp2_dp2_zero1_int8", ["parallel.pp=2", "parallel.dp=2", "parallel.zero=1",
                                "parallel.grad_compression=int8", "train.global_batch=8"], 4),
        ("pp2_adapt", ["parallel.pp=2", "parallel.schedule=1f1b", "parallel.adapt=schedule"], 2),
    ]:
        out.append((name, PIPE, n, sets))
    rep2 = ["parallel.expert_slots=3", 'parallel.expert_replicas="0:0=0.5,1=0.5;3:1=0.3,0=0.7"']
    for name, sets, n in [
        ("moe_single", [], 1),
        ("moe_ep2_dp2", ["parallel.dp=2", "parallel.ep=2"], 2),
        ("moe_ep4_dp4_placement", ["parallel.dp=4", "parallel.ep=4", "parallel.expert_placement=[2,0,3,1]"], 4),
        ("moe_tp2_ep2_dp2", ["parallel.tp=2", "parallel.dp=2", "parallel.ep=2"], 4),
        ("moe_ep2_dp2_replicas", ["parallel.dp=2", "parallel.ep=2"] + rep2, 2),
        ("moe_pp2_ep2_dp2_replicas_zb", ["parallel.pp=2", "parallel.dp=2", "parallel.ep=2",
                                         "parallel.schedule=zb-h1"] + rep2, 4),
        ("moe_ep2_dp2_bf16", ["parallel.dp=2", "parallel.ep=2", "train.dtype=bf16"], 2),
    ]:
        out.append((name, MOE, n, sets))
    return out


def train(binary, out, data, cfg, n, sets):
    """Runs one layout into `out` (binary None: reuse what is there); returns (losses, weights) or an error."""
    if binary:
        shutil.rmtree(out, ignore_errors=True)
        cmd = [binary, "--config", cfg]
        for s in [f"data.train={data}/train.bin", f"data.val={data}/val.bin", f"log.dir={out}",
                  f"checkpoint.dir={out}/ckpt"] + sets:
            cmd += ["--set", s]
        if n > 1:
            cmd = [MPIRUN, str(n)] + cmd
        p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        if p.returncode:
            return None, f"exit {p.returncode}: {(p.stdout + p.stderr)[-800:]}"
    with open(os.path.join(out, "metrics.jsonl")) as f:
        losses = [(r["step"], r["loss"]) for r in map(json.loads, filter(str.strip, f)) if "loss" in r]
    last = sorted(os.listdir(os.path.join(out, "ckpt")))[-1]
    with h5py.File(os.path.join(out, "ckpt", last, "checkpoint.h5"), "r") as h:
        weights = {k: h["model"][k][...] for k in h["model"]}
    return (losses, weights), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--base-done", action="store_true")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    passed = failed = 0
    for name, cfg, n, sets in layouts():
        if args.names and name not in args.names:
            continue
        a, ea = train(None if args.base_done else args.base, os.path.join(args.work, "base", name),
                      args.data, cfg, n, sets)
        b, eb = train(args.new, os.path.join(args.work, "new", name), args.data, cfg, n, sets)
        if a is None or b is None:
            print(f"{name:28s} FAIL: base {ea or 'ok'}; new {eb or 'ok'}", flush=True)
            failed += 1
            continue
        same_l = a[0] == b[0] and len(a[0]) > 0
        same_w = a[1].keys() == b[1].keys() and all(np.array_equal(a[1][k], b[1][k]) for k in a[1])
        ok = same_l and same_w
        passed += ok
        failed += not ok
        print(f"{name:28s} steps {len(a[0]):3d}  losses {'==' if same_l else 'DIFFER'}  "
              f"weights ({len(a[1])} tensors) {'equal' if same_w else 'DIFFER'}  {'PASS' if ok else 'FAIL'}",
              flush=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

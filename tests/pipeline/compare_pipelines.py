#!/usr/bin/env python3
"""Every pipeline schedule trains like the single process.

For pp in {2, 4}, micro-batches m in {pp, 2pp, 3pp} and every generator
(gpipe, 1f1b, interleaved with 2 virtual stages, zb-h1, greedy), alone and
combined with tp=2 or dp=2, the 8-layer ~100k-parameter model
(tests/pipeline/model.yaml) trains 20 steps under mpirun. Its per-step losses
(metrics.jsonl) and final weights (the step_20 checkpoint's whole tensors,
read through the virtual-dataset index) must equal those of the single process
with the same global batch within a relative tolerance (1e-5: fp32, where only
the order of summation differs).

usage: compare_pipelines.py --train BIN --mpirun WRAPPER --data DIR --work DIR
                            [--pp 2 4] [--extras none tp2 dp2] [--schedules ...]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEDULES = ["gpipe", "1f1b", "interleaved", "zb-h1", "greedy"]


def run(args, name, sets, ranks):
    out = os.path.join(args.work, name)
    shutil.rmtree(out, ignore_errors=True)
    cmd = [args.train, "--config", os.path.join(HERE, "model.yaml")]
    for s in [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
              f"log.dir={out}", f"checkpoint.dir={out}/ckpt"] + sets:
        cmd += ["--set", s]
    if ranks > 1:
        cmd = [args.mpirun, str(ranks)] + cmd
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    dt = time.time() - t0
    if p.returncode != 0:
        print(" ".join(cmd))
        print(p.stdout[-4000:], p.stderr[-4000:])
        return None
    with open(os.path.join(out, "metrics.jsonl")) as f:
        recs = [json.loads(l) for l in f if l.strip()]
    losses = {r["step"]: r["loss"] for r in recs if "loss" in r}
    bubbles = [r["bubble"] for r in recs if "bubble" in r]
    with h5py.File(os.path.join(out, "ckpt", "step_20", "checkpoint.h5"), "r") as h:
        weights = {k: h["model"][k][...].astype(np.float64) for k in h["model"]}
    return losses, weights, dt, bubbles


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--pp", type=int, nargs="*", default=[2, 4])
    ap.add_argument("--extras", nargs="*", default=["none", "tp2", "dp2"])
    ap.add_argument("--schedules", nargs="*", default=SCHEDULES)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    refs = {}

    def reference(global_batch):
        if global_batch not in refs:
            r = run(args, f"single_gb{global_batch}", [f"train.global_batch={global_batch}"], 1)
            if r is None or sorted(r[0]) != list(range(1, 21)):
                sys.exit(f"FAIL: the single-process run with global batch {global_batch}")
            refs[global_batch] = r
            print(f"single process, global batch {global_batch}: loss {r[0][1]:.6f} -> "
                  f"{r[0][20]:.6f} ({r[2]:.1f} s)", flush=True)
        return refs[global_batch]

    print(f"{'pp':>3} {'m':>3} {'schedule':>11} {'with':>5}  {'max rel loss err':>16}  "
          f"{'max rel weight err':>18}  {'bubble':>6}  {'time':>6}", flush=True)
    failed, n = [], 0
    for pp in args.pp:
        for extra in args.extras:
            tp = 2 if extra == "tp2" else 1
            dp = 2 if extra == "dp2" else 1
            for m in (pp, 2 * pp, 3 * pp):
                gb = m * dp
                ref_l, ref_w, _, _ = reference(gb)
                for sched in args.schedules:
                    v = 2 if sched == "interleaved" else 1
                    name = f"pp{pp}_m{m}_{sched}_{extra}"
                    sets = [f"parallel.pp={pp}", f"parallel.tp={tp}", f"parallel.dp={dp}",
                            f"parallel.schedule={sched}", f"parallel.virtual_stages={v}",
                            f"train.global_batch={gb}"]
                    r = run(args, name, sets, pp * tp * dp)
                    n += 1
                    if r is None:
                        failed.append(f"{name}: exited non-zero")
                        continue
                    l, w, t, bub = r
                    if sorted(l) != sorted(ref_l):
                        failed.append(f"{name}: logged steps {sorted(l)}")
                        continue
                    lerr = max(abs(l[s] - ref_l[s]) / abs(ref_l[s]) for s in ref_l)
                    werr, worst = 0.0, ""
                    if sorted(w) != sorted(ref_w):
                        failed.append(f"{name}: checkpoint tensors differ: "
                                      f"{sorted(set(w) ^ set(ref_w))[:4]}")
                        continue
                    for k, ref in ref_w.items():
                        e = np.linalg.norm(w[k] - ref) / np.linalg.norm(ref)
                        if e > werr:
                            werr, worst = e, k
                    ok = lerr <= args.tol and werr <= args.tol
                    b = f"{100 * np.median(bub):5.1f}%" if bub else "   n/a"
                    print(f"{pp:>3} {m:>3} {sched:>11} {extra:>5}  {lerr:>16.3e}  {werr:>18.3e}  "
                          f"{b}  {t:>5.1f}s  {'PASS' if ok else 'FAIL ' + worst}", flush=True)
                    if not ok:
                        failed.append(name)
    if failed:
        sys.exit("FAIL: " + "; ".join(failed))
    print(f"PASS: {n} pipeline runs equal the single process within {args.tol}")


if __name__ == "__main__":
    main()

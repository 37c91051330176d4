"""One adgt-train run of a layout test, shared by the layout drivers
(tests/pipeline/compare_pipelines.py, tests/moe/compare_experts.py).

train_run() starts `adgt-train --config CONFIG` (under `mpirun N` when N > 1)
with the data, log and checkpoint paths under WORK/NAME plus `sets`,
with train.device=args.device (default cpu; a later entry of sets wins),
returns (metrics records with a loss, final weights of the last checkpoint
(step_20 with the models' 20 steps) as float64 whole tensors or {}, seconds), or None after printing the output when the run
failed. rel_errors() compares losses and weights with a reference run.
in_pairs() runs independent calls two at a time (ADGT_TEST_RUN_WIDTH, default 2):
a small layout's ranks leave a core idle much of the time (a 2-rank pipeline run
uses ~1.3 of the 2 cores, start-up included), so a sweep driver runs its
independent layouts in pairs and checks the results in order.
"""
import json
import os
import shutil
import subprocess
import time

import h5py
import numpy as np


def train_run(args, config, name, sets, ranks, resume_from=None, weights=True):
    out = os.path.join(args.work, name)
    shutil.rmtree(out, ignore_errors=True)
    cmd = [args.train, "--config", config]
    if resume_from:
        cmd += ["--resume", resume_from]
    for s in [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
              f"log.dir={out}", f"checkpoint.dir={out}/ckpt",
              f"train.device={getattr(args, 'device', 'cpu')}"] + sets:
        cmd += ["--set", s]
    if ranks > 1:
        cmd = [args.mpirun, str(ranks)] + cmd
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    dt = time.time() - t0
    if os.path.isdir(out):  # what the run said, for drivers that check it
        with open(os.path.join(out, "stdout.txt"), "w") as f:
            f.write(p.stdout)
    if p.returncode != 0:  # one print: a run beside it (in_pairs) does not interleave
        print(" ".join(cmd) + "\n" + p.stdout[-4000:] + " " + p.stderr[-4000:], flush=True)
        return None
    with open(os.path.join(out, "metrics.jsonl")) as f:
        recs = [r for r in map(json.loads, filter(str.strip, f)) if "loss" in r]
    w = {}
    if weights:
        last = max((d for d in os.listdir(os.path.join(out, "ckpt")) if d.startswith("step_")),
                   key=lambda d: int(d[5:]))
        with h5py.File(os.path.join(out, "ckpt", last, "checkpoint.h5"), "r") as h:
            w = {k: h["model"][k][...].astype(np.float64) for k in h["model"]}
    return recs, w, dt


def losses(recs):
    return {r["step"]: r["loss"] for r in recs}


def rel_errors(l, ref_l, w, ref_w):
    """Max relative loss error over l's steps; max relative (Frobenius) weight
    error over ref_w's tensors and the worst tensor's name."""
    # Nothing to compare would read as a perfect match: no losses, or a run's
    # weights against none (callers comparing losses only pass {} for both).
    if not l or (w and not ref_w):
        raise ValueError(f"rel_errors: {len(l)} losses, {len(w)} weights against {len(ref_w)} "
                         "reference tensors: nothing to compare")
    lerr = max(abs(l[s] - ref_l[s]) / abs(ref_l[s]) for s in l)
    werr, worst = 0.0, ""
    for k, q in ref_w.items():
        e = np.linalg.norm(w[k] - q) / np.linalg.norm(q)
        if e > werr:
            werr, worst = e, k
    return lerr, werr, worst


def in_pairs(calls, ranks=None, alone_from=8):
    """[c() for c in calls], run ADGT_TEST_RUN_WIDTH (default 2) at a time
    (threads: each call waits on its own subprocess), results in order.
    `ranks` (one per call): calls of `alone_from` ranks or more run alone,
    after the others (two 8-rank runs on 2 cores spend their time yielding to
    each other: the emulated layout sweep took 51 s in pairs against 42 s
    alone)."""
    from concurrent.futures import ThreadPoolExecutor
    width = max(1, int(os.environ.get("ADGT_TEST_RUN_WIDTH", "2")))
    ranks = ranks or [1] * len(calls)
    small = [i for i, r in enumerate(ranks) if r < alone_from]
    out = [None] * len(calls)
    if width > 1 and len(small) > 1:
        with ThreadPoolExecutor(width) as ex:
            for i, r in zip(small, ex.map(lambda i: calls[i](), small)):
                out[i] = r
    else:
        for i in small:
            out[i] = calls[i]()
    for i, r in enumerate(ranks):
        if r >= alone_from:
            out[i] = calls[i]()
    return out

#!/usr/bin/env python3
"""FP8 training end to end (train.dtype: fp8, docs/fp8.md), on the
~100k-parameter layout model and the byte-level King James Bible:

  converge   300 steps of bf16, fp8 tensorwise and fp8 delayed: each fp8
             run's final validation loss within 1.5% of bf16's (the issue's
             acceptance), and not bit-equal to it (FP8 must be in the path)
  resume     fp8 (both recipes) from its step-10 checkpoint: steps 11-20 and
             the final weights bit-identical to the uninterrupted run, and
             the delayed recipe's amax history (state/fp8/) the same
  cross      a bf16 checkpoint resumes in fp8 (delayed: a note, history
             restarts), an fp8 one in bf16, and a delayed one with another
             fp8_amax_history length
  moe        the mixture-of-experts model (experts' GEMMs in FP8 too): 300
             steps of fp8 delayed within 1.5% of bf16's validation loss;
             resume bitwise with the experts' amax histories
             (state/fp8/expert_amax_history, filled) the same; a checkpoint
             without them (an fp8 run's from before the experts were FP8)
             resumes with a note
"""
import argparse
import os
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "layouts"))
from train_run import losses, train_run  # noqa: E402

MODEL = os.path.join(ROOT, "tests", "layouts", "model.yaml")
MOE_MODEL = os.path.join(ROOT, "tests", "moe", "model.yaml")


def val_loss(recs_dir):
    import json
    last = None
    with open(os.path.join(recs_dir, "metrics.jsonl")) as f:
        for r in map(json.loads, filter(str.strip, f)):
            if "val_loss" in r:
                last = r["val_loss"]
    return last


def converge(args, failed):
    steps = ["train.steps=300", "train.eval_interval=300", "train.eval_batches=16",
             "checkpoint.interval=0"]
    got = {}
    for name, sets in [("bf16", ["train.dtype=bf16"]),
                       ("fp8_tensorwise", ["train.dtype=fp8", "train.fp8_recipe=tensorwise"]),
                       ("fp8_delayed", ["train.dtype=fp8", "train.fp8_recipe=delayed"])]:
        r = train_run(args, MODEL, "converge_" + name, steps + sets, 1, weights=False)
        if not r:
            failed.append("converge_" + name)
            return
        got[name] = (val_loss(os.path.join(args.work, "converge_" + name)), losses(r[0]))
    ref = got["bf16"][0]
    for name in ["fp8_tensorwise", "fp8_delayed"]:
        v = got[name][0]
        rel = abs(v - ref) / ref
        differs = got[name][1] != got["bf16"][1]
        ok = rel <= 0.015 and differs
        print(f"{'ok  ' if ok else 'FAIL'} converge {name:15s} val loss {v:.4f} vs bf16 {ref:.4f}: "
              f"{100 * rel:.2f}% (bound 1.5%){'' if differs else ', but bit-equal to bf16'}")
        if not ok:
            failed.append("converge_" + name)


def h5_state(path):
    with h5py.File(path, "r") as h:
        w = {k: h["model"][k][...] for k in h["model"]}
        s = {}
        if "state" in h and "fp8" in h["state"]:
            s = {k: h["state"]["fp8"][k][...] for k in h["state"]["fp8"]}
    return w, s


def resume(args, failed):
    for recipe in ["tensorwise", "delayed"]:
        base = ["train.dtype=fp8", f"train.fp8_recipe={recipe}"]
        full = train_run(args, MODEL, f"resume_{recipe}_full", base, 1, weights=False)
        if not full:
            failed.append(f"resume_{recipe}")
            continue
        ck = os.path.join(args.work, f"resume_{recipe}_full", "ckpt")
        part = train_run(args, MODEL, f"resume_{recipe}_part", base, 1,
                         resume_from=os.path.join(ck, "step_10"), weights=False)
        if not part:
            failed.append(f"resume_{recipe}")
            continue
        lf, lp = losses(full[0]), losses(part[0])
        same_l = all(lp[s] == lf[s] for s in lp) and sorted(lp) == list(range(11, 21))
        wf, sf = h5_state(os.path.join(ck, "step_20", "checkpoint.h5"))
        wp, sp = h5_state(os.path.join(args.work, f"resume_{recipe}_part", "ckpt", "step_20",
                                       "checkpoint.h5"))
        same_w = wf.keys() == wp.keys() and all(np.array_equal(wf[k], wp[k]) for k in wf)
        same_s = sf.keys() == sp.keys() and all(np.array_equal(sf[k], sp[k]) for k in sf)
        has_s = bool(sf) == (recipe == "delayed")
        ok = same_l and same_w and same_s and has_s
        print(f"{'ok  ' if ok else 'FAIL'} resume {recipe:10s} losses {'=' if same_l else '!='}, "
              f"weights {'=' if same_w else '!='}, fp8 state {'=' if same_s else '!='} "
              f"({'saved' if sf else 'none'})")
        if not ok:
            failed.append(f"resume_{recipe}")


def cross(args, failed):
    bf = train_run(args, MODEL, "cross_bf16", ["train.dtype=bf16", "train.steps=10"], 1, weights=False)
    f8 = train_run(args, MODEL, "cross_fp8", ["train.dtype=fp8", "train.fp8_recipe=delayed",
                                              "train.steps=10"], 1, weights=False)
    if not bf or not f8:
        failed.append("cross")
        return
    step = lambda n: os.path.join(args.work, n, "ckpt", "step_10")  # noqa: E731
    cases = [("bf16 -> fp8 delayed", step("cross_bf16"), ["train.dtype=fp8", "train.fp8_recipe=delayed"]),
             ("fp8 delayed -> bf16", step("cross_fp8"), ["train.dtype=bf16"]),
             ("fp8 history 16 -> 4", step("cross_fp8"),
              ["train.dtype=fp8", "train.fp8_recipe=delayed", "train.fp8_amax_history=4"])]
    for i, (name, src, sets) in enumerate(cases):
        r = train_run(args, MODEL, f"cross_{i}", sets + ["train.steps=14"], 1, resume_from=src,
                      weights=False)
        ok = bool(r) and sorted(losses(r[0])) == [11, 12, 13, 14] and all(
            np.isfinite(v) for v in losses(r[0]).values())
        print(f"{'ok  ' if ok else 'FAIL'} cross  {name}")
        if not ok:
            failed.append(f"cross_{i}")


def moe(args, failed):
    steps = ["train.steps=300", "train.eval_interval=300", "train.eval_batches=16",
             "checkpoint.interval=0"]
    delayed = ["train.dtype=fp8", "train.fp8_recipe=delayed"]
    got = {}
    for name, sets in [("bf16", ["train.dtype=bf16"]), ("fp8_delayed", delayed)]:
        r = train_run(args, MOE_MODEL, "moe_converge_" + name, steps + sets, 1, weights=False)
        if not r:
            failed.append("moe_converge_" + name)
            return
        got[name] = (val_loss(os.path.join(args.work, "moe_converge_" + name)), losses(r[0]))
    v, ref = got["fp8_delayed"][0], got["bf16"][0]
    rel = abs(v - ref) / ref
    ok = rel <= 0.015 and got["fp8_delayed"][1] != got["bf16"][1]
    print(f"{'ok  ' if ok else 'FAIL'} moe converge fp8 delayed val loss {v:.4f} vs bf16 {ref:.4f}: "
          f"{100 * rel:.2f}% (bound 1.5%)")
    if not ok:
        failed.append("moe_converge")

    full = train_run(args, MOE_MODEL, "moe_resume_full", delayed, 1, weights=False)
    if not full:
        failed.append("moe_resume")
        return
    ck = os.path.join(args.work, "moe_resume_full", "ckpt")
    part = train_run(args, MOE_MODEL, "moe_resume_part", delayed, 1,
                     resume_from=os.path.join(ck, "step_10"), weights=False)
    wf, sf = h5_state(os.path.join(ck, "step_20", "checkpoint.h5"))
    ok = bool(part)
    if ok:
        wp, sp = h5_state(os.path.join(args.work, "moe_resume_part", "ckpt", "step_20", "checkpoint.h5"))
        lf, lp = losses(full[0]), losses(part[0])
        ex = sf.get("expert_amax_history")
        # 2 layers x 4 experts x 3 projections x 2 operands x 16 steps, each
        # with an amax in the window (a step that routed no token to an
        # expert leaves its slot 0: this model's layer 1 does, steps 6-14)
        shaped = (ex is not None and ex.size == 2 * 4 * 3 * 2 * 16 and
                  np.all(ex.reshape(-1, 16).max(axis=1) > 0))
        ok = (all(lp[k] == lf[k] for k in lp) and sorted(lp) == list(range(11, 21)) and
              all(np.array_equal(wf[k], wp[k]) for k in wf) and sf.keys() == sp.keys() and
              all(np.array_equal(sf[k], sp[k]) for k in sf) and shaped)
        print(f"{'ok  ' if ok else 'FAIL'} moe resume fp8 delayed: losses, weights and fp8 state "
              f"(experts' histories {'filled' if shaped else 'missing or empty'}) "
              f"{'bit-identical' if ok else 'differ'}")
    if not ok:
        failed.append("moe_resume")
    # An fp8 checkpoint from before the experts' histories: they start empty.
    old = os.path.join(args.work, "moe_old_ckpt")
    import shutil
    shutil.rmtree(old, ignore_errors=True)
    shutil.copytree(os.path.join(ck, "step_10"), old)
    with h5py.File(os.path.join(old, "checkpoint.h5"), "a") as h:
        del h["state"]["fp8"]["expert_amax_history"]
    import subprocess
    cmd = [args.train, "--config", MOE_MODEL, "--resume", old]
    for x in [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
              f"log.dir={args.work}/moe_old", f"checkpoint.dir={args.work}/moe_old/ckpt",
              "train.steps=12"] + delayed:
        cmd += ["--set", x]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    ok = p.returncode == 0 and "no FP8 amax history for the experts" in p.stderr
    print(f"{'ok  ' if ok else 'FAIL'} moe resume of a checkpoint without the experts' histories "
          f"(a note, they restart)")
    if not ok:
        print(p.stdout[-2000:], p.stderr[-2000:])
        failed.append("moe_old_checkpoint")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "emulated"])
    ap.add_argument("--cases", nargs="*", default=["converge", "resume", "cross", "moe"])
    args = ap.parse_args()
    args.mpirun = None
    os.makedirs(args.work, exist_ok=True)
    failed = []
    for c in args.cases:
        {"converge": converge, "resume": resume, "cross": cross, "moe": moe}[c](args, failed)
    if failed:
        sys.exit(f"FAIL: {', '.join(failed)}")
    print("PASS: fp8 converges like bf16, resumes bitwise, and crosses to and from bf16")


if __name__ == "__main__":
    main()

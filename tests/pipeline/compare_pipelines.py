#!/usr/bin/env python3
"""Every pipeline schedule trains like the single process.

For pp in {2, 4}, micro-batches m in {pp, 2pp, 3pp} and every generator
(gpipe, 1f1b, interleaved with 2 virtual stages, zb-h1, greedy, greedy
with 2 virtual stages as greedy-v2, and zb-v on the vee placement), alone and
combined with tp=2 or dp=2, the 8-layer ~100k-parameter model
(tests/pipeline/model.yaml) trains 20 steps under mpirun. Its per-step losses
(metrics.jsonl) and final weights (the step_20 checkpoint's whole tensors,
read through the virtual-dataset index) must equal those of the single process
with the same global batch within a relative tolerance (1e-5: fp32, where only
the order of summation differs).

usage: compare_pipelines.py --train BIN --mpirun WRAPPER --data DIR --work DIR
                            [--pp 2 4] [--extras none tp2 dp2] [--schedules ...]
                            [--m-per-pp 1 2 3]
"""
import argparse
import json
import os
import subprocess
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "layouts"))
from train_run import in_pairs, losses, rel_errors, train_run  # noqa: E402
SCHEDULES = ["gpipe", "1f1b", "interleaved", "zb-h1", "greedy", "greedy-v2", "zb-v"]


def run(args, name, sets, ranks, resume_from=None):
    """(losses by step, final weights, seconds, per-step measured bubbles,
    activations held at step 1) or None."""
    r = train_run(args, os.path.join(HERE, "model.yaml"), name, sets, ranks, resume_from)
    if r is None:
        return None
    recs, w, dt = r
    held = [q["held"] for q in recs if q.get("step") == 1 and "held" in q]
    return losses(recs), w, dt, [q["bubble"] for q in recs if "bubble" in q], held[0] if held else None


def planned_held(args, sets):
    """The most chunk activations a rank holds in the configured schedule, as
    `adgt-train --print-schedule` counts them (pp::held_activations: each
    chunk's peak, summed over the rank's chunks; what --dry-run's memory
    uses), or None."""
    cmd = [args.train, "--config", os.path.join(HERE, "model.yaml"), "--print-schedule"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    for line in p.stdout.splitlines():
        if line.startswith("activations held per pipeline rank"):
            return max(int(x) for x in line.split(":")[1].split())
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "emulated"],
                    help="train.device of every run (emulated: the device code paths on the CPU)")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--pp", type=int, nargs="*", default=[2, 4])
    ap.add_argument("--extras", nargs="*", default=["none", "tp2", "dp2"])
    ap.add_argument("--schedules", nargs="*", default=SCHEDULES)
    ap.add_argument("--m-per-pp", type=int, nargs="*", default=[1, 2, 3],
                    help="micro-batch counts as multiples of pp (default 1 2 3: m = pp, 2pp, 3pp)")
    ap.add_argument("--rendezvous", action="store_true",
                    help="ADGT_PP_RENDEZVOUS=1: the executor runs pp::for_rendezvous lists "
                         "(what it runs on NCCL) over MPI")
    args = ap.parse_args()
    if args.rendezvous:
        os.environ["ADGT_PP_RENDEZVOUS"] = "1"
        # The ranks must see it, or every run below is the plain lists' (and
        # would match the single process as well): the executor says so once.
        import subprocess
        out = os.path.join(args.work, "rendezvous_probe")
        cmd = [args.mpirun, "2", args.train, "--config", os.path.join(HERE, "model.yaml")]
        for s in [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
                  f"log.dir={out}", f"checkpoint.dir={out}/ckpt", "checkpoint.at_end=false",
                  "train.steps=2", "train.warmup_steps=1", "parallel.pp=2",
                  "parallel.schedule=interleaved", "parallel.virtual_stages=2",
                  "train.global_batch=4"]:
            cmd += ["--set", s]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        if p.returncode != 0 or "the schedule runs as pp::for_rendezvous" not in p.stderr:
            sys.exit(f"FAIL: ADGT_PP_RENDEZVOUS=1 did not reach the executor (exit {p.returncode})\n"
                     + p.stderr[-2000:])
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
          f"{'max rel weight err':>18}  {'bubble':>6}  {'held':>6}  {'time':>6}", flush=True)
    failed, n = [], 0
    sweep = []  # (pp, m, schedule, extra, global batch, name, sets, ranks, virtual stages)
    for pp in args.pp:
        for extra in args.extras:
            tp = 2 if extra == "tp2" else 1
            dp = 2 if extra == "dp2" else 1
            for m in (k * pp for k in args.m_per_pp):
                for sched in args.schedules:
                    v = 2 if sched in ("interleaved", "greedy-v2", "zb-v") else 1
                    sets = [f"parallel.pp={pp}", f"parallel.tp={tp}", f"parallel.dp={dp}",
                            f"parallel.schedule={sched.removesuffix('-v2')}",
                            f"parallel.virtual_stages={v}", f"train.global_batch={m * dp}"]
                    sweep.append((pp, m, sched, extra, m * dp, f"pp{pp}_m{m}_{sched}_{extra}", sets,
                                  pp * tp * dp, v))
    # The references and the layouts are independent runs: two at a time
    # (in_pairs), checked in order below.
    in_pairs([lambda g=g: reference(g) for g in sorted({e[4] for e in sweep})])
    results = in_pairs([lambda e=e: (run(args, e[5], e[6], e[7]),
                                     None if args.rendezvous else planned_held(args, e[6]))
                        for e in sweep], [e[7] for e in sweep])
    for (pp, m, sched, extra, gb, name, sets, ranks, v), (r, plan) in zip(sweep, results):
        ref_l, ref_w, _, _, _ = reference(gb)
        n += 1
        if r is None:
            failed.append(f"{name}: exited non-zero")
            continue
        l, w, t, bub, held = r
        # The executor holds at most what the schedule (and the
        # memory estimate) counts, measured at step 1 (before any
        # re-plan); exactly that with one chunk per rank. Not with
        # --rendezvous: its receives move earlier (more held).
        if not args.rendezvous:
            if held is None or plan is None or held > plan or (v == 1 and held != plan):
                failed.append(f"{name}: activations held {held}, the schedule's count {plan}")
        if sorted(l) != sorted(ref_l):
            failed.append(f"{name}: logged steps {sorted(l)}")
            continue
        if sorted(w) != sorted(ref_w):
            failed.append(f"{name}: checkpoint tensors differ: "
                          f"{sorted(set(w) ^ set(ref_w))[:4]}")
            continue
        lerr, werr, worst = rel_errors(l, ref_l, w, ref_w)
        ok = lerr <= args.tol and werr <= args.tol
        b = f"{100 * np.median(bub):5.1f}%" if bub else "   n/a"
        h = f"{held}/{plan}" if plan is not None else "-"
        print(f"{pp:>3} {m:>3} {sched:>11} {extra:>5}  {lerr:>16.3e}  {werr:>18.3e}  "
              f"{b}  {h:>6}  {t:>5.1f}s  {'PASS' if ok else 'FAIL ' + worst}", flush=True)
        if not ok:
            failed.append(name)
    # Checkpoints reshard across pipeline layouts: step_10 of one layout resumes in
    # another (same global batch 4) and ends like the uninterrupted single process;
    # the same layout resumes bit for bit.
    # (They resume the sweep's own pp2_m4_1f1b_none run: m = 2pp must be in --m-per-pp.)
    if ("none" in args.extras and 2 in args.pp and 4 in args.pp and "1f1b" in args.schedules
            and 2 in args.m_per_pp):
        ref_l, ref_w, _, _, _ = reference(4)
        single = ["parallel.pp=1", "train.global_batch=4"]
        layouts = {
            "pp2_m4_1f1b_none": (["parallel.pp=2", "parallel.schedule=1f1b", "train.global_batch=4"], 2),
            "single_gb4": (single, 1),
            "pp4_m4_zb-h1": (["parallel.pp=4", "parallel.schedule=zb-h1", "train.global_batch=4"], 4),
            "pp2_dp2_1f1b": (["parallel.pp=2", "parallel.dp=2", "parallel.schedule=1f1b",
                              "train.global_batch=4"], 4),
            "pp2_tp2_gpipe": (["parallel.pp=2", "parallel.tp=2", "parallel.schedule=gpipe",
                               "train.global_batch=4"], 4),
        }
        pairs = [("pp2_m4_1f1b_none", "single_gb4"), ("single_gb4", "pp4_m4_zb-h1"),
                 ("pp2_m4_1f1b_none", "pp2_dp2_1f1b"), ("pp2_m4_1f1b_none", "pp2_tp2_gpipe"),
                 ("pp2_m4_1f1b_none", "pp2_m4_1f1b_none")]
        if "zb-v" in args.schedules:
            # The vee placement's checkpoints (rank 0 holds the first and the
            # last stage) load into looped layouts and back, and resume bit
            # for bit in their own.
            layouts["pp4_m4_zb-v"] = (["parallel.pp=4", "parallel.schedule=zb-v",
                                       "parallel.virtual_stages=2", "train.global_batch=4"], 4)
            layouts["pp2_m4_zb-v_none"] = (["parallel.pp=2", "parallel.schedule=zb-v",
                                            "parallel.virtual_stages=2", "train.global_batch=4"], 2)
            pairs += [("pp2_m4_zb-v_none", "pp4_m4_zb-h1"), ("pp2_m4_1f1b_none", "pp4_m4_zb-v"),
                      ("pp2_m4_zb-v_none", "pp2_m4_zb-v_none")]
        # The resumes (and the example below) are independent runs: in pairs.
        src8 = "pp2_tp2_dp2_gb8"
        reference(8)
        done = in_pairs([lambda src=src, dst=dst: run(
                            args, f"resume_{src}_to_{dst}", *layouts[dst],
                            resume_from=os.path.join(args.work, src, "ckpt", "step_10"))
                         for src, dst in pairs]
                        + [lambda: run(args, src8, ["parallel.pp=2", "parallel.tp=2", "parallel.dp=2",
                                                    "parallel.schedule=1f1b", "train.global_batch=8"], 8)],
                        [layouts[dst][1] for _, dst in pairs] + [8])
        r0 = done.pop()
        for (src, dst), r in zip(pairs, done):
            name = f"resume_{src}_to_{dst}"
            if r is None:
                failed.append(f"{name}: exited non-zero")
                continue
            l, w = r[0], r[1]
            if min(l) != 11:
                failed.append(f"{name}: did not resume at step 11 (logged {sorted(l)})")
                continue
            if src == dst:  # bitwise against the uninterrupted run of the same layout
                with open(os.path.join(args.work, src, "metrics.jsonl")) as f:
                    full = losses(q for q in map(json.loads, filter(str.strip, f)) if "loss" in q)
                diff = [k for k in l if l[k] != full[k]]
                with h5py.File(os.path.join(args.work, src, "ckpt", "step_20", "checkpoint.h5")) as h:
                    diff += [k for k in h["model"] if not np.array_equal(h["model"][k][...], w[k])]
                print(f"{name}: {'PASS bitwise' if not diff else 'FAIL: differs at ' + str(diff[:4])}")
                if diff:
                    failed.append(name)
                continue
            lerr, werr, _ = rel_errors(l, ref_l, w, ref_w)
            ok = lerr <= args.tol and werr <= args.tol
            print(f"{name}: steps 11-20 max rel loss err {lerr:.3e}, final weights {werr:.3e}  "
                  f"{'PASS' if ok else 'FAIL'}", flush=True)
            if not ok:
                failed.append(name)
        # The example: tp=2 pp=2 dp=2 resumes as tp=1 pp=4 dp=2 (8 ranks each).
        ref8_l, ref8_w, _, _, _ = reference(8)
        src = src8
        r = None if r0 is None else run(
            args, f"resume_{src}_to_pp4_dp2", ["parallel.pp=4", "parallel.dp=2",
                                               "parallel.schedule=zb-h1", "train.global_batch=8"], 8,
            resume_from=os.path.join(args.work, src, "ckpt", "step_10"))
        if r0 is None or r is None:
            failed.append(f"resume_{src}_to_pp4_dp2: exited non-zero")
        else:
            l, w = r[0], r[1]
            lerr, werr, _ = rel_errors(l, ref8_l, w, ref8_w)
            ok = min(l) == 11 and lerr <= args.tol and werr <= args.tol
            print(f"resume_{src}_to_pp4_dp2: steps 11-20 max rel loss err {lerr:.3e}, final weights "
                  f"{werr:.3e}  {'PASS' if ok else 'FAIL'}", flush=True)
            if not ok:
                failed.append(f"resume_{src}_to_pp4_dp2")
    if "none" in args.extras and 4 in args.pp and "zb-v" in args.schedules:
        # Evaluation through the vee placement (forward_only hands rank pp-1's
        # activations over in memory): the same validation losses, on the
        # first 8 windows of the split (the whole split costs ~30 s a run).
        vals = {}
        ev = ["train.eval_interval=10", "train.eval_batches=8"]
        evals = [("eval_single_gb8", ["train.global_batch=8"] + ev, 1),
                 ("eval_pp4_zb-v", ["parallel.pp=4", "parallel.schedule=zb-v", "parallel.virtual_stages=2",
                                    "train.global_batch=8"] + ev, 4)]
        done = in_pairs([lambda e=e: train_run(args, os.path.join(HERE, "model.yaml"), *e, weights=False)
                         for e in evals], [e[2] for e in evals])
        for (name, sets, ranks), r in zip(evals, done):
            if r is None:
                failed.append(f"{name}: exited non-zero")
                continue
            with open(os.path.join(args.work, name, "metrics.jsonl")) as f:
                vals[name] = {q["step"]: q["val_loss"] for q in map(json.loads, filter(str.strip, f))
                              if "val_loss" in q}
        if len(vals) == 2:
            a, b = vals["eval_single_gb8"], vals["eval_pp4_zb-v"]
            ok = sorted(a) == sorted(b) == [10, 20] and all(abs(a[k] - b[k]) <= args.tol * abs(a[k]) for k in a)
            print(f"eval_pp4_zb-v: val loss {b} against the single process {a}  {'PASS' if ok else 'FAIL'}",
                  flush=True)
            if not ok:
                failed.append("eval_pp4_zb-v")
    if failed:
        sys.exit("FAIL: " + "; ".join(failed))
    print(f"PASS: {n} pipeline runs equal the single process within {args.tol}")


if __name__ == "__main__":
    main()

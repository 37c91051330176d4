"""Training with gradient compression (docs/compression.md) on CPU ranks
(tests/compress.cmake). Every run sets ADGT_CHECK_DP_REPLICAS=1: the trainer
then checks, after the last step, that every data-parallel replica holds the
same parameters bit for bit, and prints "dp replicas: ... bit-identical".

  --case off: grad_compression off and auto (before its first decision,
      off: warm-up spans the run) give the same losses bit for bit at dp=4, and int8 at dp=1 (a no-op) the same
      as off at dp=1.
  --case train --level L: the run trains (losses finite, the last below the
      first), the step records report level L and fewer dp bytes than fp32.
  --case resume --level L: steps 5..8 resumed from the step-4 checkpoint
      (error feedback restored) equal the uninterrupted run's bit for bit;
      a resume of that checkpoint at dp=2 drops the error feedback with a note.

Exits non-zero with what differed.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time


def run(args, name, sets, ranks, resume=None, expect_ok=True):
    out = os.path.join(args.work, name)
    shutil.rmtree(out, ignore_errors=True)
    cmd = [args.train, "--config", args.model]
    if resume:
        cmd += ["--resume", resume]
    for s in [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
              f"log.dir={out}", f"checkpoint.dir={out}/ckpt", "train.device=cpu"] + sets:
        cmd += ["--set", s]
    if ranks > 1:
        cmd = [args.mpirun, str(ranks)] + cmd
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1", ADGT_CHECK_DP_REPLICAS="1"))
    if p.returncode != 0 or "bit-identical" not in p.stdout:
        print(" ".join(cmd))
        print(p.stdout[-4000:], p.stderr[-4000:])
        sys.exit(f"FAILED: run {name} " + ("failed" if p.returncode else "printed no replica check"))
    with open(os.path.join(out, "metrics.jsonl")) as f:
        recs = [r for r in map(json.loads, filter(str.strip, f)) if "loss" in r]
    print(f"{name}: {len(recs)} steps in {time.time() - t0:.1f} s, losses "
          f"{[round(r['loss'], 4) for r in recs]}")
    return recs, p.stdout + p.stderr


def losses(recs):
    return {r["step"]: r["loss"] for r in recs}


def main():
    ap = argparse.ArgumentParser()
    for a in ("--train", "--mpirun", "--data", "--model", "--work"):
        ap.add_argument(a, required=True)
    ap.add_argument("--case", choices=["off", "train", "resume"], required=True)
    ap.add_argument("--level", default="int8")
    ap.add_argument("--layout", default="dp=4", help="dp=4 | tp=2,dp=2 | pp=2,dp=2 | dp=4,zero=1 | cp=2,dp=2")
    args = ap.parse_args()
    lay = [f"parallel.{kv}" for kv in args.layout.split(",")]
    ranks = 1
    for kv in args.layout.split(","):
        k, v = kv.split("=")
        if k in ("tp", "pp", "dp", "cp"):
            ranks *= int(v)
    problems = []
    if args.case == "off":
        # Warm-up over the whole run: auto's first decision (after the last
        # warm-up step) would apply from step 9, so it must equal off. Without
        # it, a decision after step 2 on a loaded machine may pick bf16.
        whole = ["train.warmup_steps=8"]
        off, _ = run(args, "off", lay + whole + ["parallel.grad_compression=off"], ranks)
        auto, _ = run(args, "auto", lay + whole + ["parallel.grad_compression=auto"], ranks)
        if losses(off) != losses(auto):
            problems.append(f"off vs auto: {losses(off)} vs {losses(auto)}")
        one_off, _ = run(args, "dp1_off", ["parallel.grad_compression=off"], 1)
        one_int8, _ = run(args, "dp1_int8", ["parallel.grad_compression=int8"], 1)
        if losses(one_off) != losses(one_int8):
            problems.append(f"dp=1 off vs int8: {losses(one_off)} vs {losses(one_int8)}")
    elif args.case == "train":
        recs, _ = run(args, args.level, lay + [f"parallel.grad_compression={args.level}"], ranks)
        ls = [r["loss"] for r in recs]
        if not ls or not all(math.isfinite(x) for x in ls):
            problems.append(f"non-finite losses {ls}")
        elif ls[-1] >= ls[0]:
            problems.append(f"loss did not fall: {ls[0]} -> {ls[-1]}")
        for r in recs:
            gc = r.get("grad_compression")
            if not gc or gc["levels"] != args.level:
                problems.append(f"step {r['step']}: grad_compression {gc}, want levels {args.level}")
                break
            if not 0 < gc["sent_bytes"] < gc["fp32_bytes"]:
                problems.append(f"step {r['step']}: sent {gc['sent_bytes']} bytes, fp32 {gc['fp32_bytes']}")
                break
            # The compressed reduce is on the step's path: the dp wait (the step
            # line's, TEI's) counts it (it once showed 0.0 ms with every bucket
            # compressed). Both are means over the ranks, of w + c and of c,
            # w >= 0, so the inequality is exact.
            if not 0 < gc.get("seconds", -1) <= r.get("dp_wait_s", -1):
                problems.append(f"step {r['step']}: compressed reduce {gc.get('seconds')} s, dp wait "
                                f"{r.get('dp_wait_s')} s: the compressed reduce is not counted")
                break
        if recs and "grad_compression" in recs[-1]:
            gc = recs[-1]["grad_compression"]
            print(f"{args.level}: dp bytes per rank per step {gc['sent_bytes']} vs fp32 {gc['fp32_bytes']} "
                  f"({gc['fp32_bytes'] / max(gc['sent_bytes'], 1):.2f}x less)")
    else:
        sets = lay + [f"parallel.grad_compression={args.level}", "checkpoint.interval=4",
                      "checkpoint.keep=0"]
        full, _ = run(args, "full", sets, ranks)
        step4 = os.path.join(args.work, "full", "ckpt", "step_4")
        resumed, log = run(args, "resumed", sets, ranks, resume=step4)
        a, b = losses(full), losses(resumed)
        for s in range(5, 9):
            if a.get(s) != b.get(s):
                problems.append(f"step {s}: uninterrupted {a.get(s)!r} vs resumed {b.get(s)!r}")
        if "dropped" in log:
            problems.append("the resume at the same layout dropped the error feedback")
        # Into half the dp ranks: the error feedback is dropped with a note, training goes on.
        dp = int(dict(kv.split("=") for kv in args.layout.split(",")).get("dp", 1))
        other = [s for s in sets if not s.startswith("parallel.dp=")] + [f"parallel.dp={dp // 2}"]
        _, log2 = run(args, "resumed_dp2", other, ranks // 2, resume=step4)
        if "error-feedback state is dropped" not in log2:
            problems.append("a resume at dp=2 did not note that the error feedback was dropped")
    if problems:
        print("FAILED:\n  " + "\n  ".join(problems))
        sys.exit(1)
    print(f"ok: {args.case} {args.level} {args.layout}")


if __name__ == "__main__":
    main()

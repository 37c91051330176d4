#!/usr/bin/env python3
"""Pipeline schedules measured: the bubble each schedule leaves in the
executor's own timeline next to its theory, and the step time relative to 1F1B.

Runs adgt-train under mpirun for every schedule and micro-batch count on a
model large enough that compute dominates the messages (8 layers, d_model 256,
128 tokens per micro-batch), OMP_NUM_THREADS=1 per rank. For each run:

  measured   the median over steps 3.. of the trainer's `bubble` metric:
             1 - sum of the ranks' compute time / (pp x the slowest rank's
             step time), as a ratio idle / busy (the convention of the
             closed forms: (p-1)/m for 1F1B)
  theory     the closed form with equal F = B = W times: GPipe and 1F1B
             (p-1)/m, interleaved (p-1)/(v m), ZB-H1 (p-1)/(3m); greedy:
             simulated with equal times
  cost model the simulator's prediction with the FLOP cost model's stage
             times (adgt-train --print-schedule), which counts the head
  step       median step time relative to 1F1B with the same m

On a machine with fewer cores than ranks the ranks share cores: compute
durations stretch while neighbours compute, so measured bubbles are only
comparable between schedules of one run of this script.

usage: bench_pipeline.py [--train BIN] [--mpirun WRAPPER] [--data DIR]
                         [--pp 4] [--m 4 8 16] [--steps 6]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

from bench_lib import TRAIN

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEDULES = ["gpipe", "1f1b", "interleaved", "zb-h1", "greedy"]
MODEL = """model:
  vocab_size: 256
  d_model: 256
  n_layers: 8
  n_heads: 8
  n_kv_heads: 8
  ffn_hidden: 688
  seq_len: 128
""" + TRAIN.replace("{gb}", "4")


def closed_form(sched, p, m, v):
    return {"gpipe": (p - 1) / m, "1f1b": (p - 1) / m, "interleaved": (p - 1) / (v * m),
            "zb-h1": (p - 1) / (3 * m)}.get(sched)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", default=os.path.join(ROOT, "build", "apps", "adgt-train"))
    ap.add_argument("--mpirun", default=os.path.join(ROOT, "tests", "parallel", "mpirun.sh"))
    ap.add_argument("--data", default=os.path.join(ROOT, "build", "data", "kjv-byte"))
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--m", type=int, nargs="*", default=[4, 8, 16])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--schedules", nargs="*", default=SCHEDULES)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench_pipeline_")
    cfg = os.path.join(work, "model.yaml")
    with open(cfg, "w") as f:
        f.write(MODEL.format(steps=args.steps))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = args.pp
    rows = []
    print(f"pipeline bubbles, pp={p}, {os.cpu_count()} cores; ratio = idle / busy compute time")
    print(f"{'m':>3} {'schedule':>11}  {'measured':>8}  {'theory':>8}  {'cost model':>10}  "
          f"{'step (s)':>8}  {'vs 1f1b':>7}", flush=True)
    for m in args.m:
        base = None
        res = {}
        for sched in args.schedules:
            v = 2 if sched == "interleaved" else 1
            out = os.path.join(work, f"m{m}_{sched}")
            sets = [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
                    f"log.dir={out}", f"checkpoint.dir={out}/ckpt", f"parallel.pp={p}",
                    f"parallel.schedule={sched}", "parallel.adapt=off", f"parallel.virtual_stages={v}",
                    f"train.global_batch={m}"]
            cmd = [args.train, "--config", cfg]
            for s in sets:
                cmd += ["--set", s]
            ps = subprocess.run(cmd + ["--print-schedule"], capture_output=True, text=True, env=env)
            if ps.returncode != 0:
                print(ps.stdout, ps.stderr)
                sys.exit(f"FAIL: --print-schedule for {sched} m={m}")
            predicted = float(re.search(r"([0-9.]+)% of the ideal compute time", ps.stdout).group(1)) / 100
            r = subprocess.run([args.mpirun, str(p)] + cmd, capture_output=True, text=True,
                               env=env, timeout=900)
            if r.returncode != 0:
                print(r.stdout[-3000:], r.stderr[-3000:])
                sys.exit(f"FAIL: {sched} m={m} exited {r.returncode}")
            with open(os.path.join(out, "metrics.jsonl")) as f:
                recs = [json.loads(l) for l in f if l.strip() and '"loss"' in l]
            recs = recs[2:] or recs  # the first steps warm up
            frac = statistics.median(q["bubble"] for q in recs)
            step_s = statistics.median(m * 128 / q["tokens_per_s"] for q in recs)
            ratio = frac / (1 - frac)
            res[sched] = (ratio, step_s, predicted)
            if sched == "1f1b":
                base = step_s
        for sched in args.schedules:
            ratio, step_s, predicted = res[sched]
            v = 2 if sched == "interleaved" else 1
            th = closed_form(sched, p, m, v)
            ths = f"{th:8.3f}" if th is not None else "     sim"
            rel = f"{step_s / base:7.2f}" if base else "    n/a"
            print(f"{m:>3} {sched:>11}  {ratio:8.3f}  {ths}  {predicted:10.3f}  {step_s:8.3f}  {rel}",
                  flush=True)
            rows.append({"m": m, "schedule": sched, "measured_ratio": ratio, "theory": th,
                         "cost_model": predicted, "step_s": step_s})
    with open(os.path.join(work, "bench_pipeline.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"(results in {work}/bench_pipeline.json)")


if __name__ == "__main__":
    main()

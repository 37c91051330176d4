#!/usr/bin/env python3
"""The pipeline bubble on uniform stages, static schedules against the
adaptive one, side by side (docs/adaptation.md, "Bubble on uniform
stages").

8 CPU ranks (pp 4 x dp 2), the 8-layer model of tests/emulate/model.yaml at
d_model 256, micro-batch 1, m micro-batches per rank and step, on the
emulation's virtual clock (what a rank with a core of its own measures). The
scenarios, for each m:
  1f1b         parallel.schedule: 1f1b, adapt off
  zb-h1        zb-h1, adapt off
  adapt        starts in 1f1b, parallel.adapt: schedule (one chunk per rank)
  interleaved  interleaved with 2 chunks per rank, adapt off
  adapt-v2     starts interleaved with 2 chunks per rank, parallel.adapt: schedule
(and, with --scenarios, zb-v and adapt-zbv: ZB-V's vee placement, static and
re-planned on it; interleaved-v4 and adapt-v4: 4 chunks per rank, for
--set model.n_layers=16).

Each runs REPS times; a run's figure is the median over steps SKIP..STEPS of
the step's measured bubble (1 - the pipeline group's compute / (pp x the
slowest rank's span)) and of its idle part (bubble_idle: receives and the
time after a rank's last instruction); a cell is the median over the runs.
Also checks that every scenario's losses equal 1f1b's bit for bit (an
adaptation never changes the numbers).

  scripts/adapt/bench_bubble.py --train build/apps/adgt-train \\
      --data build/data/kjv-byte [--reps 3] [--m 8 16] [--scenarios ...] [--set KEY=VALUE ...]

The issue's acceptance batch (docs/adaptation.md, "Measured again: the
helper's wake-ups"): --reps 5 --m 8 16 --scenarios 1f1b zb-h1 adapt-v2
--set model.n_layers=16 (two layers per chunk; on the default 8 layers the
embedding's and head's extra cost keeps adapt-v2 near 0.45-0.54x of 1F1B).
"""
import argparse
import os
import statistics
import sys

from bench_adapt import launch  # this folder: the same launcher as the straggler benchmark

SCENARIOS = {
    "1f1b": ["parallel.schedule=1f1b", "parallel.adapt=off"],
    "zb-h1": ["parallel.schedule=zb-h1", "parallel.adapt=off"],
    "adapt": ["parallel.schedule=1f1b", "parallel.adapt=schedule"],
    "interleaved": ["parallel.schedule=interleaved", "parallel.virtual_stages=2", "parallel.adapt=off"],
    "adapt-v2": ["parallel.schedule=interleaved", "parallel.virtual_stages=2", "parallel.adapt=schedule"],
    # ZB-V (the vee placement, 2 chunks per rank: 1F1B's activations), static
    # and re-planned (zb-v or greedy on the same placement).
    "zb-v": ["parallel.schedule=zb-v", "parallel.virtual_stages=2", "parallel.adapt=off"],
    "adapt-zbv": ["parallel.schedule=zb-v", "parallel.virtual_stages=2", "parallel.adapt=schedule"],
    # Four chunks per rank need model.n_layers a multiple of 16 (--set model.n_layers=16).
    "interleaved-v4": ["parallel.schedule=interleaved", "parallel.virtual_stages=4", "parallel.adapt=off"],
    "adapt-v4": ["parallel.schedule=interleaved", "parallel.virtual_stages=4", "parallel.adapt=schedule"],
}
DEFAULT = ["1f1b", "zb-h1", "adapt", "interleaved", "adapt-v2"]


def run(args, name, m, sets):
    common = [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
              f"train.steps={args.steps}", f"train.global_batch={2 * m}", "train.micro_batch=1",
              "parallel.pp=4", "parallel.dp=2", "emulate.cluster=cpu-here", "emulate.clock=virtual",
              "model.d_model=256", "model.ffn_hidden=512", "train.eval_interval=0",
              "checkpoint.at_end=false"] + args.set
    recs = launch(args.train, os.path.join(args.work, name), 8, common + sets, timeout=1800)
    bubble, idle, losses, schedule = [], [], {}, None
    for r in recs:
        if r.get("controller") == "adapt-schedule" and r.get("decision", {}).get("switch"):
            schedule = r["decision"].get("schedule")
        if "bubble" in r and "step" in r:
            losses[r["step"]] = r["loss"]
            if r["step"] >= args.skip:
                bubble.append(r["bubble"])
                idle.append(r.get("bubble_idle", float("nan")))
    if not bubble:
        sys.exit(f"FAILED: {name}: no step records after step {args.skip}")
    return statistics.median(bubble), statistics.median(idle), losses, schedule


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", default="/tmp/adgt_bench_bubble")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--skip", type=int, default=26, help="first step counted (the re-plans act at 10 and 15)")
    ap.add_argument("--m", type=int, nargs="*", default=[8, 16])
    ap.add_argument("--scenarios", nargs="*", default=DEFAULT, choices=list(SCENARIOS))
    ap.add_argument("--set", nargs="*", default=[], help="more KEY=VALUE settings for every run")
    args = ap.parse_args()
    status = 0
    print(f"{'m':>3} {'scenario':>12} {'bubble':>7} {'(runs)':>22} {'idle':>6} {'/ 1f1b':>7} {'/ zb-h1':>8}"
          f"  schedule after the re-plans", flush=True)
    for m in args.m:
        cells, ref_losses = {}, None
        for name in args.scenarios:
            runs = [run(args, f"{name}_m{m}_{k}", m, SCENARIOS[name]) for k in range(args.reps)]
            b = statistics.median(r[0] for r in runs)
            i = statistics.median(r[1] for r in runs)
            cells[name] = b
            for r in runs:
                if ref_losses is None:
                    ref_losses = r[2]
                elif r[2] != ref_losses:
                    bad = [s for s in ref_losses if ref_losses[s] != r[2].get(s)][:3]
                    print(f"FAILED: {name} m={m}: losses differ from the first run at steps {bad}")
                    status = 1
            lo, hi = min(r[0] for r in runs), max(r[0] for r in runs)
            vs1 = f"{b / cells['1f1b']:.2f}x" if "1f1b" in cells else "-"
            vsz = f"{b / cells['zb-h1']:.2f}x" if "zb-h1" in cells else "-"
            sched = runs[-1][3] or "(unchanged)"
            print(f"{m:>3} {name:>12} {b:7.3f} {'(%.3f-%.3f)' % (lo, hi):>22} {i:6.3f} {vs1:>7} {vsz:>8}  {sched}",
                  flush=True)
    if status == 0:
        print("losses: every run of each m bit for bit equal")
    return status


if __name__ == "__main__":
    sys.exit(main())

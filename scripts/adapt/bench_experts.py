#!/usr/bin/env python3
"""The MoE target of docs/adaptation.md, median of N runs of the MoE-layer benchmark.

Runs tests/tools/bench_expert_placement.cpp (8 ranks, ep 8, 64 experts top-2,
Zipf(1.2) routing, ranks 3 and 6 at half speed, 9 slots per rank; static
contiguous placement against the re-placed one with replicas) `--reps`
times and prints each run's figures, their medians and the issue's bounds:
capacity-weighted imbalance <= 0.15 (measured expert time x factor), the
layer's expert time >= 1.3x faster than static, the half-speed ranks' rows
0.5x the full-speed ranks' +-10%, the re-placement <= 5% of 50 iterations.

usage: bench_experts.py [--bench build/tests/adgt_bench_expert_placement] [--reps 5] [-- EXTRA ARGS]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PATTERNS = {
    "imbalance": r"imbalance, measured \(time x factor\)\s+\S+\s+(\S+)",
    "imbalance_rows": r"imbalance, rows x factor\s+\S+\s+(\S+)",
    "speedup": r"\((\S+)x faster\)",
    "slow_rows": r"slow ranks' rows / fast ranks'\s+\S+\s+(\S+)",
    "replace": r"= (\S+) of 50 iterations",
    "numbers": r"within (\S+) relative",
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "tests", "adgt_bench_expert_placement"))
    ap.add_argument("--mpirun", default=os.path.join(ROOT, "tests", "parallel", "mpirun.sh"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("extra", nargs="*")
    args = ap.parse_args()
    runs = []
    for i in range(args.reps):
        p = subprocess.run([args.mpirun, "8", args.bench] + args.extra, capture_output=True, text=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)
        if p.returncode != 0:
            sys.exit(f"FAIL: run {i} exited {p.returncode}:\n{(p.stdout + p.stderr)[-3000:]}")
        if i == 0:
            print(p.stdout.split("static per rank")[0].rstrip())
        r = {k: float(re.search(v, p.stdout).group(1)) for k, v in PATTERNS.items()}
        runs.append(r)
        print(f"run {i + 1}: " + ", ".join(f"{k} {v:.4g}" for k, v in r.items()))
    med = {k: statistics.median(r[k] for r in runs) for k in PATTERNS}
    print("median: " + ", ".join(f"{k} {v:.4g}" for k, v in med.items()))
    bounds = [(med["imbalance"] <= 0.15, f"capacity-weighted imbalance {med['imbalance']:.3f} <= 0.15"),
              (med["speedup"] >= 1.3, f"expert time {med['speedup']:.2f}x faster >= 1.3x"),
              (abs(med["slow_rows"] / 0.5 - 1) <= 0.1, f"half-speed ranks' rows {med['slow_rows']:.3f} = 0.5 +-10%"),
              (med["replace"] <= 0.05, f"re-placement {med['replace']:.4f} of 50 iterations <= 0.05")]
    for ok, what in bounds:
        print(("meets " if ok else "MISSES ") + what)


if __name__ == "__main__":
    main()

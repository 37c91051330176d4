#!/usr/bin/env python3
"""Plots a training run's metrics: train loss (and validation loss points) and
tokens/s against the step.

    /usr/bin/python3 scripts/plot_metrics.py RUN_DIR [--out PNG]

Reads RUN_DIR/metrics.jsonl (one JSON object per line, written by adgt-train:
train records have step, loss, lr, grad_norm, tokens_per_s, ...; eval records
have step and val_loss) and writes RUN_DIR/loss.png unless --out says where.
A resumed run appends to the same file; when steps repeat, the later record
wins. Needs matplotlib (Debian: python3-matplotlib); draws with the Agg backend.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_metrics(path: str):
    """Returns (train, evals): dicts step -> record, the later record winning."""
    train, evals = {}, {}
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                # a run killed mid-write can leave a torn last line
                print(f"{path}:{lineno}: skipped, not JSON ({e})", file=sys.stderr)
                continue
            if "step" not in r:
                continue
            if "val_loss" in r:
                evals[int(r["step"])] = r
            elif "loss" in r:
                train[int(r["step"])] = r
    return train, evals


def finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", help="log directory holding metrics.jsonl (log.dir)")
    ap.add_argument("--out", help="PNG to write (default RUN_DIR/loss.png)")
    args = ap.parse_args()

    path = os.path.join(args.run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        print(f"{path}: no such file; is {args.run_dir} a run's log.dir?", file=sys.stderr)
        return 1
    train, evals = read_metrics(path)
    if not train and not evals:
        print(f"{path}: no step records to plot", file=sys.stderr)
        return 1
    out = args.out or os.path.join(args.run_dir, "loss.png")

    ts = sorted(train)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, constrained_layout=True)
    steps = [s for s in ts if finite(train[s].get("loss"))]
    ax1.plot(steps, [train[s]["loss"] for s in steps], label="train loss", color="C0", lw=1.2)
    es = sorted(s for s in evals if finite(evals[s].get("val_loss")))
    if es:
        ax1.plot(es, [evals[s]["val_loss"] for s in es], "o--", label="val loss", color="C1", ms=5, lw=0.8)
    ax1.set_ylabel("loss (nats/token)")
    ax1.grid(True, alpha=0.3)
    ax1.legend()
    last = []
    if steps:
        last.append(f"train {train[steps[-1]]['loss']:.4f}")
    if es:
        last.append(f"val {evals[es[-1]]['val_loss']:.4f}")
    ax1.set_title(f"{os.path.basename(os.path.normpath(args.run_dir))}: " + ", ".join(last))

    rs = [s for s in ts if finite(train[s].get("tokens_per_s"))]
    ax2.plot(rs, [train[s]["tokens_per_s"] for s in rs], color="C2", lw=1.2, marker="." if len(rs) < 50 else None)
    if len(rs) > 1:
        vals = sorted(train[s]["tokens_per_s"] for s in rs[1:])  # the first step warms up
        med = vals[len(vals) // 2] if len(vals) % 2 else 0.5 * (vals[len(vals) // 2 - 1] + vals[len(vals) // 2])
        ax2.axhline(med, color="C2", ls=":", lw=0.8, label=f"median {med:,.0f} tokens/s")
        ax2.legend()
    ax2.set_ylabel("tokens/s")
    ax2.set_xlabel("step")
    ax2.set_ylim(bottom=0)
    ax2.grid(True, alpha=0.3)

    fig.savefig(out, dpi=110)
    print(f"wrote {out} ({len(ts)} train records, {len(es)} eval records)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

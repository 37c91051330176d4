#!/usr/bin/env python3
"""The planner's table and --dry-run tell one story on CPU ranks.

`parallel.auto` on an emulated cluster (wall clock: the ops measured on this
CPU, each run's in-situ factor from one micro-batch of its own model, micro-
batch and recompute: ProfileCosts::calibrate) prints its candidates' step
times; a --dry-run of a candidate's layout, set by hand, predicts that
layout's step. The two must agree (4 significant digits, the table's print)
for the chosen row and for the best rows whose micro-batch or recompute
differs from it (their factors differ: before 2026-12-07 the planner costed
every row with the run file's factor, and such rows disagreed).

usage: plan_rows_agree.py --train BIN --model YAML --cluster YAML
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile


def dry(args, sets):
    cmd = [args.train, "--config", args.model_free, "--dry-run",
           "--set", f"emulate.cluster={args.cluster}"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return p.stdout


def sets_of(layout):
    """--set values of a table row's layout ("tp=1 pp=4 dp=1 zero=0 sp=0 zb-h1 mb=1 rc=none")."""
    keys = {"tp": "parallel.tp", "pp": "parallel.pp", "dp": "parallel.dp", "zero": "parallel.zero",
            "v": "parallel.virtual_stages", "mb": "train.micro_batch", "rc": "train.recompute"}
    out = []
    for tok in layout.split():
        if "=" in tok:
            k, v = tok.split("=", 1)
            if k == "sp":
                out.append(f"parallel.sequence_parallel={'true' if v == '1' else 'false'}")
            elif k in keys:
                out.append(f"{keys[k]}={v}")
            else:
                sys.exit(f"FAIL: unknown layout key {k!r} in {layout!r}")
        else:
            out.append(f"parallel.schedule={tok}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--cluster", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        # The run file without micro_batch and recompute: the planner varies them.
        args.model_free = os.path.join(work, "model.yaml")
        with open(args.model) as f, open(args.model_free, "w") as g:
            g.writelines(l for l in f if not re.match(r"\s+(micro_batch|recompute):", l))
        out = dry(args, ["parallel.auto=true"])
        rows = re.findall(r"^  (\d+)\s+(tp=.*?rc=\S+)\s+([0-9.e+-]+)\s", out, re.M)
        if len(rows) < 3:
            sys.exit(f"FAIL: fewer than 3 plan rows:\n{out}")
        chosen = rows[0][1]
        facts = lambda lay: re.findall(r"(mb=\S+|rc=\S+)", lay)  # noqa: E731
        pick = [rows[0]] + [r for r in rows[1:] if facts(r[1]) != facts(chosen)][:2]
        if len(pick) < 2:
            sys.exit(f"FAIL: no row with another micro-batch or recompute than the chosen:\n{out}")
        failed = []
        for _, layout, t in pick:
            line = re.search(r"^predicted step:\s+([0-9.e+-]+) s", dry(args, sets_of(layout)), re.M)
            if not line:
                sys.exit(f"FAIL: no predicted step for {layout}")
            same = f"{float(t):.4g}" == f"{float(line.group(1)):.4g}"
            print(f"{layout:60s} plan {float(t):.4g} s, --dry-run {float(line.group(1)):.4g} s  "
                  f"{'ok' if same else 'DIFFER'}")
            if not same:
                failed.append(layout)
        if failed:
            sys.exit("FAIL: the plan and --dry-run differ for " + "; ".join(failed))
    print("ok: the plan's rows are the step times --dry-run predicts for them")


if __name__ == "__main__":
    main()

"""Rank placement (docs/placement.md) on an emulated cluster (tests/placement.cmake):
8 CPU ranks as 2 nodes x 4 (--cluster), tp=4 dp=2, three runs of adgt-train:

  block:     emulate.rank_order=block, parallel.placement=topology (the reference)
  topology:  emulate.rank_order=round-robin, parallel.placement=topology
  launcher:  emulate.rank_order=round-robin, parallel.placement=launcher

Checks, from each run's rank table and metrics.jsonl:
  - block and topology: every tp group on one node (the rank table's node
    column); topology also names the rebuild in its placement line and shows
    the launcher column;
  - launcher: every tp group spans both nodes;
  - the emulation puts every rank on the node the placement names (the
    table's emulated column);
  - every step's loss of all three runs is the same, bit for bit (placement
    moves ranks, never numbers).
Prints each run's median step time (after the first step). --only RUN runs one
of them (the benchmark, scripts/plan/placement_bench.sh). Exits non-zero with
the problems listed.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

RUNS = {
    "block": ["emulate.rank_order=block", "parallel.placement=topology"],
    "topology": ["emulate.rank_order=round-robin", "parallel.placement=topology"],
    "launcher": ["emulate.rank_order=round-robin", "parallel.placement=launcher"],
}


def run(args, name, sets):
    out = os.path.join(args.work, name)
    shutil.rmtree(out, ignore_errors=True)
    cmd = [args.mpirun, "8", args.train, "--config", args.model]
    for s in [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
              f"log.dir={out}", f"checkpoint.dir={out}/ckpt", "train.device=cpu",
              f"emulate.cluster={args.cluster}", "parallel.tp=4", "parallel.dp=2",
              "model.n_kv_heads=4"] + args.sets + sets:
        cmd += ["--set", s]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"))
    wall = time.time() - t0
    if p.returncode != 0:
        print(" ".join(cmd))
        print(p.stdout[-4000:], p.stderr[-4000:])
        sys.exit(f"FAILED: run {name} exited {p.returncode}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        recs = [r for r in map(json.loads, filter(str.strip, f)) if "loss" in r]
    return p.stdout, recs, wall


def rank_table(stdout):
    """The rank table's placement line and rows as dicts (columns cut at the
    header's column starts: the table is left-aligned)."""
    lines = stdout.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("rank table:"))
    placement = ""
    i = start + 1
    while not lines[i].lstrip().startswith("rank "):
        if lines[i].strip().startswith("placement:"):
            placement = lines[i].strip()
        i += 1
    header = lines[i]
    cols = list(re.finditer(r"\S+", header))
    names = [m.group() for m in cols]
    starts = [m.start() for m in cols]
    rows = []
    for l in lines[i + 1:]:
        if not l.startswith("  ") or not l.strip()[:1].isdigit():
            break
        cells = [l[s:(starts[k + 1] if k + 1 < len(starts) else None)].strip()
                 for k, s in enumerate(starts)]
        rows.append(dict(zip(names, cells)))
    return placement, rows


def tp_group_nodes(rows):
    """{(dp, pp): set of nodes of that tp group}."""
    groups = {}
    for r in rows:
        groups.setdefault((r["dp"], r["pp"]), set()).add(r["node"])
    return groups


def median_step(recs, tokens):
    return statistics.median(tokens / r["tokens_per_s"] for r in recs[1:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--only", choices=sorted(RUNS), action="append",
                    help="run only these (no checks but the table's)")
    ap.add_argument("--tokens", type=int, default=8 * 32, help="tokens per step")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    args = ap.parse_args()
    names = args.only or list(RUNS)
    problems = []
    res = {}
    for name in names:
        stdout, recs, wall = run(args, name, RUNS[name])
        placement, rows = rank_table(stdout)
        groups = tp_group_nodes(rows)
        res[name] = recs
        t = median_step(recs, args.tokens) if len(recs) > 1 else float("nan")
        print(f"{name}: {placement}")
        print(f"{name}: tp groups (dp, pp) -> nodes {sorted((k, sorted(v)) for k, v in groups.items())}; "
              f"median step {t * 1e3:.1f} ms; run {wall:.1f} s")
        if len(rows) != 8 or len(groups) != 2:
            problems.append(f"{name}: rank table of {len(rows)} rows, {len(groups)} tp groups:\n{stdout}")
            continue
        # The emulation delays by the node of each layout rank: its column agrees.
        if any(r.get("emulated", "").split(",")[0] != "node " + r["node"] for r in rows):
            problems.append(f"{name}: emulated nodes {[r.get('emulated') for r in rows]} differ "
                            f"from the placement's {[r['node'] for r in rows]}")
        inside = all(len(v) == 1 for v in groups.values())
        if name == "launcher":
            if any(len(v) != 2 for v in groups.values()):
                problems.append(f"{name}: a tp group stays inside one node: {groups}")
            if "placement: launcher" not in placement or "cross nodes" not in placement:
                problems.append(f"{name}: placement line {placement!r}")
        else:
            if not inside:
                problems.append(f"{name}: a tp group crosses nodes: {groups}")
        if name == "topology":
            if "rebuilt node-contiguous so every tp group is inside one node" not in placement:
                problems.append(f"{name}: placement line {placement!r}")
            if "launcher" not in rows[0] or [r["launcher"] for r in rows] != \
                    ["0", "2", "4", "6", "1", "3", "5", "7"]:
                problems.append(f"{name}: launcher column {[r.get('launcher') for r in rows]}")
        if name == "block" and "already node-contiguous" not in placement:
            problems.append(f"{name}: placement line {placement!r}")
    ref_name = names[0]
    ref = [(r["step"], r["loss"]) for r in res[ref_name]]
    if not ref:
        problems.append(f"{ref_name}: no loss logged")
    for name in names[1:]:
        got = [(r["step"], r["loss"]) for r in res[name]]
        if got != ref:
            problems.append(f"{name}: losses {got} differ from {ref_name}'s {ref}")
    print(f"losses ({ref_name}): {[l for _, l in ref]}")
    if problems:
        print("FAILED:\n  " + "\n  ".join(problems))
        sys.exit(1)
    print(f"placement: ok ({', '.join(names)}; the same losses)")


if __name__ == "__main__":
    main()

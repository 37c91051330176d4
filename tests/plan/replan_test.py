#!/usr/bin/env python3
"""parallel.auto re-plans while training (docs/planner.md "Re-planning").

8 CPU ranks of the emulated 2-node cluster train the layout-test model with 8
layers in f64 under parallel.auto (the launch plans the layout):

  clean      no straggler: no layout switch;
  straggler  launcher rank 3 computes 16x slower from step 10 on
             (emulate.slow_ranks "3:16@10"): a re-plan names rank 3 as the
             slowest, at least 2x slower than its peers, predicts a faster
             layout for the measured cluster, and the run switches to it in
             memory at that step boundary.

  link       (--case link) an inter-node pipeline link of the launch's plan
             (1-5 on pp=2 x dp=4; on pp=4 x dp=2, 2-4) turns 16x slower from
             step 10 on (emulate.slow_links "A-B:16@10"): a re-plan within
             20 steps names that link as the slow one at 16x (and no other
             link or rank), predicts a faster layout and the run switches to
             it, once. A one-step launch first plans, to name the link; the
             run plans the same from its cached profile.

Every run is on the emulation's model clock (emulate.clock: model,
docs/emulation.md): the ranks' compute and the launch's op profile are
counted matmul FLOPs at a fixed rate, so the plan, the measured slowdowns and
the re-plan's step are the same on any machine under any load: the injected
16x reads 16x (within 2%), every other rank and link 1x (within 10%).

Every run must train every step with the losses of an uninterrupted
single-process run: within 1e-7 relative before a switch (f64: the order of
summation), 1e-5 after it (the switch carries the state in f32, as a
checkpoint does; see check_losses). The step times
before and after the switch are printed (measured, not asserted).

usage: replan_test.py --train BIN --mpirun WRAPPER --data DIR --work DIR [--case link]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
MODEL = os.path.join(ROOT, "tests", "layouts", "model.yaml")
CLUSTER = os.path.join(ROOT, "configs", "clusters", "emulated-2node.yaml")
STEPS = 40


def run(args, name, ranks, extra, steps=STEPS, profile=None):
    """Trains `steps` steps in args.work/name (emptied first); `profile`: a
    plan-profile.json to start its cache from."""
    work = os.path.join(args.work, name)
    shutil.rmtree(work, ignore_errors=True)
    if profile:
        os.makedirs(work)
        shutil.copy(profile, os.path.join(work, "plan-profile.json"))
    cmd = [args.train, "--config", MODEL]
    for s in [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin", f"log.dir={work}",
              f"checkpoint.dir={work}/ckpt", "checkpoint.interval=0", f"train.steps={steps}",
              "model.n_layers=8", "train.dtype=f64", "log.interval=1"] + extra:
        cmd += ["--set", s]
    if ranks > 1:
        cmd = [args.mpirun, str(ranks)] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    with open(os.path.join(args.work, name + ".log"), "w") as f:
        f.write(p.stdout + p.stderr)
    if p.returncode != 0:
        sys.exit(f"FAIL: {name} exited {p.returncode}:\n{(p.stdout + p.stderr)[-3000:]}")
    with open(os.path.join(work, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def losses(recs):
    return {r["step"]: r["loss"] for r in recs if "loss" in r and "event" not in r}


def check_losses(name, recs, ref, switch_step=None):
    """Relative loss differences to the single process: 1e-7 up to a switch
    (f64: the order of summation only, measured <= 2e-16), 1e-5 after it. The
    switch carries the state in f32, as a checkpoint does (an f64 run's state
    is rounded there): 3e-10 at the next steps, and 4.0e-7 measured at step
    19, whose gradient norm is 600 before clipping. A wrong data order or
    batch moves the loss by 3e-2 or more (docs/reliability.md)."""
    got = losses(recs)
    if sorted(got) != sorted(ref):
        sys.exit(f"FAIL: {name} logged steps {sorted(got)[:5]}..., want 1..{STEPS}")
    worst = 0.0
    for s in ref:
        err = abs(got[s] - ref[s]) / abs(ref[s])
        bound = 1e-7 if switch_step is None or s <= switch_step else 1e-5
        if err > bound:
            sys.exit(f"FAIL: {name}: step {s}'s loss differs from the single process's by {err:.2e} > {bound}")
        worst = max(worst, err)
    return worst


def step_times(recs):
    el = {r["step"]: r["elapsed_s"] for r in recs if "elapsed_s" in r and "event" not in r}
    return {s: el[s] - el[s - 1] for s in el if s - 1 in el}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--case", choices=["straggler", "link"], default="straggler")
    ap.add_argument("--clock", choices=["model", "virtual", "wall"], default="model",
                    help="emulate.clock of the emulated runs: model (the ctest's: the same "
                         "measurements under any load) or the host's (scripts/bench.sh)")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    ref = losses(run(args, "single", 1, []))
    auto = ["parallel.auto=true", f"emulate.cluster={CLUSTER}", f"emulate.clock={args.clock}"]
    if args.case == "link":
        return slow_link(args, ref, auto)

    clean = run(args, "clean", 8, auto)
    switches = [r for r in clean if r.get("event") == "switch"]
    if switches:
        sys.exit(f"FAIL: the run without a straggler switched its layout: {switches}")
    e_clean = check_losses("clean", clean, ref)
    replans = [r for r in clean if r.get("controller") == "replan"]

    slow = run(args, "straggler", 8, auto + ["emulate.slow_ranks=3:16@10"])
    recs = [r for r in slow if r.get("controller") == "replan"]
    sw = [r for r in slow if r.get("event") == "switch"]
    first = next((r for r in recs if r["decision"].get("layout_request")), None)
    if not first:
        sys.exit(f"FAIL: no re-plan asked for a switch; re-plans: {[r['decision'] for r in recs]}")
    d = first["decision"]
    m = {int(k): v for k, v in d["measured_slowdown"].items()}
    if args.clock == "model":
        if abs(m.get(3, 1) - 16) > 0.32 or any(v > 1.1 for r, v in m.items() if r != 3):
            sys.exit(f"FAIL: the re-plan measured {m}; want rank 3 at 16x (within 2%), the others 1x")
    elif m.get(3, 1) < 2 or max(m, key=lambda r: m[r]) != 3 or sum(v >= 2 for v in m.values()) > 2:
        # The host's clocks (the benchmark): ranks sharing 2 cores read noise.
        sys.exit(f"FAIL: the re-plan measured {m}; want rank 3 the slowest, >= 2x (and at most one "
                 f"other rank read as slow)")
    if first["step"] <= 10:
        sys.exit(f"FAIL: re-planned at step {first['step']}, before the straggler (step 10)")
    if not d["predicted_new_s"] < d["predicted_now_s"]:
        sys.exit(f"FAIL: switch without a predicted gain: {d}")
    done = [r for r in sw if r["step"] == first["step"] and "refused" not in r]
    if not done:
        sys.exit(f"FAIL: no switch at step {first['step']}: {sw}")
    e_slow = check_losses("straggler", slow, ref, switch_step=first["step"])
    t = step_times(slow)
    s0 = first["step"]
    before = [t[s] for s in t if 12 <= s <= s0]
    after = [t[s] for s in t if s >= s0 + 3]
    print(f"clean: no switch ({len(replans)} re-plans kept the layout); losses within {e_clean:.1e}")
    print(f"straggler: re-planned at step {s0}, measured {m[3]:.2f}x for rank 3; "
          f"{d['layout_now']} -> {d['layout_new']}: predicted {d['predicted_now_s']:.4g} -> "
          f"{d['predicted_new_s']:.4g} s; switched in {done[0].get('seconds', 0):.3f} s; "
          f"losses within {e_slow:.1e}")
    if before and after:
        print(f"  measured step time (median): {statistics.median(before):.4f} s after the onset, "
              f"{statistics.median(after):.4f} s after the switch")
    print("PASS")


def rank_table(log):
    """{launcher rank: (tp, dp, pp, node)} from a run's printed rank table."""
    lines = log.splitlines()
    at = next(i for i, l in enumerate(lines) if l.startswith("rank table:"))
    head = next(i for i in range(at + 1, len(lines)) if lines[i].split()[:1] == ["rank"])
    cols = lines[head].split()
    out = {}
    for l in lines[head + 1:]:
        f = l.split()
        if not f or not f[0].isdigit():
            break
        row = dict(zip(cols, f))
        r = int(row.get("launcher", row["rank"]))
        out[r] = (int(row["tp"]), int(row["dp"]), int(row["pp"]), int(row.get("node", 0)))
    return out


def pipeline_link(args, auto):
    """The slow link is chosen from the plan: a one-step launch plans (on
    the model clock's counted profile: pp=4 x dp=2 here), and the test's run
    plans from its cached profile (the same plan).
    The link: an inter-node pipeline link, 1-5 where the plan has it.
    Returns (a, b, profile path, layout)."""
    recs = run(args, "link-plan", 8, auto + ["train.warmup_steps=1"], steps=1)
    layout = next(r["plan"]["layout"] for r in recs if r.get("event") == "plan")
    with open(os.path.join(args.work, "link-plan.log")) as f:
        table = rank_table(f.read())
    links = sorted((a, b) for a, (ta, da, pa, na) in table.items()
                   for b, (tb, db, pb, nb) in table.items()
                   if (ta, da) == (tb, db) and pb == pa + 1 and na != nb)
    if not links:
        sys.exit(f"FAIL: the launch planned {layout}, without a pipeline link between nodes: {table}")
    a, b = (1, 5) if (1, 5) in links else links[0]
    return a, b, os.path.join(args.work, "link-plan", "plan-profile.json"), layout


def slow_link(args, ref, auto):
    a, b, profile, layout = pipeline_link(args, auto)
    key = f"{a}-{b}"
    recs = run(args, "link", 8, auto + [f"emulate.slow_links={key}:16@10"], profile=profile)
    planned = next(r["plan"]["layout"] for r in recs if r.get("event") == "plan")
    if planned != layout:
        sys.exit(f"FAIL: the run planned {planned}, the one-step launch with the same profile {layout}")
    replans = [r for r in recs if r.get("controller") == "replan" and "measured_slowdown" in r["decision"]]
    sw = [r for r in recs if r.get("event") == "switch" and "refused" not in r]
    first = next((r for r in replans if r["decision"].get("layout_request")), None)
    if not first:
        sys.exit(f"FAIL: no re-plan asked for a switch; re-plans: {[r['decision'] for r in replans]}")
    d = first["decision"]
    if not 10 < first["step"] <= 30:
        sys.exit(f"FAIL: re-planned at step {first['step']}; the link slowed at step 10 (want 11..30)")
    links = d.get("measured_link_slowdown", {})
    exact = args.clock == "model"  # else the host's clocks (the benchmark): looser
    if (abs(links.get(key, 1) - 16) > 0.32 if exact else links.get(key, 1) < 8) or \
            any(v > (1.1 if exact else 2) for k, v in links.items() if k != key):
        sys.exit(f"FAIL: the re-plan measured links {links}; want {key} at 16x, the others 1x")
    ranks = {int(k): v for k, v in d["measured_slowdown"].items()}
    # The link's time must not be read as any rank's compute (its end ranks'
    # above all: the misattribution this checks).
    if any(v > 1.1 for v in ranks.values()) if exact else any(ranks.get(r, 1) >= 2 for r in (a, b)):
        sys.exit(f"FAIL: a rank read as slow beside the slow link: {ranks}")
    if not d["predicted_new_s"] < d["predicted_now_s"]:
        sys.exit(f"FAIL: switch without a predicted gain: {d}")
    if [r["step"] for r in sw] != [first["step"]]:
        sys.exit(f"FAIL: want one switch, at step {first['step']}; got {[(r['step'], r['to']) for r in sw]}")
    e = check_losses("link", recs, ref, switch_step=first["step"])
    t = step_times(recs)
    s0 = first["step"]
    clean = [t[s] for s in t if 3 <= s < 10]
    slow = [t[s] for s in t if 12 <= s <= s0]
    after = [t[s] for s in t if s >= s0 + 3]
    print(f"link: {key} slowed (the launch planned {layout}); re-planned at step {s0} (onset 10), links measured {links}; {d['layout_now']} -> "
          f"{d['layout_new']}: predicted {d['predicted_now_s']:.4g} -> {d['predicted_new_s']:.4g} s; "
          f"switched in {sw[0].get('seconds', 0):.3f} s; losses within {e:.1e}")
    if clean and slow and after:
        c, sl, a = (statistics.median(x) for x in (clean, slow, after))
        print(f"  measured step time (median): {c:.4f} s before the onset, {sl:.4f} s with the slow "
              f"link, {a:.4f} s after the switch (mitigation {(sl - a) / max(sl - c, 1e-9):.0%})")
    print("PASS")


if __name__ == "__main__":
    main()

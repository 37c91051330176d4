#!/usr/bin/env python3
"""The simulator against measured runs (docs/simulator.md):
8 CPU ranks on this host emulate a 2-node cluster (emulate.cluster), and for
each layout the measured step time (median of the steps after the warm-up) is
compared with adgt-sim's prediction for the same run file and cluster, costed
from a profile measured on this machine (--costs profile, --host-cores: the
ranks share this host's cores). Prints the table, mean |error|, Spearman rank
correlation and the memory check (the --dry-run estimate against the emulated
backend's measured allocation peak).

  scripts/sim/validate_cpu.py --train build/apps/adgt-train --sim build/apps/adgt-sim \
      --mpirun tests/parallel/mpirun.sh --data build/data/kjv-byte [--quick]

Exit status 1 when a bound is missed: mean |error| <= 10%, Spearman >= 0.9,
memory within 5% (--quick: the ctest's smaller set and bounds, see below).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODEL = os.environ.get("ADGT_VALIDATE_MODEL", os.path.join(HERE, "validate_model.yaml"))
CLUSTER = os.path.join(ROOT, "configs", "clusters", "emulated-2node.yaml")

# (name, --set overrides): tp, pp, dp, cp, ZeRO, schedules and micro-batch counts.
LAYOUTS = [
    ("dp8", ["parallel.dp=8"]),
    ("dp8 zero1", ["parallel.dp=8", "parallel.zero=1"]),
    ("dp8 mb1", ["parallel.dp=8", "train.micro_batch=1"]),
    ("tp2 dp4", ["parallel.tp=2", "parallel.dp=4"]),
    ("tp2 dp4 sp zero1", ["parallel.tp=2", "parallel.dp=4", "parallel.sequence_parallel=true",
                          "parallel.zero=1"]),
    ("tp4 dp2", ["parallel.tp=4", "parallel.dp=2"]),
    ("pp2 dp4 1f1b", ["parallel.pp=2", "parallel.dp=4"]),
    ("pp4 dp2 1f1b", ["parallel.pp=4", "parallel.dp=2"]),
    ("pp8 1f1b", ["parallel.pp=8"]),
    ("pp4 dp2 zb-h1", ["parallel.pp=4", "parallel.dp=2", "parallel.schedule=zb-h1"]),
    ("pp2 tp2 dp2 gpipe", ["parallel.pp=2", "parallel.tp=2", "parallel.dp=2",
                           "parallel.schedule=gpipe"]),
    ("pp4 tp2 interleaved", ["parallel.pp=4", "parallel.tp=2", "parallel.schedule=interleaved",
                             "parallel.virtual_stages=2"]),
    ("pp2 dp4 mb1 zb-h1", ["parallel.pp=2", "parallel.dp=4", "train.micro_batch=1",
                           "parallel.schedule=zb-h1"]),
    ("tp2 pp2 dp2 zero1 mb4", ["parallel.tp=2", "parallel.pp=2", "parallel.dp=2",
                               "parallel.zero=1", "train.micro_batch=4"]),
    # Context parallelism (docs/context-parallel.md): the ring's hops
    # between its blocks, the all-to-alls around the attention.
    ("cp2 dp4", ["parallel.cp=2", "parallel.dp=4"]),
    ("cp4 dp2", ["parallel.cp=4", "parallel.dp=2"]),
    ("cp2 dp4 a2a", ["parallel.cp=2", "parallel.dp=4", "parallel.cp_mode=all-to-all"]),
    ("tp2 cp2 dp2", ["parallel.tp=2", "parallel.cp=2", "parallel.dp=2"]),
]
# The ctest's set: layouts whose ranks synchronise rarely (docs/simulator.md:
# on this 2-core host tightly coupled groups wait for the scheduler).
QUICK = ["dp8", "dp8 mb1", "pp4 dp2 1f1b", "pp4 tp2 interleaved"]


def tokens_per_step(model):
    """global_batch x seq_len of the run file."""
    text = open(model).read()
    return int(re.search(r"global_batch:\s*(\d+)", text).group(1)) * int(
        re.search(r"seq_len:\s*(\d+)", text).group(1))


def spearman(a, b):
    def ranks(x):
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2.0
            i = j + 1
        return r
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    num = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    den = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return num / den if den else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--sim", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", default="/tmp/adgt-sim-validate")
    ap.add_argument("--cores", type=int, default=0, help="host cores (default: os.cpu_count())")
    ap.add_argument("--steps", type=int, default=7, help="steps per run; the first 2 are warm-up")
    ap.add_argument("--quick", action="store_true",
                    help="the ctest's version: 4 layouts (dp, dp with one micro-batch, 1f1b and "
                         "interleaved pipelines), 6 steps; bounds the mean |error| after the host "
                         "factor (the layouts' median of measured / predicted) at 15%% (each 25%%) and the "
                         "factor at 0.8-1.6; the plain mean |error| is printed (5.6%%, 18.3%% and "
                         "26.5%% with one binary as the shared host's state moved); memory within "
                         "5%% (3 layouts), no rank correlation (4 points)")
    ap.add_argument("--rounds", type=int, default=0,
                    help="runs per layout, the fastest run's median step kept (default 1; --quick: 2)")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--no-emulate", action="store_true",
                    help="plain shared-memory MPI, simulated as the cpu-here preset")
    ap.add_argument("--only", help="comma-separated layout names")
    ap.add_argument("--host-sync", default="0", help="adgt-sim --host-sync (0 or auto)")
    ap.add_argument("--clock", choices=["virtual", "wall", "model"], default="virtual",
                    help="emulate.clock of the measured runs: virtual (default) = each rank times "
                         "its training thread's CPU time plus the emulated waits, so the 8 ranks "
                         "time their steps as 8 devices would although they share this host's "
                         "cores (simulated with a core per rank); wall = wall time on the shared "
                         "cores (simulated with --host-cores); model = the model clock: each rank's "
                         "compute is its counted matmul FLOPs at emulate.model_flops and the "
                         "simulator's profile counts the same (no host in either: the ctest's)")
    ap.add_argument("--profile-procs", type=int, default=8,
                    help="measure the op profile in this many adgt-sim processes at once on this "
                         "host (each its own cache; the median of each op is kept): the ops then "
                         "pay what sharing the host's cores and caches with the other ranks costs "
                         "them, as they do in the measured runs (default 8, the runs' ranks; 1: "
                         "alone)")
    ap.add_argument("--reuse-profile", action="store_true",
                    help="keep WORK/profile.json from an earlier run (default: measure it again)")
    ap.add_argument("--slowdown", type=float, default=1,
                    help="every rank computes this many times slower (emulate.slow_ranks), so that "
                         "the 8 ranks' compute uses about 8/slowdown of a core: the emulated devices "
                         "do not take turns on this host's cores (1: real contention)")
    args = ap.parse_args()
    model_clock = args.clock == "model"
    if model_clock:  # nothing measured on the host: one round, no loaded profile
        args.rounds, args.profile_procs = 1, 1
    args.rounds = args.rounds or (2 if args.quick else 1)
    # On the virtual and model clocks every rank has a core of its own.
    cores = 8 if args.clock != "wall" and not args.no_emulate else (args.cores or os.cpu_count())
    layouts = [l for l in LAYOUTS if not args.quick or l[0] in QUICK]
    if args.only:
        layouts = [l for l in layouts if l[0] in args.only.split(",")]
    cluster = "cpu-here" if args.no_emulate else CLUSTER
    slow = ",".join(f"{r}:{args.slowdown:g}" for r in range(8)) if args.slowdown > 1 else ""
    slow_set = [f"emulate.slow_ranks={slow}"] if slow and not args.no_emulate else []
    clock_set = [] if args.no_emulate else [f"emulate.clock={args.clock}"]
    steps = 6 if args.quick else args.steps
    os.makedirs(args.work, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    common = [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
              f"train.steps={steps}", "log.interval=1", "checkpoint.interval=0",
              "parallel.adapt=off",  # the simulator predicts the configured schedule
              "checkpoint.at_end=false"]
    profile = os.path.join(args.work, "profile.json")
    if os.path.exists(profile) and not args.reuse_profile:
        os.remove(profile)  # measured again: this run's machine and load
    if args.profile_procs > 1 and not os.path.exists(profile):
        loaded_profile(args, env, cluster, cores, slow, slow_set, layouts, profile)
    rows, failed = [], []
    # Each layout's step: the median of the steps after the warm-up, in each
    # of --rounds runs (the layouts in turn, round after round), and the
    # fastest round's: this shared host slows a whole run now and then (the
    # same layout measured 0.30 and 0.39 s in two runs a minute apart).
    runs = {name: [] for name, _ in layouts}
    walls = {name: 0.0 for name, _ in layouts}
    for rnd in range(args.rounds):
        for name, sets in layouts:
            if name in [f.split(":")[0] for f in failed]:
                continue
            tag = name.replace(" ", "_")
            log = os.path.join(args.work, tag)
            all_sets = common + sets + [f"log.dir={log}", f"checkpoint.dir={log}/ckpt",
                                        ] + ([] if args.no_emulate else [f"emulate.cluster={CLUSTER}"]) + slow_set + clock_set
            flags = sum([["--set", s] for s in all_sets], [])
            if os.path.exists(os.path.join(log, "metrics.jsonl")):
                os.remove(os.path.join(log, "metrics.jsonl"))
            t0 = time.time()
            out = subprocess.run([args.mpirun, "8", args.train, "--config", MODEL] + flags,
                                 capture_output=True, text=True, env=env)
            if out.returncode != 0:
                failed.append(f"{name}: adgt-train failed: {out.stderr[-800:]}")
                continue
            times = []
            with open(os.path.join(log, "metrics.jsonl")) as f:
                for line in f:
                    j = json.loads(line)
                    if "tokens_per_s" in j and j.get("step", 0) > 2:
                        times.append(j["tokens_per_s"])
            runs[name].append(statistics.median(tokens_per_step(MODEL) / t for t in times))
            walls[name] += time.time() - t0
    for name, sets in layouts:
        if not runs[name]:
            continue
        measured = min(runs[name])
        sflags = sum([["--set", s] for s in sets], [])
        # On the model clock the simulator's profile counts FLOPs at the
        # run file's emulate.model_flops (adgt-sim reads emulate.clock).
        model_sets = ["--set", f"emulate.cluster={CLUSTER}", "--set", "emulate.clock=model"] if model_clock else []
        sim = subprocess.run([args.sim, "--config", MODEL, "--cluster", cluster, "--costs", "profile",
                              "--profile-cache", profile, "--host-cores", str(cores), "--json",
                              "--host-sync", args.host_sync]
                             + (["--slow-ranks", slow] if slow_set else []) + sflags + model_sets,
                             capture_output=True, text=True, env=env)
        if sim.returncode != 0:
            failed.append(f"{name}: adgt-sim failed: {sim.stderr[-800:]}")
            continue
        pred = json.loads(sim.stdout)
        row = {"layout": name, "measured_s": measured, "rounds_s": runs[name],
               "predicted_s": pred["step_time_s"],
               "error": pred["step_time_s"] / measured - 1, "bubble": pred["bubble"],
               "exposed_comm_s": pred["exposed_comm_s"], "memory_gib": pred["memory_gib_max"],
               "wall_s": walls[name]}
        rows.append(row)
        each = "" if len(runs[name]) < 2 else " (rounds " + ", ".join(f"{x:.4f}" for x in runs[name]) + ")"
        print(f"{name:24s} measured {measured:8.4f} s  predicted {row['predicted_s']:8.4f} s  "
              f"error {100 * row['error']:+6.1f}%  (exposed comm {row['exposed_comm_s']:.3f} s, "
              f"runs {row['wall_s']:.0f} s){each}", flush=True)
    if failed:
        print("\n".join(failed))
        sys.exit(1)
    errs = [abs(r["error"]) for r in rows]
    mean_err = statistics.mean(errs)
    rho = spearman([r["measured_s"] for r in rows], [r["predicted_s"] for r in rows])
    # The host's factor: the layouts' median of measured over predicted. The
    # absolute error moves with this shared host's state (the quick set with
    # one binary: 5.6% on 2026-12-02, 18.3% on an idle host and 26.5% in CI
    # on 2026-12-04, every prediction below the measurement); what the
    # simulator decides, the layouts' times against each other, is the
    # error after that one common factor.
    factor = statistics.median(r["measured_s"] / r["predicted_s"] for r in rows)
    rel = [abs(r["predicted_s"] * factor / r["measured_s"] - 1) for r in rows]
    mean_rel = statistics.mean(rel)
    bound = (0.15 if args.clock == "virtual" else 0.35) if args.quick else 0.10
    rho_bound = -1.0 if args.quick else 0.9
    rel_bound, rel_max_bound, factor_bounds = 0.15, 0.25, (0.8, 1.6)
    print(f"\n{len(rows)} layouts: mean |error| {100 * mean_err:.1f}% "
          f"({'printed; ' if args.quick else ''}bound {100 * bound:.0f}%), "
          f"max {100 * max(errs):.1f}%, Spearman {rho:.3f} (bound {rho_bound})")
    print(f"host factor (median measured / predicted) {factor:.3f}"
          f"{f' (bound {factor_bounds[0]}-{factor_bounds[1]})' if args.quick else ''}; after it: "
          f"mean |error| {100 * mean_rel:.1f}%{f' (bound {100 * rel_bound:.0f}%)' if args.quick else ''}, "
          f"max {100 * max(rel):.1f}%{f' (bound {100 * rel_max_bound:.0f}%)' if args.quick else ''}")
    if model_clock:
        # The ctest: no host in the measured runs or the profile, so the
        # times are the same on any machine under any load and the error is
        # the simulator's against the emulation alone: measured 2026-12-05
        # (quick set) -10.2%, -10.1% on the dp layouts (the dp reduce's
        # exposure), +0.3%, +0.3% on the pipelines; bound each |error| by 15%
        # and the mean by 10%.
        ok = mean_err <= 0.10 and max(errs) <= 0.15
        print(f"model clock: mean |error| {100 * mean_err:.1f}% (bound 10%), max "
              f"{100 * max(errs):.1f}% (bound 15%)")
    elif args.quick:
        # The ctest: the relative times within a mean of 15% and each within
        # 25% (measured 4.4% and 8.0%, max 7.1% and 12.1%: one layout
        # mispredicted by a third fails), and the factor within 0.8-1.6 (a
        # profile or clock off by more than this host's load moves it fails;
        # measured 1.06, 1.23, 1.35 and about 1.33 in CI).
        ok = (mean_rel <= rel_bound and max(rel) <= rel_max_bound
              and factor_bounds[0] <= factor <= factor_bounds[1])
    else:
        ok = mean_err <= bound and rho >= rho_bound
    if not args.no_memory:
        ok = check_memory(args, env, common, layouts) and ok
    with open(os.path.join(args.work, "table.json"), "w") as f:
        json.dump({"rows": rows, "mean_abs_error": mean_err, "spearman": rho, "clock": args.clock,
                   "host_factor": factor, "mean_abs_error_after_factor": mean_rel},
                  f, indent=1)
    sys.exit(0 if ok else 1)


def loaded_profile(args, env, cluster, cores, slow, slow_set, layouts, profile):
    """Measures the op profile (and its in-situ factor) for every layout in
    --profile-procs adgt-sim processes at once, each with its own cache, and
    keeps each entry's median in `profile`."""
    t0 = time.time()
    procs = []
    for i in range(args.profile_procs):
        cache = f"{profile}.{i}"
        if os.path.exists(cache):
            os.remove(cache)
        script = []
        for name, sets in layouts:
            cmd = [args.sim, "--config", MODEL, "--cluster", cluster, "--costs", "profile",
                   "--profile-cache", cache, "--host-cores", str(cores), "--json"]
            cmd += (["--slow-ranks", slow] if slow_set else []) + sum([["--set", x] for x in sets], [])
            script.append(" ".join(f"'{c}'" for c in cmd) + " > /dev/null")
        procs.append(subprocess.Popen(["bash", "-c", " && ".join(script)], env=env))
    if any(p.wait() != 0 for p in procs):
        sys.exit("the loaded profile failed (adgt-sim)")
    tables = [json.load(open(f"{profile}.{i}")) for i in range(args.profile_procs)]
    merged = dict(tables[0])
    merged["ops"] = {k: statistics.median(t["ops"][k] for t in tables if k in t["ops"])
                     for k in tables[0]["ops"]}
    with open(profile, "w") as f:
        json.dump(merged, f, indent=1)
    factor = [v for k, v in merged["ops"].items() if "in_situ" in k]
    print(f"profile: {len(merged['ops'])} entries measured in {args.profile_procs} processes at once "
          f"({time.time() - t0:.0f} s); in-situ factor {factor[0] if factor else 1:.3f}", flush=True)


def check_memory(args, env, common, layouts):
    """The --dry-run estimate the simulator reports against the emulated
    backend's allocation peak (train.device=emulated tracks every buffer)."""
    ok = True
    for name, sets in layouts[: 3 if args.quick else len(layouts)]:
        log = os.path.join(args.work, "mem_" + name.replace(" ", "_"))
        all_sets = common + sets + ["train.steps=2", "train.device=emulated", f"log.dir={log}",
                                    f"checkpoint.dir={log}/ckpt"]
        flags = sum([["--set", s] for s in all_sets], [])
        out = subprocess.run([args.mpirun, "8", args.train, "--config", MODEL] + flags,
                             capture_output=True, text=True, env=env)
        m = re.search(r"device memory:\s+([\d.]+) GiB", out.stdout)
        sim = subprocess.run([args.sim, "--config", MODEL, "--cluster", CLUSTER, "--costs", "model",
                              "--json"] + sum([["--set", s] for s in sets], []),
                             capture_output=True, text=True, env=env)
        if out.returncode != 0 or not m or sim.returncode != 0:
            print(f"memory {name}: run failed: {out.stderr[-400:]} {sim.stderr[-400:]}")
            ok = False
            continue
        measured = float(m.group(1))
        pred = json.loads(sim.stdout)["memory_gib_max"]
        err = pred / measured - 1
        print(f"memory {name:24s} measured {measured * 1024:8.2f} MiB  predicted {pred * 1024:8.2f} MiB  "
              f"error {100 * err:+6.1f}%")
        if abs(err) > 0.05:
            ok = False
    return ok


if __name__ == "__main__":
    main()

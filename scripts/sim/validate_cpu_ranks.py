#!/usr/bin/env python3
"""`adgt-train --dry-run` against real CPU ranks on this machine
(docs/simulator.md, "On real CPU ranks").

Each layout trains the tiny model (configs/tiny.yaml, global batch 16) on
real ranks of this host under mpirun, no emulation, each rank with the threads
adgt-train gives it (OMP_NUM_THREADS unset: the host's cores over its ranks;
--threads N to force one count), and its measured step (the median of the
steps after --warmup) is compared with the dry run's prediction for the same
run file and the same environment (the cpu-here cluster: the ranks share the
host's cores and memory bandwidth, their ops profiled at their thread count).

  scripts/sim/validate_cpu_ranks.py --train build/apps/adgt-train \\
      --data build/data/kjv [--rounds 2] [--only dp2,tp2]

The layouts run in turn --rounds times (default 3) and each keeps its
fastest run (another tenant of a shared host only ever lengthens a run).
Prints the table, mean and max |error| and the Spearman rank correlation of
predicted and measured; exit 1 when a bound is missed (mean |error| <= 10%,
max <= 20%, Spearman >= 0.9). A benchmark, not a test: it times this host's
wall clock.

The measurement's own order is printed beside it: the Spearman correlation
between each two rounds (how far the measured order reproduces: no
prediction can agree with the measurement better than the measurement
agrees with itself), and the pairs of layouts every round orders the same
way ("resolved": their difference is larger than the host's noise), with
how many of them the prediction orders alike.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TINY = os.path.join(ROOT, "configs", "tiny.yaml")
TINY_MOE = os.path.join(ROOT, "configs", "tiny-moe.yaml")
sys.path.insert(0, HERE)
from validate_cpu import spearman  # noqa: E402

# (name, ranks, run file, --set overrides)
LAYOUTS = [
    ("1 process", 1, TINY, []),
    ("dp2", 2, TINY, ["parallel.dp=2"]),
    ("tp2", 2, TINY, ["parallel.tp=2"]),
    ("pp2", 2, TINY, ["parallel.pp=2"]),
    ("dp4", 4, TINY, ["parallel.dp=4"]),
    ("tp2 dp2", 4, TINY, ["parallel.tp=2", "parallel.dp=2"]),
    ("pp2 dp2", 4, TINY, ["parallel.pp=2", "parallel.dp=2"]),
    # Capacity 1 (tokens over an expert's share dropped): a rank's expert work
    # is at most its balanced share, which the simulator costs; dropless, the
    # young router sends most tokens to one or two experts (load [4096, 4096,
    # 0, 0] at step 10) and the rank that holds them sets the step, which no
    # estimate made before training can know.
    # Beyond the eight, layouts far apart in time, so that the rank
    # correlation tests an order rather than the noise between near-equal
    # steps: a pipeline of 2 micro-batches (a third of it bubble), one
    # sequence per micro-batch (small GEMMs, 16 passes a step; with tp2, 16
    # times a layer's all-reduces) and 4 stages on 4 ranks.
    ("pp2 m2", 2, TINY, ["parallel.pp=2", "train.micro_batch=8"]),
    ("dp2 mb1", 2, TINY, ["parallel.dp=2", "train.micro_batch=1"]),
    ("tp2 mb1", 2, TINY, ["parallel.tp=2", "train.micro_batch=1"]),
    ("pp4 m4", 4, TINY, ["parallel.pp=4"]),
    ("moe dp2 ep2", 2, TINY_MOE, ["parallel.dp=2", "parallel.ep=2", "model.moe_capacity_factor=1.0"]),
]


def mpirun(n):
    """Open MPI on this host, as tests/parallel/mpirun.sh but leaving
    OMP_NUM_THREADS to the caller: more ranks than cores, no binding (the
    ranks share the cores as the model assumes), shared memory."""
    cmd = ["mpirun", "-np", str(n), "--oversubscribe", "--bind-to", "none",
           "--mca", "btl", "self,vader", "--mca", "btl_vader_single_copy_mechanism", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--data", required=True, help="a prepared corpus with the tiny model's "
                    "tokenizer (build/data/kjv: scripts/prepare_data.sh)")
    ap.add_argument("--work", default="/tmp/adgt-validate-cpu-ranks")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4, help="steps left out of the median")
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3,
                    help="runs per layout (the layouts in turn); the fastest run's median kept")
    ap.add_argument("--threads", type=int, default=0,
                    help="OMP_NUM_THREADS of every rank and of the dry run (0: unset, adgt-train's "
                         "default of the host's cores over its ranks)")
    ap.add_argument("--only", help="comma-separated layout names")
    ap.add_argument("--reuse-profile", action="store_true",
                    help="keep WORK/profile.json from an earlier run (default: measured again)")
    ap.add_argument("--mean-bound", type=float, default=0.10)
    ap.add_argument("--max-bound", type=float, default=0.20)
    ap.add_argument("--rank-bound", type=float, default=0.9)
    args = ap.parse_args()
    layouts = [l for l in LAYOUTS if not args.only or l[0] in args.only.split(",")]
    env = dict(os.environ)
    env.setdefault("OMPI_MCA_pml", "ob1")
    env.pop("OPENBLAS_NUM_THREADS", None)
    if args.threads > 0:
        env["OMP_NUM_THREADS"] = str(args.threads)
    else:
        env.pop("OMP_NUM_THREADS", None)
    os.makedirs(args.work, exist_ok=True)
    # The dry runs' profile: measured now, in the minutes of the runs it is
    # compared with (a profile cached in ~/.cache/adgt keeps what a busier
    # moment measured: an in-situ factor of 1.45 against 0.85-0.89 measured
    # again on a quiet one), unless --reuse-profile.
    profile = os.path.join(args.work, "profile.json")
    if os.path.exists(profile) and not args.reuse_profile:
        os.remove(profile)
    env["ADGT_PROFILE_CACHE"] = profile
    common = [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
              f"data.tokenizer={args.data}/tokenizer.model",
              f"train.steps={args.steps}", f"train.global_batch={args.global_batch}",
              "train.micro_batch=4", "train.warmup_steps=2", "log.interval=1",
              "train.eval_interval=0", "checkpoint.interval=0", "checkpoint.at_end=false",
              "parallel.adapt=off", "log.telemetry_interval_s=0"]
    predicted, dry_lines = {}, {}
    for name, n, config, sets in layouts:
        flags = sum([["--set", s] for s in common + sets], [])
        p = subprocess.run([args.train, "--config", config, "--dry-run"] + flags,
                           capture_output=True, text=True, env=env, timeout=600)
        m = re.search(r"predicted step:\s+([0-9.eE+-]+) s", p.stdout)
        if p.returncode != 0 or not m:
            sys.exit(f"FAIL: {name}: no prediction from --dry-run (exit {p.returncode}):\n"
                     f"{p.stdout[-1500:]}{p.stderr[-1500:]}")
        predicted[name] = float(m.group(1))
        dry_lines[name] = [l for l in p.stdout.splitlines() if l.startswith(("  cores:", "profil"))]
    def run(name, n, config, sets):
        """The run's median step after the warm-up, seconds."""
        log = os.path.join(args.work, name.replace(" ", "_"))
        shutil.rmtree(log, ignore_errors=True)
        flags = sum([["--set", s] for s in common + sets + [f"log.dir={log}",
                                                           f"checkpoint.dir={log}/ckpt"]], [])
        cmd = ([args.train] if n == 1 else mpirun(n) + [args.train]) + ["--config", config] + flags
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
        if p.returncode != 0:
            sys.exit(f"FAIL: {name}: adgt-train exited {p.returncode}:\n{p.stderr[-2000:]}")
        seq = int(re.search(r"seq_len:\s*(\d+)", open(config).read()).group(1))
        with open(os.path.join(log, "metrics.jsonl")) as f:
            times = [args.global_batch * seq / j["tokens_per_s"] for j in map(json.loads, f)
                     if "tokens_per_s" in j and j.get("step", 0) > args.warmup]
        return statistics.median(times)

    # The layouts in turn, --rounds times, and each layout's fastest run: this
    # shared VM's speed moves by 20% and more within minutes (the one-process
    # run measured 0.86 to 1.45 s in one session), and another tenant only
    # ever lengthens a run, as it lengthens a profiled op, whose fastest
    # round the profile keeps. (Ratios to a one-process run just before each
    # were tried: that run, on 2 threads that spin at their barriers, is the
    # noisiest of all, and the ratios' errors were twice the plain ones.)
    runs = {name: [] for name, *_ in layouts}
    for rnd in range(args.rounds):
        for name, n, config, sets in layouts:
            runs[name].append(run(name, n, config, sets))
            print(f"  round {rnd + 1}: {name}: {runs[name][-1]:.4f} s", flush=True)
    print(f"\n{'layout':<14} {'ranks':>5} {'predicted':>10} {'measured':>10} {'error':>8}  runs")
    errs, pred, meas = [], [], []
    for name, n, _, _ in layouts:
        m = min(runs[name])
        e = predicted[name] / m - 1
        errs.append(abs(e))
        pred.append(predicted[name])
        meas.append(m)
        print(f"{name:<14} {n:>5} {predicted[name]:>9.4f}s {m:>9.4f}s {100 * e:>+7.1f}%  "
              + " ".join(f"{t:.3f}" for t in runs[name]))
    for name in dry_lines:
        for l in dry_lines[name]:
            if l.startswith("  cores:"):
                print(f"  {name}: {l.strip()}")
    mean, worst = statistics.mean(errs), max(errs)
    rho = spearman(pred, meas) if len(pred) > 2 else float("nan")
    names = [name for name, *_ in layouts]
    if args.rounds > 1 and len(names) > 2:
        # The measurement against itself: round i's steps against round j's.
        between = [spearman([runs[n][i] for n in names], [runs[n][j] for n in names])
                   for i in range(args.rounds) for j in range(i + 1, args.rounds)]
        print("measured against itself, round by round: Spearman " +
              ", ".join(f"{x:.3f}" for x in between) + f" (mean {statistics.mean(between):.3f})")
        # Pairs every round orders alike, and the prediction's order of them.
        resolved = agree = 0
        for i in range(len(names)):
            for j in range(i + 1, len(names)):
                a, b = runs[names[i]], runs[names[j]]
                if all(x < y for x, y in zip(a, b)) or all(x > y for x, y in zip(a, b)):
                    resolved += 1
                    agree += (a[0] < b[0]) == (predicted[names[i]] < predicted[names[j]])
        pairs = len(names) * (len(names) - 1) // 2
        print(f"pairs every round orders alike: {resolved} of {pairs}; the prediction orders "
              f"{agree} of them alike" + (f" ({100 * agree / resolved:.0f}%)" if resolved else ""))
    print(f"mean |error| {100 * mean:.1f}% (bound {100 * args.mean_bound:.0f}%), max "
          f"{100 * worst:.1f}% (bound {100 * args.max_bound:.0f}%), Spearman {rho:.3f} "
          f"(bound {args.rank_bound})")
    ok = mean <= args.mean_bound and worst <= args.max_bound and (len(pred) <= 2 or rho >= args.rank_bound)
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

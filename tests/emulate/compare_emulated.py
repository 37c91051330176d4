"""Training under link and compute emulation (docs/emulation.md) against the
same run without it, on --ranks CPU ranks (tests/emulate.cmake):

  --case same: emulate.cluster (and --slow-ranks) set: every step's loss and
      every group's byte count are those of the plain run, exactly; the
      emulated median step takes at least 8 ms (the cluster's latencies are
      milliseconds; no load makes a sleep shorter).
  --case slow: both runs emulated on --cluster on the model clock
      (emulate.clock: model: counted compute, the same times under any
      load); with --slow-ranks f times slower the median step is 2/3 f to f
      times the one without, and the losses are the same.

Exits non-zero with the differing steps (or times) printed.
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "layouts"))
from train_run import train_run  # noqa: E402


def step_seconds(recs, tokens_per_step):
    # Every step but the first (start-up), from tokens_per_s of its log line.
    return [tokens_per_step / r["tokens_per_s"] for r in recs[1:]]


def run(args, name, sets):
    out = train_run(args, args.model, name, args.layout_sets + sets, args.ranks, weights=False)
    if out is None:
        sys.exit(f"FAILED: run {name} did not finish")
    recs, _, wall = out
    return recs, wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--case", choices=["same", "slow"], required=True)
    ap.add_argument("--layout", required=True, help="tp=2,pp=2")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--slow-ranks", default="")
    ap.add_argument("--set", action="append", default=[], dest="sets",
                    help="more overrides for every run (section.key=value)")
    args = ap.parse_args()
    args.device = "cpu"
    args.layout_sets = [f"parallel.{kv}" for kv in args.layout.split(",")] + args.sets
    given = dict(s.split("=", 1) for s in args.sets)
    # global_batch x seq_len (model.yaml's unless overridden)
    tokens = int(given.get("train.global_batch", 8)) * int(given.get("model.seq_len", 32))
    emulated = [f"emulate.cluster={args.cluster}"]
    if args.case == "same":
        ref, ref_wall = run(args, "plain", [])
        emu, emu_wall = run(args, "emulated", emulated + [f"emulate.slow_ranks={args.slow_ranks}"])
    else:
        emulated.append("emulate.clock=model")
        ref, ref_wall = run(args, "emulated", emulated)
        emu, emu_wall = run(args, "slow", emulated + [f"emulate.slow_ranks={args.slow_ranks}"])
    problems = []
    if [r["step"] for r in ref] != [r["step"] for r in emu] or not ref:
        problems.append(f"steps differ: {[r['step'] for r in ref]} vs {[r['step'] for r in emu]}")
    for a, b in zip(ref, emu):
        if a["loss"] != b["loss"]:
            problems.append(f"step {a['step']}: loss {a['loss']!r} vs {b['loss']!r}")
        if a.get("comm_bytes") != b.get("comm_bytes"):
            problems.append(f"step {a['step']}: comm_bytes {a.get('comm_bytes')} vs {b.get('comm_bytes')}")
    t_ref = statistics.median(step_seconds(ref, tokens))
    t_emu = statistics.median(step_seconds(emu, tokens))
    print(f"median step: {t_ref * 1e3:.1f} ms -> {t_emu * 1e3:.1f} ms ({t_emu / t_ref:.2f}x); "
          f"runs {ref_wall:.1f} s, {emu_wall:.1f} s; losses {[r['loss'] for r in emu]}")
    if args.case == "same" and t_emu < 8e-3:
        problems.append(f"the emulated step ({t_emu * 1e3:.1f} ms) is under 8 ms: the emulation "
                        f"did not delay")
    # A rank f times slower: the step at most f times longer, and (the slow
    # rank's stage holding half the pipeline's work) at least 2/3 of that.
    f = max([float(x.split(":")[1].split("@")[0]) for x in args.slow_ranks.split(",") if x] + [1.0])
    if args.case == "slow" and not (2 / 3 * f * t_ref <= t_emu <= f * t_ref * (1 + 1e-6)):
        problems.append(f"with emulate.slow_ranks={args.slow_ranks} the step ({t_emu * 1e3:.1f} ms) "
                        f"is not {2 / 3 * f:.2f}-{f:g}x the one without ({t_ref * 1e3:.1f} ms)")
    if problems:
        print("FAILED:\n  " + "\n  ".join(problems))
        sys.exit(1)
    print(f"ok: {args.case}, {args.layout}, cluster {args.cluster}, slow ranks '{args.slow_ranks}'")


if __name__ == "__main__":
    main()

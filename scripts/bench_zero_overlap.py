#!/usr/bin/env python3
"""ZeRO-3's weight gathers overlapped with compute by prefetching, measured.

Runs adgt-train under mpirun with parallel.zero=3 over dp ranks with the link
emulation (emulate.cluster cpu-here, its links slowed by --link-factor so that
a layer's gather takes about as long as its compute) on the emulation's model
clock (emulate.clock: model: compute is counted matmul FLOPs at
emulate.model_flops, each collective takes the cluster model's time on the
emulated link, so every figure is the same on any machine under any load).
For parallel.zero3_prefetch 0, 1 and 2 it reads, over steps 3.., the
trainer's per-step `zero` record of rank 0:

  exposed   gather_wait_s: the time the step waited for a unit's weights
  gathers   the unit gathers of the step

The gathers' total time is their bytes over the emulated link (the cluster
model's ring: each rank sends dp - 1 slots); with prefetch 0 each gather
starts when its unit is needed and is waited for in full, with prefetch the
gathers travel while the previous unit computes. The claim
(issue 46): with prefetch on, the exposed gather time is at most 25% of the
total when a unit's gather takes no longer than its compute. The script also
prints a unit's gather time against its compute, and checks the losses of
the three runs are identical (prefetching moves only timing).

usage: bench_zero_overlap.py [--train BIN] [--mpirun WRAPPER] [--data DIR] [--dp 4]
                             [--layers 8] [--d-model 256] [--ffn 1024] [--seq 128]
                             [--link-factor 0.025] [--steps 6] [--bound 0.25]
"""
import argparse
import os
import statistics
import sys
import tempfile

from bench_lib import TRAIN, add_build_args, run_train

MODEL = """model:
  vocab_size: 256
  d_model: {d_model}
  n_layers: {layers}
  n_heads: 8
  n_kv_heads: 8
  ffn_hidden: {ffn}
  seq_len: {seq}
""" + TRAIN


def run(args, work, prefetch):
    recs = run_train(args, os.path.join(work, "model.yaml"), args.dp, os.path.join(work, f"prefetch{prefetch}"),
                     [f"parallel.dp={args.dp}", "parallel.zero=3", f"parallel.zero3_prefetch={prefetch}",
                      "emulate.cluster=cpu-here", "emulate.clock=model",
                      f"emulate.link_bandwidth={args.link_factor}@1"], f"prefetch {prefetch}", timeout=900)
    return [r for r in recs if "zero" in r]


def main():
    ap = argparse.ArgumentParser()
    add_build_args(ap)
    ap.add_argument("--dp", type=int, default=4)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--link-factor", type=float, default=0.025)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--bound", type=float, default=0.25)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "model.yaml"), "w") as f:
            f.write(MODEL.format(d_model=args.d_model, layers=args.layers, ffn=args.ffn, seq=args.seq,
                                 steps=args.steps, gb=2 * args.dp))
        runs = {p: run(args, work, p) for p in (0, 1, 2)}
    losses = {p: [r["loss"] for r in recs] for p, recs in runs.items()}
    if not (losses[0] == losses[1] == losses[2]):
        sys.exit(f"FAIL: the losses differ with the prefetch depth: {losses}")
    tail = {p: [r for r in recs if r["step"] >= 3] for p, recs in runs.items()}
    exposed = {p: statistics.median(r["zero"]["gather_wait_s"] for r in t) for p, t in tail.items()}
    gathers = {p: statistics.median(r["zero"]["gathers"] for r in t) for p, t in tail.items()}
    step = {p: statistics.median(1.0 / r["tokens_per_s"] for r in t) for p, t in tail.items()}
    # The gathers' time on the emulated link: a ring all-gather sends
    # (dp - 1) slots a rank (gather_bytes) at cpu-here's 4 GB/s x the factor,
    # plus a 5 us latency a hop (configs' cpu-here preset).
    bw = 4e9 * args.link_factor
    link = {p: statistics.median(r["zero"]["gather_bytes"] / bw + r["zero"]["gathers"] * (args.dp - 1) * 5e-6
                                 for r in t) for p, t in tail.items()}
    total = link[0]
    per_gather = total / gathers[0]
    tokens = 2 * args.dp * args.seq
    compute = (statistics.median(tokens / r["tokens_per_s"] for r in tail[0]) - total
               - statistics.median(r["zero"]["reduce_wait_s"] for r in tail[0]))
    # A unit's forward: a third of its compute (the backward's two GEMMs per
    # weight are the rest), over the units and the step's 2 micro-batches.
    fwd = compute / 3 / ((args.layers + 2) * 2)
    print(f"ZeRO-3 dp{args.dp}, {args.layers} layers d_model {args.d_model}, model clock, links x{args.link_factor}:")
    print(f"  a unit's gather {1e3 * per_gather:.1f} ms against its forward's compute {1e3 * fwd:.1f} ms "
          f"(mean over the units; the backward computes twice as long and reduce-scatters as much)")
    for p in (0, 1, 2):
        print(f"  prefetch {p}: exposed gather {1e3 * exposed[p]:8.1f} ms a step ({gathers[p]:.0f} gathers, "
              f"{1e3 * link[p]:.1f} ms on the link), {100 * exposed[p] / link[p]:5.1f}% of the gathers' time; "
              f"step {1e3 * step[p] * tokens:.1f} ms")
    ratio = exposed[1] / link[1] if link[1] > 0 else 1.0
    ok = ratio <= args.bound and per_gather <= fwd * 1.05
    print(f"{'PASS' if ok else 'FAIL'}: prefetch 1 exposes {100 * ratio:.1f}% of the gather time "
          f"(bound {100 * args.bound:.0f}%, with a unit's gather <= its compute)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

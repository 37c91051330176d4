#!/usr/bin/env python3
"""Communication volume and step time of each data/tensor-parallel layout.

For every layout of the layout tests it trains a small model for a few steps
under mpirun and prints, per step and per rank, the bytes each group's
communicator sent (counted by the communicator itself) next to the analytic
volume of the algorithm (ring all-reduce 2(n-1)/n x bytes, reduce-scatter and
all-gather (n-1)/n x bytes each), and the step time relative to one process.
On a 2-core machine 8 ranks share two cores, so the times measure overhead, not
speed-up.

usage: scripts/bench_parallel.py [--train build/apps/adgt-train] [--data build/data/kjv-byte]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
E = 4  # fp32 bytes
M = dict(V=256, C=128, L=2, H=16, KV=8, F=256, T=64, B=2, G=16)
LAYOUTS = [(1, 1, 0, 0)] + [(tp, dp, z, sp) for tp, dp in [(2, 1), (1, 2), (2, 2), (4, 2), (2, 4), (8, 1)]
                            for z in (0, 1) for sp in ((0, 1) if tp > 1 else (0,))
                            if not (z and dp == 1)]


def pad16(n):
    return (n + 15) // 16 * 16


def local_numel(tp):
    """total_numel of build_param_table(m, tp, rank): shards, 16-element padding."""
    V, C, L, H, KV, F = M["V"], M["C"], M["L"], M["H"], M["KV"], M["F"]
    hd = C // H
    Vl = (V + tp - 1) // tp
    per_layer = [C, H // tp * hd * C, KV // tp * hd * C, KV // tp * hd * C, C * H // tp * hd, C,
                 F // tp * C, F // tp * C, C * F // tp]
    sizes = [Vl * C] + per_layer * L + [C, Vl * C]
    return sum(pad16(s) for s in sizes)


def analytic(tp, dp, zero, sp):
    C, L, T, B, G = M["C"], M["L"], M["T"], M["B"], M["G"]
    N, A = B * T, G // (B * dp)
    out = {"tp": 0.0, "dp": 0.0}
    if tp > 1:
        act = (4 + 8 * L) * (tp - 1) / tp * N * C * E  # same volume with or without SP
        ce = (tp - 1) * N * 3 * E                      # all-gather of the loss statistics
        out["tp"] = A * (act + ce)
        if sp:
            out["tp"] += (2 * L + 1) * 2 * (tp - 1) / tp * C * E  # norm-weight gradients
    if dp > 1:
        P = local_numel(tp)
        if zero:
            mult = 16 * dp
            Pf = (P + mult - 1) // mult * mult
            out["dp"] = 2 * (dp - 1) / dp * Pf * E     # reduce-scatter + all-gather
        else:
            out["dp"] = 2 * (dp - 1) / dp * P * E      # bucketed all-reduce
    return out


def run(args, tp, dp, zero, sp):
    name = f"tp{tp}_dp{dp}_z{zero}_sp{sp}"
    out = os.path.join(args.work, name)
    cmd = [args.train, "--config", os.path.join(ROOT, "tests/layouts/model.yaml")]
    sets = [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin", f"log.dir={out}",
            f"checkpoint.dir={out}/ckpt", "checkpoint.keep=1", f"train.steps={args.steps}",
            "train.warmup_steps=1", f"model.d_model={M['C']}", f"model.ffn_hidden={M['F']}",
            f"model.seq_len={M['T']}", f"parallel.tp={tp}", f"parallel.dp={dp}",
            f"parallel.zero={zero}", f"parallel.sequence_parallel={'true' if sp else 'false'}"]
    for s in sets:
        cmd += ["--set", s]
    cmd = [os.path.join(ROOT, "tests/parallel/mpirun.sh"), str(tp * dp)] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode:
        sys.exit(p.stdout[-3000:] + p.stderr[-3000:])
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l]
    steps = recs[1:-1] or recs  # skip warm-up and the checkpointing last step
    comm = steps[-1]["comm_bytes"]
    t = statistics.median(1.0 / r["tokens_per_s"] for r in steps)
    return comm, t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", default=os.path.join(ROOT, "build/apps/adgt-train"))
    ap.add_argument("--data", default=os.path.join(ROOT, "build/data/kjv-byte"))
    ap.add_argument("--work", default="/tmp/adgt-bench-parallel")
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    if not os.path.exists(os.path.join(args.data, "train.bin")):
        subprocess.run([os.path.join(ROOT, "scripts/prepare_data.sh"), args.data,
                        os.path.join(ROOT, "build/apps/adgt-data")], check=True,
                       env=dict(os.environ, ADGT_TOKENIZER="byte"))
    print(f"model: d_model {M['C']}, {M['L']} layers, {M['H']} heads / {M['KV']} kv, ffn {M['F']}, "
          f"vocab {M['V']}, seq {M['T']}, micro_batch {M['B']}, global batch {M['G']}")
    print(f"{'tp':>3} {'dp':>3} {'zero':>4} {'sp':>3} | {'tp MB/step':>10} {'analytic':>9} {'diff':>7}"
          f" | {'dp MB/step':>10} {'analytic':>9} {'diff':>7} | {'step time':>9}")
    base = None
    worst = 0.0
    for tp, dp, zero, sp in LAYOUTS:
        comm, t = run(args, tp, dp, zero, sp)
        base = base or t
        an = analytic(tp, dp, zero, sp)
        cells = []
        for g in ("tp", "dp"):
            got, want = comm[g], an[g]
            diff = (got - want) / want if want else (0.0 if got == 0 else float("inf"))
            if want:
                worst = max(worst, abs(diff))
            cells.append(f"{got / 1e6:>10.3f} {want / 1e6:>9.3f} {100 * diff:>6.2f}%")
        print(f"{tp:>3} {dp:>3} {zero:>4} {sp:>3} | {cells[0]} | {cells[1]} | {t / base:>8.2f}x")
    print(f"largest difference from the analytic volume: {100 * worst:.2f}% (target: within 5%)")


if __name__ == "__main__":
    main()

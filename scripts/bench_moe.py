#!/usr/bin/env python3
"""Mixture of experts, measured.

1. All-to-all bytes per step against the analytic volume. For ep in {2, 4}
   (dp = ep) the ~100k-parameter MoE model (tests/moe/model.yaml) trains a few
   steps; rank 0's all-to-all payload per step (metrics.jsonl, forward +
   backward, summed over MoE layers) is compared with the volume of uniform
   routing: each of the B*T*k assignments of a micro-batch goes to another
   rank with probability (ep-1)/ep and moves a row of C values four times
   (dispatch, combine, output gradient out, input gradient back), plus the
   per-expert counts (ep x E/ep int32 per forward, the ep-1 remote ones sent).
   The measured/analytic ratio departs from 1 by the routing's imbalance.
2. Load imbalance (max expert load / mean) with and without balancing: the
   tiny MoE model (configs/tiny-moe.yaml, or tests/moe/model.yaml with
   --small) trains `--steps` steps with no balancing, the auxiliary loss, and
   the auxiliary-loss-free bias; mean imbalance over the last quarter of the
   steps per layer, and the final training loss.

usage: bench_moe.py [--train BIN] [--mpirun WRAPPER] [--data DIR] [--byte-data DIR] [--steps 200] [--small]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train(args, cfg, out, sets, ranks, data):
    cmd = [args.train, "--config", cfg]
    for s in [f"data.train={data}/train.bin", f"data.val={data}/val.bin", f"log.dir={out}",
              f"checkpoint.dir={out}/ckpt", "checkpoint.interval=0", "train.eval_interval=0",
              "log.interval=1"] + sets:
        cmd += ["--set", s]
    if ranks > 1:
        cmd = [args.mpirun, str(ranks)] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:])
        sys.exit(f"FAIL: {' '.join(cmd)}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip() and '"loss"' in l]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", default=os.path.join(ROOT, "build", "apps", "adgt-train"))
    ap.add_argument("--mpirun", default=os.path.join(ROOT, "tests", "parallel", "mpirun.sh"))
    ap.add_argument("--data", default=os.path.join(ROOT, "build", "data", "kjv"))
    ap.add_argument("--byte-data", default=os.path.join(ROOT, "build", "data", "kjv-byte"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--small", action="store_true", help="use tests/moe/model.yaml for part 2")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench_moe_")
    small = os.path.join(ROOT, "tests", "moe", "model.yaml")

    print("1. all-to-all bytes per step (rank 0, all MoE layers, forward + backward)")
    print(f"{'ep':>3} {'measured':>12} {'analytic':>12} {'ratio':>6}")
    B, T, C, E, k, layers, gb = 2, 32, 48, 4, 2, 2, 8
    for ep in (2, 4):
        recs = train(args, small, os.path.join(work, f"a2a_ep{ep}"),
                     [f"parallel.dp={ep}", f"parallel.ep={ep}", "train.steps=5"], ep, args.byte_data)
        measured = sum(sum(x["a2a_bytes"] for x in r["moe"]) for r in recs[1:]) / len(recs[1:])
        micro = gb // (B * ep)
        rows = B * T * k * (ep - 1) / ep
        analytic = micro * layers * (4 * rows * C * 4 + (ep - 1) * (E // ep) * 8)
        print(f"{ep:>3} {measured:>12.0f} {analytic:>12.0f} {measured / analytic:>6.3f}", flush=True)

    cfg = small if args.small else os.path.join(ROOT, "configs", "tiny-moe.yaml")
    data = args.byte_data if args.small else args.data
    print(f"\n2. load imbalance (max/mean), {args.steps} steps of {os.path.relpath(cfg, ROOT)}; "
          f"mean over the last {args.steps // 4} steps")
    variants = [("none", ["model.moe_aux_loss_coef=0", "model.moe_aux_free=false"]),
                ("aux loss 0.01", ["model.moe_aux_loss_coef=0.01", "model.moe_aux_free=false"]),
                ("bias 1e-3", ["model.moe_aux_loss_coef=0", "model.moe_aux_free=true",
                               "model.moe_bias_rate=0.001"]),
                ("bias 1e-2", ["model.moe_aux_loss_coef=0", "model.moe_aux_free=true",
                               "model.moe_bias_rate=0.01"])]
    print(f"{'balancing':>14}  {'imbalance per layer':>28}  {'mean':>5}  {'final loss':>10}")
    for name, sets in variants:
        recs = train(args, cfg, os.path.join(work, name.replace(" ", "_")),
                     sets + [f"train.steps={args.steps}", f"train.warmup_steps={min(20, args.steps)}"],
                     1, data)
        tail = recs[-max(1, args.steps // 4):]
        n_layers = len(tail[0]["moe"])
        per = [sum(r["moe"][i]["imbalance"] for r in tail) / len(tail) for i in range(n_layers)]
        print(f"{name:>14}  {' '.join(f'{x:.2f}' for x in per):>28}  {sum(per) / len(per):5.2f}  "
              f"{recs[-1]['loss']:10.4f}", flush=True)
    print(f"(runs in {work})")


if __name__ == "__main__":
    main()

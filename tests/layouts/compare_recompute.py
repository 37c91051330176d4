#!/usr/bin/env python3
"""Activation recompute changes no number: train.recompute selective and full
(and full for the first layer of each stage only) give the losses and final
weights of train.recompute none bit for bit (f32, CPU backend: the same ops in
the same order), in one process, with tp + sequence parallelism, under
pipeline schedules with fused and split (zero-bubble) backwards, and with
mixture-of-experts layers over expert parallelism. Also: --dry-run's
activation memory falls from none to selective to full, and on the emulated
device (which counts its buffers) the measured peak falls with it and stays
within 15% above the --dry-run total.

usage: compare_recompute.py --train BIN --mpirun WRAPPER --data DIR --work DIR [--device cpu|emulated]
                            [--cases ...] [--modes selective full full1]
"""
import argparse
import os
import re
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from train_run import in_pairs, losses, train_run  # noqa: E402

DENSE = os.path.join(HERE, "model.yaml")
MOE = os.path.join(HERE, "..", "moe", "model.yaml")
# name: (config, ranks, sets)
CASES = {
    "single": (DENSE, 1, []),
    "tp2_sp": (DENSE, 2, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
    "pp2_1f1b_dp2": (DENSE, 4, ["parallel.pp=2", "parallel.dp=2", "parallel.schedule=1f1b"]),
    "pp2_zb": (DENSE, 2, ["parallel.pp=2", "parallel.schedule=zb-h1"]),
    "moe_ep2_tp2": (MOE, 4, ["parallel.tp=2", "parallel.dp=2", "parallel.ep=2"]),
    "moe_pp2_ep2": (MOE, 4, ["parallel.pp=2", "parallel.dp=2", "parallel.ep=2"]),
}
MODES = {"selective": ["train.recompute=selective"], "full": ["train.recompute=full"],
         "full1": ["train.recompute=full", "train.recompute_layers=1"]}


# The memory estimate alone: with --cluster, --dry-run predicts the step on that
# cluster's device model instead of profiling the CPU's ops (seconds a run);
# train.device is set, so the memory stays the named device's.
ESTIMATE_ONLY = ["--cluster", "dgx-h100"]


def dry_run_activations(args, sets):
    cmd = ([args.train, "--config", DENSE, "--dry-run", "--set", f"train.device={args.device}"]
           + ESTIMATE_ONLY + sum([["--set", s] for s in sets], []))
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    m = re.search(r"activations\s+([\d.]+) GiB", out)
    return float(m.group(1))


def emulated_peaks(args, failed):
    """On the emulated device the backend's buffers are counted: the measured
    peak falls with recompute as --dry-run says, and the dry-run total
    (scratch included) is within 5% of it (the simulator's memory bound,
    docs/simulator.md). A d512, 8-layer
    model at seq 256, where activations are about half of the memory."""
    sets = ["model.d_model=512", "model.ffn_hidden=1376", "model.n_layers=8", "model.n_heads=8",
            "model.n_kv_heads=8", "model.seq_len=256", "train.micro_batch=4", "train.global_batch=4",
            "train.steps=2", "train.warmup_steps=1", f"data.train={args.data}/train.bin",
            f"data.val={args.data}/val.bin", f"log.dir={args.work}/peak",
            f"checkpoint.dir={args.work}/peak/ckpt", "checkpoint.at_end=false"]
    peaks = {}
    for mode in ("none", "selective", "full"):
        s = sets + [f"train.recompute={mode}"]
        flags = sum([["--set", x] for x in s], [])
        out = subprocess.run([args.train, "--config", DENSE, "--set", "train.device=emulated"] + flags,
                             capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="2"))
        m = re.search(r"device memory:\s+([\d.]+) GiB", out.stdout)
        dry = subprocess.run([args.train, "--config", DENSE, "--dry-run", "--set",
                              "train.device=emulated"] + ESTIMATE_ONLY + flags,
                             capture_output=True, text=True).stdout
        est = float(re.search(r"total\s+([\d.]+) GiB", dry).group(1))
        if out.returncode != 0 or not m:
            failed.append(f"peak run {mode} failed: {out.stderr[-500:]}")
            return
        peaks[mode] = float(m.group(1))
        ratio = peaks[mode] / est
        print(f"emulated peak, recompute {mode:9s}: {peaks[mode]:.3f} GiB measured, "
              f"{est:.3f} GiB --dry-run ({ratio:.3f}x)")
        if not 0.95 <= ratio <= 1.05:
            failed.append(f"recompute {mode}: measured peak {peaks[mode]} GiB vs estimate {est} GiB")
    if not peaks["none"] > peaks["selective"] > peaks["full"]:
        failed.append(f"measured peaks do not fall with recompute: {peaks}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "emulated"])
    ap.add_argument("--cases", nargs="*", default=list(CASES))
    ap.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    failed = []
    # Bit for bit from the first step on: 6 steps (past the 4 warm-up steps,
    # into the decay) show any difference as well as the model's 20. Every
    # run is independent: two at a time (in_pairs), compared in order.
    jobs = []  # (case, mode or "none", config, sets, ranks)
    for name in args.cases:
        config, ranks, sets = CASES[name]
        sets = sets + ["train.steps=6"]
        jobs += [(name, mode, config, sets + (MODES[mode] if mode != "none" else []), ranks)
                 for mode in ["none"] + list(args.modes)]
    done = dict(zip([(j[0], j[1]) for j in jobs],
                    in_pairs([lambda j=j: train_run(args, j[2], f"{j[0]}_{j[1]}", j[3], j[4]) for j in jobs],
                             [j[4] for j in jobs])))
    for name in args.cases:
        ref = done[(name, "none")]
        if ref is None:
            failed.append(f"{name} none: run failed")
            continue
        ref_l, ref_w = losses(ref[0]), ref[1]
        for mode in args.modes:
            r = done[(name, mode)]
            if r is None:
                failed.append(f"{name} {mode}: run failed")
                continue
            l, w = losses(r[0]), r[1]
            same_l = l == ref_l
            diff_w = [k for k in ref_w if not np.array_equal(w[k], ref_w[k])]
            print(f"{name:>14} {mode:>9}: losses {'identical' if same_l else 'DIFFER'}, "
                  f"weights {'identical' if not diff_w else 'DIFFER in ' + ', '.join(diff_w[:3])} "
                  f"({r[2]:.1f} s vs {ref[2]:.1f} s)")
            if not same_l or diff_w:
                failed.append(f"{name} {mode}")
    # --dry-run: activations fall with recompute (seq 512, where the T x T
    # attention probabilities of the CPU backend dominate a layer).
    base = ["model.seq_len=512", "train.micro_batch=4", "train.global_batch=4"]
    a = {m: dry_run_activations(args, base + [f"train.recompute={m}"]) for m in ("none", "selective", "full")}
    print(f"dry-run activations: none {a['none']:.4f} GiB, selective {a['selective']:.4f}, full {a['full']:.4f}")
    if not a["none"] > a["selective"] > a["full"] > 0:
        failed.append(f"dry-run activations do not fall: {a}")
    if args.device == "emulated":
        emulated_peaks(args, failed)
    if failed:
        sys.exit("FAIL: " + "; ".join(failed))
    print("ok: recompute is bitwise identical to keeping every activation")


if __name__ == "__main__":
    main()

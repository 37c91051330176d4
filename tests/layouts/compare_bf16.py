#!/usr/bin/env python3
"""bf16 mixed precision under every kind of parallelism, against the single
process in bf16 (20 steps of the ~100k-parameter pipeline-test model, byte-level
King James Bible). What each layout changes, and so what it is held to:

  pp2 (1f1b, zb-h1)   the same ops in the same order, split over stages:
                      losses and final (fp32 master) weights bit-identical
  dp2, dp2 ZeRO-1     fp32 gradients summed in another order: losses and
                      weights within fp32 rounding of the single process,
                      amplified by AdamW and by the bf16 copy (a master
                      weight near a rounding boundary can round the other way)
  tp2, tp2 + SP       row-parallel partial sums are bf16 and reduced in bf16
                      (each hop rounds), the vocab-parallel loss combines fp32
                      statistics: bf16-sized differences

Mixture of experts in bf16 (MOE_BOUNDS): against f32 MoE, and ep2 dp2 and
pp2 ep2 dp2 against the single bf16 process.

The bounds are 4x the errors measured when this test was written (BOUNDS); a layout whose bf16 path is wrong (a bf16 buffer read as
fp32, a missing reduction, an unsynchronised bf16 copy) misses them by orders
of magnitude. It also runs the f32 single process, to show the scale of the
bf16-vs-f32 gap next to the layout errors.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_run import losses, rel_errors, train_run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "tests", "pipeline", "model.yaml")
MOE_MODEL = os.path.join(ROOT, "tests", "moe", "model.yaml")

# name: (ranks, sets, max loss error, max weight error) against single-process bf16.
BOUNDS = {
    "pp2_1f1b": (2, ["parallel.pp=2", "parallel.schedule=1f1b", "parallel.microbatches=4"], 0.0, 0.0),
    "pp2_zbh1": (2, ["parallel.pp=2", "parallel.schedule=zb-h1", "parallel.microbatches=4"], 0.0, 0.0),
    # Measured when this test was written (loss, weights; the bf16-vs-f32 gap of
    # the single process was 3.5e-4, 1.45e-2): dp2 and dp2 ZeRO-1 8.8e-5,
    # 7.65e-3; tp2 and tp2 + SP 2.66e-4, 1.29e-2. The dp differences start at
    # fp32 rounding of the gradient sums; AdamW's normalised update and the bf16
    # copy (a master weight on a rounding boundary rounds the other way) grow
    # them over 20 steps to the size of bf16's own error. Bounds: 4x measured.
    "dp2": (2, ["parallel.dp=2"], 3.5e-4, 3.1e-2),
    "dp2_zero1": (2, ["parallel.dp=2", "parallel.zero=1"], 3.5e-4, 3.1e-2),
    "tp2": (2, ["parallel.tp=2"], 1.1e-3, 5.2e-2),
    "tp2_sp": (2, ["parallel.tp=2", "parallel.sequence_parallel=true"], 1.1e-3, 5.2e-2),
}
# Mixture of experts in bf16 (the ~100k-parameter MoE model, 4 experts top-2):
# name: (ranks, sets, max loss error, max weight error) against the single
# process in bf16; "f32" is the single f32 process, the bf16-vs-f32 bound.
# Routing is computed in fp32 from bf16 logits, so a near-tie between two
# experts can route a token differently than f32 does: the f32 gap is larger
# than the dense model's. Measured when this test was written (loss, weights):
# f32 vs bf16 1.75e-3, 7.99e-2 (the dense model's gap: 3.1e-4, 1.46e-2);
# ep2 dp2 and pp2 ep2 dp2 (pp adds nothing: the same ops per stage) 4.56e-4,
# 1.25e-2 (the dense dp2's: 1.27e-4, 9.8e-3). Bounds: 4x measured.
MOE_BOUNDS = {
    "f32": (1, ["train.dtype=f32"], 7.0e-3, 3.2e-1),
    "ep2_dp2": (2, ["parallel.dp=2", "parallel.ep=2"], 1.8e-3, 5.0e-2),
    "pp2_ep2_dp2": (4, ["parallel.pp=2", "parallel.dp=2", "parallel.ep=2"], 1.8e-3, 5.0e-2),
}


def moe_checks(args, failed):
    base = ["train.dtype=bf16", f"train.device={args.device}"]
    ref = train_run(args, MOE_MODEL, "moe_single_bf16", base, 1)
    if not ref:
        failed.append("moe_single_bf16")
        return
    ref_l, ref_w = losses(ref[0]), ref[1]
    for name, (ranks, sets, lb, wb) in MOE_BOUNDS.items():
        r = train_run(args, MOE_MODEL, "moe_" + name, base + sets, ranks)
        if not r:
            failed.append("moe_" + name)
            continue
        le, we, worst = rel_errors(losses(r[0]), ref_l, r[1], ref_w)
        ok = args.measure or (le <= lb and we <= wb)
        print(f"{'ok  ' if ok else 'FAIL'} moe {name:12s} loss {le:.2e} (bound {lb:.1e}), "
              f"weights {we:.2e} (bound {wb:.1e}, worst {worst})  {r[2]:.1f} s")
        if not ok:
            failed.append("moe_" + name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "emulated"],
                    help="train.device of every run (emulated: the device code paths on the CPU)")
    ap.add_argument("--measure", action="store_true", help="print errors, check nothing")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    base = ["train.dtype=bf16", f"train.device={args.device}", "train.global_batch=4"]
    ref = train_run(args, MODEL, "single_bf16", base, 1)
    f32 = train_run(args, MODEL, "single_f32", ["train.dtype=f32", f"train.device={args.device}"], 1)
    if not ref or not f32:
        sys.exit("FAIL: a single-process run failed")
    ref_l, ref_w = losses(ref[0]), ref[1]
    gl, gw, _ = rel_errors(losses(f32[0]), ref_l, f32[1], ref_w)
    print(f"bf16 vs f32, single process: loss {gl:.2e}, weights {gw:.2e} (for scale)")
    failed = []
    for name, (ranks, sets, lb, wb) in BOUNDS.items():
        r = train_run(args, MODEL, name, base + sets, ranks)
        if not r:
            failed.append(name)
            continue
        le, we, worst = rel_errors(losses(r[0]), ref_l, r[1], ref_w)
        ok = args.measure or (le <= lb and we <= wb)
        print(f"{'ok  ' if ok else 'FAIL'} {name:10s} loss {le:.2e} (bound {lb:.1e}), "
              f"weights {we:.2e} (bound {wb:.1e}, worst {worst})  {r[2]:.1f} s")
        if not ok:
            failed.append(name)
    moe_checks(args, failed)
    if failed:
        sys.exit(f"FAIL: {', '.join(failed)}")
    print("PASS: bf16 under pp, dp, ZeRO-1, tp and SP matches the single process; bf16 MoE "
          "matches f32 MoE and its own single process")


if __name__ == "__main__":
    main()

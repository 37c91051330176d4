#!/usr/bin/env python3
"""A weighted blend of two token files in training (docs/data-format.md,
"Blends"): data.train = "0.7 A 0.3 B" reads 0.7 of its samples from A (to
within the interleaving's one sample) and says so in metrics.jsonl's
source_tokens; with one source named the losses equal those of the plain
path; a resume mid-run continues the same order (losses == the
uninterrupted run's); a resume into another layout (dp=2) continues it as
well (source tokens equal, losses within 1e-4 of the single process: only
the summation order differs), and resuming that dp=2 run again is bitwise.

usage: blend_train.py --train ADGT_TRAIN --data ADGT_DATA --mpirun MPIRUN --model MODEL_YAML
                      --shard A.bin --text TEXT --work DIR
"""
import argparse
import json
import os
import shutil
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    for k in ("train", "data", "mpirun", "model", "shard", "text", "work"):
        ap.add_argument("--" + k, required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    b_dir = os.path.join(a.work, "b")
    p = subprocess.run([a.data, "prepare", "--input", a.text, "--out", b_dir, "--tokenizer", "byte"],
                       capture_output=True, text=True)
    if p.returncode:
        sys.exit("FAILED: prepare B: " + p.stderr)
    blend = f"0.7 {a.shard} 0.3 {b_dir}"  # a directory stands for its train.bin

    def train(tag, data, steps, ranks=1, resume=None, ckpt=None, extra=()):
        out = os.path.join(a.work, tag)
        cmd = ([a.mpirun, str(ranks)] if ranks > 1 else []) + [a.train, "--config", a.model]
        sets = [f"data.train={data}", f"data.val={os.path.join(b_dir, 'val.bin')}", f"log.dir={out}",
                f"checkpoint.dir={ckpt or out + '/ckpt'}", f"train.steps={steps}", "train.eval_interval=0",
                "checkpoint.interval=6", "checkpoint.at_end=false", "train.device=cpu", *extra]
        for s in sets:
            cmd += ["--set", s]
        if resume:
            cmd += ["--resume", resume]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if r.returncode:
            sys.exit(f"FAILED: {tag}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
        recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if l.strip()]
        return [r for r in recs if "loss" in r and "event" not in r]

    failures = []
    full = train("full", blend, 12)
    st = full[-1]["source_tokens"]
    samples = 12 * 16
    share = st[0] / (st[0] + st[1])
    if sum(st) != samples * 32 or abs(share - 0.7) > 1.0 / samples + 1e-12:
        failures.append(f"source_tokens {st}: share {share:.4f} of A over {samples} samples (want 0.7 within one sample)")
    plain = train("plain", a.shard, 4)
    solo = train("solo", f"1 {a.shard}", 4)
    if [r["loss"] for r in plain] != [r["loss"] for r in solo] or "source_tokens" in solo[0]:
        failures.append("one source named as a blend does not train as the plain path")
    ckpt6 = os.path.join(a.work, "full", "ckpt", "step_6")
    resumed = train("resumed", blend, 12, resume=ckpt6, ckpt=os.path.join(a.work, "resumed_ckpt"))
    if [r["loss"] for r in resumed] != [r["loss"] for r in full[6:]]:
        failures.append(f"resume at step 6: {[r['loss'] for r in resumed]} != {[r['loss'] for r in full[6:]]}")
    dp2 = train("dp2", blend, 12, ranks=2, resume=ckpt6, ckpt=os.path.join(a.work, "dp2_ckpt"),
                extra=["parallel.dp=2", "checkpoint.interval=3"])
    dp2_rest = train("dp2_rest", blend, 12, ranks=2, resume=os.path.join(a.work, "dp2_ckpt", "step_9"),
                     ckpt=os.path.join(a.work, "dp2_rest_ckpt"), extra=["parallel.dp=2"])
    if [r["loss"] for r in dp2_rest] != [r["loss"] for r in dp2[3:]]:
        failures.append("dp=2 (resumed from the single process's step 6) resumed again at step 9 differs "
                        "from its uninterrupted run")
    if dp2[-1]["source_tokens"] != st:
        failures.append(f"dp=2 read {dp2[-1]['source_tokens']} tokens per source, the single process {st}")
    rel = max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(dp2, full[6:]))
    if rel > 1e-4:
        failures.append(f"dp=2 after the switch strays {rel:.2e} from the single process (another order?)")
    if failures:
        sys.exit("FAILED:\n" + "\n".join(failures))
    print(f"ok: share of A {share:.4f} over {samples} samples (source_tokens {st}); one source == plain; "
          f"resume == uninterrupted; dp=2 from step 6 within {rel:.1e} of one process, its resume at 9 bitwise")


if __name__ == "__main__":
    main()

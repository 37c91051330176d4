#!/usr/bin/env python3
"""A checkpoint written before named trainer state still resumes exactly.

tests/checkpoint/v2_moe_fixture/step_6 was written by adgt-train at commit
3b25315 (format version 2, the trainer's state packed into meta/rng_state:
word 0 the AdamW update count, then the n_layers x n_experts aux-loss-free MoE
biases as bit copies) for the tiny MoE model beside it. That build, resumed
from it to step 8 on the byte-level corpus, logged the losses below and saved
the words below. This build must resume it to the same losses (to 1e-7 relative: the
last bits differ between CPUs, see WANT_LOSSES) and save the same state, bit
for bit, as named entries (state/trainer/opt_steps,
state/moe/bias/layer_<l>) with no rng_state words.

usage: v2_compat_check.py --train BIN --data DIR --work DIR
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "v2_moe_fixture")
# From the build at 3b25315, resumed from the fixture to step 8 (on the
# machine of that session). On an AMD EPYC host with AVX-512 (2026-12-02)
# that same build, and every later one, gives 5.470046103000641 and
# 5.450505241751671: 5.4e-9 relative apart, the last bits of f32 arithmetic
# whose library code paths (glibc's libm, OpenBLAS) differ between CPUs.
# So the losses are checked to LOSS_TOL relative (20x that gap), and the
# restored state (the AdamW update count and the MoE biases, which routing
# reads) is checked bit for bit in the saved step_8 below.
WANT_LOSSES = {7: 5.4700460731983185, 8: 5.450505271553993}
LOSS_TOL = 1e-7
WANT_WORDS = [8, 13800290266158863483, 4576918229304087675, 0, 0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    src = os.path.join(a.work, "old", "step_6")
    shutil.copytree(os.path.join(FIXTURE, "step_6"), src)
    out = os.path.join(a.work, "run")
    cmd = [a.train, "--config", os.path.join(FIXTURE, "model.yaml"), "--resume", src,
           "--set", f"data.train={a.data}/train.bin", "--set", f"data.val={a.data}/val.bin",
           "--set", "train.steps=8", "--set", f"log.dir={out}", "--set", f"checkpoint.dir={out}/ckpt"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        print(p.stdout, p.stderr)
        sys.exit(f"FAIL: resuming the old checkpoint exited {p.returncode}")
    if "has no MoE selection biases" in p.stderr:
        sys.exit("FAIL: the old checkpoint's MoE biases were not found: " + p.stderr)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        got = {r["step"]: r["loss"] for r in map(json.loads, filter(str.strip, f)) if "loss" in r}
    fails = []
    if sorted(got) != sorted(WANT_LOSSES) or any(
            abs(got[k] - v) > LOSS_TOL * abs(v) for k, v in WANT_LOSSES.items()):
        fails.append(f"losses {got}, want {WANT_LOSSES} within {LOSS_TOL} relative (the build at 3b25315)")
    with h5py.File(os.path.join(out, "ckpt", "step_8", "checkpoint.h5"), "r") as h:
        words = np.array(WANT_WORDS, dtype=np.uint64)
        bias = words[1:].view(np.float64).reshape(2, 2)
        if "state" not in h:
            sys.exit("FAIL: the saved checkpoint has no state/ group (named trainer state)")
        if h["meta/rng_state"].shape != (0,):
            fails.append(f"meta/rng_state {h['meta/rng_state'][...]}: the trainer writes no words now")
        if h["state/trainer/opt_steps"][...].tolist() != [8]:
            fails.append(f"state/trainer/opt_steps {h['state/trainer/opt_steps'][...]}, want [8]")
        for l in range(2):
            b = h[f"state/moe/bias/layer_{l}"]
            if b.dtype != np.float64 or b[...].view(np.uint64).tolist() != bias[l].view(np.uint64).tolist():
                fails.append(f"state/moe/bias/layer_{l} {b[...]!r}, want {bias[l]!r} (bit for bit)")
            if b.attrs["version"] != 1:
                fails.append(f"state/moe/bias/layer_{l} version {b.attrs['version']}")
    if fails:
        sys.exit("FAIL: " + "; ".join(fails))
    err = max(abs(got[k] - v) / abs(v) for k, v in WANT_LOSSES.items())
    print(f"v2 compat: the pre-named-state checkpoint resumed to steps 7-8 with the old build's "
          f"losses (within {err:.1e} relative; {got[8]!r} at step 8) and saved its state as named entries, "
          f"bit for bit")


if __name__ == "__main__":
    main()

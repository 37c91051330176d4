#!/usr/bin/env python3
"""Saves are atomic under SIGKILL of any rank.

Each trial trains the layout-test model as tp=2 dp=2 ZeRO-1 (4 ranks) with a
checkpoint after every step (keep 3), waits for the first complete checkpoint,
times one save (the life of its temporary directory), then SIGKILLs one random
rank at a uniformly random moment of the next save (or just after it). Then:
  * the job ends (no hang) within 60 s;
  * every complete step_<N> (COMPLETE and checkpoint.h5) is whole: h5py reads
    every piece of meta/pieces from its rank file and its zlib.crc32 matches;
  * `adgt-train --resume auto --eval-only` (one process: another layout) picks
    the newest complete step and loads it (its loader verifies every checksum).

Only processes this script started are signalled: the rank is found among the
descendants of its own mpirun, and cleanup kills that mpirun's process group.

usage: kill_check.py --train BIN --mpirun WRAPPER --data DIR --work DIR [--trials 3] [--seed S]
"""
import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import zlib

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "..", "layouts", "model.yaml")


def complete_steps(ckpt):
    out = []
    if os.path.isdir(ckpt):
        for d in os.listdir(ckpt):
            m = re.fullmatch(r"step_([1-9][0-9]*|0)", d)
            p = os.path.join(ckpt, d)
            if m and os.path.isfile(os.path.join(p, "COMPLETE")) and os.path.isfile(os.path.join(p, "checkpoint.h5")):
                out.append((int(m.group(1)), p))
    return sorted(out)


def descendants(root):
    children = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(pid))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def rank_pids(mpirun_pid):
    ranks = {}
    for pid in descendants(mpirun_pid):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        r = env.get(b"OMPI_COMM_WORLD_RANK")
        if r is not None and comm.startswith("adgt-train"):
            ranks[int(r)] = pid
    return ranks


def verify_pieces(step_dir):
    """Every piece of a complete checkpoint is present and matches its crc32."""
    with h5py.File(os.path.join(step_dir, "checkpoint.h5"), "r") as f:
        p = f["meta/pieces"]
        files = {}
        try:
            for t, r, crc in sorted(set(zip(p["tensor"][...], p["rank"][...], p["crc32"][...]))):
                fn = os.path.join(step_dir, f"rank_{r}.h5")
                files.setdefault(fn, h5py.File(fn, "r"))
                got = zlib.crc32(np.ascontiguousarray(files[fn][t.decode()][...], dtype="<f4").tobytes())
                if got != int(crc):
                    return f"{t.decode()} in {fn}: crc32 {got:#010x}, recorded {int(crc):#010x}"
        finally:
            for h in files.values():
                h.close()
    return ""


def trial(args, k, rng):
    work = os.path.join(args.work, f"trial_{k}")
    shutil.rmtree(work, ignore_errors=True)
    ckpt = os.path.join(work, "ckpt")
    common = [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin", f"log.dir={work}",
              f"checkpoint.dir={ckpt}"]
    cmd = [args.mpirun, "4", args.train, "--config", MODEL]
    for s in common + ["parallel.tp=2", "parallel.dp=2", "parallel.zero=1", "train.steps=100000",
                       "checkpoint.interval=1", "checkpoint.keep=3", "log.interval=1000"]:
        cmd += ["--set", s]
    log = open(os.path.join(args.work, f"trial_{k}.log"), "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        deadline = time.time() + 60
        while not complete_steps(ckpt):
            if p.poll() is not None or time.time() > deadline:
                return f"trial {k}: no checkpoint appeared (exit {p.poll()}; see {log.name})"
            time.sleep(0.02)
        # Aim inside a save: time one (its temporary directory's lifetime), then
        # kill at a uniformly random moment of the next one (or just after it).
        def wait_tmp(present):
            while bool([d for d in os.listdir(ckpt) if d.startswith(".tmp_")]) != present:
                if p.poll() is not None or time.time() > deadline:
                    return False
                time.sleep(0.0005)
            return True
        wait_tmp(False)
        wait_tmp(True)
        t0 = time.time()
        wait_tmp(False)
        save_s = time.time() - t0
        wait_tmp(True)
        time.sleep(rng.uniform(0.0, 1.2 * save_s))
        ranks = rank_pids(p.pid)
        if len(ranks) != 4:
            return f"trial {k}: found ranks {sorted(ranks)} among mpirun's processes, expected 0..3"
        victim = rng.randrange(4)
        os.kill(ranks[victim], signal.SIGKILL)
        t_kill = time.time()
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            return f"trial {k}: the job did not end within 60 s of killing rank {victim}"
        ended = time.time() - t_kill
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        log.close()
    # What the kill interrupted: a save in progress leaves its temporary directory.
    tmp = [d for d in os.listdir(ckpt) if d.startswith(".tmp_")]
    steps = complete_steps(ckpt)
    if not steps:
        return f"trial {k}: no complete checkpoint left after the kill"
    for s, d in steps:
        bad = verify_pieces(d)
        if bad:
            return f"trial {k}: complete checkpoint step_{s} is damaged: {bad}"
    newest = steps[-1][1]
    cmd = [args.train, "--config", MODEL, "--resume", "auto", "--eval-only"]
    for s in common + ["train.eval_batches=1"]:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0 or f"resumed from {newest} (loaded in" not in r.stdout or "eval loss:" not in r.stdout:
        return f"trial {k}: --resume auto did not load {newest}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    where = f"during the save of {tmp[0][5:].rsplit('_', 1)[0]}" if tmp else "between saves"
    print(f"ok   trial {k}: SIGKILL rank {victim} {where}; job ended in {ended:.1f} s; complete "
          f"{[s for s, _ in steps]} all verified; --resume auto loaded step_{steps[-1][0]}")
    return "", bool(tmp)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"kill_check: {args.trials} trials, seed {seed}")
    rng = random.Random(seed)
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    mid_save = 0
    for k in range(args.trials):
        res = trial(args, k, rng)
        if isinstance(res, str):
            sys.exit(f"FAIL (seed {seed}): {res}")
        mid_save += res[1]
    print(f"PASS: {args.trials} trials ({mid_save} killed inside a save): the newest complete checkpoint "
          f"always loaded")


if __name__ == "__main__":
    main()

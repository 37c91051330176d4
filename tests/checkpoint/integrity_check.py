#!/usr/bin/env python3
"""A damaged or mismatched checkpoint stops every rank of a parallel resume,
non-zero, within seconds, and each rank names the file and the tensor.

Makes one tp=2 dp=2 ZeRO-1 checkpoint (format version 2) of the layout-test
model, then resumes copies of it under mpirun (4 ranks) after:
  * deleting a rank file                      -> "rank file ... is missing; it holds tensor ..."
  * truncating a rank file                    -> "rank file ... is N bytes but COMPLETE records M"
  * flipping a bit inside a tensor's data     -> "tensor ... fails its checksum: piece ... in .../rank_3.h5"
  * overwriting a rank file's HDF5 signature,
    loading as tp=4 (that rank file's pieces are
    read from the file itself)                -> "tensor ... in .../rank_0.h5: cannot read it"
  * a model of another shape                  -> "tensor ... has shape (128,64), the model expects (256,64)"
and saving where the directory cannot be made -> "save_checkpoint(...): cannot create ..."

usage: integrity_check.py --train BIN --mpirun WRAPPER --data DIR --work DIR
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import time

import h5py

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "..", "layouts", "model.yaml")


def sets(args, work, tp=2, dp=2, steps=4, extra=()):
    s = [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin", f"log.dir={work}",
         f"checkpoint.dir={work}/ckpt", f"parallel.tp={tp}", f"parallel.dp={dp}", "parallel.zero=1",
         f"train.steps={steps}", "checkpoint.interval=0", "log.interval=10"] + list(extra)
    out = []
    for x in s:
        out += ["--set", x]
    return out


def launch(args, cmd_sets, resume=None, n=4):
    cmd = [args.mpirun, str(n), args.train, "--config", MODEL] + cmd_sets
    if resume:
        cmd += ["--resume", resume]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
    except subprocess.TimeoutExpired as e:
        return None, "", str(e.stderr or ""), time.time() - t0
    return p.returncode, p.stdout, p.stderr, time.time() - t0


def expect_all_ranks(name, result, regex, n=4):
    rc, out, err, dt = result
    problems = []
    if rc is None:
        problems.append("it hung: killed after 60 s")
    elif rc == 0:
        problems.append("it exited 0")
    else:
        for r in range(n):
            if not re.search(rf"error: rank {r} \(host [^)]*\): .*{regex}", err):
                problems.append(f"rank {r} did not report /{regex}/")
    if problems:
        print(f"FAIL {name}: " + "; ".join(problems) + f"\n---- stdout ----\n{out[-3000:]}\n---- stderr ----\n{err[-5000:]}")
        return False
    first = next(l for l in err.splitlines() if l.startswith("error: rank 0 "))
    print(f"ok   {name}: exit {rc} after {dt:.1f} s, all {n} ranks: {first[:260]}")
    return True


def flip_bit(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x20]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    src = os.path.join(args.work, "source")
    rc, out, err, _ = launch(args, sets(args, src))
    good = os.path.join(src, "ckpt", "step_4")
    if rc != 0 or not os.path.isfile(os.path.join(good, "COMPLETE")):
        sys.exit(f"FAIL: the source run did not write {good}\n{out[-2000:]}\n{err[-4000:]}")

    def damaged(name, damage):
        d = os.path.join(args.work, name, "ckpt", "step_4")
        shutil.copytree(good, d)
        damage(d)
        return d

    ok = True
    d = damaged("missing", lambda d: os.remove(os.path.join(d, "rank_1.h5")))
    ok &= expect_all_ranks("missing rank file", launch(args, sets(args, os.path.join(args.work, "r1"), steps=5), d),
                           r"rank file \S*/rank_1\.h5 is missing; it holds tensor \S+ \[")

    def truncate(d):
        p = os.path.join(d, "rank_2.h5")
        os.truncate(p, os.path.getsize(p) - 4096)
    d = damaged("truncated", truncate)
    ok &= expect_all_ranks("truncated rank file",
                           launch(args, sets(args, os.path.join(args.work, "r2"), steps=5), d),
                           r"rank file \S*/rank_2\.h5 is [0-9]+ bytes but COMPLETE records [0-9]+ \(it holds tensor")

    target = {}

    def bitflip(d):
        p = os.path.join(d, "rank_3.h5")
        with h5py.File(p, "r") as f:
            name = "model/" + list(f["model"])[-1]
            offset = f[name].id.get_offset()
        target["name"] = name
        flip_bit(p, offset + 40)
    d = damaged("bitflip", bitflip)
    ok &= expect_all_ranks("bit flip", launch(args, sets(args, os.path.join(args.work, "r3"), steps=5), d),
                           rf"tensor {re.escape(target['name'])} fails its checksum: piece \[[0-9:, ]+\] in "
                           r"\S*/rank_3\.h5")

    def signature(d):
        with open(os.path.join(d, "rank_0.h5"), "r+b") as f:
            f.write(b"NOT HDF5")
    d = damaged("signature", signature)
    ok &= expect_all_ranks("unreadable rank file (tp=4)",
                           launch(args, sets(args, os.path.join(args.work, "r4"), tp=4, dp=1, steps=5), d),
                           r"tensor \S+ \[[0-9:, ]+\] in \S*/rank_0\.h5: cannot read it")

    ok &= expect_all_ranks("incompatible model",
                           launch(args, sets(args, os.path.join(args.work, "r5"), steps=5,
                                             extra=["model.ffn_hidden=256"]), good),
                           r"tensor model/model\.layers\.0\.mlp\.gate_proj\.weight has shape \(128,64\), "
                           r"the model expects \(256,64\)")

    blocker = os.path.join(args.work, "not_a_directory")
    open(blocker, "w").close()
    ok &= expect_all_ranks("save into an impossible directory",
                           launch(args, sets(args, os.path.join(args.work, "r6"), steps=1,
                                             extra=["train.warmup_steps=1", f"checkpoint.dir={blocker}/ckpt"])),
                           r"save_checkpoint\(\S*not_a_directory/ckpt, step 1\): cannot create")
    if not ok:
        sys.exit("FAIL")
    print("PASS: every damaged checkpoint stops every rank with the file and tensor named")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Checkpoint corruption campaign (docs/reliability.md): bit flips and truncations.

Trains the layout-test model (tests/layouts/model.yaml) for 2 steps on 2 ranks
(tp=2, format version 2: checkpoint.h5 + rank_0.h5 + rank_1.h5 + COMPLETE),
resumes the undamaged checkpoint for one step as the reference, then runs
TRIALS trials. Each trial copies the checkpoint, damages one random file of it
(checkpoint.h5, rank_<R>.h5 or COMPLETE) by flipping 1-8 random bits or by
truncating it at a random offset, and resumes it for one step on 2 ranks
(the trainer's real load path: load_checkpoint_sharded with every CRC). Outcomes:

  refused      non-zero exit; the error names the damaged file (and, when the
               damage is inside a tensor's stored data, the tensor)      (good)
  identical    loaded and trained: the step-3 loss and the saved step-3 state
               (every parameter and AdamW moment, bitwise) equal the reference's:
               the damage hit bytes the load does not use               (good)
  unnamed      refused, but the error names neither the file nor the tensor
  different    loaded and trained to a different state (silent corruption)
  crash        a signal, "Segmentation fault", a sanitizer report, terminate
  hang         still running after --timeout seconds

Prints a summary and every failed trial (with its damaged copy, kept under
WORK/trial_NNN); exits 1 on any unnamed, different, crash or hang.

  scripts/reliability/corrupt_checkpoints.py --train build-gc/apps/adgt-train
      --data build-gc/data/kjv-byte [--trials 100] [--seed 17] [--work runs/corrupt_checkpoints]
      [--timeout 60] [--ranks 2]
"""
import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(ROOT, "tests", "layouts", "model.yaml")
MPIRUN = os.path.join(ROOT, "tests", "parallel", "mpirun.sh")
CRASH = re.compile(r"exited on signal|Segmentation fault|Aborted|core dumped|AddressSanitizer|"
                   r"LeakSanitizer|runtime error:|terminate called|signal [0-9]+ \(")
STEPS = 2


def sets(args, work, steps):
    s = [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin", f"log.dir={work}",
         f"checkpoint.dir={work}/ckpt", f"parallel.tp={args.ranks}", "parallel.dp=1",
         "train.global_batch=4", f"train.steps={steps}", "train.warmup_steps=1",
         "checkpoint.interval=0", "checkpoint.keep=0", "log.interval=1"] + args.set
    out = []
    for x in s:
        out += ["--set", x]
    return out


def launch(args, work, steps, resume=None):
    cmd = [MPIRUN, str(args.ranks), args.train, "--config", MODEL] + sets(args, work, steps)
    if resume:
        cmd += ["--resume", resume]
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         errors="replace", start_new_session=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        out, err = p.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return None, out, err, time.time() - t0
    return p.returncode, out, err, time.time() - t0


def state_digest(step_dir, work):
    """sha256 over every dataset under model/, optim/ and meta/ (read through the
    index, so the rank files' data), plus the sorted names; in meta/config_yaml
    the run's directory `work` reads as WORK."""
    h = hashlib.sha256()
    with h5py.File(os.path.join(step_dir, "checkpoint.h5"), "r") as f:
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        for n in sorted(names):
            if n.startswith("meta/pieces"):
                continue  # which rank wrote what: the same layout writes the same
            h.update(n.encode())
            a = f[n][()]
            if n == "meta/config_yaml":
                a = a.replace(work.encode(), b"WORK")
            h.update(np.asarray(a).tobytes() if not isinstance(a, bytes) else a)
    return h.hexdigest()


def losses(work):
    """The losses of metrics.jsonl as written (text: bitwise)."""
    out = []
    p = os.path.join(work, "metrics.jsonl")
    if os.path.exists(p):
        for line in open(p):
            m, s = re.search(r'"loss":\s*([-0-9.eE+naif]+)', line), re.search(r'"step":\s*([0-9]+)', line)
            if m and s and '"event"' not in line and '"at"' not in line:
                out.append((int(s[1]), m[1]))
    return out


def tensor_extents(path):
    """[(start, end, dataset name)] of the contiguous datasets' stored bytes."""
    ext = []
    try:
        with h5py.File(path, "r") as f:
            def visit(n, o):
                if isinstance(o, h5py.Dataset):
                    try:
                        off = o.id.get_offset()
                        size = o.id.get_storage_size()
                    except Exception:
                        return
                    if off is not None and size:
                        ext.append((off, off + size, n))
            f.visititems(visit)
    except OSError:
        pass
    return ext


CHANGED = r"""
import sys, json, h5py, numpy as np
a, b = sys.argv[1], sys.argv[2]
out = []
with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
    names = []
    fa.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) and not o.is_virtual else None)
    seen = set()
    try:
        fb.visititems(lambda n, o: seen.add(n))
    except Exception:
        pass
    out += [n for n in names if n not in seen]  # no longer reachable by name
    for n in names:
        try:
            x = np.asarray(fb[n][()]).tobytes()
        except Exception:
            out.append(n)  # unreadable: its object header or layout message is damaged
            continue
        if x != np.asarray(fa[n][()]).tobytes():
            out.append(n)
print(json.dumps(out))
"""


def changed_datasets(pristine, damaged):
    """The datasets whose stored values differ (read by h5py in a child process,
    which a damaged file may crash); [] when the damaged file does not open."""
    try:
        p = subprocess.run([sys.executable, "-c", CHANGED, pristine, damaged], capture_output=True,
                           text=True, timeout=60)
        if p.returncode == 0 and p.stdout.strip():
            return set(json.loads(p.stdout))
        return {"(unreadable)"}  # h5py cannot open it (or crashed): damaged metadata
    except (subprocess.TimeoutExpired, ValueError):
        return set()


def damage(rng, d, files):
    name = rng.choice(files)
    path = os.path.join(d, name)
    size = os.path.getsize(path)
    info = {"file": name, "size": size}
    if rng.random() < 0.6 and size > 0:
        k = rng.randint(1, 8)
        bits = sorted(rng.sample(range(size * 8), k))
        with open(path, "r+b") as f:
            data = bytearray(f.read())
            for b in bits:
                data[b // 8] ^= 1 << (b % 8)
            f.seek(0)
            f.write(data)
        info.update(op="flip", bits=bits, offsets=sorted({b // 8 for b in bits}))
    else:
        cut = rng.randrange(size) if size else 0
        os.truncate(path, cut)
        info.update(op="truncate", offset=cut)
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", default=os.path.join(ROOT, "build", "apps", "adgt-train"))
    ap.add_argument("--data", default=os.path.join(ROOT, "build", "data", "kjv-byte"))
    ap.add_argument("--work", default=os.path.join(ROOT, "runs", "corrupt_checkpoints"))
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--set", action="append", default=[],
                    help="an extra section.key=value for every run (repeatable)")
    ap.add_argument("--keep-good", action="store_true", help="keep the good trials' directories")
    args = ap.parse_args()
    args.train = os.path.abspath(args.train)
    args.data = os.path.abspath(args.data)
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)

    src = os.path.join(args.work, "source")
    rc, out, err, _ = launch(args, src, STEPS)
    good = os.path.join(src, "ckpt", f"step_{STEPS}")
    if rc != 0 or not os.path.isfile(os.path.join(good, "COMPLETE")):
        sys.exit(f"FAIL: the source run did not write {good}\n{out[-2000:]}\n{err[-4000:]}")
    ref_work = os.path.join(args.work, "reference")
    rc, out, err, dt = launch(args, ref_work, STEPS + 1, good)
    ref_step = os.path.join(ref_work, "ckpt", f"step_{STEPS + 1}")
    if rc != 0 or not os.path.isdir(ref_step):
        sys.exit(f"FAIL: the reference resume failed\n{out[-2000:]}\n{err[-4000:]}")
    ref = (state_digest(ref_step, ref_work), losses(ref_work))
    files = sorted(f for f in os.listdir(good) if f.endswith(".h5") or f == "COMPLETE")
    extents = {f: tensor_extents(os.path.join(good, f)) for f in files if f.endswith(".h5")}
    print(f"checkpoint {good}: {', '.join(f'{f} ({os.path.getsize(os.path.join(good, f))} B)' for f in files)}; "
          f"reference resume {dt:.1f} s, losses {ref[1]}")

    rng = random.Random(args.seed)
    outcomes = {k: 0 for k in ["refused", "identical", "unnamed", "different", "crash", "hang"]}
    per_file = {}
    failures = []
    t_start = time.time()
    for t in range(args.trials):
        tdir = os.path.join(args.work, f"trial_{t:03d}")
        d = os.path.join(tdir, "damaged", f"step_{STEPS}")
        shutil.copytree(good, d)
        info = damage(rng, d, files)
        tensors = set()
        for o in info.get("offsets", []):
            for a, b, n in extents.get(info["file"], []):
                if a <= o < b:
                    tensors.add(n)
        if info["op"] == "flip" and info["file"].endswith(".h5"):
            tensors |= changed_datasets(os.path.join(good, info["file"]), os.path.join(d, info["file"]))
        tensors = {n for n in tensors if n.startswith(("model/", "optim/"))}
        rc, out, err, dt = launch(args, os.path.join(tdir, "run"), STEPS + 1, d)
        errs = [l for l in err.splitlines() if l.startswith("error:")]
        if rc is None:
            cls, why = "hang", f"still running after {args.timeout} s"
        elif rc < 0 or CRASH.search(err):
            cls, why = "crash", (CRASH.search(err)[0] if CRASH.search(err) else f"signal {-rc}")
        elif rc != 0:
            named = bool(errs) and all(info["file"] in l for l in errs)
            if named and tensors:
                named = all(any(n.split("/", 1)[-1] in l for n in tensors) for l in errs)
            if named:
                cls, why = "refused", errs[0][:300]
            else:
                cls, why = "unnamed", (errs[0][:400] if errs else f"exit {rc} without an error line: "
                                       + err[-400:])
        else:
            step_dir = os.path.join(tdir, "run", "ckpt", f"step_{STEPS + 1}")
            try:
                got = (state_digest(step_dir, os.path.join(tdir, "run")), losses(os.path.join(tdir, "run")))
            except Exception as e:  # noqa: BLE001
                got = (f"unreadable: {e}", [])
            if got == ref:
                cls, why = "identical", ""
            else:
                cls, why = "different", f"losses {got[1]} vs {ref[1]}; state {'same' if got[0] == ref[0] else 'differs'}"
        outcomes[cls] += 1
        pf = per_file.setdefault(f"{info['file']} {info['op']}", {k: 0 for k in outcomes})
        pf[cls] += 1
        desc = (f"{info['file']} {info['op']} " +
                (f"bits {info['bits']}" if info["op"] == "flip" else f"at {info['offset']} of {info['size']}") +
                (f" (tensor data: {', '.join(sorted(tensors))})" if tensors else ""))
        print(f"trial {t:3d} {cls:<9} {dt:5.1f} s  {desc}" + (f"\n      {why}" if cls != "identical" else ""),
              flush=True)
        if cls in ("refused", "identical"):
            if not args.keep_good:
                shutil.rmtree(tdir, ignore_errors=True)
        else:
            failures.append((t, cls, tdir, desc, why))
            with open(os.path.join(tdir, "stderr.txt"), "w") as f:
                f.write(err)
    print(f"\n{args.trials} trials (seed {args.seed}, {args.ranks} ranks tp={args.ranks}), "
          f"{time.time() - t_start:.0f} s")
    print(f"{'damage':<22}" + "".join(f"{k:>11}" for k in outcomes))
    for k in sorted(per_file):
        print(f"{k:<22}" + "".join(f"{per_file[k][c]:>11}" for c in outcomes))
    print(f"{'total':<22}" + "".join(f"{outcomes[c]:>11}" for c in outcomes))
    if failures:
        print(f"\n{len(failures)} failed trial(s):")
        for t, cls, tdir, desc, why in failures:
            print(f"  trial {t} {cls}: {desc}\n    {why}\n    kept in {tdir}")
        print("FAIL")
        return 1
    print("PASS: every damaged checkpoint was refused naming the file (and tensor) or loaded identically")
    return 0


if __name__ == "__main__":
    sys.exit(main())

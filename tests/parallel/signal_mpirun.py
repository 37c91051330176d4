#!/usr/bin/env python3
"""A stop signal to mpirun or to any one rank stops every rank cleanly.

Launches `mpirun -np 2` training (dp=2) on the layout-test model, waits for the
first step line, then sends SIG to the mpirun process (--to mpirun) or to one
rank (--to rank). Every rank must save at the same step boundary: the run exits
0, rank 0 prints "stopping at step N", step_N is COMPLETE with both rank files,
and a resume from it continues at step N+1.

usage: signal_mpirun.py --train BIN --mpirun WRAPPER --data DIR --work DIR --signal TERM|USR1 --to mpirun|rank
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--signal", choices=["TERM", "USR1", "INT"], default="TERM")
    ap.add_argument("--to", choices=["mpirun", "rank"], default="mpirun")
    args = ap.parse_args()
    out = os.path.join(args.work, f"sig_{args.signal}_{args.to}")
    shutil.rmtree(out, ignore_errors=True)
    sets = [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
            f"log.dir={out}", f"checkpoint.dir={out}/ckpt", "train.steps=100000",
            "checkpoint.interval=0", "parallel.dp=2", "log.interval=1"]
    cmd = [args.train, "--config", os.path.join(HERE, "..", "layouts", "model.yaml")]
    for s in sets:
        cmd += ["--set", s]
    os.makedirs(out, exist_ok=True)
    log_path = os.path.join(out, "stdout.txt")
    log = open(log_path, "w")  # a file, not a pipe: nothing blocks while we wait
    p = subprocess.Popen([args.mpirun, "2"] + cmd, stdout=log, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        with open(log_path) as f:
            if re.search(r"^step", f.read(), re.M):
                break
        time.sleep(0.1)
    sig = getattr(signal, "SIG" + args.signal)
    if args.to == "mpirun":
        target = p.pid
    else:  # the rank processes are mpirun's children running adgt-train; pick the last one
        kids = subprocess.run(["pgrep", "-P", str(p.pid), "-f", "adgt-train"], capture_output=True,
                              text=True).stdout.split()
        if not kids:
            p.kill()
            sys.exit("FAIL: found no rank process under mpirun")
        target = int(kids[-1])
    os.kill(target, sig)
    try:
        p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        sys.exit(f"FAIL: SIG{args.signal} to {args.to}: the job did not end within 120 s")
    log.close()
    with open(log_path) as f:
        so = se = f.read()
    m = re.search(r"stopping at step (\d+) on signal", so)
    if p.returncode != 0 or not m:
        print(so[-3000:], se[-3000:])
        sys.exit(f"FAIL: SIG{args.signal} to {args.to}: exit {p.returncode}, "
                 f"{'no' if not m else 'a'} 'stopping at step' line")
    step = int(m.group(1))
    d = os.path.join(out, "ckpt", f"step_{step}")
    missing = [f for f in ("COMPLETE", "rank_0.h5", "rank_1.h5") if not os.path.isfile(os.path.join(d, f))]
    if missing:
        sys.exit(f"FAIL: step_{step} lacks {missing}")
    r = subprocess.run([args.mpirun, "2"] + cmd + ["--resume", "auto", "--set",
                                                    f"train.steps={step + 5}"],
                       capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                       timeout=120)
    first = re.search(r"^step +(\d+)/", r.stdout, re.M)
    if r.returncode != 0 or not first or int(first.group(1)) != step + 1:
        print(r.stdout[-2000:], r.stderr[-2000:])
        sys.exit(f"FAIL: resume from step_{step} did not run step {step + 1}")
    print(f"PASS: SIG{args.signal} to {args.to} -> every rank saved step_{step}, exit 0, resumed")


if __name__ == "__main__":
    main()

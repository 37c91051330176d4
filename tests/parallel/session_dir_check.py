#!/usr/bin/env python3
"""Every launch keeps Open MPI's session files in a base of its own, and leaves
nothing behind (docs/testing.md: Open MPI 4.1's shared session directory races
between launches started side by side).

For a single process (MpiEnv) and a 2-rank launch (tests/parallel/mpirun.sh),
each with TMPDIR set to a fresh directory: once the run has printed its first
step (MPI is up), Open MPI's session directory (ompi.*) must sit inside the
launch's own base (adgt-mpi.PID.* for the single process, PID its own;
adgt-mpirun.UID.PID for mpirun, PID being mpirun's), never directly in
TMPDIR, and the training process must not carry OMPI_MCA_orte_tmpdir_base in
its environment (what it starts would share the base). SIGTERM then stops
the run cleanly (exit 0); afterwards the single process's base is gone. The
start of each removes the bases of ended ones (a planted base of a pid that
does not exist) and keeps a live process's.

usage: session_dir_check.py --train BIN --mpirun WRAPPER --data DIR --work DIR
"""
import argparse
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def launch(args, out, tmp, ranks):
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    cmd = [args.train, "--config", os.path.join(HERE, "..", "layouts", "model.yaml")]
    for s in [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
              f"log.dir={out}", f"checkpoint.dir={out}/ckpt", "train.steps=100000",
              "checkpoint.interval=0", "log.interval=1", f"parallel.dp={ranks}"]:
        cmd += ["--set", s]
    if ranks > 1:
        cmd = [args.mpirun, str(ranks)] + cmd
    env = {k: v for k, v in os.environ.items() if k != "OMPI_MCA_orte_tmpdir_base"}
    env.update(OMP_NUM_THREADS="1", TMPDIR=tmp)
    log_path = os.path.join(out, "stdout.txt")
    log = open(log_path, "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.time() + 300  # a hang guard, not a speed check
    while p.poll() is None and time.time() < deadline:
        with open(log_path) as f:
            if re.search(r"^step", f.read(), re.M):
                return p, log, log_path
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    with open(log_path) as f:
        print(f.read()[-3000:])
    sys.exit(f"FAIL: the {ranks}-rank run printed no step line (exit {p.poll()})")


def stop(p, log, log_path, what):
    # SIGUSR1 to mpirun is forwarded to every rank; a single process takes SIGTERM.
    os.kill(p.pid, signal.SIGTERM if what == "single process" else signal.SIGUSR1)
    try:
        p.wait(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        sys.exit(f"FAIL: {what}: did not stop on the signal")
    log.close()
    if p.returncode != 0:
        with open(log_path) as f:
            print(f.read()[-3000:])
        sys.exit(f"FAIL: {what}: exit {p.returncode} after the stop signal")


def train_pids(root_pid):
    """adgt-train processes among root_pid and its children."""
    kids = subprocess.run(["pgrep", "-P", str(root_pid), "-f", "adgt-train"], capture_output=True,
                          text=True).stdout.split()
    return [root_pid] + [int(k) for k in kids]


def environ_has_base(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return b"OMPI_MCA_orte_tmpdir_base=" in f.read()
    except OSError:
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    uid = os.getuid()

    # One process, no launcher.
    tmp = os.path.join(args.work, "tmp_single")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    # A SIGKILLed single process's base (no such pid: swept at the next
    # start) and a live process's (this script's: kept).
    stale = os.path.join(tmp, "adgt-mpi.999999999.AbCdEf")
    os.makedirs(os.path.join(stale, "ompi.vm.0"))
    live = f"adgt-mpi.{os.getpid()}.KeepMe"
    os.makedirs(os.path.join(tmp, live))
    p, log, log_path = launch(args, os.path.join(args.work, "single"), tmp, 1)
    bases = glob.glob(os.path.join(tmp, f"adgt-mpi.{p.pid}.*"))
    inside = [d for b in bases for d in glob.glob(os.path.join(b, "ompi.*"))]
    outside = glob.glob(os.path.join(tmp, "ompi.*"))
    leaked_env = environ_has_base(p.pid)
    stale_left = os.path.isdir(stale)
    stop(p, log, log_path, "single process")
    if len(bases) != 1 or not inside or outside:
        sys.exit(f"FAIL: single process: bases {bases}, session dirs inside {inside}, in TMPDIR itself {outside}")
    if leaked_env:
        sys.exit("FAIL: single process: OMPI_MCA_orte_tmpdir_base is still in its environment after MPI_Init")
    if stale_left:
        sys.exit("FAIL: single process: an ended process's base (adgt-mpi.999999999.*) was not removed")
    if os.listdir(tmp) != [live]:
        sys.exit(f"FAIL: single process: left {os.listdir(tmp)} in TMPDIR (expected only the live {live})")
    print(f"PASS: single process: session files in {os.path.basename(bases[0])}, removed at exit; "
          "an ended process's base swept, a live one's kept")

    # Two ranks through the tests' wrapper: mpirun is p itself (exec).
    tmp = os.path.join(args.work, "tmp_mpirun")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    stale = os.path.join(tmp, f"adgt-mpirun.{uid}.999999999")  # an ended launch's (no such pid)
    os.makedirs(os.path.join(stale, "ompi.vm.0"))
    p, log, log_path = launch(args, os.path.join(args.work, "np2"), tmp, 2)
    base = os.path.join(tmp, f"adgt-mpirun.{uid}.{p.pid}")
    inside = glob.glob(os.path.join(base, "ompi.*"))
    outside = glob.glob(os.path.join(tmp, "ompi.*"))
    ranks_env = [pid for pid in train_pids(p.pid)[1:] if environ_has_base(pid)]
    n_ranks = len(train_pids(p.pid)) - 1
    stale_left = os.path.isdir(stale)
    stop(p, log, log_path, "2-rank launch")
    if not inside or outside:
        sys.exit(f"FAIL: 2 ranks: session dirs in {base}: {inside}, in TMPDIR itself {outside}")
    if stale_left:
        sys.exit("FAIL: 2 ranks: the ended launch's base was not removed")
    if n_ranks != 2 or len(ranks_env) != 2:
        sys.exit(f"FAIL: 2 ranks: {n_ranks} rank processes under mpirun, {len(ranks_env)} of them with "
                 "the launch's base (mpirun's ranks need it to find the session files)")
    print(f"PASS: 2 ranks: session files in {os.path.basename(base)}; the ended launch's base removed")


if __name__ == "__main__":
    main()

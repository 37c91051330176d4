#!/usr/bin/env python3
"""Chaos campaign for hang and death detection (docs/reliability.md).

Each trial trains a ~100k-parameter model on N CPU ranks under mpirun
(default 8: tp2 dp2 pp2), waits until it has finished a few steps, then at a
random moment sends a random rank SIGKILL (--signal kill) or SIGSTOP
(--signal stop). It then checks, from the ranks' output:
  * every surviving rank printed a watchdog line naming the victim ("watchdog:
    rank V (host H ...") together with the group, operation and sequence number
    it waits in;
  * the job ended non-zero and within a hard limit (no hang; a hang is
    counted and the job killed);
and records each rank's detection time (its watchdog line's arrival after the
signal) and the job's end. With --resume, after each kill the run is
relaunched with `--resume auto` and must resume from the newest complete
checkpoint.

Only processes this script started are signalled: the victim is found among
the descendants of its own mpirun, and cleanup kills that mpirun's session.

usage: chaos.py --train BIN --data DIR --work DIR [--signal kill|stop|both] [--trials 20]
                [--ranks 8] [--layout tp=2,dp=2,pp=2] [--timeout 5] [--seed S] [--resume]
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
MODEL = os.path.join(ROOT, "tests", "layouts", "model.yaml")
MPIRUN = os.path.join(ROOT, "tests", "parallel", "mpirun.sh")
LINE = re.compile(r"^error: rank (\d+) \(host ([^)]*)\): watchdog: (.*)$")


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


def heartbeats(hbdir):
    """launcher rank -> dict of the heartbeat's fields (this run's files only)."""
    out = {}
    if not os.path.isdir(hbdir):
        return out
    for fn in os.listdir(hbdir):
        m = re.fullmatch(r"rank(\d+)\.hb", fn)
        if not m:
            continue
        try:
            with open(os.path.join(hbdir, fn)) as f:
                text = f.read()
        except OSError:
            continue
        if not text.endswith("end\n"):
            continue
        d = {}
        for line in text.splitlines():
            k, _, v = line.partition(" ")
            if k in ("group",):
                d.setdefault("groups", []).append(v)
            else:
                d[k] = v
        out[int(m.group(1))] = d
    return out


class Job:
    """One mpirun, its output read line by line with arrival times."""

    def __init__(self, cmd, log_path, env):
        self.lines = []  # (time, line)
        self.log = open(log_path, "w")
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True, env=env, bufsize=1)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))
            self.log.write(line)
            self.log.flush()

    def kill(self):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGCONT)
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.p.wait()
        self.reader.join(timeout=5)
        self.log.close()


def train_cmd(args, work, extra=()):
    sets = [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
            f"log.dir={work}", f"checkpoint.dir={work}/ckpt", "train.steps=100000",
            f"train.collective_timeout_s={args.timeout}", "log.interval=1",
            f"checkpoint.interval={args.ckpt_interval}", "checkpoint.keep=2"]
    sets += [f"parallel.{kv}" for kv in args.layout.split(",") if kv]
    sets += list(args.set)
    cmd = [MPIRUN, str(args.ranks), args.train, "--config", MODEL]
    for s in sets:
        cmd += ["--set", s]
    return cmd + list(extra)


def env():
    return dict(os.environ, OMP_NUM_THREADS="1")


def trial(args, k, sig, rng):
    """Returns a dict of the trial's figures."""
    work = os.path.join(args.work, f"{sig}_{k}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    hbdir = os.path.join(work, ".heartbeat")
    res = {"trial": k, "signal": sig, "ok": False, "hang": False, "why": ""}
    job = Job(train_cmd(args, work), os.path.join(work, "run.log"), env())
    try:
        # Running: every rank's heartbeat shows at least min_step finished steps.
        t_limit = time.time() + args.start_limit
        while True:
            hb = heartbeats(hbdir)
            if len(hb) == args.ranks and all(int(h.get("step", 0)) >= args.min_step for h in hb.values()):
                break
            if job.p.poll() is not None or time.time() > t_limit:
                res["why"] = f"the run did not reach step {args.min_step} (exit {job.p.poll()})"
                return res
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, args.max_delay))
        hb = heartbeats(hbdir)
        mine = set(descendants(job.p.pid))
        victim = rng.randrange(args.ranks)  # a layout rank
        target = [(l, h) for l, h in hb.items() if int(h["rank"]) == victim]
        if not target or int(target[0][1]["pid"]) not in mine:
            res["why"] = f"rank {victim}'s process not found among mpirun's"
            return res
        pid = int(target[0][1]["pid"])
        res["victim"] = victim
        res["victim_step"] = int(target[0][1].get("step", 0))
        t_sig = time.time()
        os.kill(pid, signal.SIGKILL if sig == "kill" else signal.SIGSTOP)
        # --timeout 0: auto, max(30 s, 5 x the slowest step) (docs/reliability.md)
        deadline = args.timeout if args.timeout > 0 else 30.0
        limit = deadline + args.hard_slack if sig == "stop" else args.hard_slack
        try:
            job.p.wait(timeout=limit + 5)  # hard limit: beyond it a hang
        except subprocess.TimeoutExpired:
            res["hang"] = True
        t_end = time.time()
        res["rc"] = job.p.poll()
        res["end_s"] = t_end - t_sig
    finally:
        job.kill()
    host = socket.gethostname()
    named, times, bad = {}, {}, []
    for t, line in job.lines:
        m = LINE.match(line)
        if not m:
            continue
        r, text = int(m.group(1)), m.group(3)
        ok = (text.startswith(f"rank {victim} (host {host}") and
              re.search(r"waits in group \S+ \(ranks [0-9,L]+\) [a-z_]+ #\d+", text) is not None)
        if r == victim:
            continue  # a stopped victim resumed by the launcher's SIGCONT may print too
        if r not in named:
            named[r] = ok
            times[r] = t - t_sig
            if not ok:
                bad.append(f"rank {r} named someone else: {line}")
    survivors = [r for r in range(args.ranks) if r != victim]
    missing = [r for r in survivors if r not in named]
    res["named"] = sum(1 for r in survivors if named.get(r))
    res["survivors"] = len(survivors)
    res["detect_s"] = [round(times[r], 2) for r in sorted(times)]
    if res["hang"]:
        res["why"] = f"hang: the job had not ended {res['end_s']:.0f} s after the signal"
    elif res["rc"] == 0:
        res["why"] = "the job exited 0"
    elif bad:
        res["why"] = bad[0]
    elif missing:
        res["why"] = f"ranks {missing} printed no watchdog line"
    else:
        res["ok"] = True
    if sig == "kill" and args.resume and res["ok"]:
        res.update(check_resume(args, work))
    return res


def check_resume(args, work):
    """Relaunch with --resume auto: it must load the newest complete checkpoint."""
    ckpt = os.path.join(work, "ckpt")
    steps = sorted(int(d[5:]) for d in os.listdir(ckpt) if re.fullmatch(r"step_\d+", d)
                   and os.path.isfile(os.path.join(ckpt, d, "COMPLETE"))) if os.path.isdir(ckpt) else []
    if not steps:
        return {"resume": "no complete checkpoint (killed before the first)"}
    newest = os.path.join(ckpt, f"step_{steps[-1]}")
    cmd = train_cmd(args, work) + ["--resume", "auto"]
    i = cmd.index("train.steps=100000")
    cmd[i] = f"train.steps={steps[-1] + 2}"
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env())
    ok = r.returncode == 0 and f"resumed from {newest}" in r.stdout
    return {"resume": "ok" if ok else f"FAILED (rc {r.returncode}): {r.stdout[-500:]}{r.stderr[-500:]}",
            "resumed_step": steps[-1]}


def summary(results, sig):
    rs = [r for r in results if r["signal"] == sig]
    if not rs:
        return ""
    det = [t for r in rs for t in r.get("detect_s", [])]
    ends = [r["end_s"] for r in rs if "end_s" in r]
    named = sum(r.get("named", 0) for r in rs)
    surv = sum(r.get("survivors", 0) for r in rs)
    lines = [f"SIG{sig.upper()}: {len(rs)} trials, {sum(r['ok'] for r in rs)} with every survivor naming the "
             f"victim; survivors naming it {named}/{surv}; hangs {sum(r['hang'] for r in rs)}"]
    if det:
        lines.append(f"  detection (watchdog line after the signal): median {statistics.median(det):.2f} s, "
                     f"max {max(det):.2f} s over {len(det)} lines")
    if ends:
        lines.append(f"  job end after the signal: median {statistics.median(ends):.2f} s, max {max(ends):.2f} s")
    res = [r for r in rs if "resume" in r]
    if res:
        lines.append(f"  --resume auto: {sum(r['resume'] == 'ok' for r in res)}/{len(res)} resumed from the "
                     f"newest complete checkpoint")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--signal", choices=["kill", "stop", "both"], default="both")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--layout", default="tp=2,dp=2,pp=2")
    ap.add_argument("--timeout", type=float, default=5, help="train.collective_timeout_s")
    ap.add_argument("--min-step", type=int, default=3, help="steps every rank finishes before the signal")
    ap.add_argument("--max-delay", type=float, default=3.0, help="random delay after that, s")
    ap.add_argument("--start-limit", type=float, default=120)
    ap.add_argument("--hard-slack", type=float, default=25,
                    help="a job not ended this long after the signal (+ the deadline for SIGSTOP) hangs")
    ap.add_argument("--ckpt-interval", type=int, default=5)
    ap.add_argument("--set", action="append", default=[], help="extra --set KEY=VALUE")
    ap.add_argument("--resume", action="store_true", help="after each kill, check --resume auto")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", default=None, help="write every trial's figures here")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    os.makedirs(args.work, exist_ok=True)
    sigs = ["kill", "stop"] if args.signal == "both" else [args.signal]
    print(f"chaos: {args.trials} trials x {sigs}, {args.ranks} ranks ({args.layout}), "
          f"train.collective_timeout_s={args.timeout}, seed {seed}", flush=True)
    results = []
    for sig in sigs:
        for k in range(args.trials):
            r = trial(args, k, sig, rng)
            results.append(r)
            print(f"{'ok  ' if r['ok'] else 'FAIL'} {sig} trial {k}: victim rank {r.get('victim')} "
                  f"(step {r.get('victim_step')}), named by {r.get('named', 0)}/{r.get('survivors', 0)}, "
                  f"detect {r.get('detect_s')}, end {r.get('end_s', float('nan')):.2f} s, rc {r.get('rc')}"
                  + (f", resume {r['resume']}" if "resume" in r else "") + (f" -- {r['why']}" if r["why"] else ""),
                  flush=True)
    print("\n== summary ==")
    for sig in sigs:
        print(summary(results, sig))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seed": seed, "args": vars(args), "trials": results}, f, indent=1)
    sys.exit(0 if all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""ctest end of the watchdog (docs/reliability.md "Hang and death detection").

  --mode stop   SIGSTOP one random rank of a 4-rank run (tp2 dp2) mid-run, with
                train.collective_timeout_s=5: every other rank prints the
                stopped rank's number and host, the group, operation and
                sequence number it waits in, and the job ends non-zero within
                the deadline + 60 s (else: a hang, the test kills it and fails).
  --mode kill   the same with SIGKILL: every survivor names the dead rank.
  --mode stall  a random rank's main thread stops for good before a tp
                collective mid-run (ADGT_TEST_STALL, as on a stuck device): the
                process stays alive and its watchdog heartbeats, so the others
                must find it by its sequence number (it has not entered the
                operation and waits in no other); every other rank names it.
  --mode clean  a normal run with the small deadline, an evaluation and a
                checkpoint save every 10 steps, must not trip: exit 0, no
                watchdog line, and every rank's heartbeat ends "done" with its
                groups' sequence numbers counted (the watchdog really ran).

The trial itself is scripts/reliability/chaos.py's (the campaign's).
"""
import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts", "reliability"))
import chaos  # noqa: E402


# What the tests bound is only what load cannot change: the right rank is
# named, and the job ends before an outside limit many times the 5 s
# deadline (detection takes about the deadline: the chaos campaign's
# figures are scripts/reliability/chaos.py's, a benchmark). A hang never ends.
HARD_SLACK = 60

def clean(args):
    work = os.path.join(args.work, "clean")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    ns = types.SimpleNamespace(data=args.data, timeout=args.timeout, ckpt_interval=10, layout="tp=2,dp=2",
                               set=["train.eval_interval=10", "train.eval_batches=2"], ranks=4, train=args.train)
    cmd = chaos.train_cmd(ns, work)
    cmd[cmd.index("train.steps=100000")] = "train.steps=30"
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=chaos.env())
    out = r.stdout + r.stderr
    with open(os.path.join(work, "run.log"), "w") as f:
        f.write(out)
    if r.returncode != 0 or "watchdog" in out:
        sys.exit(f"FAIL: the clean run tripped or failed (rc {r.returncode}):\n{out[-3000:]}")
    if "checkpoint: " not in out or "eval step 30" not in out:
        sys.exit(f"FAIL: the clean run did not save and evaluate:\n{out[-2000:]}")
    hb = chaos.heartbeats(os.path.join(work, ".heartbeat"))
    if len(hb) != 4:
        sys.exit(f"FAIL: {len(hb)} heartbeat files, expected 4")
    for l, h in sorted(hb.items()):
        seqs = [int(g.split()[3]) for g in h.get("groups", [])]
        if h.get("state") != "done" or int(h.get("step", 0)) != 30 or not seqs or max(seqs) < 30:
            sys.exit(f"FAIL: rank {l}'s last heartbeat: state {h.get('state')}, step {h.get('step')}, "
                     f"group seqs {seqs} (expected done, 30, counted collectives)")
    print(f"PASS: 30 steps with train.collective_timeout_s={args.timeout}, eval and 3 checkpoint saves: no "
          f"watchdog exit; heartbeats done, collectives counted (max seq {max(seqs)})")


def stall(args, seed):
    rng = random.Random(seed)
    work = os.path.join(args.work, "stall")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    victim, seq = rng.randrange(4), rng.randrange(150, 400)  # tp: ~47 collectives a step
    ns = types.SimpleNamespace(data=args.data, timeout=args.timeout, ckpt_interval=0, layout="tp=2,dp=2",
                               set=[], ranks=4, train=args.train)
    env = dict(chaos.env(), ADGT_TEST_STALL=f"{victim}:tp:{seq}")
    job = chaos.Job(chaos.train_cmd(ns, work), os.path.join(work, "run.log"), env)
    try:
        job.p.wait(timeout=120)
        hang = False
    except subprocess.TimeoutExpired:
        hang = True
    finally:
        job.kill()
    if hang:
        sys.exit(f"FAIL: hang: the job had not ended 120 s after start (see {work}/run.log)")
    host = chaos.socket.gethostname()
    named = {}
    for _, line in job.lines:
        m = chaos.LINE.match(line)
        if m and int(m.group(1)) != victim:
            named.setdefault(int(m.group(1)), m.group(3))
    bad = {r: t for r, t in named.items()
           if not (t.startswith(f"rank {victim} (host {host}") and "waits in no communication operation" in t
                   and re.search(r"has not entered \S+ [a-z_]+ #\d+", t))}
    missing = [r for r in range(4) if r != victim and r not in named]
    if job.p.returncode == 0 or bad or missing:
        sys.exit(f"FAIL (seed {seed}): rc {job.p.returncode}, ranks without a line {missing}, wrong lines {bad}")
    print(f"PASS: rank {victim} stalled before tp collective #{seq}: named by {len(named)}/3 as not "
          f"progressing; e.g. {next(iter(named.values()))}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["stop", "kill", "stall", "clean"], required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--timeout", type=float, default=5)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    if args.mode == "clean":
        return clean(args)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    if args.mode == "stall":
        return stall(args, seed)
    ns = types.SimpleNamespace(data=args.data, timeout=args.timeout, ckpt_interval=0, layout="tp=2,dp=2",
                               set=[], ranks=4, train=args.train, min_step=3, max_delay=1.0,
                               start_limit=120, hard_slack=HARD_SLACK, resume=False, work=args.work)
    r = chaos.trial(ns, 0, args.mode, random.Random(seed))
    print(f"seed {seed}: {r}")
    if not r["ok"]:
        sys.exit(f"FAIL: {r['why']} (see {args.work}/{args.mode}_0/run.log)")
    limit = args.timeout + HARD_SLACK if args.mode == "stop" else HARD_SLACK
    if r["end_s"] > limit:
        sys.exit(f"FAIL: the job ended {r['end_s']:.1f} s after the signal (limit {limit} s)")
    print(f"PASS: SIG{args.mode.upper()} of rank {r['victim']}: named by {r['named']}/{r['survivors']} "
          f"survivors (after {r['detect_s']} s); the job ended non-zero after {r['end_s']:.1f} s")


if __name__ == "__main__":
    main()

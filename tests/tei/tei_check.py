"""The Training Efficiency Index over an interrupted job (docs/tei.md).

One job in one log directory, three runs of adgt-train on 2 CPU ranks:
  1. stopped by SIGTERM (to one rank) once metrics.jsonl shows step >= 3:
     it saves a checkpoint at the step boundary and exits 0;
  2. --resume auto, killed (SIGKILL to one rank) two steps after its first
     periodic checkpoint: the steps after that checkpoint are lost work;
  3. --resume auto to the end: its summary prints the TEI block.
Then, from metrics.jsonl alone, this script recomputes the job's TEI and
breakdown with the formulas of docs/tei.md (its own implementation, over
every record, not the program's pruned copy) and checks that
  - the last record reports TEI over all three runs and equals the
    recomputation (relative 1e-9), every breakdown field likewise;
  - the job's wall-clock is the sum of the three runs' (each measured from
    its process start), and no run's is longer than this script saw it run;
  - the lost steps are run 2's steps after the checkpoint run 3 resumed
    from, and lost time and every run's start-up are counted;
  - every TEI record's breakdown sums to 100% +- 0.1;
  - the summary's TEI line shows the recorded figure.
"""
import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "configs", "tiny.yaml")
STEPS = 60
CKPT_EVERY = 10
# ~40 ms a step on 2 ranks here: slow enough for the signals to land mid-run.
SETS = ["model.vocab_size=256", "model.d_model=64", "model.n_layers=2", "model.n_heads=4",
        "model.n_kv_heads=2", "model.ffn_hidden=128", "model.seq_len=64", "train.micro_batch=4",
        "train.global_batch=32", "parallel.dp=2", "train.device=cpu", "train.warmup_steps=2",
        f"train.steps={STEPS}", "train.eval_interval=20", "train.eval_batches=2",
        "log.interval=1", f"checkpoint.interval={CKPT_EVERY}", "checkpoint.keep=0",
        "data.tokenizer=byte"]
CATEGORIES = ["useful", "below_peak", "recompute", "comm", "bubble", "optimizer", "checkpoint",
              "eval", "startup", "lost", "other"]


def fail(msg):
    sys.exit("FAIL: " + msg)


def records(path):
    out = []
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a torn last line
    return out


def train_ranks(pid):
    """The adgt-train processes under the launcher `pid` (found through /proc)."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(d))
        except (OSError, IndexError, ValueError):
            pass
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            todo.append(c)
            try:
                with open(f"/proc/{c}/cmdline", "rb") as f:
                    if b"adgt-train" in f.read().split(b"\0")[0]:
                        found.append(c)
            except OSError:
                pass
    return sorted(found)


def launch(args, work, resume):
    cmd = [args.mpirun, "2", args.train, "--config", TINY]
    if resume:
        cmd += ["--resume", "auto"]
    for s in SETS + [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
                     f"log.dir={work}", f"checkpoint.dir={work}/ckpt"]:
        cmd += ["--set", s]
    print("+", " ".join(cmd), flush=True)
    out = open(os.path.join(work, f"stdout_{int(time.time() * 1000)}.txt"), "w+")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True), out


def finish(p, out, timeout=120):
    p.wait(timeout=timeout)
    out.seek(0)
    text = out.read()
    out.close()
    return text


def wait_for(p, cond, what, timeout=90):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        if p.poll() is not None:
            fail(f"the run ended (exit {p.returncode}) before {what}")
        time.sleep(0.01)
    p.kill()
    fail(f"timed out waiting for {what}")


def run_records(recs):
    """[(run_start record, [tei records])] in order."""
    runs = []
    for r in recs:
        if r.get("event") == "run_start":
            runs.append((r, []))
        elif r.get("event") == "tei" and runs:
            runs[-1][1].append(r)
    return runs


def recompute(runs):
    """docs/tei.md, written out again: the job's TEI and breakdown."""
    n = len(runs)
    cat = {k: 0.0 for k in CATEGORIES}
    cap = counted_flops = 0.0
    wall = 0.0
    counted_steps = lost_steps = 0
    for k, (start, recs) in enumerate(runs):
        later = [runs[j][0]["resumed_from"] for j in range(k + 1, n)]
        last = recs[-1]["counters"]
        peak = recs[-1]["peak_tflops"] * 1e12
        if not later:
            kept = last
        else:
            cutoff = min(later)
            ck = [r for r in recs if r["at"] == "checkpoint" and r["step"] <= cutoff]
            if ck:
                kept = max(ck, key=lambda r: r["step"])["counters"]
            else:
                kept = {key: 0 for key in last}
                kept["wall_s"] = kept["startup_s"] = last["startup_s"]
        compute = kept["step_s"] - kept["comm_s"] - kept["bubble_s"] - kept["optimizer_s"]
        useful = kept["model_flops"] / peak
        fl = kept["model_flops"] + kept["recompute_flops"]
        rc = compute * kept["recompute_flops"] / fl if fl > 0 else 0.0
        parts = {
            "useful": useful, "recompute": rc, "below_peak": compute - rc - useful,
            "comm": kept["comm_s"], "bubble": kept["bubble_s"], "optimizer": kept["optimizer_s"],
            "checkpoint": kept["checkpoint_s"], "eval": kept["eval_s"],
            "startup": kept["startup_s"],
            "lost": last["wall_s"] - kept["wall_s"] + kept["skipped_s"],
            "other": kept["wall_s"] - (kept["startup_s"] + kept["step_s"] + kept["checkpoint_s"]
                                       + kept["eval_s"] + kept["skipped_s"]),
        }
        for key, v in parts.items():
            cat[key] += peak * v
        cap += peak * last["wall_s"]
        counted_flops += kept["model_flops"]
        wall += last["wall_s"] / start["devices"]
        counted_steps += kept["steps"] - kept["skipped_steps"]
        lost_steps += last["steps"] - kept["steps"] + kept["skipped_steps"]
    return {
        "tei": counted_flops / cap,
        "breakdown": {k: v / cap for k, v in cat.items()},
        "wall_s": wall, "counted_steps": counted_steps, "lost_steps": lost_steps,
    }


def close(a, b, rel=1e-9, abs_=1e-12):
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    metrics = os.path.join(work, "metrics.jsonl")
    seen_wall = []

    def steps_logged(run_no):
        runs = run_records(records(metrics))
        if len(runs) < run_no:
            return []
        return runs[run_no - 1][1]

    # 1. SIGTERM to one rank once step >= 3.
    t0 = time.time()
    p, out = launch(args, work, resume=False)
    wait_for(p, lambda: any(r["step"] >= 3 for r in steps_logged(1)), "step 3 of run 1")
    ranks = train_ranks(p.pid)
    if len(ranks) != 2:
        p.kill()
        fail(f"expected 2 adgt-train ranks under the launcher, found {ranks}")
    os.kill(ranks[-1], signal.SIGTERM)
    text1 = finish(p, out)
    seen_wall.append(time.time() - t0)
    m = re.search(r"stopping at step (\d+) on signal", text1)
    if p.returncode != 0 or not m:
        print(text1[-3000:])
        fail(f"run 1: exit {p.returncode}; no 'stopping at step' line")
    stop1 = int(m.group(1))
    if stop1 >= STEPS:
        fail(f"run 1 reached the end ({stop1}) before the signal; the test needs more steps")
    print(f"run 1: SIGTERM -> stopped at step {stop1}")

    # 2. --resume auto; SIGKILL to one rank two steps after its first periodic checkpoint.
    t0 = time.time()
    p, out = launch(args, work, resume=True)

    def ckpt_and_two():
        recs = steps_logged(2)
        ck = [r["step"] for r in recs if r["at"] == "checkpoint"]
        return ck and any(r["step"] >= ck[0] + 2 for r in recs)

    wait_for(p, ckpt_and_two, "a checkpoint and two more steps in run 2")
    for r in train_ranks(p.pid)[:1]:
        os.kill(r, signal.SIGKILL)
    text2 = finish(p, out)
    seen_wall.append(time.time() - t0)
    if p.returncode == 0:
        fail("run 2 exited 0 after SIGKILL")
    print(f"run 2: killed (launcher exit {p.returncode})")

    # 3. --resume auto to the end.
    t0 = time.time()
    p, out = launch(args, work, resume=True)
    text3 = finish(p, out, timeout=300)
    seen_wall.append(time.time() - t0)
    if p.returncode != 0:
        print(text2[-2000:], text3[-3000:])
        fail(f"run 3 exited {p.returncode}")
    block = text3[text3.find("TEI:"):]
    print(block)

    runs = run_records(records(metrics))
    if len(runs) != 3:
        fail(f"metrics.jsonl has {len(runs)} run_start records, expected 3")
    if runs[1][0]["resumed_from"] != stop1:
        fail(f"run 2 resumed from {runs[1][0]['resumed_from']}, run 1 stopped at {stop1}")
    run2_steps = [r["step"] for r in runs[1][1]]
    run2_ckpts = [r["step"] for r in runs[1][1] if r["at"] == "checkpoint"]
    resumed3 = runs[2][0]["resumed_from"]
    if resumed3 not in run2_ckpts:
        fail(f"run 3 resumed from {resumed3}, not one of run 2's checkpoints {run2_ckpts}")
    expected_lost = max(run2_steps) - resumed3
    if expected_lost < 1:
        fail(f"run 2 logged up to step {max(run2_steps)}, no later than checkpoint {resumed3}: "
             "nothing lost; the kill came too late")

    last = runs[2][1][-1]
    if last["at"] != "end" or last["step"] != STEPS:
        fail(f"the last record is {last['at']} at step {last['step']}, not the end at {STEPS}")
    want = recompute(runs)
    job = last["job"]
    print(f"recomputed TEI {want['tei']:.6%}, logged {last['tei']:.6%}; wall {want['wall_s']:.2f} s "
          f"(runs seen {', '.join(f'{w:.2f}' for w in seen_wall)} s); counted "
          f"{want['counted_steps']}, lost {want['lost_steps']} steps")
    print("breakdown: " + ", ".join(f"{k} {100 * v:.2f}%" for k, v in last["breakdown"].items()))
    if job["runs"] != 3:
        fail(f"the last record's TEI covers {job['runs']} runs, not 3")
    if not close(last["tei"], want["tei"]):
        fail(f"TEI {last['tei']} != recomputed {want['tei']}")
    for k in CATEGORIES:
        if not close(last["breakdown"][k], want["breakdown"][k]):
            fail(f"breakdown {k}: {last['breakdown'][k]} != recomputed {want['breakdown'][k]}")
    if not close(job["wall_s"], want["wall_s"]):
        fail(f"job wall {job['wall_s']} != sum of the runs' {want['wall_s']}")
    for i, ((start, recs), seen) in enumerate(zip(runs, seen_wall)):
        w = recs[-1]["counters"]["wall_s"] / start["devices"]
        if not 0 < w <= seen + 0.5:
            fail(f"run {i + 1}: recorded wall {w:.2f} s, but it ran {seen:.2f} s")
        if recs[-1]["counters"]["startup_s"] <= 0:
            fail(f"run {i + 1}: no start-up time")
    if want["lost_steps"] != expected_lost or job["lost_steps"] != expected_lost:
        fail(f"lost steps: recorded {job['lost_steps']}, recomputed {want['lost_steps']}, "
             f"expected {expected_lost} (run 2 logged to {max(run2_steps)}, run 3 resumed {resumed3})")
    if job["counted_steps"] != STEPS:
        fail(f"counted steps {job['counted_steps']} != {STEPS}")
    if not last["breakdown"]["lost"] > 0 or not last["breakdown"]["startup"] > 0:
        fail("the lost work or the start-up is not counted")
    if not 0 < last["tei"] <= 1:
        fail(f"TEI {last['tei']} outside (0, 1]")
    for r in (r for _, recs in runs for r in recs):
        s = sum(r["breakdown"].values())
        if abs(s - 1) > 0.001:
            fail(f"run {r['run']} step {r['step']} ({r['at']}): breakdown sums to {100 * s:.3f}%")
        if r["at"] == "interval" and r["run"] == 3 and r["job"]["runs"] != 3:
            fail(f"run 3 step {r['step']}: TEI over {r['job']['runs']} runs")
    m = re.search(r"^TEI: +([0-9.]+)% \(goodput MFU over 3 runs", text3, re.M)
    if not m or abs(float(m.group(1)) - 100 * last["tei"]) > 0.006:
        fail(f"the summary's TEI line is missing or differs from {100 * last['tei']:.2f}%")
    print(f"PASS: TEI {100 * last['tei']:.2f}% over 3 runs (SIGTERM stop, a kill losing "
          f"{expected_lost} steps, the rest); breakdown sums to 100%")


if __name__ == "__main__":
    main()

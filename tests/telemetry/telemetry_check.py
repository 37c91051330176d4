"""Hardware telemetry in adgt-train's records (docs/telemetry.md).

Runs of a tiny model on CPU ranks, with ADGT_POWERCAP_ROOT pointing at a fake
powercap tree whose package counter this script advances while the run goes
(written whole with a rename, starting near max_energy_range_uj so it wraps):
  1. one rank: the start-up line names the RAPL zone; step records carry
     "telemetry" with energy_j measured by 1 rank; the TEI's end record
     carries "energy" with tokens = steps x global_batch x seq_len and
     j_per_token = energy_j / tokens; the step records' interval energies add
     up to no more than the run's; the summary prints the same J/token;
  2. two ranks of one host: the host's counters are read by one of them
     (energy ranks = 1 everywhere);
  3. log.telemetry_interval_s=0: no telemetry line, key, record or summary line;
  4. a powercap tree with no counters: the start-up line says why, and every
     field is absent (no "telemetry", no "energy", no summary line), not zero.
Nothing here depends on how fast the machine is: which intervals held a
reading varies, so values are checked for consistency, never for size.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "configs", "tiny.yaml")
STEPS = 6
GLOBAL_BATCH = 8
SEQ = 64
RANGE = 262143328850  # a real package's max_energy_range_uj
SETS = ["model.vocab_size=256", "model.d_model=64", "model.n_layers=2", "model.n_heads=4",
        "model.n_kv_heads=2", "model.ffn_hidden=128", f"model.seq_len={SEQ}",
        "train.micro_batch=4", f"train.global_batch={GLOBAL_BATCH}", "train.device=cpu",
        "train.warmup_steps=2", f"train.steps={STEPS}", "train.eval_interval=0",
        "log.interval=1", "checkpoint.interval=0", "checkpoint.at_end=false",
        "data.tokenizer=byte"]


def fail(msg):
    sys.exit("FAIL: " + msg)


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)


def fake_tree(d, with_counters=True):
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    if not with_counters:
        return None
    z = os.path.join(d, "intel-rapl:0")
    os.makedirs(z)
    write_atomic(os.path.join(z, "name"), "package-0")
    write_atomic(os.path.join(z, "max_energy_range_uj"), str(RANGE))
    counter = os.path.join(z, "energy_uj")
    write_atomic(counter, str(RANGE - 3_000_000))
    return counter


class Advance(threading.Thread):
    """Adds 1 J to the counter every 5 ms (wrapping at RANGE) until stopped."""

    def __init__(self, counter):
        super().__init__(daemon=True)
        self.counter, self.value, self.done = counter, RANGE - 3_000_000, threading.Event()

    def run(self):
        while not self.done.wait(0.005):
            self.value = (self.value + 1_000_000) % RANGE
            write_atomic(self.counter, str(self.value))


def train(args, work, ranks, sets, env_extra):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    cmd = ([args.mpirun, str(ranks)] if ranks > 1 else []) + [args.train, "--config", TINY]
    extra = [f"parallel.dp={ranks}"] if ranks > 1 else []
    for s in SETS + extra + sets + [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
                                    f"log.dir={work}", f"checkpoint.dir={work}/ckpt"]:
        cmd += ["--set", s]
    env = dict(os.environ, OMP_NUM_THREADS="1", **env_extra)
    print("+", " ".join(f"{k}={v}" for k, v in env_extra.items()), " ".join(cmd), flush=True)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=180)
    if p.returncode != 0:
        print(p.stdout)
        fail(f"adgt-train exited {p.returncode}")
    with open(os.path.join(work, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return p.stdout, recs


def step_records(recs):
    return [r for r in recs if "loss" in r and "event" not in r]


def end_record(recs):
    ends = [r for r in recs if r.get("event") == "tei" and r.get("at") == "end"]
    if len(ends) != 1:
        fail(f"{len(ends)} TEI end records")
    return ends[0]


def check_measured(name, out, recs, ranks):
    if not re.search(r"^telemetry: every 0\.02 s on each rank; rank 0 reads RAPL intel-rapl:0 \(package-0\)",
                     out, re.M):
        fail(f"{name}: no start-up line naming the RAPL zone:\n{out}")
    steps = step_records(recs)
    if len(steps) != STEPS:
        fail(f"{name}: {len(steps)} step records, expected {STEPS}")
    # The first interval holds the baseline reading at least: energy measured (by one rank).
    if "telemetry" not in steps[0] or "energy_j" not in steps[0]["telemetry"]:
        fail(f"{name}: the first step record has no telemetry.energy_j: {steps[0]}")
    interval_sum = 0.0
    for r in steps:
        t = r.get("telemetry", {})
        for field, v in t.items():
            if not (v["min"] <= v["mean"] + 1e-9 and v["mean"] <= v["max"] + 1e-9):
                fail(f"{name}: step {r['step']} {field}: min/mean/max out of order: {v}")
        unexpected = set(t) - {"energy_j", "power_w"}  # RAPL reads no temperatures, clocks or reasons
        if unexpected:
            fail(f"{name}: step {r['step']}: fields a RAPL source cannot have: {sorted(unexpected)}")
        if "energy_j" in t:
            e = t["energy_j"]
            if e["ranks"] != 1 or e["min"] < 0 or abs(e["total"] - e["mean"]) > 1e-9:
                fail(f"{name}: step {r['step']}: energy_j should be one rank's, >= 0: {e}")
            interval_sum += e["total"]
    end = end_record(recs)
    e = end.get("energy")
    if not e:
        fail(f"{name}: the TEI end record has no energy: {end}")
    tokens = STEPS * GLOBAL_BATCH * SEQ
    if e["tokens"] != tokens or e["ranks"] != 1:
        fail(f"{name}: energy tokens {e['tokens']} (expected {tokens}), ranks {e['ranks']} (expected 1)")
    if e["energy_j"] < 0 or abs(e["j_per_token"] - e["energy_j"] / tokens) > 1e-12 * max(1, e["j_per_token"]):
        fail(f"{name}: j_per_token {e['j_per_token']} is not energy_j / tokens ({e['energy_j']} / {tokens})")
    if interval_sum > e["energy_j"] + 1e-6:
        fail(f"{name}: the intervals' energy {interval_sum} exceeds the run's {e['energy_j']}")
    if "throttled_share" in e:
        fail(f"{name}: a RAPL source has no throttle reasons, yet: {e}")
    m = re.search(r"^energy: +(\S+) J/token \((\S+) J over (\d+) tokens, 1 rank measured", out, re.M)
    if not m:
        fail(f"{name}: no energy line in the summary:\n{out}")
    if m.group(1) != f"{e['j_per_token']:.4g}" or int(m.group(3)) != tokens:
        fail(f"{name}: summary '{m.group(0)}' against the record {e}")
    print(f"{name}: ok ({e['energy_j']:.3f} J, {e['j_per_token']:.4g} J/token, "
          f"{sum('telemetry' in r for r in steps)} of {STEPS} step records with telemetry)")


def check_absent(name, out, recs):
    if any("telemetry" in r for r in recs):
        fail(f"{name}: a record has telemetry")
    if "energy" in end_record(recs):
        fail(f"{name}: the TEI end record has energy")
    if re.search(r"^(energy|throttled):", out, re.M):
        fail(f"{name}: the summary has an energy or throttled line:\n{out}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    tree = os.path.join(args.work, "powercap")
    on = ["log.telemetry_interval_s=0.02"]

    for name, ranks in [("one rank", 1), ("two ranks of one host", 2)]:
        counter = fake_tree(tree)
        adv = Advance(counter)
        adv.start()
        try:
            out, recs = train(args, os.path.join(args.work, f"np{ranks}"), ranks, on,
                              {"ADGT_POWERCAP_ROOT": tree})
        finally:
            adv.done.set()
            adv.join()
        check_measured(name, out, recs, ranks)

    fake_tree(tree)
    out, recs = train(args, os.path.join(args.work, "off"), 1, ["log.telemetry_interval_s=0"],
                      {"ADGT_POWERCAP_ROOT": tree})
    check_absent("off", out, recs)
    if "telemetry:" in out:
        fail("off: a telemetry start-up line")
    print("off: ok (no telemetry anywhere)")

    fake_tree(tree, with_counters=False)
    out, recs = train(args, os.path.join(args.work, "none"), 1, on, {"ADGT_POWERCAP_ROOT": tree})
    if not re.search(r"^telemetry: every 0\.02 s on each rank; rank 0 reads nothing: no RAPL energy "
                     r"counters under .*; its fields are absent", out, re.M):
        fail(f"none: no start-up line saying why nothing is read:\n{out}")
    check_absent("nothing readable", out, recs)
    print("nothing readable: ok (every field absent)")
    print("telemetry: ok")


if __name__ == "__main__":
    main()

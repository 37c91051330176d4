#!/usr/bin/env python3
"""The power model end to end (docs/power.md): adgt-sim --power-cap, and
emulate.power_cap_w with the power controller on 2 CPU ranks.

  - adgt-sim: a 400 W cap lengthens the 70B step on dgx-h100 and lowers its
    mean power and joules per token; a cluster without a power model and a
    cap at or below idle are refused by name;
  - emulate.power_cap_w on the model clock (each rank's compute its counted
    matmul FLOPs: deterministic): micro-batch 8 on tests/power/capped-cpu.yaml
    at 33 W runs its steps the printed factor slower than uncapped
    (the printed factor > 1.4), micro-batch 2 under 1.1x;
  - the power controller logs a decision every 5 steps from step 10 with the
    throttled ranks and the factor as inputs, and takes the candidate the
    simulator predicts fastest (logged with every candidate): on capped-cpu
    micro-batch 8 stays (it is still predicted fastest under the cap: see
    docs/power.md on why a per-kernel power model never favours a smaller
    micro-batch); parallel.adapt off, or no cap: no decision is logged;
  - on capped-flat.yaml with pp 2 the controller switches the micro-batch at
    step 10 (f64): the losses of steps 1-10 equal an uncapped run's bit for
    bit, and every step is within 1e-12 of an uncapped run at the chosen
    micro-batch from the start (the switch carries the f64 state exactly);
  - the limiter (capped-spiky.yaml, f64, 86 W): micro-batch 8 >= 1.4x slower
    than uncapped, micro-batch 2 unthrottled; the controller switches once
    within 20 steps and recovers >= 60% of the slowdown, the losses within
    1e-12 of a run at the new micro-batch from the start; 1000 steps at
    micro-batch 2 under the cap: no switch;
  - throttling read from telemetry instead (--fake-nvml: every rank reads a
    fake NVML, log.telemetry_source nvml, FAKE_NVML_STATE a GPU held at
    1100 of 1980 MHz by an 86 W limit; no emulate.power_cap_w): the same
    decision at the same step as the emulation's (its candidates equal), the
    switch made, the losses the emulated run's bit for bit; the clock's
    slowdown 1980/1100 and the limit logged as inputs; thermal reasons only:
    the cap planned under is the power the device holds; no reason set: no
    decision logged; with parallel.auto the layout re-planned under the
    limit is the plan the launch makes under emulate.power_cap_w at that cap.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys


def run(cmd, expect=0, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))
    if p.returncode != expect:
        sys.exit(f"FAIL: exit {p.returncode} (expected {expect}): {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p


def records(log_dir):
    with open(os.path.join(log_dir, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--sim", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--source", required=True)  # the source tree
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--fake-nvml", required=True)  # tests/telemetry/fake_nvml.c, built
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    fails = []

    # adgt-sim --power-cap
    sim = [a.sim, "--config", f"{a.source}/configs/llama-70b.yaml", "--cluster", "dgx-h100", "--set",
           "train.dtype=bf16", "--set", "parallel.tp=8", "--set", "parallel.pp=4", "--set", "parallel.dp=8", "--json"]
    free = json.loads(run(sim).stdout)
    capped = json.loads(run(sim + ["--power-cap", "400"]).stdout)
    print(f"70B tp8 pp4 dp8: {free['step_time_s']:.3f} s {free['mean_power_w']:.0f} W "
          f"{free['energy_per_token_j']:.4f} J/token; at 400 W {capped['step_time_s']:.3f} s "
          f"{capped['mean_power_w']:.0f} W {capped['energy_per_token_j']:.4f} J/token")
    if not (capped["step_time_s"] > free["step_time_s"] and capped["mean_power_w"] < free["mean_power_w"]
            and capped["energy_per_token_j"] < free["energy_per_token_j"]):
        fails.append("a 400 W cap did not lengthen the step and lower its power and energy")
    p = run([x if x != "dgx-h100" else "cpu-here" for x in sim] + ["--power-cap", "100"], expect=2)
    if "no power model" not in p.stderr:
        fails.append(f"--power-cap on cpu-here: {p.stderr[-300:]}")
    p = run(sim[:-1] + ["--power-cap", "50"], expect=2)
    if "idle" not in p.stderr:
        fails.append(f"--power-cap 50 (below idle): {p.stderr[-300:]}")

    def launch(cluster, *sets, config=f"{a.source}/tests/layouts/model.yaml"):
        """adgt-train of the layout model (or `config`) on 2 ranks emulating
        tests/power/<cluster>, on the model clock (each rank's compute its counted
        matmul FLOPs: deterministic)."""
        common = [f"emulate.cluster={a.source}/tests/power/{cluster}", "emulate.clock=model",
                  f"data.train={a.data}/train.bin", f"data.val={a.data}/val.bin", "checkpoint.at_end=false",
                  "checkpoint.interval=0", "log.interval=1"]
        return [a.mpirun, "2", a.train, "--config", config] + \
            sum([["--set", x] for x in common + list(sets)], [])

    # emulate.power_cap_w on 2 ranks, the model clock.
    base = launch("capped-cpu.yaml", "parallel.dp=2")

    def train(name, mb, steps, extra):
        d = os.path.join(a.work, name)
        p = run(base + ["--set", f"train.micro_batch={mb}", "--set", f"train.steps={steps}",
                        "--set", f"log.dir={d}"] + extra)
        m = re.search(r"computes x([0-9.]+) at micro-batch", p.stdout)
        # Each step's time (log.interval 1): tokens per step / tokens_per_s.
        steps_s = [1.0 / r["tokens_per_s"] for r in records(d) if "tokens_per_s" in r and "event" not in r]
        return d, (float(m.group(1)) if m else None), steps_s

    d8, f8, s8 = train("mb8_cap", 8, 20, ["--set", "emulate.power_cap_w=33"])
    _, f8_off, s8_free = train("mb8_free", 8, 6, [])
    _, f2, _ = train("mb2_cap", 2, 4, ["--set", "emulate.power_cap_w=33", "--set", "parallel.adapt=off"])
    print(f"factors at 33 W: micro-batch 8 x{f8}, micro-batch 2 x{f2}; uncapped: {f8_off}")
    if f8 is None or f8 < 1.4 or f2 is None or f2 >= 1.1 or f8_off is not None:
        fails.append(f"factors: micro-batch 8 x{f8} (want >= 1.4), 2 x{f2} (want < 1.1), uncapped {f8_off} (want none printed)")
    if s8 and s8_free:
        ratio = sorted(s8[2:])[len(s8[2:]) // 2] / sorted(s8_free[2:])[len(s8_free[2:]) // 2]
        print(f"model-clock step time, capped / uncapped: {ratio:.3f}")
        if not (0.9 * f8 <= ratio <= 1.02 * f8):
            fails.append(f"capped steps {ratio:.3f}x the uncapped, the factor is {f8}")
    else:
        fails.append(f"no step times logged ({len(s8)}, {len(s8_free)})")
    dec = [r for r in records(d8) if r.get("event") == "controller" and r.get("controller") == "power"]
    if [r["step"] for r in dec] != [10, 15, 20]:
        fails.append(f"power decisions at steps {[r['step'] for r in dec]}, expected 10, 15, 20")
    for r in dec:
        i, d = r["inputs"], r["decision"]
        if i["throttled_ranks"] != 2 or abs(i["clock_slowdown"] - f8) > 1e-3 * f8:
            fails.append(f"step {r['step']}: inputs {i}")
        cands = d.get("candidates", [])
        best = min(cands, key=lambda c: c["predicted_step_s"]) if cands else None
        want = "none" if best is None or best["micro_batch"] == 8 or \
            best["predicted_step_s"] > 0.95 * d["predicted_now_s"] else "switch"
        if sorted(c["micro_batch"] for c in cands) != [1, 2, 4, 8] or d["action"] != want:
            fails.append(f"step {r['step']}: decision {d} (expected {want})")
    print(f"power decisions: {[(r['step'], r['decision']['action']) for r in dec]}; candidates "
          f"{[(c['micro_batch'], round(c['predicted_step_s'], 5)) for c in dec[0]['decision']['candidates']] if dec else []}")
    for name in ("mb8_free", "mb2_cap"):
        if any(r.get("controller") == "power" for r in records(os.path.join(a.work, name))):
            fails.append(f"{name}: a power decision was logged")
    # The switch: on tests/power/capped-flat.yaml every micro-batch throttles
    # alike and the simulator prefers the smaller pipeline bubble of a small
    # micro-batch, so the controller asks for it at step 10 (f64, pp 2).
    flat = launch("capped-flat.yaml", "parallel.pp=2", "train.dtype=f64", "train.steps=20")

    def losses(d):
        return {r["step"]: r["loss"] for r in records(d) if "loss" in r and "event" not in r}

    sw, ref, res = (os.path.join(a.work, n) for n in ("flat_capped", "flat_free", "flat_resumed"))
    run(flat + ["--set", "train.micro_batch=8", "--set", "emulate.power_cap_w=40", "--set", f"log.dir={sw}"])
    run(flat + ["--set", "train.micro_batch=8", "--set", f"log.dir={ref}"])
    dec = [r for r in records(sw) if r.get("controller") == "power"]
    first = dec[0]["decision"] if dec else {}
    chosen = first.get("micro_batch")
    switches = [r for r in records(sw) if r.get("event") == "switch"]
    print(f"capped-flat: decisions {[(r['step'], r['decision']['action']) for r in dec]}, chosen micro-batch "
          f"{chosen}, switches at {[r.get('step') for r in switches]}")
    cands = first.get("candidates", [])
    if not dec or dec[0]["step"] != 10 or first.get("action") != "switch" or not cands or \
            chosen != min(cands, key=lambda c: c["predicted_step_s"])["micro_batch"] or chosen == 8:
        fails.append(f"capped-flat: the first decision {dec[0] if dec else None} is not a switch to the fastest candidate")
    elif len(switches) != 1 or f"train.micro_batch={chosen}" not in json.dumps(switches[0]):
        fails.append(f"capped-flat: switches {switches}")
    elif any(r["decision"]["action"] != "none" for r in dec[1:]):
        fails.append(f"capped-flat: decisions after the switch {[r['decision'] for r in dec[1:]]}")
    else:
        # The numbers: steps 1-10 those of the uncapped run (the cap changes
        # no number), bit for bit; every step within 1e-12 of an uncapped run
        # at the new micro-batch from the start (the in-memory switch of an
        # f64 run that keeps its layout carries the state in f64: only the
        # accumulation order differs).
        run(flat + ["--set", f"train.micro_batch={chosen}", "--set", f"log.dir={res}"])
        ls, lr, lres = losses(sw), losses(ref), losses(res)
        bad = [s for s in range(1, 11) if ls.get(s) != lr.get(s)]
        worst = max(abs(ls[s] - lres[s]) for s in lres) if ls.keys() == lres.keys() else float("inf")
        print(f"capped-flat: steps 1-10 = the uncapped run: {'bitwise' if not bad else 'differ at ' + str(bad)}; "
              f"against micro-batch {chosen} from the start: max |diff| {worst:.2e} (bound 1e-12)")
        if bad or not worst <= 1e-12:
            fails.append(f"capped-flat: losses differ at steps {bad}, or by {worst:.3e} from micro-batch {chosen}")

    # The limiter (tests/power/capped-spiky.yaml, f64, 86 W; docs/power.md,
    # "The limiter"): micro-batch 8's long GEMM bursts trip the brake,
    # micro-batch 2's do not. A dp2 run at micro-batch 8 must be >= 1.4x slower
    # than uncapped, the controller must switch once within 20 steps and
    # recover >= 60% of the slowdown, the losses must stay within 1e-12 (f64)
    # of a run at the new micro-batch from the start, and 1000 steps at the
    # unthrottled micro-batch 2 under the same cap must switch nothing.
    spk = launch("capped-spiky.yaml", "parallel.dp=2", "train.dtype=f64")

    def spiky(name, mb, steps, extra):
        d = os.path.join(a.work, name)
        p = run(spk + ["--set", f"train.micro_batch={mb}", "--set", f"train.steps={steps}",
                       "--set", f"log.dir={d}"] + sum([["--set", x] for x in extra], []))
        m = re.search(r"computes x([0-9.]+) at micro-batch", p.stdout)
        times = {r["step"]: 1.0 / r["tokens_per_s"] for r in records(d) if "tokens_per_s" in r and "event" not in r}
        return d, (float(m.group(1)) if m else None), times

    def median(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2] if xs else float("nan")

    ad, f8, t_ad = spiky("spiky_adapt", 8, 30, ["emulate.power_cap_w=86"])
    _, _, t_free = spiky("spiky_free8", 8, 6, [])
    _, f2, _ = spiky("spiky_mb2", 2, 4, ["emulate.power_cap_w=86", "parallel.adapt=off"])
    dec = [r for r in records(ad) if r.get("controller") == "power"]
    sw = [r for r in records(ad) if r.get("event") == "switch"]
    first = next((r for r in dec if r["decision"]["action"] == "switch"), None)
    chosen = first["decision"].get("micro_batch") if first else None
    print(f"capped-spiky (f64, 86 W): micro-batch 8 x{f8}, micro-batch 2 x{f2}; decisions "
          f"{[(r['step'], r['decision']['action'], r['decision'].get('micro_batch')) for r in dec]}; "
          f"switches at {[r['step'] for r in sw]}")
    if f8 is None or f8 < 1.4 or f2 != 1.0:
        fails.append(f"capped-spiky: factors micro-batch 8 x{f8} (want >= 1.4), 2 x{f2} (want 1.000)")
    # adgt-sim reports the same walk: the busiest rank's slowdown and braked share.
    for mb, want in ((8, f8), (2, 1.0)):
        j = json.loads(run([a.sim, "--config", f"{a.source}/tests/layouts/model.yaml", "--cluster",
                            f"{a.source}/tests/power/capped-spiky.yaml", "--set", "parallel.dp=2", "--set",
                            "train.dtype=f64", "--set", f"train.micro_batch={mb}", "--power-cap", "86",
                            "--json"]).stdout)
        if want is None or abs(j.get("limiter_slowdown", -1) - want) > 1e-3 * want or \
                (j.get("limiter_braked_share", -1) > 0) != (mb == 8):
            fails.append(f"adgt-sim --power-cap 86, micro-batch {mb}: limiter {j.get('limiter_slowdown')} "
                         f"braked {j.get('limiter_braked_share')} (the emulation's factor x{want})")
    if first is None or first["step"] > 20 or len(sw) != 1 or sw[0]["step"] != first["step"] or \
            not sw[0].get("exact_f64") or any(r["decision"]["action"] != "none" for r in dec if r is not first):
        fails.append(f"capped-spiky: want one switch within 20 steps, carried in f64; decisions "
                     f"{[(r['step'], r['decision']) for r in dec]}, switches {sw}")
    else:
        k = first["step"]
        before = median([t for s, t in t_ad.items() if 2 < s <= k])
        after = median([t for s, t in t_ad.items() if s > k + 2])
        free = median([t for s, t in t_free.items() if s > 2])
        slow = before / free
        recovered = (before - after) / (before - free)
        print(f"capped-spiky: micro-batch 8 capped {slow:.3f}x its uncapped step; after the switch to "
              f"micro-batch {chosen} at step {k}: {after / free:.3f}x, {100 * recovered:.1f}% of the slowdown recovered")
        if slow < 1.4 or recovered < 0.6:
            fails.append(f"capped-spiky: slowdown {slow:.3f}x (want >= 1.4), recovered {recovered:.2f} (want >= 0.6)")
        # The numbers: within 1e-12 of a run at the new micro-batch from step 0
        # (uncapped, no controller): only the accumulation order differs.
        ref, _, _ = spiky("spiky_ref", chosen, 30, ["parallel.adapt=off"])
        la, lr = losses(ad), losses(ref)
        worst = max(abs(la[s] - lr[s]) for s in lr) if la.keys() == lr.keys() else float("inf")
        print(f"capped-spiky: losses against micro-batch {chosen} from the start: max |diff| {worst:.2e} (bound 1e-12)")
        if not worst <= 1e-12:
            fails.append(f"capped-spiky: losses differ by {worst:.3e} from the run at micro-batch {chosen}")
    fails += telemetry_checks(a, spk, ad, losses, launch)
    clean, _, _ = spiky("spiky_clean", 2, 1000, ["emulate.power_cap_w=86"])
    cd = [r for r in records(clean) if r.get("controller") == "power"]
    cs = [r for r in records(clean) if r.get("event") == "switch"]
    print(f"capped-spiky: 1000 clean steps at micro-batch 2 under 86 W: {len(cd)} decisions, "
          f"{sum(r['decision']['action'] != 'none' for r in cd)} switches asked, {len(cs)} made")
    if len(cd) < 190 or cs or any(r["decision"]["action"] != "none" for r in cd):
        fails.append(f"capped-spiky: the clean run logged {len(cd)} decisions and {len(cs)} switches")

    p = run([a.train, "--config", f"{a.source}/tests/layouts/model.yaml", "--set", "emulate.power_cap_w=33",
             "--set", f"log.dir={a.work}/bad"], expect=2)
    if "emulate.power_cap_w" not in p.stderr or "needs emulate.cluster" not in p.stderr:
        fails.append(f"a cap without emulate.cluster: {p.stderr[-300:]}")
    if fails:
        print("FAIL:\n  " + "\n  ".join(fails))
        return 1
    print("OK")
    return 0


def telemetry_checks(a, spk, emulated_dir, losses, launch):
    """The controller on throttling read from telemetry: every rank reads the
    fake NVML (log.telemetry_source nvml) held in FAKE_NVML_STATE; no
    emulate.power_cap_w, so the numbers and step times are the uncapped
    run's and only the decision comes from the telemetry."""
    fails = []

    def nvml_run(name, state, steps=20, extra=()):
        d = os.path.join(a.work, name)
        run(spk + ["--set", "train.micro_batch=8", "--set", f"train.steps={steps}", "--set", f"log.dir={d}",
                   "--set", "log.telemetry_source=nvml", "--set", "log.telemetry_interval_s=0.05"] +
            sum([["--set", x] for x in extra], []),
            env={"ADGT_NVML_LIBRARY": a.fake_nvml, "FAKE_NVML_STATE": state})
        recs = records(d)
        return d, [r for r in recs if r.get("controller") == "power"], [r for r in recs if r.get("event") == "switch"]

    emu = [r for r in records(emulated_dir) if r.get("controller") == "power"]
    emu_first = next((r for r in emu if r["decision"]["action"] == "switch"), None)
    d, dec, sw = nvml_run("nvml_capped", "power_w=84,limit_w=86,sm_mhz=1100,reasons=4", steps=30)
    first = dec[0] if dec else None
    print(f"telemetry (fake NVML, 86 W limit, 1100 of 1980 MHz): decisions "
          f"{[(r['step'], r['decision']['action'], r['decision'].get('micro_batch')) for r in dec]}; "
          f"switches at {[r['step'] for r in sw]}; inputs {first['inputs'] if first else None}")
    if first is None or emu_first is None:
        fails.append(f"telemetry: no decision ({dec}) or no emulated one to compare ({emu_first})")
        return fails
    i, dd, ed = first["inputs"], first["decision"], emu_first["decision"]
    if i.get("source") != "telemetry" or i.get("power_limit_w") != 86 or i.get("power_cap_w") != 86 or \
            abs(i.get("clock_slowdown", 0) - 1980 / 1100) > 1e-12 or i.get("throttled_ranks") != 2 or \
            i.get("telemetry_ranks") != 2 or i.get("throttled_share_max") != 1:
        fails.append(f"telemetry: inputs {i}")
    if first["step"] != emu_first["step"] or dd.get("action") != "switch" or \
            dd.get("micro_batch") != ed.get("micro_batch") or dd.get("candidates") != ed.get("candidates"):
        fails.append(f"telemetry: decision at {first['step']} {dd}, the emulation's at {emu_first['step']} {ed}")
    # The fake's clock does not follow the micro-batch: still throttled after
    # the switch, the later decisions keep micro-batch 4 (the fastest under 86 W).
    if len(sw) != 1 or sw[0]["step"] != first["step"] or any(r["decision"]["action"] != "none" for r in dec[1:]):
        fails.append(f"telemetry: switches {[r['step'] for r in sw]}, decisions "
                     f"{[(r['step'], r['decision']['action']) for r in dec]} (want one switch, then none)")
    la, le = losses(d), losses(emulated_dir)  # both 30 steps (the lr schedule's length)
    if la != le:
        fails.append("telemetry: losses differ from the emulated cap's run (the same switch at the same step)")
    else:
        print(f"telemetry: losses of {len(la)} steps equal the emulated cap's run bit for bit")
    # Thermal reasons only, a 200 W limit: the cap planned under is the power held.
    _, dec, _ = nvml_run("nvml_thermal", "power_w=86,limit_w=200,sm_mhz=1100,reasons=64", steps=11)
    t = dec[0] if dec else None
    print(f"telemetry, thermal only: {t['inputs'] if t else None} -> {t['decision'].get('action') if t else None}")
    if t is None or not t["inputs"].get("thermal_only") or t["inputs"].get("power_cap_w") != 86 or \
            t["decision"].get("micro_batch") != ed.get("micro_batch"):
        fails.append(f"telemetry, thermal only: {t}")
    # No reason set (a lower clock, no throttle): nothing logged, nothing switched.
    _, dec, sw = nvml_run("nvml_calm", "power_w=84,limit_w=86,sm_mhz=1100,reasons=0", steps=16)
    if dec or sw:
        fails.append(f"telemetry, no reason set: decisions {dec}, switches {sw}")
    # parallel.auto: the layout re-planned under the limit read is the plan
    # the launch makes with the devices capped at it (emulate.power_cap_w).
    # The run file without train.micro_batch, so the planner chooses it too.
    free_mb = os.path.join(a.work, "model_free_micro_batch.yaml")
    with open(f"{a.source}/tests/layouts/model.yaml") as f, open(free_mb, "w") as g:
        g.write("".join(l for l in f if not l.strip().startswith("micro_batch:")))
    auto = launch("capped-spiky.yaml", "train.dtype=f64", "parallel.auto=true", config=free_mb)
    want = os.path.join(a.work, "auto_capped_launch")
    run(auto + ["--set", "emulate.power_cap_w=86", "--set", "train.steps=1", "--set", "train.warmup_steps=0",
                "--set", f"log.dir={want}",
                "--set", "parallel.adapt=off"])
    with open(os.path.join(want, "plan.json")) as f:
        capped_plan = json.load(f).get("layout")
    d = os.path.join(a.work, "nvml_auto")
    run(auto + ["--set", "train.steps=12", "--set", f"log.dir={d}", "--set", "log.telemetry_source=nvml",
                "--set", "log.telemetry_interval_s=0.05"],
        env={"ADGT_NVML_LIBRARY": a.fake_nvml, "FAKE_NVML_STATE": "power_w=84,limit_w=86,sm_mhz=1100,reasons=4"})
    with open(os.path.join(d, "plan.json")) as f:
        launch_plan = json.load(f).get("layout")
    dec = [r for r in records(d) if r.get("controller") == "power"]
    sw = [r for r in records(d) if r.get("event") == "switch"]
    first = dec[0] if dec else None
    print(f"telemetry with parallel.auto: launched {launch_plan}; decisions "
          f"{[(r['step'], r['decision'].get('action'), r['decision'].get('layout_new')) for r in dec]}; "
          f"switches at {[r['step'] for r in sw]}; the launch capped at 86 W plans {capped_plan}")
    if first is None or first["decision"].get("layout_now") != launch_plan or \
            first["decision"].get("layout_new") != capped_plan:
        fails.append(f"telemetry with parallel.auto: decision {first}, the capped launch's plan {capped_plan}")
    elif (first["decision"]["action"] == "switch") != (len(sw) == 1) or \
            (first["decision"]["action"] == "switch") != (capped_plan != launch_plan):
        fails.append(f"telemetry with parallel.auto: decision {first['decision']}, switches {sw}")
    return fails


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""parallel.adapt: schedule on 4 CPU ranks, pp = 4 (docs/adaptation.md).

  --case start: rank 2 computes 1.5x slower (emulate.slow_ranks) under 1F1B
      from the start. The controller warms up its detectors, then re-plans
      from the measured stage times: the record names the candidates and
      predicts a makespan no longer than 1F1B's.
  --case onset: rank 2 turns 2x slower at step 30 ("2:2@30"): a re-plan
      for a detected change follows within 20 steps that flags stage 2 at
      2x (within 5%), and no change is flagged before step 30.
  --case link: the link between ranks 1 and 2 turns 4x slower at step 30
      (emulate.slow_links "1-2:4@30"): a re-plan for a link change follows
      within 20 steps, naming link 1 (pp ranks 1-2) at about 4x, and no link
      change is flagged before step 30 (the emulation times each message,
      without noise).
  --case link-messages: the same with parallel.link_times: messages (the
      step's own messages' send and arrival times on the ranks' clocks, as
      on real transports, not the emulation's stamps); also its link times
      at the warm-up re-plan must agree with the stamps' (a third run) within
      1%.
  --case layers: rank 2 computes 3x slower from the start under
      parallel.adapt: schedule+layers: the warm-up re-plan moves layers off
      stage 2 (an in-memory layout switch to parallel.stage_layers, logged),
      so stage 2 ends with fewer layers than the others' mean.
  --case resume: the layers case saving a checkpoint at step 16 (after the
      layer move at step 10), resumed twice to step 24: in the same layout
      (the run file's split; the controller re-derives its plan from fresh
      measurements) every loss equals the uninterrupted run's bit for bit;
      in another layout (pp 2 x dp 2) within 1e-5 relative (dp sums in
      another order).
  --case memory: no slow rank, the emulated device (train.device emulated)
      and a model whose activations dominate (d_model 256, seq_len 512):
      1F1B is estimated at 0.11 GiB on its largest rank, ZB-H1 at 0.15. With
      0.14 GiB of device memory (ADGT_EMULATED_MEMORY_GB) the warm-up
      re-plan refuses ZB-H1 for the budget (90%: 0.126 GiB), logs it in
      over_memory, and the run trains on; with 0.3 GiB it switches to a
      split schedule. ZB-H1 configured on the 0.14 GiB device runs out of
      device memory: what the budget kept the adaptive run from.
  --case chunks: no slow rank; the run plans interleaved 1F1B with two
      chunks per rank: the warm-up re-plan switches to greedy over the
      chunks with split backwards (the interleaved order with split
      backwards, or list scheduling, by the measured times; that it holds
      no more than interleaved is the unit tests'), and the "measured
      split" re-plan follows.
  --case sites: no slow rank; the 4 ranks on two sites of
      configs/clusters/two-sites-cpu.yaml (emulate.rank_order=interleave-sites:
      stages 0-1 on a node of site 0, stages 2-3 on a node of site 1), so the
      pipeline's link 1 is the WAN (docs/sites.md): the warm-up re-plan's
      measured link times put link 1 at least 10x links 0 and 2 (measured:
      5819 us against 22 us), its decision predicts no longer a step than
      the schedule before, and the rank table shows the sites.
In all, every step's loss equals the run without adaptation bit for bit (a
schedule moves work in time, a layer move between ranks, neither changes
the numbers).

Every run is on the emulation's model clock (emulate.clock: model,
docs/emulation.md): a rank's compute is the matmul FLOPs it executes at a
fixed rate and every wait is the cluster model's, so what the controller
measures, and so what it decides and when, is the same on any machine under
any load. The onset case runs the adaptive run twice and wants the same
records.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODEL = os.path.join(ROOT, "tests", "emulate", "model.yaml")
exact = True  # --clock model: exact bounds (set in main)


def run(args, name, sets, extra=(), pp=4, env=None, expect_fail=False):
    log = os.path.join(args.work, name)
    os.makedirs(log, exist_ok=True)
    m = os.path.join(log, "metrics.jsonl")
    if os.path.exists(m):
        os.remove(m)
    common = [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
              f"train.steps={args.steps}", "train.global_batch=8", "train.micro_batch=1",
              f"parallel.pp={pp}", "parallel.schedule=1f1b", f"emulate.cluster={args.cluster}",
              f"emulate.slow_ranks={args.slow}", f"emulate.slow_links={args.slow_links}",
              f"emulate.clock={args.clock}",
              f"log.dir={log}", f"checkpoint.dir={log}/ckpt"]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", **(env or {}))
    p = subprocess.run(["timeout", "120", args.mpirun, "4", args.train, "--config", MODEL]
                       + sum([["--set", s] for s in common + sets], []) + list(extra),
                       capture_output=True, text=True, env=env)
    if expect_fail:
        return p
    if p.returncode != 0:
        sys.exit(f"FAILED: {name} exited {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    with open(os.path.join(log, "stdout.txt"), "w") as f:
        f.write(p.stdout)
    return [json.loads(l) for l in open(m)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--case", choices=["start", "onset", "link", "link-messages", "layers", "resume", "chunks",
                                       "memory", "sites"],
                    default="start")
    ap.add_argument("--clock", choices=["model", "virtual"], default="model",
                    help="emulate.clock of every run: model (the ctest's: the same decisions under "
                         "any load) or virtual (measured CPU time: scripts/bench.sh's figure)")
    args = ap.parse_args()
    global exact
    exact = args.clock == "model"
    messages = args.case == "link-messages"
    if messages:
        args.case = "link"
    args.steps, args.slow = {"start": (24, "2:1.5"), "onset": (60, "2:2@30"), "link": (60, ""),
                             "layers": (24, "2:3"), "resume": (24, "2:3"), "chunks": (24, ""),
                             "memory": (12, ""), "sites": (16, "")}[args.case]
    args.slow_links = "1-2:4@30" if args.case == "link" else ""
    args.cluster = os.path.join(ROOT, "tests", "emulate", "pipeline_link.yaml") if args.case == "link" else "cpu-here"
    if args.case == "sites":
        args.cluster = os.path.join(ROOT, "configs", "clusters", "two-sites-cpu.yaml")
    if args.case == "resume":
        return resume_case(args)
    if args.case == "memory":
        return memory_case(args)
    chunks = ["parallel.schedule=interleaved", "parallel.virtual_stages=2"] if args.case == "chunks" else []
    if args.case == "sites":
        chunks = ["emulate.rank_order=interleave-sites"]
    plain = run(args, "off", ["parallel.adapt=off"] + chunks)
    mode = "schedule+layers" if args.case == "layers" else "schedule"
    adapt = run(args, "schedule", [f"parallel.adapt={mode}"] + chunks +
                (["parallel.link_times=messages"] if messages else []))
    loss = lambda recs: [(r["step"], r["loss"]) for r in recs if "loss" in r and "event" not in r]
    a, b = loss(plain), loss(adapt)
    if not a or a != b:
        sys.exit(f"FAILED: losses differ with adaptation:\n off      {a}\n schedule {b}")
    recs = [r for r in adapt if r.get("event") == "controller" and r.get("controller") == "adapt-schedule"]
    if not recs:
        sys.exit("FAILED: no adapt-schedule record in metrics.jsonl")
    # Every schedule change the controller makes is one console line (rank 0),
    # and nothing else prints one.
    with open(os.path.join(args.work, "schedule", "stdout.txt")) as f:
        said = [l.rstrip("\n") for l in f if l.startswith("adapt-schedule at step ")]
    want = [f"adapt-schedule at step {r['step']}: {r['decision']['console']}" for r in recs
            if "console" in r["decision"]]
    if said != want:
        sys.exit("FAILED: the console lines of schedule changes differ from the decisions:\n"
                 + "\n".join(said) + "\nwant\n" + "\n".join(want))
    if args.case == "layers":
        sw = [r for r in adapt if r.get("event") == "switch"]
        moves = [r for r in recs if "layers" in r["decision"]]
        if not sw or not moves or any("refused" in r for r in sw):
            sys.exit("FAILED: no layer move was made: switches " + json.dumps(sw) + "; decisions "
                     + json.dumps([r["decision"] for r in recs]))
        d = moves[0]["decision"]
        before, after = d["layers_before"], d["layers"]
        if sw[0]["step"] != moves[0]["step"] or after[2] >= before[2] or \
                after[2] >= sum(after) / len(after):
            sys.exit(f"FAILED: the first layer move {before} -> {after} at step {moves[0]['step']} "
                     f"(switch at step {sw[0]['step']}) does not take layers off the slow stage 2")
        print(f"adapt-layers: step {moves[0]['step']}: stage speeds "
              f"{[round(x, 3) for x in d['stage_speed']]}; layers {before} -> {after} in "
              f"{sw[0]['seconds']:.3f} s (predicted {d['predicted_after_s']:.4f} s -> "
              f"{d['layers_predicted_s']:.4f} s); {len(sw)} switch(es) in {args.steps} steps; "
              "losses equal bit for bit")
        return
    if args.case == "onset":
        # On the model clock nothing but the onset changes a stage's time:
        # any change flagged before it is a defect.
        early = [(r["step"], r["inputs"].get("stage_change")) for r in recs
                 if r["inputs"].get("replan") == "change" and r["step"] <= 30]
        # On the virtual clock (the benchmark's) the host's noise may flag a
        # change before the onset (printed) and dilutes the 2x: a flag or
        # 1.3x counts there.
        late = [r for r in recs if r["inputs"].get("replan") == "change" and r["step"] > 30
                and 2 in (r["inputs"].get("stage_flagged") or [])
                and (abs(r["inputs"]["stage_change"][2] - 2.0) <= 0.05 if exact
                     else r["inputs"]["stage_change"][2] > 1.1)
                or (not exact and r["inputs"].get("replan") == "change" and r["step"] > 30
                    and r["inputs"]["stage_change"][2] >= 1.3)]
        what = json.dumps([(r["step"], r["inputs"].get("replan"), r["inputs"].get("stage_change"),
                            r["inputs"].get("stage_flagged")) for r in recs])
        if (early and exact) or not late or late[0]["step"] > 50:
            sys.exit("FAILED: want stage 2 flagged at about 2x within 20 steps of step 30 and no "
                     "change before: " + what)
        if exact:  # the same run again: the same decisions at the same steps
            again = run(args, "schedule_again", [f"parallel.adapt={mode}"])
            same = lambda recs: [(r["step"], r["inputs"], r["decision"]) for r in recs
                                 if r.get("event") == "controller" and r.get("controller") == "adapt-schedule"]
            if same(again) != same(adapt):
                sys.exit("FAILED: the same run on the model clock decided differently:\n"
                         + json.dumps(same(adapt)) + "\n" + json.dumps(same(again)))
        r = late[0]
        print(f"adapt-schedule: rank 2 2x slower from step 30, detected at step {r['step']} "
              f"(stage changes {[round(x, 2) for x in r['inputs']['stage_change']]}, flagged "
              f"{r['inputs'].get('stage_flagged')}); "
              f"{r['decision']['schedule']} predicted {r['decision']['predicted_after_s']:.4f} s "
              f"against {r['decision']['predicted_before_s']:.4f} s; {len(recs)} re-plan(s) in "
              f"{args.steps} steps, {len(early)} change(s) flagged before the onset {early}"
              f"{'; the same records on a second run' if exact else ''}; losses equal bit for bit")
        return
    if args.case == "link":
        # A re-plan names a link change in link_change whatever its reason
        # ("change" when a stage's change is confirmed at the same step).
        links = [r for r in recs if any(x != 1.0 for x in r["inputs"].get("link_change", []))]
        early = [r for r in links if r["step"] <= 30]
        late = [r for r in links if r["step"] > 30 and r["inputs"]["link_change"][1] >= 3]
        if early or not late or late[0]["step"] > 50:
            sys.exit("FAILED: want a link change of link 1 within 20 steps of step 30 and none "
                     "before: " + json.dumps([(r["step"], r["inputs"].get("replan"),
                                               r["inputs"].get("link_change")) for r in recs]))
        r = late[0]
        i = r["inputs"]
        print(f"adapt-schedule: link 1-2 4x slower from step 30, detected at step {r['step']} "
              f"(link changes {[round(x, 2) for x in i['link_change']]}, link times "
              f"{[round(x * 1e6, 1) for x in i['link_s']]} us); {r['decision']['schedule']} predicted "
              f"{r['decision']['predicted_after_s']:.4f} s against {r['decision']['predicted_before_s']:.4f} s "
              f"with {i['comm_s'] * 1e6:.1f} us a message; {len(recs)} re-plan(s) in {args.steps} steps; "
              "losses equal bit for bit" + (" (link times from the step's messages)" if messages else ""))
        if messages:
            stamps = run(args, "stamps", ["parallel.adapt=schedule"])
            srecs = [r for r in stamps if r.get("event") == "controller" and r.get("controller") == "adapt-schedule"]
            got, want = recs[0]["inputs"]["link_s"], srecs[0]["inputs"]["link_s"]
            tol = 0.01 if exact else 0.25
            bad = [k for k in range(3) if not abs(got[k] - want[k]) <= tol * want[k]]
            print(f"warm-up re-plan's link times: messages {[round(x * 1e6, 1) for x in got[:3]]} us, "
                  f"the emulation's stamps {[round(x * 1e6, 1) for x in want[:3]]} us")
            if bad or recs[0]["step"] != srecs[0]["step"]:
                sys.exit(f"FAILED: link times from the messages differ from the stamps by > {tol:.0%} on links {bad}")
        return
    first = recs[0]
    d = first["decision"]
    if args.case == "sites":
        i = first["inputs"]
        link = i["link_s"]
        with open(os.path.join(args.work, "schedule", "stdout.txt")) as f:
            out = f.read()
        if first["inputs"].get("replan") != "warm-up" or "  site" not in out.split("rank table", 1)[-1][:2000] \
                or link[1] < 10 * max(link[0], link[2]) or \
                d["predicted_after_s"] > d["predicted_before_s"] * (1 + 1e-9):
            sys.exit(f"FAILED: want the warm-up re-plan to see link 1 (the WAN) >= 10x links 0 and 2 "
                     f"and predict no slower a step, with the rank table's site column: {first}")
        print(f"adapt-schedule over two sites: step {first['step']}: link times "
              f"{[round(x * 1e6, 1) for x in link]} us (link 1 the WAN, {link[1] / max(link[0], link[2]):.0f}x "
              f"the others); {d['schedule']} predicted {d['predicted_after_s']:.4f} s against "
              f"{d['predicted_before_s']:.4f} s; losses equal bit for bit")
        return
    if first["inputs"].get("replan") != "warm-up" or not (first["step"] == 10 or
                                                         (not exact and 10 <= first["step"] <= 13)):
        sys.exit(f"FAILED: the first re-plan is not the warm-up one at step 10: {first}")
    if d["predicted_after_s"] > d["predicted_before_s"] * (1 + 1e-9) or len(d["candidates"]) < 3:
        sys.exit(f"FAILED: the re-plan predicts no gain or lists too few candidates: {d}")
    if args.case == "chunks":
        # Split backwards: W instructions (op 2), no fused Backward (op 3).
        # Which of greedy's candidates wins follows this tiny model's
        # measured times: the split interleaved order (the unit tests' pick
        # on the d256 model's times) or, seen once under the suite's load,
        # list scheduling with the deepest F first.
        ops = {x[0] for rank in d.get("ranks", []) for x in rank}
        if len(first["inputs"]["f_s"]) != 8 or not d["switch"] or not d["schedule"].startswith("greedy") \
                or 2 not in ops or 3 in ops:
            sys.exit(f"FAILED: with two chunks per rank the warm-up re-plan did not switch to greedy "
                     f"with split backwards over 8 stages: {d}")
    slow = first["inputs"]["f_s"][2] / max(first["inputs"]["f_s"][1], 1e-12)
    # 1F1B measures B + W as one fused time and the plan split it half and
    # half; a switch to a schedule that splits them re-plans once more from
    # the measured B and W when the detectors have warmed up again.
    split = ""
    if d["switch"] and not d["schedule"].startswith("1f1b"):
        second = [r for r in recs[1:] if r["inputs"].get("replan") == "measured split"]
        if not second or not (first["step"] + 5 <= second[0]["step"] <= first["step"] + 8):
            sys.exit("FAILED: no 'measured split' re-plan 5-8 steps after the switch to "
                     f"{d['schedule']} at step {first['step']}: "
                     + json.dumps([(r["step"], r["inputs"].get("replan")) for r in recs]))
        i2 = second[0]["inputs"]
        if all(abs(b - w) <= 1e-3 * b for b, w in zip(i2["b_s"], i2["w_s"])):
            sys.exit(f"FAILED: the 'measured split' re-plan's B and W are still equal halves: {i2}")
        split = (f"; step {second[0]['step']} (measured split, B/W "
                 f"{[round(b / max(w, 1e-12), 2) for b, w in zip(i2['b_s'], i2['w_s'])]}): "
                 f"{second[0]['decision'].get('schedule')}")
    print(f"adapt-schedule: step {first['step']}: {d['schedule']} predicted {d['predicted_after_s']:.4f} s "
          f"against the schedule before {d['predicted_before_s']:.4f} s (switch {d['switch']}); stage 2's forward "
          f"{slow:.2f}x stage 1's{split}; {len(recs)} re-plan(s) in {args.steps} steps; losses equal bit for bit")


def resume_case(args):
    loss = lambda recs: {r["step"]: r["loss"] for r in recs if "loss" in r and "event" not in r}
    plain = loss(run(args, "off", ["parallel.adapt=off"]))
    mode = ["parallel.adapt=schedule+layers"]
    adapted = run(args, "adapted", mode + ["checkpoint.interval=16"])
    moves = [r for r in adapted if r.get("event") == "switch" and "refused" not in r]
    if not moves or moves[0]["step"] >= 16:
        sys.exit("FAILED: no layer move before the checkpoint at step 16: "
                 + json.dumps([r for r in adapted if r.get("event") == "switch"]))
    ckpt = os.path.join(args.work, "adapted", "ckpt")
    steps = sorted(d for d in os.listdir(ckpt) if d.startswith("step_"))
    at16 = [d for d in steps if int(d.split("_")[1]) == 16]
    if not at16:
        sys.exit(f"FAILED: no step-16 checkpoint in {ckpt}: {steps}")
    src = os.path.join(ckpt, at16[0])
    a = loss(adapted)
    if a != plain:
        sys.exit("FAILED: the adapted run's losses differ from the plain run's")
    same = loss(run(args, "resumed", mode, ["--resume", src]))
    other = loss(run(args, "resumed_pp2dp2", mode + ["parallel.dp=2"], ["--resume", src], pp=2))
    want = {s: l for s, l in plain.items() if s > 16}
    got = {s: l for s, l in same.items() if s > 16}
    if got != want:
        sys.exit(f"FAILED: resumed in the same layout, losses differ:\n want {want}\n got  {got}")
    got2 = {s: l for s, l in other.items() if s > 16}
    if sorted(got2) != sorted(want):
        sys.exit(f"FAILED: resumed in pp 2 x dp 2, steps {sorted(got2)} against {sorted(want)}")
    rel = max(abs(got2[s] - want[s]) / abs(want[s]) for s in want)
    if rel > 1e-5:
        sys.exit(f"FAILED: resumed in pp 2 x dp 2, losses differ by {rel:.2e} relative (bound 1e-5):"
                 f"\n want {want}\n got  {got2}")
    print(f"adapt-resume: layer move at step {moves[0]['step']}, checkpoint at 16; resumed in the "
          f"same layout: steps 17-24 bit for bit; in pp 2 x dp 2: within {rel:.1e} relative")



def memory_case(args):
    big = ["train.device=emulated", "model.d_model=256", "model.ffn_hidden=512", "model.seq_len=512",
           "train.global_batch=4"]  # m = pp: 1F1B's rank 0 and every ZB-H1 rank hold 4
    gib = 1 << 30
    tight = run(args, "tight", ["parallel.adapt=schedule"] + big, env={"ADGT_EMULATED_MEMORY_GB": "0.14"})
    roomy = run(args, "roomy", ["parallel.adapt=schedule"] + big, env={"ADGT_EMULATED_MEMORY_GB": "0.3"})
    loss = lambda recs: [(r["step"], r["loss"]) for r in recs if "loss" in r and "event" not in r]
    if not loss(tight) or loss(tight) != loss(roomy):
        sys.exit(f"FAILED: losses differ between the devices:\n tight {loss(tight)}\n roomy {loss(roomy)}")
    dec = lambda recs: [(r["step"], r["decision"]) for r in recs
                        if r.get("event") == "controller" and r.get("controller") == "adapt-schedule"]
    split = ("zb-h1", "greedy")
    t, r = dec(tight), dec(roomy)
    refused = [(s, d) for s, d in t if any(x.startswith("zb-h1") for x in d.get("over_memory", []))]
    if not refused:
        sys.exit("FAILED: on the 0.14 GiB device no re-plan refused zb-h1 for memory: " + json.dumps(t))
    s0, d0 = refused[0]
    # The arena reserves whole pages: the capacity is 0.14 GiB rounded up.
    if not 0 <= d0["memory_budget_bytes"] - 0.9 * 0.14 * gib <= 0.9 * 65536:
        sys.exit(f"FAILED: budget {d0['memory_budget_bytes']} bytes, want 90% of 0.14 GiB")
    taken = [d.get("name") for _, d in t if d.get("switch")]
    if "zb-h1" in taken:
        sys.exit(f"FAILED: the tight run switched to zb-h1 though it was over the budget: {taken}")
    switched = [(s, d) for s, d in r if d.get("switch") and d.get("name") in split]
    if not switched or any(d.get("over_memory") for _, d in r):
        sys.exit("FAILED: on the 0.3 GiB device the re-plan did not switch to a split schedule "
                 "(or refused one): " + json.dumps(r))
    # The refused schedule does not fit the device: configured, it runs out.
    p = run(args, "zb-h1", ["parallel.adapt=off", "parallel.schedule=zb-h1"] + big,
            env={"ADGT_EMULATED_MEMORY_GB": "0.14"}, expect_fail=True)
    if p.returncode == 0:
        sys.exit("FAILED: zb-h1 configured on the 0.14 GiB emulated device trained; the budget's "
                 "refusal was not needed (the test's sizes are off)")
    out = p.stdout + p.stderr
    oom = next((l for l in out.splitlines() if "reservation" in l or "memory" in l.lower()), out[-300:])
    print(f"adapt-schedule memory: 0.14 GiB device: step {s0} refused {d0['over_memory']} (budget "
          f"{d0['memory_budget_bytes'] / gib:.3f} GiB), kept {t[-1][1].get('schedule')}; 0.3 GiB device: "
          f"step {switched[0][0]} switched to {switched[0][1]['schedule']}; losses equal bit for bit; "
          f"zb-h1 configured on 0.14 GiB: exit {p.returncode}: {oom.strip()[:200]}")

if __name__ == "__main__":
    main()

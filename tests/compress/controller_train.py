"""The gradient-compression controller (parallel.grad_compression=auto;
docs/compression.md, "Controller") on 4 CPU ranks under the link emulation
(tests/compress.cmake):

  --link slow: a 50 Mbit/s link (slow_link.yaml): after warm-up the
      controller turns compression on (some bucket at int8, int4, int3,
      int2 or PowerSGD), and the steps after its decision send fewer dp bytes;
  --link fast: a 100 Gbit/s link (fast_link.yaml): every decision keeps
      every bucket at off or bf16;
  --link schedule: fast_link.yaml with emulate.link_bandwidth taking every
      link to 50 Mbit/s (x0.0005) from step 30 and back from step 60: the
      levels follow each change within 2 controller intervals (compressing
      by the decision at step 50, off or bf16 again by step 80), and are off
      or bf16 before the first change.
  --link sites: two sites joined by a 50 Mbit/s WAN, fast inside
      (two_sites_slow_wan.yaml; one node of each site, the dp group reduced
      over the sites: parallel.site_reduce=hierarchical): the controller
      prices the cross-site exchange apart from the links inside the sites
      (its inputs carry sites 2, 2 members a site, and the two links: the
      cross-site one within 25% of the WAN's share in the model, the site's
      at least 100x faster), and compresses (the last step sends fewer bytes than fp32).

Both: the controller records of metrics.jsonl (rank 0) equal what every rank
applied (ADGT_LOG_CONTROLLER=1 lines on stderr), and the dp replicas hold the
same parameters bit for bit at the end (ADGT_CHECK_DP_REPLICAS=1).
Exits non-zero with what differed.
"""
import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


# The levels that compress beyond bf16.
COMPRESSING = ("int8", "int4", "int3", "int2", "powersgd")


def main():
    ap = argparse.ArgumentParser()
    for a in ("--train", "--mpirun", "--data", "--model", "--work"):
        ap.add_argument(a, required=True)
    ap.add_argument("--link", choices=["slow", "fast", "schedule", "sites"], required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--clock", choices=["model", "virtual"], default="model",
                    help="emulate.clock: model (the ctest's) or virtual (measured CPU time and codec "
                         "speeds: scripts/bench.sh)")
    args = ap.parse_args()
    out = args.work
    shutil.rmtree(out, ignore_errors=True)
    schedule = args.link == "schedule"
    if schedule:
        args.steps = max(args.steps, 90)
    sites = args.link == "sites"
    cluster = os.path.join(HERE, "two_sites_slow_wan.yaml" if sites else
                           f"{'fast' if schedule else args.link}_link.yaml")
    sets = [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
            f"log.dir={out}", f"checkpoint.dir={out}/ckpt", "train.device=cpu", "parallel.dp=4",
            f"train.steps={args.steps}", "train.warmup_steps=10", "parallel.compress_interval=10",
            "parallel.grad_compression=auto", f"emulate.cluster={cluster}",
            # The model clock: the probes read the link model's time, the
            # compute and the codecs' costs are counted, not a loaded host's
            # scheduling (docs/emulation.md, "Clocks"): the same decisions
            # on any machine under any load.
            f"emulate.clock={args.clock}"]
    if schedule:
        sets.append("emulate.link_bandwidth=0.0005@30,1@60")
    if sites:
        sets += ["emulate.rank_order=interleave-sites", "parallel.site_reduce=hierarchical"]
    cmd = [args.mpirun, "4", args.train, "--config", args.model]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1", ADGT_CHECK_DP_REPLICAS="1",
                                ADGT_LOG_CONTROLLER="1"))
    problems = []
    if p.returncode != 0 or "bit-identical" not in p.stdout:
        print(" ".join(cmd))
        print(p.stdout[-4000:], p.stderr[-4000:])
        sys.exit(f"FAILED: the run " + ("failed" if p.returncode else "printed no replica check"))
    with open(os.path.join(out, "metrics.jsonl")) as f:
        recs = [json.loads(l) for l in f if l.strip()]
    steps = [r for r in recs if "loss" in r and "step" in r and r.get("event") is None]
    ctl = [r for r in recs if r.get("event") == "controller" and r.get("controller") == "grad-compression"]
    print(f"{args.link}: {len(steps)} steps, {len(ctl)} decisions in {time.time() - t0:.1f} s")
    want = args.steps // 10
    if len(ctl) != want:
        problems.append(f"{len(ctl)} controller records, want {want}")
    applied = collections.defaultdict(dict)
    for m in re.finditer(r"grad-compression rank (\d+) step (\d+) applied (\[.*\])", p.stderr):
        applied[int(m.group(2))][int(m.group(1))] = json.loads(m.group(3))
    for r in ctl:
        lv = r["decision"]["levels"]
        ranks = applied.get(r["step"], {})
        if sorted(ranks) != [0, 1, 2, 3] or any(v != lv for v in ranks.values()):
            problems.append(f"step {r['step']}: rank 0 logged {lv}, the ranks applied {ranks}")
        meas = r["inputs"]["measured"]
        print(f"  step {r['step']}: levels {collections.Counter(lv)} reasons "
              f"{collections.Counter(r['decision']['reasons'])} predicted reduce "
              f"{r['decision']['predicted_reduce_s'] * 1e3:.2f} ms (off "
              f"{r['decision']['predicted_reduce_off_s'] * 1e3:.2f} ms), noise share "
              f"{r['inputs']['noise_share']:.3f}, all-reduce link "
              f"{r['inputs']['all_reduce_link']['bandwidth_Bps'] / 1e9:.4g} GB/s "
              f"{r['inputs']['all_reduce_link']['latency_s'] * 1e6:.0f} us, compute "
              f"{meas['compute_s'] * 1e3:.1f} ms")
    after = [r for r in ctl if r["step"] > 10]
    compressing = lambda r: any(l in COMPRESSING for l in r["decision"]["levels"])
    if schedule:
        # decision steps are the steps after which the controller ran (every 10)
        for r in ctl:
            if r["step"] < 30 and compressing(r):
                problems.append(f"schedule: step {r['step']} (fast link) compresses")
        slow = [r for r in ctl if 30 < r["step"] <= 50]
        if not slow or not compressing(slow[-1]):
            problems.append("schedule: no compression by step 50 (slow link from step 30)")
        back = [r for r in ctl if 60 < r["step"] <= 80]
        if not back or compressing(back[-1]):
            problems.append("schedule: still compressing at step 80 (fast link from step 60)")
        for r in ctl:
            if r["step"] > 80 and compressing(r):
                problems.append(f"schedule: step {r['step']} (fast link again) compresses")
    elif sites:
        # The WAN of the cluster model: 0.00625 GB/s, shared by the cross
        # groups of the 2 places at once (cluster::cross_site_time: every
        # place's exchange runs together), so each reads half of it.
        wan = 0.00625e9 / 2
        for r in ctl:
            i = r["inputs"]
            if i.get("sites") != 2 or i.get("site_ranks") != 2:
                problems.append(f"sites: step {r['step']}: inputs without the sites ({i.get('sites')}, "
                                f"{i.get('site_ranks')})")
                continue
            cross = i["all_reduce_link"]["bandwidth_Bps"]
            inside = i["site_link"]["bandwidth_Bps"]
            print(f"    cross-site link {cross / 1e6:.3g} MB/s, inside a site {inside / 1e9:.3g} GB/s")
            if not 0.8 * wan <= cross <= 1.25 * wan:
                problems.append(f"sites: step {r['step']}: the cross-site link reads {cross:.3g} B/s, "
                                f"the WAN is {wan:.3g}")
            if inside < 100 * cross:
                problems.append(f"sites: step {r['step']}: the site's link {inside:.3g} B/s is not "
                                f"100x the cross-site one {cross:.3g}")
        if not after or not compressing(after[-1]):
            problems.append("sites: the last decision compresses no bucket")
        last = steps[-1].get("grad_compression")
        if not last or not 0 < last["sent_bytes"] < last["fp32_bytes"]:
            problems.append(f"sites: the last step sent {last}")
    elif args.link == "slow":
        if not after or not any(l in COMPRESSING for l in after[-1]["decision"]["levels"]):
            problems.append("slow link: the last decision compresses no bucket")
        last = steps[-1].get("grad_compression")
        if not last or not 0 < last["sent_bytes"] < last["fp32_bytes"] / 4:
            problems.append(f"slow link: the last step sent {last}")
    else:
        for r in ctl:
            bad = [l for l in r["decision"]["levels"] if l not in ("off", "bf16")]
            if bad:
                problems.append(f"fast link: step {r['step']} chose {bad}")
    if problems:
        print("FAILED:\n  " + "\n  ".join(problems))
        sys.exit(1)
    print(f"ok: controller {args.link} link")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Several ranks on one GPU (check.sh stage 5): each layout against the
single process on the same device, with the CPU tests' bounds.

Layouts (4 ranks sharing the device, ADGT_SHARED_GPU_TEST=1, collectives
host-staged through MPI): tp2 dp2 ZeRO-1 SP (bf16), dp2 ZeRO-3 (bf16), pp2 zb-h1 dp2 (bf16),
pp2 zb-v dp2 (bf16, 4 layers: rank 1's turn handed over in device memory),
ep2 dp2 MoE (bf16), FP8 ep2 dp2 MoE and tp2 SP with the FP8 gather, cp2 in
ring and all-to-all mode (bf16; bound: compare_bf16.py's tp bound, the
order of the sums being what differs; 2.9e-4 measured on the emulated
device). Each trains the
~100k-parameter layout model 20 steps; the relative loss error against the
single process must stay under the bound the CPU tests use
(tests/layouts/compare_bf16.py: 1.1e-3 with tp, 3.5e-4 with dp; pp bf16 is
bitwise on the CPU, given 3.5e-4 here with dp; MoE ep2 dp2 in bf16 1.8e-3,
its MOE_BOUNDS). Prints a table with
step time and the exposed communication per group and step (metrics.jsonl's
comm_wait_s: time inside blocking tp/pp/ep/cp calls, and for dp the gradient
reduction the step could not hide).

Runs with --device emulated on a CPU machine too (the rehearsal of the GPU
check, scripts/device/check.sh rehearse).

usage: multirank_check.py --train BIN --mpirun CMD --data DIR --work DIR --device cuda|emulated
       (CMD: a launcher taking `-np N PROGRAM ARGS`, quoted as one string)
"""
import argparse
import re
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
DENSE = os.path.join(ROOT, "tests", "layouts", "model.yaml")
MOE = os.path.join(ROOT, "tests", "moe", "model.yaml")
# name: (config, ranks, dtype, sets, bound on the relative loss error)
LAYOUTS = {
    "tp2_dp2_zero1_sp": (DENSE, 4, "bf16", ["parallel.tp=2", "parallel.dp=2", "parallel.zero=1",
                                            "parallel.sequence_parallel=true"], 1.1e-3),
    # log.trace of steps 3-4 too (docs/trace.md: on CUDA the compute spans are
    # the executor's device times, and NVTX ranges are pushed): checked by trace_summary.
    "pp2_zbh1_dp2": (DENSE, 4, "bf16", ["parallel.pp=2", "parallel.dp=2", "parallel.schedule=zb-h1",
                                        "log.trace=3-4"], 3.5e-4),
    "ep2_dp2_moe": (MOE, 2, "bf16", ["parallel.dp=2", "parallel.ep=2"], 1.8e-3),
    # ZeRO-3 (docs/zero.md): bf16 unit gathers and fp32 reduce-scatters on
    # NCCL's stream, the store's kept buffers on the device.
    "dp2_zero3": (DENSE, 2, "bf16", ["parallel.dp=2", "parallel.zero=3"], 3.5e-4),
    # ZB-V: rank 1 hands its turn over in device memory (4 layers: 2 chunks
    # per rank; its reference is the single process with the same model).
    "pp2_zbv_dp2": (DENSE, 4, "bf16", ["model.n_layers=4", "parallel.pp=2", "parallel.dp=2",
                                       "parallel.schedule=zb-v", "parallel.virtual_stages=2"], 3.5e-4),
    # FP8 (docs/fp8.md; sm_89+): the experts' GEMMs with their rows padded to
    # 16 for cuBLASLt, and the SP input gathered as FP8 codes over NCCL
    # (bounds: compare_fp8.py's MoE ep2 dp2 and its tp2 order bound).
    "ep2_dp2_moe_fp8": (MOE, 2, "fp8", ["parallel.dp=2", "parallel.ep=2"], 1.8e-3),
    "tp2_sp_fp8_allgather": (DENSE, 2, "fp8", ["parallel.tp=2", "parallel.sequence_parallel=true",
                                               "parallel.fp8_allgather=true"], 1.5e-3),
    # Context parallelism (docs/context-parallel.md): the ring's block
    # kernels and merge on the device, its exchanges host-staged here (NCCL
    # on one GPU a rank); the all-to-all mode's gathers by index.
    "cp2_ring": (DENSE, 2, "bf16", ["parallel.cp=2"], 1.1e-3),
    "cp2_a2a": (DENSE, 2, "bf16", ["parallel.cp=2", "parallel.cp_mode=all-to-all"], 1.1e-3),
}


def run(args, name, config, ranks, sets):
    out = os.path.join(args.work, name)
    shutil.rmtree(out, ignore_errors=True)
    cmd = [args.train, "--config", config]
    for s in [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin",
              f"log.dir={out}", f"checkpoint.dir={out}/ckpt", "checkpoint.at_end=false",
              "checkpoint.interval=0", f"train.device={args.device}"] + sets:
        cmd += ["--set", s]
    if ranks > 1:
        cmd = shlex.split(args.mpirun) + ["-np", str(ranks)] + cmd
    env = dict(os.environ, ADGT_SHARED_GPU_TEST="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    dt = time.time() - t0
    with open(os.path.join(args.work, name + ".log"), "w") as f:
        f.write(" ".join(cmd) + "\n" + p.stdout + p.stderr)
    if p.returncode != 0:
        print(f"{name}: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        return None
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if l.strip()]
    recs = [r for r in recs if "loss" in r]
    table = [l for l in p.stdout.splitlines() if l.startswith("  ") and "collectives" in l]
    return recs, dt, table


def trace_summary(args, name):
    """The trace.json of a layout run with log.trace: (ok, text). Every rank's
    track with two step spans and compute spans inside them; the share of each
    step its spans cover (reported, not bounded: on a device the compute spans
    are device times, the others host times)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "trace"))
    import trace_lib  # noqa: E402
    path = os.path.join(args.work, name, "trace.json")
    try:
        events, names = trace_lib.by_rank(trace_lib.load(path))
    except Exception as e:  # noqa: BLE001 - any failure to read is the finding
        return False, f"{path}: {e}"
    covs, computes = [], 0
    for pid, ev in events.items():
        computes += sum(1 for e in ev if e.get("cat") == "compute")
        covs += [c for _, _, c in trace_lib.step_coverage(ev)]
    ok = len(names) == 4 and len(covs) == 8 and computes > 0
    return ok, (f"{len(names)} rank tracks, {len(covs)} step spans, {computes} compute spans, "
                f"spans cover {100 * min(covs or [0]):.1f}-{100 * max(covs or [0]):.1f}% of the steps")


def watchdog_kill(args):
    """SIGKILL of one of 4 ranks sharing the device mid-run (tp2 dp2, f32,
    train.collective_timeout_s=10): every survivor must name it ("watchdog:
    rank 1 (host ...") and the job must end non-zero within 30 s: the
    watchdog's path through the device backend's waits (docs/reliability.md).
    Returns (ok, text)."""
    out = os.path.join(args.work, "watchdog_kill")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    cmd = shlex.split(args.mpirun) + ["-np", "4", args.train, "--config", DENSE]
    for s_ in [f"data.train={args.data}/train.bin", f"data.val={args.data}/val.bin", f"log.dir={out}",
               f"checkpoint.dir={out}/ckpt", "checkpoint.interval=0", "checkpoint.at_end=false",
               f"train.device={args.device}", "train.steps=100000", "train.collective_timeout_s=10",
               "parallel.tp=2", "parallel.dp=2"]:
        cmd += ["--set", s_]
    env = dict(os.environ, ADGT_SHARED_GPU_TEST="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    log = open(os.path.join(args.work, "watchdog_kill.log"), "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    hb = os.path.join(out, ".heartbeat", "rank1.hb")
    victim, t_kill = None, None
    t0 = time.time()
    try:
        while time.time() - t0 < 120 and p.poll() is None:
            try:
                fields = dict(l.split(" ", 1) for l in open(hb).read().splitlines() if " " in l)
                if int(fields.get("step", "0")) >= 3:
                    victim = int(fields["pid"])
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        if victim is None:
            return False, "rank 1 did not reach step 3 (or the job ended)"
        os.kill(victim, 9)
        t_kill = time.time()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            return False, "hang: the job had not ended 30 s after SIGKILL of rank 1"
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()
        log.close()
    text = open(os.path.join(args.work, "watchdog_kill.log")).read()
    named = {int(m) for m in re.findall(r"^error: rank (\d+) \([^)]*\): watchdog: rank 1 ", text, re.M)}
    missing = sorted({0, 2, 3} - named)
    end = time.time() - t_kill
    if p.returncode == 0 or missing:
        return False, f"exit {p.returncode}, survivors without a watchdog line naming rank 1: {missing}"
    return True, f"named by ranks {sorted(named)}; the job ended {end:.1f} s after the kill (exit {p.returncode})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--device", default="cuda", choices=["cuda", "emulated"])
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--layouts", nargs="*", default=list(LAYOUTS))
    ap.add_argument("--extra", nargs="*", default=["watchdog"],
                    help="checks after the layouts: watchdog (SIGKILL of a rank mid-run); none: []")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    refs = {}
    rows, failed = [], []
    for name in args.layouts:
        config, ranks, dtype, sets, bound = LAYOUTS[name]
        model_sets = [x for x in sets if x.startswith("model.")]  # the reference's model too
        key = (config, dtype, tuple(model_sets))
        if key not in refs:
            suffix = "".join("_" + x.split("=")[0].split(".")[-1] + x.split("=")[1] for x in model_sets)
            refs[key] = run(args, f"single_{os.path.basename(os.path.dirname(config))}_{dtype}{suffix}",
                            config, 1, [f"train.dtype={dtype}"] + model_sets)
        ref = refs[key]
        got = run(args, name, config, ranks, sets + [f"train.dtype={dtype}"])
        if ref is None or got is None:
            failed.append(f"{name}: a run failed")
            rows.append((name, ranks, dtype, float("nan"), bound, float("nan"), {}, "FAIL"))
            continue
        rl = {r["step"]: r["loss"] for r in ref[0]}
        gl = {r["step"]: r["loss"] for r in got[0]}
        err = max(abs(gl[s] - rl[s]) / abs(rl[s]) for s in rl)
        recs = got[0]
        el = [r["elapsed_s"] for r in recs]
        step_ms = 1000 * (el[-1] - el[0]) / max(1, len(el) - 1)  # the first step excluded
        # Exposed communication per group (metrics.jsonl comm_wait_s; dp: the
        # reduction the step did not hide), mean ms per step after the first.
        later = recs[1:] or recs
        wait_ms = {g: 1000 * sum(r.get("comm_wait_s", {}).get(g, 0) for r in later) / len(later)
                   for g in ("tp", "dp", "pp", "ep", "cp") if g in later[0].get("comm_wait_s", {})}
        ok = sorted(gl) == sorted(rl) and err <= bound
        if not ok:
            failed.append(f"{name}: loss error {err:.2e} > {bound:.1e}")
        rows.append((name, ranks, dtype, err, bound, step_ms, wait_ms, "ok" if ok else "FAIL"))
    print(f"| layout ({args.device}, ranks share one device) | ranks | dtype | max rel loss err "
          f"| bound | step ms | exposed comm ms/step: tp / dp / pp / ep / cp | |")
    print("|---|---|---|---|---|---|---|---|")
    for n, r, d, e, b, s, w, v in rows:
        waits = " / ".join(f"{w[g]:.2f}" if g in w else "-" for g in ("tp", "dp", "pp", "ep", "cp"))
        print(f"| {n} | {r} | {d} | {e:.2e} | {b:.1e} | {s:.1f} | {waits} | {v} |")
    if "pp2_zbh1_dp2" in args.layouts:
        ok, text = trace_summary(args, "pp2_zbh1_dp2")
        print(f"trace ({args.device}, pp2 zb-h1 dp2, steps 3-4): {'ok' if ok else 'FAIL'}: {text}")
        if not ok:
            failed.append("trace: " + text)
    if "watchdog" in args.extra:
        ok, text = watchdog_kill(args)
        print(f"watchdog ({args.device}, 4 ranks tp2 dp2, SIGKILL of rank 1 after step 3): "
              f"{'ok' if ok else 'FAIL'}: {text}")
        if not ok:
            failed.append("watchdog: " + text)
    if failed:
        sys.exit("FAIL: " + "; ".join(failed))
    print("multirank: ok")


if __name__ == "__main__":
    main()

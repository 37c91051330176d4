#!/usr/bin/env python3
"""Every expert-parallel layout trains like the single process.

The ~100k-parameter MoE model (tests/moe/model.yaml: 4 experts, top-2) trains
20 steps under mpirun with ep in {1, 2, 4} (ep ranks carved out of dp), alone
and with tp=2, with a non-contiguous placement table, with dp=4 over ep=2,
under a pipeline, and with expert replicas (parallel.expert_replicas), and under context parallelism
(cp2 alone, all-to-all, with ep2 x dp2, with dp2 and ZeRO-1); its per-step losses and final weights (the step_20
checkpoint's whole tensors) must equal the single process's within 1e-5
relative (fp32: only summation order differs). Dropless by default; then with
moe_capacity_factor 0.5 the dropped assignments per step (metrics.jsonl,
summed over layers) must equal the single process's exactly, and the losses
match too (ep2 x dp2, ep4 x dp4, ep2 x dp4; groups of a whole micro-batch that
span cp's chunks: cp2, all-to-all cp2, cp2 x ep2 x dp2, cp4; with
moe_capacity_segment 8 or 4, groups inside cp's chunks, cp2, cp2 x ep2 x dp2,
all-to-all cp2 and cp4, and 16, a group of two chunks on two ranks, cp2,
against the single process with the same segment). Checkpoints move between these layouts (cp's included), and the
aux-loss-free biases resume bitwise and follow the single process under cp.

usage: compare_experts.py --train BIN --mpirun WRAPPER --data DIR --work DIR
"""
import argparse
import os
import sys


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "layouts"))
from train_run import in_pairs, losses, rel_errors, train_run  # noqa: E402


def run(args, name, sets, ranks, weights=True, resume_from=None):
    """(losses by step, final weights, seconds, dropped assignments by step) or None."""
    r = train_run(args, os.path.join(HERE, "model.yaml"), name, sets, ranks, resume_from, weights)
    if r is None:
        return None
    recs, w, dt = r
    return losses(recs), w, dt, {q["step"]: sum(x["dropped"] for x in q.get("moe", [])) for q in recs}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "emulated"],
                    help="train.device of every run (emulated: the device code paths on the CPU)")
    ap.add_argument("--tol", type=float, default=1e-5)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    failed = []
    ref = run(args, "single", [], 1)
    if ref is None:
        sys.exit("FAIL: the single-process run")
    ref_l, ref_w, ref_t, _ = ref
    print(f"single process: loss {ref_l[1]:.6f} -> {ref_l[20]:.6f} ({ref_t:.1f} s)", flush=True)
    layouts = [  # name, sets, ranks
        ("ep2_dp2", ["parallel.dp=2", "parallel.ep=2"], 2),
        ("ep4_dp4", ["parallel.dp=4", "parallel.ep=4"], 4),
        ("ep2_dp4", ["parallel.dp=4", "parallel.ep=2"], 4),
        ("ep4_dp4_placement", ["parallel.dp=4", "parallel.ep=4",
                               "parallel.expert_placement=[2,0,3,1]"], 4),
        ("tp2_ep1", ["parallel.tp=2"], 2),
        ("tp2_ep2_dp2", ["parallel.tp=2", "parallel.dp=2", "parallel.ep=2"], 4),
        ("tp2_ep4_dp4", ["parallel.tp=2", "parallel.dp=4", "parallel.ep=4"], 8),
        ("tp2_sp_ep2_dp2", ["parallel.tp=2", "parallel.dp=2", "parallel.ep=2",
                            "parallel.sequence_parallel=true"], 4),
        ("pp2_ep2_dp2", ["parallel.pp=2", "parallel.dp=2", "parallel.ep=2",
                         "parallel.schedule=1f1b"], 4),
    ]
    # Expert replicas (parallel.expert_replicas): shadows serve a share of a
    # hot expert's tokens; the model's numbers are the single process's.
    rep2 = ["parallel.expert_slots=3", 'parallel.expert_replicas="0:0=0.5,1=0.5;3:1=0.3,0=0.7"']
    layouts += [
        ("ep2_dp2_replicas", ["parallel.dp=2", "parallel.ep=2"] + rep2, 2),
        ("ep4_dp4_replicas", ["parallel.dp=4", "parallel.ep=4", "parallel.expert_slots=3",
                              'parallel.expert_replicas="0:0=0.4,1=0.3,3=0.3;2:2=0.5,1=0.5"'], 4),
        ("tp2_ep2_dp2_replicas", ["parallel.tp=2", "parallel.dp=2", "parallel.ep=2"] + rep2, 4),
        ("pp2_ep2_dp2_replicas", ["parallel.pp=2", "parallel.dp=2", "parallel.ep=2",
                                  "parallel.schedule=1f1b"] + rep2, 4),
        # Split backward (B, then W later): the replicas' gradients go back in
        # each chunk's last B, once a step.
        ("pp2_ep2_dp2_replicas_zb", ["parallel.pp=2", "parallel.dp=2", "parallel.ep=2",
                                     "parallel.schedule=zb-h1"] + rep2, 4),
        # Context parallelism: each rank routes its chunks of the sequences;
        # the aux loss is over the whole sequences (summed over cp), the
        # experts' gradients over edp x cp, ZeRO-1 over dp x cp.
        ("cp2", ["parallel.cp=2"], 2),
        ("cp2_a2a", ["parallel.cp=2", "parallel.cp_mode=all-to-all"], 2),
        ("cp2_ep2_dp2", ["parallel.cp=2", "parallel.dp=2", "parallel.ep=2"], 4),
        ("cp2_dp2_zero1", ["parallel.cp=2", "parallel.dp=2", "parallel.zero=1"], 4),
    ]
    print(f"{'layout':>20}  {'max rel loss err':>16}  {'max rel weight err':>18}  {'time':>6}")
    # Independent runs: two at a time (in_pairs), checked in order.
    for (name, sets, ranks), r in zip(layouts, in_pairs([lambda e=e: run(args, *e) for e in layouts],
                                                          [e[2] for e in layouts])):
        if r is None:
            failed.append(f"{name}: exited non-zero")
            continue
        l, w, t, _ = r
        if sorted(l) != sorted(ref_l) or sorted(w) != sorted(ref_w):
            failed.append(f"{name}: steps or tensors differ")
            continue
        lerr, werr, worst = rel_errors(l, ref_l, w, ref_w)
        ok = lerr <= args.tol and werr <= args.tol
        print(f"{name:>20}  {lerr:>16.3e}  {werr:>18.3e}  {t:>5.1f}s  {'PASS' if ok else 'FAIL ' + worst}",
              flush=True)
        if not ok:
            failed.append(name)
    # Checkpoints move between expert layouts: step_10 of one resumes in another.
    resumes = [("ep2_dp2", ("single", [], 1)),
               ("ep2_dp2", ("ep4_dp4", ["parallel.dp=4", "parallel.ep=4"], 4)),
               ("tp2_ep2_dp2", ("ep4_dp4_placement", ["parallel.dp=4", "parallel.ep=4",
                                                      "parallel.expert_placement=[2,0,3,1]"], 4)),
               # cp's ranks are dp x cp replicas to a checkpoint, ZeRO-1's
               # AdamW chunks among them
               ("cp2_ep2_dp2", ("ep4_dp4", ["parallel.dp=4", "parallel.ep=4"], 4)),
               ("cp2_dp2_zero1", ("ep2_dp2", ["parallel.dp=2", "parallel.ep=2"], 2)),
               ("ep2_dp2", ("cp2_ep2_dp2", ["parallel.cp=2", "parallel.dp=2", "parallel.ep=2"], 4))]
    done = in_pairs([lambda src=src, d=d: run(args, f"resume_{src}_to_{d[0]}", d[1], d[2],
                                              resume_from=os.path.join(args.work, src, "ckpt", "step_10"))
                     for src, d in resumes], [d[2] for _, d in resumes])
    for (src, (dst, sets, ranks)), r in zip(resumes, done):
        name = f"resume_{src}_to_{dst}"
        if r is None:
            failed.append(f"{name}: exited non-zero")
            continue
        l, w = r[0], r[1]
        lerr, werr, _ = rel_errors(l, ref_l, w, ref_w)
        ok = min(l) == 11 and lerr <= args.tol and werr <= args.tol
        print(f"{name}: steps 11-20 max rel loss err {lerr:.3e}, final weights {werr:.3e}  "
              f"{'PASS' if ok else 'FAIL'}", flush=True)
        if not ok:
            failed.append(name)
    # The aux-loss-free biases are part of the checkpoint: a resume is bitwise
    # (without them the routing after the resume would differ).
    af = ["model.moe_aux_free=true", "model.moe_bias_rate=0.01"]
    cap = ["model.moe_capacity_factor=0.5"]
    caps = [("cap_ep2_dp2", ["parallel.dp=2", "parallel.ep=2"], 2),
            ("cap_ep4_dp4", ["parallel.dp=4", "parallel.ep=4"], 4),
            # two ep groups: the record adds the other group's tokens (edp)
            ("cap_ep2_dp4", ["parallel.dp=4", "parallel.ep=2"], 4),
            # groups of a whole micro-batch spanning cp's chunks: each run's
            # prior counts all-gathered over cp (core/model/moe_capacity.hpp)
            ("cap_cp2", ["parallel.cp=2"], 2),
            ("cap_cp2_a2a", ["parallel.cp=2", "parallel.cp_mode=all-to-all"], 2),
            ("cap_cp2_ep2_dp2", ["parallel.cp=2", "parallel.dp=2", "parallel.ep=2"], 4),
            ("cap_cp4", ["parallel.cp=4"], 4)]
    # Capacity groups of a segment inside cp's chunks (seq_len 32: chunks of 8
    # at cp2, 4 at cp4): the drops of the single process with the same segment.
    seg = [("model.moe_capacity_segment=8", [("cap_seg8_cp2", ["parallel.cp=2"], 2),
                                             ("cap_seg8_cp2_ep2_dp2", ["parallel.cp=2", "parallel.dp=2",
                                                                       "parallel.ep=2"], 4),
                                             ("cap_seg8_cp2_a2a", ["parallel.cp=2",
                                                                   "parallel.cp_mode=all-to-all"], 2)]),
           ("model.moe_capacity_segment=4", [("cap_seg4_cp4", ["parallel.cp=4"], 4)]),
           # a segment of two chunks (16 at cp2: chunks 0 and 1 on two ranks)
           ("model.moe_capacity_segment=16", [("cap_seg16_cp2", ["parallel.cp=2"], 2)])]
    # The runs below that need no other's checkpoint, in pairs.
    a, s1, c2, c1, *cr = in_pairs(
        [lambda: run(args, "aux_free_ep2", af + ["parallel.dp=2", "parallel.ep=2"], 2, weights=False),
         lambda: run(args, "aux_free_single", af, 1, weights=False),
         lambda: run(args, "aux_free_cp2_ep2_dp2", af + ["parallel.cp=2", "parallel.dp=2", "parallel.ep=2"],
                     4, weights=False),
         lambda: run(args, "cap_single", cap, 1, weights=False)]
        + [lambda e=e: run(args, e[0], cap + e[1], e[2], weights=False) for e in caps]
        + [lambda s=s: run(args, "cap_" + s.split("=")[1] + "_single", cap + [s], 1, weights=False)
           for s, _ in seg]
        + [lambda s=s, e=e: run(args, e[0], cap + [s] + e[1], e[2], weights=False)
           for s, es in seg for e in es],
        [2, 1, 4, 1] + [e[2] for e in caps] + [1 for _ in seg] + [e[2] for _, es in seg for e in es])
    cr, seg_single, seg_runs = cr[:len(caps)], cr[len(caps):len(caps) + len(seg)], cr[len(caps) + len(seg):]
    b = run(args, "aux_free_ep2_resumed", af + ["parallel.dp=2", "parallel.ep=2"], 2, weights=False,
            resume_from=os.path.join(args.work, "aux_free_ep2", "ckpt", "step_10"))
    ok = a is not None and b is not None and min(b[0]) == 11 and all(b[0][k] == a[0][k] for k in b[0])
    print(f"aux-free bias resume (ep2): {'PASS bitwise' if ok else 'FAIL'}", flush=True)
    if not ok:
        failed.append("aux_free_resume")
    # The biases follow the load of every token: under cp summed over the
    # experts' replicas edp x cp, as the single process counts them.
    lerr = rel_errors(c2[0], s1[0], {}, {})[0] if s1 and c2 and sorted(c2[0]) == sorted(s1[0]) else 1.0
    print(f"aux-free biases under cp2 x ep2 x dp2: max rel loss err {lerr:.3e} against the single "
          f"process  {'PASS' if lerr <= args.tol else 'FAIL'}", flush=True)
    if lerr > args.tol:
        failed.append("aux_free_cp2_ep2_dp2")
    # Capacity: drops counted and identical to the single process's, step by
    # step (the record sums every rank's tokens: over ep, then edp x cp), and
    # the segment must change the single process's drops (else the cp runs'
    # grouping would go unchecked).
    against = [(e, r, c1) for e, r in zip(caps, cr)]
    it = iter(seg_runs)
    for (s, es), single in zip(seg, seg_single):
        against += [(e, next(it), single) for e in es]
        ok = single is not None and c1 is not None and single[3] != c1[3]
        print(f"single process, {s}: dropped {sum(single[3].values()) if single else '-'} "
              f"(whole micro-batch groups: {sum(c1[3].values()) if c1 else '-'}), per step "
              f"{'different' if ok else 'THE SAME'}  {'PASS' if ok else 'FAIL'}", flush=True)
        if not ok:
            failed.append(f"single process {s}: the segment changes no drop")
    for (name, sets, ranks), r, ref in against:
        if ref is None or r is None:
            failed.append(f"{name}: exited non-zero")
            continue
        lerr = rel_errors(r[0], ref[0], {}, {})[0]
        same_drops = r[3] == ref[3]
        total = sum(ref[3].values())
        ok = lerr <= args.tol and same_drops and total > 0
        print(f"{name}: dropped {sum(r[3].values())} assignments over 20 steps "
              f"(single process {total}{'' if same_drops else ', NOT step by step the same'}), max rel loss err "
              f"{lerr:.3e}  {'PASS' if ok else 'FAIL'}", flush=True)
        if not ok:
            failed.append(name)
    if failed:
        sys.exit("FAIL: " + "; ".join(failed))
    print("PASS: every expert-parallel layout equals the single process")


if __name__ == "__main__":
    main()

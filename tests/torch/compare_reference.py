#!/usr/bin/env python3
"""Checks an adgt-reference-dump file against the independent PyTorch LLaMA.

    /usr/bin/python3 tests/torch/compare_reference.py DUMP.h5 [--verbose]

The reference (tests/torch/llama_ref.py) always runs in float64, starting from
the dump's initial weights (model/<HF name>) and reading the dump's batches
(batch/tokens). It recomputes step 0's logits, loss and gradients, and then
trains S steps with torch.optim.AdamW, clip_grad_norm_ and the dump's learning
rates, and compares each quantity by relative error ||a - b|| / ||b||
(per parameter for gradients and final weights; per step for losses, gradient
norms and learning rates). The learning rates are also checked against the
schedule recomputed here (linear warm-up, then cosine to min_lr).

Prints a table (quantity, max relative error, tolerance, PASS/FAIL) and exits
0 when everything passes, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_ref import LlamaConfig, LlamaForCausalLM, lr_at, train_steps  # noqa: E402

# Relative-error tolerances per dump dtype.
TOLERANCES = {
    "f32": {"logits": 1e-5, "loss": 1e-5, "grad": 1e-4, "losses": 1e-5, "grad_norms": 1e-5,
            "final": 1e-4, "lrs": 1e-6},
    "f64": {"logits": 1e-10, "loss": 1e-10, "grad": 1e-9, "losses": 1e-9, "grad_norms": 1e-9,
            "final": 1e-8, "lrs": 1e-12},
}


def rel_err(a, b) -> float:
    """||a - b|| / ||b|| in float64; exact zeros on both sides count as 0."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return math.inf
    num = float(np.linalg.norm((a - b).ravel()))
    den = float(np.linalg.norm(b.ravel()))
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def per_entry_rel(a, b) -> float:
    """max_i |a_i - b_i| / |b_i| over a 1-D series (each step on its own)."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    if a.shape != b.shape:
        return math.inf
    worst = 0.0
    for x, y in zip(a, b):
        worst = max(worst, rel_err([x], [y]) if np.isfinite(x) else math.inf)
    return worst


class Report:
    def __init__(self, tol: dict, floor: bool):
        self.tol = tol
        self.floor = floor  # show the fp32 floor column
        self.rows = []      # (quantity, err, tol, ok, floor, where)

    def add(self, quantity: str, key: str, err: float, floor: float = math.nan, where: str = ""):
        tol = self.tol[key]
        ok = bool(err <= tol)  # NaN fails
        self.rows.append((quantity, err, tol, ok, floor, where))

    def fail(self, quantity: str, why: str):
        self.rows.append((quantity, math.nan, math.nan, False, math.nan, why))

    def print(self):
        w = max([len(r[0]) for r in self.rows] + [8])
        fl = f"  {'fp32 floor':>10}" if self.floor else ""
        print(f"{'quantity':<{w}}  {'max rel err':>12}  {'tolerance':>10}{fl}  result  worst")
        for q, err, tol, ok, floor, where in self.rows:
            fl = (f"  {'-':>10}" if math.isnan(floor) else f"  {floor:>10.3e}") if self.floor else ""
            print(f"{q:<{w}}  {err:>12.3e}  {tol:>10.1e}{fl}  {'PASS' if ok else 'FAIL':<6}  {where}")
        if self.floor:
            print("fp32 floor: the same error for PyTorch's own float32 run of the reference "
                  "(fp32 rounding alone; not used for PASS/FAIL)")

    @property
    def ok(self) -> bool:
        return all(r[3] for r in self.rows)


def run_reference(mcfg: LlamaConfig, dtype: torch.dtype, init: dict, tokens: torch.Tensor,
                  tcfg: dict, lrs: list) -> dict:
    """Step 0's logits, loss and gradients, then len(lrs) AdamW steps, from
    the weights `init` (name -> float64 array); all results as float64 numpy."""
    model = LlamaForCausalLM(mcfg, dtype)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(torch.from_numpy(init[n]))
    b0 = tokens[0]
    loss0, logits0 = model.loss(b0[:, :-1], b0[:, 1:])
    loss0.backward()
    out = {"logits": logits0.detach().double().numpy(), "loss": loss0.item(),
           "grad": {n: p.grad.detach().double().numpy().copy() for n, p in model.named_parameters()}}
    model.zero_grad(set_to_none=True)
    hist = train_steps(model, tokens, tcfg, lrs)
    out["losses"], out["grad_norms"] = hist["losses"], hist["grad_norms"]
    out["final"] = {n: p.detach().double().numpy().copy() for n, p in model.named_parameters()}
    return out


def params_err(got, want: dict, verbose: bool = False, label: str = ""):
    """Worst per-parameter rel_err of got[name] (a dict or an h5py group)
    against want[name]; returns (err, name)."""
    worst, where = 0.0, ""
    for name, w in want.items():
        err = rel_err(got[name][()], w)
        if verbose:
            print(f"  {label:<14} {name:<48} {err:.3e}")
        if not math.isnan(worst) and not (err <= worst):  # a NaN stays the worst
            worst, where = err, name
    return worst, where


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dump", help="HDF5 file written by adgt-reference-dump")
    ap.add_argument("--verbose", action="store_true", help="print every parameter's and step's errors")
    ap.add_argument("--no-floor", action="store_true",
                    help="for f32 dumps, skip PyTorch's own float32 run (the 'fp32 floor' column)")
    args = ap.parse_args()

    torch.manual_seed(0)
    with h5py.File(args.dump, "r") as f:
        cfg = json.loads(f.attrs["config_json"])
        dtype = cfg.get("dtype", "f32")
        if dtype not in TOLERANCES:
            print(f"{args.dump}: config_json dtype={dtype!r}; expected 'f32' or 'f64'")
            return 1
        tcfg = cfg["train"]
        mcfg = LlamaConfig.from_dict(cfg["model"])
        floor = dtype == "f32" and not args.no_floor
        rep = Report(TOLERANCES[dtype], floor)
        print(f"{args.dump}: dtype {dtype}; reference in float64; model {cfg['model']}")

        # ---- the dump's initial weights and batches, checked for shape
        names = [n for n, _ in LlamaForCausalLM(mcfg, torch.float64).named_parameters()]
        shapes = {n: tuple(p.shape) for n, p in LlamaForCausalLM(mcfg, torch.float64).named_parameters()}
        for group in ("model", "grad", "final"):
            have = set(f[group].keys()) if group in f else set()
            missing, extra = sorted(set(names) - have), sorted(have - set(names))
            if missing or extra:
                print(f"{group}/: parameter names differ from HF's: missing {missing}, unexpected {extra}")
                return 1
            for n in names:
                if tuple(f[f"{group}/{n}"].shape) != shapes[n]:
                    print(f"{group}/{n}: shape {f[f'{group}/{n}'].shape}, expected {shapes[n]} (HF (out, in) layout)")
                    return 1
        init = {n: np.asarray(f[f"model/{n}"][()], dtype=np.float64) for n in names}
        tokens = torch.from_numpy(np.asarray(f["batch/tokens"][()], dtype=np.int64))  # (S, B, T+1)
        S = tokens.shape[0]
        if tokens.min() < 0 or tokens.max() >= mcfg.vocab_size:
            print(f"batch/tokens: ids outside [0, {mcfg.vocab_size})")
            return 1
        if tokens.shape[2] - 1 > mcfg.seq_len:
            print(f"batch/tokens: windows of {tokens.shape[2]} exceed seq_len+1={mcfg.seq_len + 1}")
            return 1
        dump_lrs = np.asarray(f["train/lrs"][()], dtype=np.float64)
        if dump_lrs.shape != (S,):
            print(f"train/lrs: shape {dump_lrs.shape}, expected ({S},)")
            return 1

        # ---- the truth (float64) and, for f32 dumps, PyTorch's own fp32 error
        ref = run_reference(mcfg, torch.float64, init, tokens, tcfg, dump_lrs.tolist())
        r32 = run_reference(mcfg, torch.float32, init, tokens, tcfg, dump_lrs.tolist()) if floor else None

        def fl(fn):
            return fn(r32) if r32 is not None else math.nan

        rep.add("step0 logits", "logits", rel_err(f["step0/logits"][()], ref["logits"]),
                fl(lambda r: rel_err(r["logits"], ref["logits"])))
        rep.add("step0 loss", "loss", rel_err(f["step0/loss"][()], ref["loss"]),
                fl(lambda r: rel_err(r["loss"], ref["loss"])))
        err, where = params_err(f["grad"], ref["grad"], args.verbose, "step0 grads")
        rep.add("step0 grads", "grad", err, fl(lambda r: params_err(r["grad"], ref["grad"])[0]), where)

        # learning-rate schedule, recomputed independently
        sched = [lr_at(s, float(tcfg["lr"]), float(tcfg["min_lr"]), int(tcfg["warmup_steps"]),
                       int(tcfg["steps"])) for s in range(S)]
        rep.add("lrs vs schedule", "lrs", per_entry_rel(dump_lrs, sched))

        rep.add(f"train losses ({S} steps)", "losses", per_entry_rel(f["train/losses"][()], ref["losses"]),
                fl(lambda r: per_entry_rel(r["losses"], ref["losses"])))
        rep.add(f"grad norms ({S} steps)", "grad_norms",
                per_entry_rel(f["train/grad_norms"][()], ref["grad_norms"]),
                fl(lambda r: per_entry_rel(r["grad_norms"], ref["grad_norms"])))
        err, where = params_err(f["final"], ref["final"], args.verbose, "final weights")
        rep.add("final weights", "final", err, fl(lambda r: params_err(r["final"], ref["final"])[0]), where)
        if args.verbose:
            for s in range(S):
                print(f"  step {s:3d}  lr {dump_lrs[s]:.6e}  loss dump {f['train/losses'][s]:.10f} "
                      f"ref {ref['losses'][s]:.10f}  norm dump {f['train/grad_norms'][s]:.8f} "
                      f"ref {ref['grad_norms'][s]:.8f}")

    rep.print()
    print("PASS" if rep.ok else "FAIL")
    return 0 if rep.ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, KeyError) as e:  # unreadable file, missing dataset or attribute
        print(f"compare_reference: {e}")
        sys.exit(1)

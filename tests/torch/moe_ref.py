#!/usr/bin/env python3
"""Independent PyTorch float64 check of adgt's mixture-of-experts block.

    moe_ref.py DUMP.h5     (written by adgt-moe-dump --dtype f32|f64)

For every case group in the dump, recomputes from the stored inputs (cast to
float64) with autograd:
  router   logits = x gate^T, probs = softmax(logits)
  select   top_k experts by probs + bias (bias only with aux_free), ties to the
           lower expert id, weights = the chosen probs / their sum
  capacity per group of capacity_segment rows (0: all rows), expert e takes at
           most ceil(capacity_factor * rows * top_k / E) assignments in token
           order; the rest contribute 0 (weights not renormalised)
  experts  y = w2 (silu(w1 x) * (w3 x))
  aux      E * sum_e f_e P_e, f_e = routed assignments / (N top_k) (a constant),
           P_e = mean probs[:, e]
  loss     sum(out * dout) + aux_loss_coef * aux_grad_scale * aux
and compares adgt's output, aux, gradients (relative error, max |a - b| / max
|b|, 1e-5 for f32 and 1e-10 for f64 dumps) and load / dropped (exactly).
Exits 1 on any mismatch.
"""
import math
import sys

import h5py
import numpy as np
import torch


def reference(g):
    a = g.attrs
    k = int(a["top_k"])
    coef, scale = float(a["aux_loss_coef"]), float(a["aux_grad_scale"])
    cf, seg = float(a["capacity_factor"]), int(a["capacity_segment"])
    aux_free = bool(a["aux_free"])
    t = {n: torch.tensor(np.asarray(g[n], dtype=np.float64), requires_grad=True)
         for n in ("x", "gate", "w1", "w2", "w3")}
    x, gate, w1, w2, w3 = t["x"], t["gate"], t["w1"], t["w2"], t["w3"]
    bias = np.asarray(g["bias"], dtype=np.float64)
    dout = torch.tensor(np.asarray(g["dout"], dtype=np.float64))
    N, E = x.shape[0], gate.shape[0]

    probs = torch.softmax(x @ gate.T, dim=-1)
    score = probs.detach().numpy() + (bias if aux_free else 0.0)
    chosen = np.argsort(-score, axis=1, kind="stable")[:, :k]  # ties: lower id first
    chosen_t = torch.from_numpy(chosen)
    p_sel = probs.gather(1, chosen_t)
    weights = p_sel / p_sel.sum(dim=1, keepdim=True)

    keep = np.ones((N, k), dtype=bool)
    if cf > 0:
        seg = seg if seg > 0 else N
        for g0 in range(0, N, seg):
            rows = min(seg, N - g0)
            cap = math.ceil(cf * (rows * k) / E)
            used = np.zeros(E, dtype=np.int64)
            for tok in range(g0, g0 + rows):
                for j in range(k):
                    e = chosen[tok, j]
                    if used[e] < cap:
                        used[e] += 1
                    else:
                        keep[tok, j] = False

    out = torch.zeros_like(x)
    for e in range(E):
        toks, js = np.nonzero((chosen == e) & keep)
        if len(toks) == 0:
            continue
        ti, ji = torch.from_numpy(toks), torch.from_numpy(js)
        xe = x[ti]
        y = (torch.nn.functional.silu(xe @ w1[e].T) * (xe @ w3[e].T)) @ w2[e].T
        out = out.index_add(0, ti, weights[ti, ji].unsqueeze(1) * y)

    load = np.bincount(chosen.reshape(-1), minlength=E)
    f = torch.tensor(load / (N * k), dtype=torch.float64)
    aux = E * (f * probs.mean(dim=0)).sum()
    loss = (out * dout).sum() + coef * scale * aux
    loss.backward()
    return {
        "out": out.detach().numpy(), "aux": aux.item(), "load": load,
        "dropped": int((~keep).sum()), "dx": x.grad.numpy(), "dgate": gate.grad.numpy(),
        "dw1": w1.grad.numpy(), "dw2": w2.grad.numpy(), "dw3": w3.grad.numpy(),
    }


def rel_err(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    ref = np.abs(b).max() if b.size else 0.0
    err = np.abs(a - b).max() if b.size else 0.0
    return err / ref if ref > 0 else err


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 64
    torch.set_default_dtype(torch.float64)
    failures = 0
    with h5py.File(sys.argv[1], "r") as f:
        tol = 1e-10 if int(f.attrs["dtype_bits"]) == 64 else 1e-5
        for name, g in f.items():
            ref = reference(g)
            checks = []
            for key in ("out", "dx", "dgate", "dw1", "dw2", "dw3"):
                e = rel_err(g[key], ref[key])
                checks.append((key, e, e <= tol))
            e = abs(float(g["aux"][0]) - ref["aux"]) / max(abs(ref["aux"]), 1e-300)
            checks.append(("aux", e, e <= tol))
            ok_load = np.array_equal(np.asarray(g["load"]), ref["load"])
            ok_drop = int(g["dropped"][0]) == ref["dropped"]
            checks.append(("load", 0.0 if ok_load else 1.0, ok_load))
            checks.append(("dropped", 0.0 if ok_drop else 1.0, ok_drop))
            bad = [c for c in checks if not c[2]]
            failures += len(bad)
            detail = " ".join(f"{k}={e:.2e}" for k, e, _ in checks[:7])
            print(f"moe_ref {name}: {'ok' if not bad else 'FAILED'} (tol {tol:g}) {detail} "
                  f"dropped={ref['dropped']}")
            for k, e, _ in bad:
                print(f"  mismatch: {k} (error {e:.3e})")
    print("moe_ref: " + ("ok" if failures == 0 else f"{failures} mismatches"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Writes a dump in adgt-reference-dump's format from the PyTorch reference
itself, optionally with one deliberate error, to test compare_reference.py.

    /usr/bin/python3 tests/torch/make_fake_dump.py --config tests/torch/ref_model.yaml \
        --out fake.h5 --dtype f32 [--perturb grad|logit|loss|losses|grad_norm|lr|final|none]

The model runs in --dtype (f32 dumps therefore carry genuine fp32 rounding,
which is what the comparison's f32 tolerances must absorb). A perturbation
changes a single entry by 1e-3 relative (--rel): the largest-magnitude entry
of the chosen tensor, so the change is as visible as one entry can be.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_ref import LlamaConfig, LlamaForCausalLM, lr_at, read_yaml, train_steps  # noqa: E402

TRAIN_KEYS = ("micro_batch", "lr", "min_lr", "warmup_steps", "steps", "weight_decay",
              "decay_norms_and_embeddings", "beta1", "beta2", "eps", "grad_clip")
TRAIN_DEFAULTS = {"micro_batch": 8, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 20, "steps": 300,
                  "weight_decay": 0.1, "decay_norms_and_embeddings": False, "beta1": 0.9,
                  "beta2": 0.95, "eps": 1e-8, "grad_clip": 1.0}
PERTURB_TARGET = "model.layers.0.self_attn.q_proj.weight"


def bump_largest(a: np.ndarray, rel: float) -> np.ndarray:
    a = np.array(a, copy=True)
    i = np.unravel_index(np.argmax(np.abs(a)), a.shape)
    a[i] *= 1.0 + rel
    return a


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", choices=("f32", "f64"), default="f32")
    ap.add_argument("--steps", type=int, default=None, help="default: train.steps of the config")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--perturb", default="none",
                    choices=("none", "grad", "logit", "loss", "losses", "grad_norm", "lr", "final"))
    ap.add_argument("--rel", type=float, default=1e-3, help="relative size of the perturbation")
    args = ap.parse_args()

    y = read_yaml(args.config)
    mcfg = LlamaConfig.from_dict(y.get("model", {}))
    train = {k: type(TRAIN_DEFAULTS[k])(y.get("train", {}).get(k, TRAIN_DEFAULTS[k])) for k in TRAIN_KEYS}
    S = args.steps if args.steps is not None else train["steps"]
    train["steps"] = S
    dtype = torch.float32 if args.dtype == "f32" else torch.float64
    npdt = np.float32 if args.dtype == "f32" else np.float64

    g = torch.Generator().manual_seed(args.seed)
    model = LlamaForCausalLM(mcfg, dtype)
    model.reset_parameters(generator=g)
    B, T = train["micro_batch"], mcfg.seq_len
    tokens = torch.randint(0, mcfg.vocab_size, (S, B, T + 1), generator=g, dtype=torch.int32)
    lrs = [lr_at(s, train["lr"], train["min_lr"], train["warmup_steps"], S) for s in range(S)]

    names = [n for n, _ in model.named_parameters()]
    init = {n: p.detach().cpu().numpy().astype(npdt) for n, p in model.named_parameters()}
    b0 = tokens[0].long()
    loss0, logits0 = model.loss(b0[:, :-1], b0[:, 1:])
    loss0.backward()
    grads = {n: p.grad.detach().numpy().astype(npdt) for n, p in model.named_parameters()}
    logits0 = logits0.detach().numpy().astype(npdt)
    loss0 = np.array(loss0.item(), dtype=npdt)
    model.zero_grad(set_to_none=True)

    hist = train_steps(model, tokens, train, lrs)
    final = {n: p.detach().numpy().astype(npdt) for n, p in model.named_parameters()}
    losses = np.array(hist["losses"], dtype=npdt)
    norms = np.array(hist["grad_norms"], dtype=npdt)
    lrs_np = np.array(lrs, dtype=np.float64)

    r = args.rel
    if args.perturb == "grad":
        grads[PERTURB_TARGET] = bump_largest(grads[PERTURB_TARGET], r)
    elif args.perturb == "logit":
        logits0 = bump_largest(logits0, r)
    elif args.perturb == "loss":
        loss0 = np.array(loss0 * (1 + r), dtype=npdt)
    elif args.perturb == "losses":
        losses[S // 2] *= 1 + r
    elif args.perturb == "grad_norm":
        norms[S // 2] *= 1 + r
    elif args.perturb == "lr":
        lrs_np[S // 2] *= 1 + r
    elif args.perturb == "final":
        final[PERTURB_TARGET] = bump_largest(final[PERTURB_TARGET], r)

    cfg_json = {"model": {k: getattr(mcfg, k) for k in ("vocab_size", "d_model", "n_layers", "n_heads",
                                                       "n_kv_heads", "ffn_hidden", "seq_len", "rope_theta",
                                                       "norm_eps", "tie_embeddings")},
                "train": train, "dtype": args.dtype}
    with h5py.File(args.out, "w") as f:
        f.attrs["config_json"] = json.dumps(cfg_json)
        for n in names:
            f[f"model/{n}"] = init[n]
            f[f"grad/{n}"] = grads[n]
            f[f"final/{n}"] = final[n]
        f["batch/tokens"] = tokens.numpy()
        f["step0/logits"] = logits0
        f["step0/loss"] = loss0
        f["train/losses"] = losses
        f["train/lrs"] = lrs_np
        f["train/grad_norms"] = norms
    print(f"wrote {args.out} ({args.dtype}, {S} steps, perturb={args.perturb})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

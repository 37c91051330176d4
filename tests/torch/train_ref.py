#!/usr/bin/env python3
"""Trains the PyTorch reference LLaMA on the CPU and reports tokens/s: the
other half of scripts/bench_cpu.sh (adgt-train against PyTorch, same shape).

    /usr/bin/python3 tests/torch/train_ref.py --config configs/tiny.yaml --steps 20 --threads 2

Model shape, batch, learning-rate schedule and AdamW settings come from the
run file's model/train sections (flags override). Random init (N(0, init_std)),
float32, torch.optim.AdamW with weight decay on the linear weights, global-norm
clipping, gradient accumulation global_batch / micro_batch. Tokens: random
windows of a token shard (adgt-data output, see core/data/token_shard.hpp) when
--tokens or the config's data.train names one that exists, else uniform random
ids (the speed does not depend on which).

Per-step tokens/s = global_batch * seq_len / step time; the summary is the
median over all steps but the first (which warms caches and thread pools).
The last line is machine-readable: `tokens_per_s <median>`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SHARD_MAGIC = b"ADGTTOK\0"
SHARD_HEADER = 64


def open_shard(path: str) -> np.ndarray:
    """Memory-maps an adgt token shard: 64-byte header (magic "ADGTTOK\\0",
    u32 version 1 or 2, u32 dtype 1=uint16/2=uint32, u64 count, u64 vocab, u64
    documents (version 2), zeros) then the tokens (then version 2's document
    index)."""
    with open(path, "rb") as f:
        head = f.read(SHARD_HEADER)
    if len(head) < SHARD_HEADER or head[:8] != SHARD_MAGIC:
        raise SystemExit(f"{path}: not an adgt token shard (bad magic); make one with adgt-data prepare")
    version, dt, count, vocab = struct.unpack_from("<IIQQ", head, 8)
    if version not in (1, 2) or dt not in (1, 2):
        raise SystemExit(f"{path}: unsupported shard version {version} / dtype {dt}")
    return np.memmap(path, dtype=np.uint16 if dt == 1 else np.uint32, mode="r",
                     offset=SHARD_HEADER, shape=(count,))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/tiny.yaml", help="adgt run file (model/train/data sections)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    ap.add_argument("--micro-batch", type=int)
    ap.add_argument("--global-batch", type=int)
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--warmup-steps", type=int, help="default: the config's train.warmup_steps")
    ap.add_argument("--tokens", help="token shard to sample from (default: the config's data.train)")
    ap.add_argument("--random-tokens", action="store_true", help="uniform random ids, ignore any shard")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--log-interval", type=int, default=1)
    ap.add_argument("--json", help="also write the per-step figures to this JSON file")
    args = ap.parse_args()

    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch  # after OMP_NUM_THREADS is set

    from llama_ref import LlamaConfig, LlamaForCausalLM, lr_at, make_adamw, read_yaml

    torch.set_num_threads(args.threads)
    y = read_yaml(args.config)
    mdict = dict(y.get("model", {}))
    if args.seq_len:
        mdict["seq_len"] = args.seq_len
    cfg = LlamaConfig.from_dict(mdict)
    t = dict(y.get("train", {}))
    mb = args.micro_batch or int(t.get("micro_batch", 8))
    gb = args.global_batch or int(t.get("global_batch", mb))
    if gb % mb:
        raise SystemExit(f"global_batch={gb} is not a multiple of micro_batch={mb}")
    accum, T, V = gb // mb, cfg.seq_len, cfg.vocab_size
    lr, min_lr = float(t.get("lr", 3e-3)), float(t.get("min_lr", 3e-4))
    warmup = args.warmup_steps if args.warmup_steps is not None else int(t.get("warmup_steps", 20))
    clip = float(t.get("grad_clip", 1.0))

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    model = LlamaForCausalLM(cfg, torch.float32)
    opt = make_adamw(model, t)
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)

    shard_path = None if args.random_tokens else (args.tokens or y.get("data", {}).get("train"))
    shard = None
    if shard_path and os.path.exists(shard_path):
        shard = open_shard(shard_path)
        if len(shard) < T + 2:
            raise SystemExit(f"{shard_path}: {len(shard)} tokens, fewer than seq_len+2={T + 2}")
    elif args.tokens:
        raise SystemExit(f"{args.tokens}: no such file")

    def batch() -> torch.Tensor:  # (mb, T+1) int64
        if shard is None:
            return torch.from_numpy(rng.integers(0, V, size=(mb, T + 1), dtype=np.int64))
        starts = rng.integers(0, len(shard) - T - 1, size=mb)
        b = np.stack([np.asarray(shard[s:s + T + 1], dtype=np.int64) for s in starts])
        if b.max() >= V:
            raise SystemExit(f"{shard_path}: token id {b.max()} >= vocab_size={V}")
        return torch.from_numpy(b)

    print(f"train_ref: torch {torch.__version__}, {torch.get_num_threads()} threads, {n_params} parameters, "
          f"vocab {V} d_model {cfg.d_model} layers {cfg.n_layers} heads {cfg.n_heads}/{cfg.n_kv_heads} "
          f"ffn {cfg.ffn_hidden}, batch {gb} (micro {mb} x accum {accum}) x seq {T}, "
          f"tokens: {shard_path if shard is not None else 'random'}", flush=True)

    tok_per_step = gb * T
    rates, records = [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(accum):
            b = batch()
            loss, _ = model.loss(b[:, :-1], b[:, 1:])
            (loss / accum).backward()
            total += loss.item() / accum
        norm = float(torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf")))
        cur_lr = lr_at(step, lr, min_lr, warmup, args.steps)
        for g in opt.param_groups:
            g["lr"] = cur_lr
        opt.step()
        dt = time.perf_counter() - t0
        rate = tok_per_step / dt
        if step > 0:
            rates.append(rate)
        records.append({"step": step + 1, "loss": total, "lr": cur_lr, "grad_norm": norm,
                        "tokens_per_s": rate, "step_s": dt})
        if (step + 1) % args.log_interval == 0 or step + 1 == args.steps:
            print(f"step {step + 1:5d}/{args.steps}  loss {total:.4f}  lr {cur_lr:.3e}  "
                  f"norm {norm:.3f}  {dt * 1e3:8.1f} ms  {rate:9.0f} tok/s", flush=True)

    med = statistics.median(rates) if rates else tok_per_step / records[0]["step_s"]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": torch.get_num_threads(), "tokens_per_step": tok_per_step,
                       "median_tokens_per_s": med, "steps": records}, f, indent=1)
    print(f"train_ref: median {med:.0f} tokens/s over {len(rates)} steps (first skipped), "
          f"{torch.get_num_threads()} threads")
    print(f"tokens_per_s {med:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The PyTorch baseline for adgt's GPU benchmark (docs/cuda.md).

A self-contained LLaMA-style decoder with HuggingFace LlamaForCausalLM
semantics (RMSNorm pre-norm, rotary embeddings rotate-half, SwiGLU MLP, no
biases, untied lm_head, causal attention, grouped-query attention when
--kv-heads < --heads), trained on random tokens the way such a baseline is
usually run: fp32 master parameters, torch.autocast(bfloat16), fused AdamW
(lr 3e-4), torch.compile and F.scaled_dot_product_attention(is_causal=True).
Parameter names are HuggingFace's, so a state_dict loads into an HF model or
into tests/torch/llama_ref.py.

MFU uses adgt's formula (parallel/cost/flops.cpp: mfu_flops_per_token, PaLM appendix B):
    FLOP/token = 6 * N_matmul + 12 * L * H * hd * T
N_matmul = q,k,v,o,gate,up,down of every layer + lm_head (the embedding lookup
is free); no causal discount. Peak: 989 TFLOP/s (H100/H200 dense bf16).

    python3 scripts/device/torch_llama_bench.py            # 1.3B, batch 8, cuda
    python3 scripts/device/torch_llama_bench.py --json $OUT/torch_bench.json
    python3 scripts/device/torch_llama_bench.py --precision pure-bf16
    python3 scripts/device/torch_llama_bench.py --smoke    # tiny, cpu, checks

Defaults: d_model 2048, 24 layers, 16 heads, 16 kv heads, ffn 5632, seq 2048,
vocab 32000 (~1.36B parameters), batch 8, 3 warm-up + 10 timed steps.
On CUDA out-of-memory the batch is halved (and said so, in the JSON too).

--smoke: d 64, 2 layers, 4 heads, 2 kv heads, ffn 128, seq 32, vocab 256,
batch 2, 2 timed steps, cpu, fp32, no compile; first checks the model: the
loss at init is log(vocab) within 0.5; the logits equal those of
tests/torch/llama_ref.py (an independent LLaMA) in float64 given the same
weights (when that file is there); changing a later token leaves earlier
logits alone; SDPA and the masked-softmax path agree (when SDPA exists); the
loss falls over 20 AdamW steps on one repeated batch. Exits 1 on a failed
check, 77 when torch cannot be imported (ctest's skip code).

Runs on torch >= 1.13 (no SDPA or compile there: masked softmax, eager).
"""
from __future__ import annotations

import argparse
import gc
import inspect
import json
import math
import os
import platform
import statistics
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except Exception as e:  # pragma: no cover - depends on the machine
    print(f"torch_llama_bench: cannot import torch ({e}): skipped", flush=True)
    sys.exit(77)

PEAK_TFLOPS = 989.0  # H100/H200 SXM dense bf16, the figure adgt's MFU uses
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")
HAS_COMPILE = hasattr(torch, "compile")


def log(msg: str) -> None:
    print(f"torch_llama_bench: {msg}", flush=True)


# ------------------------------------------------------------------ the model

class RMSNorm(nn.Module):
    """HF LlamaRMSNorm: normalise in (at least) float32, cast back, scale by the weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        dt = x.dtype
        h = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dt)


def rotary_tables(seq: int, hd: int, theta: float):
    """cos, sin (T, hd) in float64 (cast to the activations' dtype where used):
    angle(t, i) = t * theta^(-2i/hd), the hd/2 frequencies repeated for both
    halves (rotate-half layout)."""
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def rope(x, cos, sin):
    """x (B, H, T, hd); (x1, x2) -> x*cos + (-x2, x1)*sin."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


def attention_manual(q, k, v):
    """Causal softmax(q k^T / sqrt(hd)) v with an explicit mask, softmax in >= fp32."""
    T = q.shape[-2]
    s = torch.matmul(q, k.transpose(-1, -2))
    if s.dtype in (torch.float16, torch.bfloat16):
        s = s.float()
    s = s * (1.0 / math.sqrt(q.shape[-1]))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    s = s.masked_fill(mask, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1).to(v.dtype), v)


class Attention(nn.Module):
    def __init__(self, C, H, KV, use_sdpa):
        super().__init__()
        assert C % H == 0 and H % KV == 0
        self.H, self.KV, self.hd, self.use_sdpa = H, KV, C // H, use_sdpa
        self.q_proj = nn.Linear(C, H * self.hd, bias=False)
        self.k_proj = nn.Linear(C, KV * self.hd, bias=False)
        self.v_proj = nn.Linear(C, KV * self.hd, bias=False)
        self.o_proj = nn.Linear(H * self.hd, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.H, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.KV, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.KV, self.hd).transpose(1, 2)
        cos, sin = cos[:T].to(q.dtype), sin[:T].to(q.dtype)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        if self.KV != self.H:  # GQA: query head h reads kv head h // (H/KV)
            k = k.repeat_interleave(self.H // self.KV, dim=1)
            v = v.repeat_interleave(self.H // self.KV, dim=1)
        if self.use_sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = attention_manual(q, k, v)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.H * self.hd))


class MLP(nn.Module):
    def __init__(self, C, Fh):
        super().__init__()
        self.gate_proj = nn.Linear(C, Fh, bias=False)
        self.up_proj = nn.Linear(C, Fh, bias=False)
        self.down_proj = nn.Linear(Fh, C, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, a, use_sdpa):
        super().__init__()
        self.input_layernorm = RMSNorm(a.d_model, a.norm_eps)
        self.self_attn = Attention(a.d_model, a.heads, a.kv_heads, use_sdpa)
        self.post_attention_layernorm = RMSNorm(a.d_model, a.norm_eps)
        self.mlp = MLP(a.d_model, a.ffn)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, a, use_sdpa):
        super().__init__()
        self.embed_tokens = nn.Embedding(a.vocab, a.d_model)
        self.layers = nn.ModuleList(Layer(a, use_sdpa) for _ in range(a.layers))
        self.norm = RMSNorm(a.d_model, a.norm_eps)


class Llama(nn.Module):
    """HF LlamaForCausalLM parameter names; forward(idx, targets) -> mean CE."""

    def __init__(self, a, use_sdpa):
        super().__init__()
        self.model = Body(a, use_sdpa)
        self.lm_head = nn.Linear(a.d_model, a.vocab, bias=False)
        cos, sin = rotary_tables(a.seq, a.d_model // a.heads, a.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        with torch.no_grad():  # HF init: N(0, 0.02) for linears and embedding, norms 1
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    p.normal_(0.0, a.init_std)

    def logits(self, idx):
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x, self.rope_cos, self.rope_sin)
        return self.lm_head(self.model.norm(x))

    def forward(self, idx, targets):
        lg = self.logits(idx)
        return F.cross_entropy(lg.reshape(-1, lg.shape[-1]).float(), targets.reshape(-1))


# ------------------------------------------------------------- FLOPs, memory

def flops_per_token(a) -> tuple[float, int]:
    """adgt's formula: 6 * N_matmul + 12 * L * H * hd * T. Returns (flops, N_matmul)."""
    hd = a.d_model // a.heads
    per_layer = a.d_model * hd * (2 * a.heads + 2 * a.kv_heads) + 3 * a.d_model * a.ffn
    n_matmul = a.layers * per_layer + a.vocab * a.d_model
    return 6.0 * n_matmul + 12.0 * a.layers * a.heads * hd * a.seq, n_matmul


def estimate_memory(a, n_params: int, n_matmul: int, batch: int, precision: str) -> dict:
    """Rough bytes for the compiled path: parameters, gradients, AdamW's two
    moments, autocast's bf16 weight copies, saved activations (flash SDPA: no
    T x T matrix; bf16 matmul inputs, fp32 residual stream under autocast),
    logits (bf16 + fp32 for the loss + fp32 gradient). Eager mode saves more
    (RMSNorm's fp32 intermediates, silu's output)."""
    C, L, Fh, V, T = a.d_model, a.layers, a.ffn, a.vocab, a.seq
    hd = C // a.heads
    pb = 2 if precision == "pure-bf16" else 4
    ab = 4 if precision == "fp32" else 2          # matmul inputs
    rb = 2 if precision == "pure-bf16" else 4     # residual stream
    params = n_params * pb
    grads = n_params * pb
    adam = 2 * n_params * pb
    cast = n_matmul * 2 if precision == "amp-bf16" else 0
    per_tok_layer = (2 * rb * C                              # residual in, residual 2
                     + 2 * ab * C                            # norm1 out, norm2 out
                     + ab * hd * (2 * a.heads + 2 * a.kv_heads)  # q, k, v, attention out
                     + 3 * ab * Fh)                          # gate, up, silu(gate)*up
    tok = batch * T
    acts = tok * (L * per_tok_layer + rb * C + ab * C)
    logits = tok * V * (ab + 4 + 4)
    total = params + grads + adam + cast + acts + logits
    gib = 1 << 30
    return {"params_gib": params / gib, "grads_gib": grads / gib, "adamw_gib": adam / gib,
            "autocast_weight_copies_gib": cast / gib, "activations_gib": acts / gib,
            "logits_gib": logits / gib, "total_gib": total / gib}


# ------------------------------------------------------------------ training

def make_optimizer(model, lr, device):
    """AdamW(lr, betas (0.9, 0.95), eps 1e-8, weight decay 0.1): fused on CUDA
    where this torch has it, else torch's default (foreach on CUDA)."""
    kw = {"lr": lr, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    if device == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters:
        try:
            return torch.optim.AdamW(model.parameters(), fused=True, **kw), "fused"
        except Exception as e:  # noqa: BLE001 - bf16 parameters on an old torch, ...
            log(f"fused AdamW refused ({e}); using the default")
    return torch.optim.AdamW(model.parameters(), **kw), "default"


def autocast_ctx(precision, device):
    if precision == "amp-bf16":
        return torch.autocast(device_type=device, dtype=torch.bfloat16)
    import contextlib
    return contextlib.nullcontext()


def is_oom(e: BaseException) -> bool:
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(e, oom_type):
        return True
    return "out of memory" in str(e).lower()


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def run_once(a, batch: int, use_sdpa: bool) -> dict:
    """Builds the model and optimizer, warms up, times a.steps steps."""
    dev = torch.device(a.device)
    torch.manual_seed(a.seed)
    if hasattr(dev, "__enter__"):  # torch >= 2.0: initialise on the device (seconds, not minutes)
        with dev:
            model = Llama(a, use_sdpa)
    else:
        model = Llama(a, use_sdpa).to(dev)
    if a.precision == "pure-bf16":
        model = model.to(torch.bfloat16)
    opt, opt_kind = make_optimizer(model, a.lr, a.device)
    step_fn = model
    if a.compile:
        step_fn = torch.compile(model, dynamic=False)
    gen = torch.Generator().manual_seed(a.seed + 1)
    pool = [torch.randint(0, a.vocab, (batch, a.seq + 1), generator=gen).to(dev)
            for _ in range(4)]

    def step(i):
        tok = pool[i % len(pool)]
        with autocast_ctx(a.precision, a.device):
            loss = step_fn(tok[:, :-1], tok[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    warm_s = []
    for i in range(a.warmup):
        t0 = time.perf_counter()
        loss = step(i)
        sync(a.device)
        warm_s.append(time.perf_counter() - t0)
        log(f"warm-up step {i}: {warm_s[-1]:.2f} s, loss {loss.item():.4f}")

    times_ms, losses = [], []
    events = []
    sync(a.device)
    t_all = time.perf_counter()
    for i in range(a.steps):
        if a.device == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            loss = step(a.warmup + i)
            e1.record()
            events.append((e0, e1))
        else:
            t0 = time.perf_counter()
            loss = step(a.warmup + i)
            times_ms.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.detach())
    sync(a.device)
    wall_ms = (time.perf_counter() - t_all) * 1e3 / max(1, a.steps)
    if events:
        times_ms = [e0.elapsed_time(e1) for e0, e1 in events]
    losses = [float(x) for x in losses]
    r = {"step_ms_all": times_ms, "step_ms_wall_mean": wall_ms, "warmup_s": warm_s,
         "losses": losses, "optimizer": opt_kind}
    if a.device == "cuda":
        r["peak_mem_allocated_gib"] = torch.cuda.max_memory_allocated() / (1 << 30)
        r["peak_mem_reserved_gib"] = torch.cuda.max_memory_reserved() / (1 << 30)
    return r


def release(device):
    if HAS_COMPILE:
        try:
            torch._dynamo.reset()
        except Exception:
            pass
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def benchmark(a, use_sdpa: bool) -> dict:
    fpt, n_matmul = flops_per_token(a)
    # Embedding + lm_head + final norm + per layer (matmuls + two norms); the
    # smoke run checks this against the module.
    n_params = 2 * a.vocab * a.d_model + a.d_model + (n_matmul - a.vocab * a.d_model) + 2 * a.layers * a.d_model
    batch, notes, res = a.batch, [], None
    while True:
        failed = None
        try:
            res = run_once(a, batch, use_sdpa)
        except Exception as e:  # noqa: BLE001 - OOM is told apart below
            if a.device != "cuda" or not is_oom(e):
                raise
            failed = f"CUDA out of memory at batch {batch}: {str(e).splitlines()[0][:200]}"
        if failed is None:
            break
        release(a.device)
        notes.append(failed)
        log(failed)
        if batch == 1:
            break
        batch //= 2
        notes.append(f"batch halved to {batch}")
        log(f"halving the batch to {batch}")

    out = {
        "what": "PyTorch LLaMA baseline (scripts/device/torch_llama_bench.py)",
        "model": {"d_model": a.d_model, "layers": a.layers, "heads": a.heads,
                  "kv_heads": a.kv_heads, "ffn": a.ffn, "seq": a.seq, "vocab": a.vocab,
                  "rope_theta": a.rope_theta, "norm_eps": a.norm_eps, "tie_embeddings": False},
        "n_params": n_params, "n_params_matmul": n_matmul,
        "flops_per_token": fpt,
        "flops_formula": "6*N_matmul + 12*L*H*hd*T (adgt parallel/cost/flops.cpp: mfu_flops_per_token; lm_head counted, no causal discount)",
        "peak_tflops": PEAK_TFLOPS,
        "batch_requested": a.batch, "batch": batch, "oom_notes": notes,
        "tokens_per_step": batch * a.seq,
        "precision": a.precision, "compile": bool(a.compile),
        "attention": "sdpa(is_causal=True)" if use_sdpa else "manual masked softmax",
        "gqa": "repeat_interleave" if a.kv_heads != a.heads else "none (kv_heads == heads)",
        "device": a.device, "warmup": a.warmup, "steps": a.steps, "lr": a.lr,
        "torch": torch.__version__, "torch_cuda": getattr(torch.version, "cuda", None),
        "python": platform.python_version(),
        "memory_estimate": estimate_memory(a, n_params, n_matmul, batch, a.precision),
    }
    if a.device == "cuda":
        out["gpu"] = torch.cuda.get_device_name(0)
        out["tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
    if res is None:
        out["error"] = "out of memory even at batch 1"
        return out
    out.update(res)
    med = statistics.median(res["step_ms_all"])
    tps = batch * a.seq / (med / 1e3)
    out.update({
        "step_ms_median": med, "step_ms_min": min(res["step_ms_all"]),
        "step_ms_mean": statistics.mean(res["step_ms_all"]),
        "tokens_per_s": tps, "tflops": tps * fpt / 1e12,
        "mfu": tps * fpt / (PEAK_TFLOPS * 1e12),
        "compile_s": res["warmup_s"][0] if (a.compile and res["warmup_s"]) else None,
        "loss_finite": all(math.isfinite(x) for x in res["losses"]),
    })
    return out


# --------------------------------------------------------------- smoke checks

def smoke_checks(a, use_sdpa: bool) -> list[str]:
    """Correctness of the model on the tiny configuration; returns failures."""
    fails = []
    torch.manual_seed(a.seed)
    g = torch.Generator().manual_seed(a.seed + 7)
    tok = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
    x, y = tok[:, :-1], tok[:, 1:]

    def check(ok, what):
        log(("ok    " if ok else "FAIL  ") + what)
        if not ok:
            fails.append(what)

    # 1. loss at init ~ log(V).
    m = Llama(a, use_sdpa)
    with torch.no_grad():
        l0 = float(m(x, y))
    check(abs(l0 - math.log(a.vocab)) < 0.5,
          f"loss at init {l0:.4f} vs log(vocab) {math.log(a.vocab):.4f} (within 0.5)")

    # 1b. the FLOP formula's N_matmul is every 2-D weight but the embedding.
    _, n_matmul = flops_per_token(a)
    n_mod = sum(p.numel() for n, p in m.named_parameters() if p.dim() == 2 and "embed" not in n)
    check(n_mod == n_matmul, f"N_matmul {n_matmul} = the module's matmul weights {n_mod}")

    # 2. the same weights in the independent reference (tests/torch/llama_ref.py), float64.
    here = os.path.dirname(os.path.abspath(__file__))
    ref_dir = os.path.normpath(os.path.join(here, "..", "..", "tests", "torch"))
    ref = None
    if os.path.isfile(os.path.join(ref_dir, "llama_ref.py")):
        sys.path.insert(0, ref_dir)
        try:
            import llama_ref  # noqa: E402
            rc = llama_ref.LlamaConfig(vocab_size=a.vocab, d_model=a.d_model, n_layers=a.layers,
                                       n_heads=a.heads, n_kv_heads=a.kv_heads, ffn_hidden=a.ffn,
                                       seq_len=a.seq, rope_theta=a.rope_theta,
                                       norm_eps=a.norm_eps)
            ref = llama_ref.LlamaForCausalLM(rc, dtype=torch.float64)
        except Exception as e:  # noqa: BLE001
            log(f"reference model unavailable ({e}): comparison skipped")
        finally:
            sys.path.pop(0)
    else:
        log(f"{ref_dir}/llama_ref.py not found: reference comparison skipped")
    if ref is not None:
        m64 = Llama(a, use_sdpa).double()
        m64.load_state_dict(m.state_dict())
        ref.load_state_dict(m.state_dict(), strict=True)
        with torch.no_grad():
            mine = m64.logits(x)
            theirs = ref(x)
        err = float((mine - theirs).abs().max() / theirs.abs().max())
        check(err < 1e-10, f"logits vs tests/torch/llama_ref.py in float64: max rel err {err:.2e} (< 1e-10)")
        with torch.no_grad():
            err32 = float((m.logits(x).double() - theirs).abs().max() / theirs.abs().max())
        check(err32 < 1e-4, f"float32 logits vs the float64 reference: max rel err {err32:.2e} (< 1e-4)")

    # 3. causality: a change at position T-1 leaves positions < T-1 alone.
    with torch.no_grad():
        x2 = x.clone()
        x2[:, -1] = (x2[:, -1] + 1) % a.vocab
        d_early = float((m.logits(x)[:, :-1] - m.logits(x2)[:, :-1]).abs().max())
        d_last = float((m.logits(x)[:, -1] - m.logits(x2)[:, -1]).abs().max())
    check(d_early == 0.0 and d_last > 0.0,
          f"causal: earlier logits change by {d_early:.1e}, the changed position's by {d_last:.1e}")

    # 4. SDPA path == masked-softmax path.
    if HAS_SDPA:
        m_other = Llama(a, not use_sdpa)
        m_other.load_state_dict(m.state_dict())
        with torch.no_grad():
            d = float((m.logits(x) - m_other.logits(x)).abs().max())
        check(d < 1e-4, f"SDPA vs masked softmax: max abs diff {d:.1e} (< 1e-4)")
    else:
        log(f"torch {torch.__version__} has no scaled_dot_product_attention: masked softmax only")

    # 5. overfit one repeated batch.
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
    losses = []
    for _ in range(20):
        loss = m(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    check(losses[-1] < losses[0] - 0.5 and all(math.isfinite(v) for v in losses),
          f"overfit one batch, 20 AdamW steps (lr 3e-3): loss {losses[0]:.4f} -> {losses[-1]:.4f} (falls > 0.5)")
    return fails


# ---------------------------------------------------------------------- main

def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d-model", type=int, default=2048)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    p.add_argument("--ffn", type=int, default=5632)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=8, help="micro-batch, sequences per step")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps (the compile is in the first)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--precision", choices=["amp-bf16", "pure-bf16", "fp32"], default=None,
                   help="amp-bf16 (default on cuda): fp32 parameters, autocast bf16; "
                        "pure-bf16: bf16 parameters and AdamW state; fp32 (default on cpu)")
    p.add_argument("--no-compile", dest="compile", action="store_false", default=True)
    p.add_argument("--no-sdpa", action="store_true", help="masked softmax even where SDPA exists")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--norm-eps", type=float, default=1e-5)
    p.add_argument("--init-std", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--json", metavar="OUT", default=None, help="write the results here")
    p.add_argument("--smoke", action="store_true",
                   help="tiny model on cpu, fp32, no compile, with correctness checks")
    a = p.parse_args(argv)
    if a.smoke:
        a.d_model, a.layers, a.heads, a.kv_heads, a.ffn = 64, 2, 4, 2, 128
        a.seq, a.vocab, a.batch, a.steps, a.warmup = 32, 256, 2, 2, 1
        a.device, a.precision, a.compile = "cpu", "fp32", False
    if a.kv_heads is None:
        a.kv_heads = a.heads
    if a.precision is None:
        a.precision = "amp-bf16" if a.device == "cuda" else "fp32"
    if a.d_model % a.heads or a.heads % a.kv_heads or (a.d_model // a.heads) % 2:
        p.error("need d_model % heads == 0, heads % kv_heads == 0 and an even head_dim")
    if a.steps < 1 or a.batch < 1:
        p.error("--steps and --batch must be >= 1")
    if a.compile and not HAS_COMPILE:
        log(f"torch {torch.__version__} has no torch.compile: eager")
        a.compile = False
    return a


def main(argv=None) -> int:
    a = parse(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        log("--device cuda but torch sees no GPU")
        return 2
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if a.smoke:  # tiny matrices: one thread is fastest (2 threads took 3x longer here)
        torch.set_num_threads(1)
    use_sdpa = HAS_SDPA and not a.no_sdpa
    t_start = time.perf_counter()

    fails = smoke_checks(a, use_sdpa) if a.smoke else []
    out = benchmark(a, use_sdpa)
    if a.smoke:
        out["smoke_failures"] = fails
    out["total_s"] = time.perf_counter() - t_start
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    if "error" in out:
        log(out["error"])
        return 1
    mem = (f", peak {out['peak_mem_allocated_gib']:.1f} GiB allocated"
           f" ({out['peak_mem_reserved_gib']:.1f} reserved)" if "peak_mem_allocated_gib" in out else "")
    halved = f" (batch halved from {a.batch})" if out["batch"] != a.batch else ""
    comp = f", compile {out['compile_s']:.0f} s" if out.get("compile_s") else ""
    print(f"torch_llama_bench: {out['n_params'] / 1e6:.1f}M params, batch {out['batch']}{halved} x "
          f"seq {a.seq}, {a.precision}, compile {'on' if a.compile else 'off'}, "
          f"{'sdpa' if use_sdpa else 'manual attention'}, torch {torch.__version__}: "
          f"step {out['step_ms_median']:.1f} ms (median of {a.steps}), "
          f"{out['tokens_per_s']:.0f} tokens/s, {out['tflops']:.1f} TFLOP/s, "
          f"MFU {100 * out['mfu']:.1f}% of {PEAK_TFLOPS:.0f}{mem}{comp}; "
          f"est. memory {out['memory_estimate']['total_gib']:.1f} GiB; "
          f"loss {out['losses'][0]:.3f} -> {out['losses'][-1]:.3f}", flush=True)
    if not out["loss_finite"]:
        log("non-finite loss")
        return 1
    if fails:
        log(f"{len(fails)} check(s) failed: " + "; ".join(fails))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

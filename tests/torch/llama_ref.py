"""An independent PyTorch LLaMA (HuggingFace LlamaForCausalLM semantics).

Written from the HuggingFace definition, not from adgt's C++, so that it can
serve as the truth adgt is checked against. Parameter names and layouts are
HuggingFace's: linear weights are (out, in), norms are (C,).

    embed -> L x [x + o(attn(rope(q(n1(x))), rope(k(n1(x))), v(n1(x))))
                  x + down(silu(gate(n2(x))) * up(n2(x)))] -> norm -> lm_head

Works in float32 and float64 (every computation runs in the parameter dtype).
Also holds the helpers the comparison, the fake-dump generator and the speed
benchmark share: a tiny YAML reader, the parameter-name rules for weight
decay, and the learning-rate schedule.

Requires PyTorch >= 1.13 (no scaled_dot_product_attention needed).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LlamaConfig:
    vocab_size: int = 4096
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int = 4
    ffn_hidden: int = 688
    seq_len: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    init_std: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def from_dict(cls, d: dict) -> "LlamaConfig":
        """Takes the known keys of `d` (a config.json 'model' section or a YAML
        'model' section); unknown keys are ignored."""
        kw = {}
        for f in fields(cls):
            if f.name in d:
                kw[f.name] = type(getattr(cls, f.name))(d[f.name])  # int, float or bool
        cfg = cls(**kw)
        if cfg.d_model % cfg.n_heads != 0:
            raise ValueError(f"d_model={cfg.d_model} is not divisible by n_heads={cfg.n_heads}")
        if cfg.n_heads % cfg.n_kv_heads != 0:
            raise ValueError(f"n_kv_heads={cfg.n_kv_heads} does not divide n_heads={cfg.n_heads}")
        if cfg.head_dim % 2 != 0:
            raise ValueError(f"head_dim={cfg.head_dim} must be even for rotary embeddings")
        return cfg


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * w, in the tensor's dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))  # (C,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.eps) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """HF convention: (x1, x2) -> (-x2, x1), halves of the last dimension."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(seq_len: int, head_dim: int, theta: float, dtype: torch.dtype):
    """cos, sin of shape (T, hd): inv_freq = theta^(-arange(0,hd,2)/hd),
    emb = cat(freqs, freqs). Computed in float64, then cast."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    t = torch.arange(seq_len, dtype=torch.float64)
    freqs = torch.outer(t, inv_freq)           # (T, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)    # (T, hd)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (B, H, T, hd); cos/sin: (T, hd)
    return x * cos + rotate_half(x) * sin


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, Hkv, T, hd) -> (B, Hkv*n_rep, T, hd); query head h reads kv head h // n_rep."""
    if n_rep == 1:
        return x
    b, hkv, t, hd = x.shape
    return x[:, :, None, :, :].expand(b, hkv, n_rep, t, hd).reshape(b, hkv * n_rep, t, hd)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        C = cfg.d_model
        self.q_proj = nn.Linear(C, self.n_heads * self.hd, bias=False)  # (H*hd, C)
        self.k_proj = nn.Linear(C, self.n_kv * self.hd, bias=False)     # (Hkv*hd, C)
        self.v_proj = nn.Linear(C, self.n_kv * self.hd, bias=False)     # (Hkv*hd, C)
        self.o_proj = nn.Linear(self.n_heads * self.hd, C, bias=False)  # (C, H*hd)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.hd).transpose(1, 2)  # (B, H, T, hd)
        k = self.k_proj(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)     # (B, Hkv, T, hd)
        v = self.v_proj(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos[:T], sin[:T]), apply_rope(k, cos[:T], sin[:T])
        rep = self.n_heads // self.n_kv
        k, v = repeat_kv(k, rep), repeat_kv(v, rep)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.hd)  # (B, H, T, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        p = torch.softmax(scores, dim=-1)
        y = torch.matmul(p, v)                                               # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.hd)
        return self.o_proj(y)


class LlamaMLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        C, Fh = cfg.d_model, cfg.ffn_hidden
        self.gate_proj = nn.Linear(C, Fh, bias=False)  # (F, C)
        self.up_proj = nn.Linear(C, Fh, bias=False)    # (F, C)
        self.down_proj = nn.Linear(Fh, C, bias=False)  # (C, F)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)  # (V, C)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: LlamaConfig, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.cfg = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)  # (V, C)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.to(dtype)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None):
        """HF init: linears and embedding ~ N(0, init_std), norms = 1."""
        for name, p in self.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.fill_(1.0)
            else:
                p.normal_(0.0, self.cfg.init_std, generator=generator)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (B, T) int64 -> logits (B, T, V)."""
        T = idx.shape[1]
        if T > self.cfg.seq_len:
            raise ValueError(f"sequence length {T} exceeds seq_len={self.cfg.seq_len}")
        w = self.model.embed_tokens.weight
        cos, sin = rope_cos_sin(T, self.cfg.head_dim, self.cfg.rope_theta, w.dtype)
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))

    def loss(self, idx: torch.Tensor, targets: torch.Tensor):
        """Mean cross-entropy over all B*T next-token targets; returns (loss, logits (B*T, V))."""
        logits = self(idx)
        flat = logits.reshape(-1, logits.shape[-1])
        return F.cross_entropy(flat, targets.reshape(-1)), flat


# ---------------------------------------------------------------- shared helpers

def decays(name: str, decay_norms_and_embeddings: bool = False) -> bool:
    """AdamW weight decay applies to 2-D linear weights (names ending in
    `_proj.weight`, and `lm_head.weight`); norms and embeddings only when
    decay_norms_and_embeddings is set."""
    if decay_norms_and_embeddings:
        return True
    return name.endswith("_proj.weight") or name == "lm_head.weight"


def make_adamw(model: nn.Module, t: dict) -> torch.optim.AdamW:
    """torch.optim.AdamW with two groups (decayed / not) from a train section
    (keys lr, weight_decay, decay_norms_and_embeddings, beta1, beta2, eps)."""
    dne = bool(t.get("decay_norms_and_embeddings", False))
    dec, nodec = [], []
    for n, p in model.named_parameters():
        (dec if decays(n, dne) else nodec).append(p)
    groups = [{"params": dec, "weight_decay": float(t.get("weight_decay", 0.1))},
              {"params": nodec, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=float(t.get("lr", 3e-3)),
                             betas=(float(t.get("beta1", 0.9)), float(t.get("beta2", 0.95))),
                             eps=float(t.get("eps", 1e-8)), foreach=False)


def lr_at(step: int, lr: float, min_lr: float, warmup: int, steps: int) -> float:
    """Linear warm-up lr*(s+1)/warmup for s < warmup, then cosine lr -> min_lr."""
    if step < warmup:
        return lr * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * p))


def _scalar(v: str):
    v = v.strip()
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        return v[1:-1]
    low = v.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return v


def read_yaml(path: str) -> dict:
    """Reads the two-level `section:\\n  key: value` YAML that adgt run files
    use (comments allowed; no lists or deeper nesting)."""
    out: dict = {}
    section = None
    with open(path) as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].rstrip()
            if not line.strip():
                continue
            indented = line[0] in " \t"
            key, sep, val = line.strip().partition(":")
            if not sep:
                raise ValueError(f"{path}:{lineno}: expected 'key: value', got {raw.strip()!r}")
            if not indented:
                if val.strip():
                    out[key] = _scalar(val)
                    section = None
                else:
                    section = out.setdefault(key, {})
            else:
                if section is None:
                    raise ValueError(f"{path}:{lineno}: indented key {key!r} outside a section")
                section[key.strip()] = _scalar(val)
    return out


def train_steps(model: "LlamaForCausalLM", tokens: torch.Tensor, train: dict, lrs) -> dict:
    """Runs len(lrs) AdamW steps on `tokens` (S, B, T+1): step s reads inputs
    tokens[s,:,:-1] and targets tokens[s,:,1:], clips the global gradient norm
    to train['grad_clip'] (0 disables) and uses lr lrs[s]. Returns the loss and
    the pre-clip gradient norm of every step (as Python floats)."""
    opt = make_adamw(model, train)
    params = [p for p in model.parameters()]
    clip = float(train.get("grad_clip", 0.0))
    losses, norms = [], []
    for s, lr in enumerate(lrs):
        batch = tokens[s].long()
        opt.zero_grad(set_to_none=True)
        loss, _ = model.loss(batch[:, :-1], batch[:, 1:])
        loss.backward()
        if clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, clip)
        else:
            norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params))
        for g in opt.param_groups:
            g["lr"] = float(lr)
        opt.step()
        losses.append(loss.item())
        norms.append(float(norm))
    return {"losses": losses, "grad_norms": norms}

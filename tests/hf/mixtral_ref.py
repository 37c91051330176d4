"""A tiny independent PyTorch Mixtral (HuggingFace MixtralForCausalLM semantics)
for the export test (tests/hf/hf_check.py, check `moe_torch`).

Written from HuggingFace's definition (modeling_mixtral.py), not from adgt's
C++. Attention, RoPE and RMSNorm are LLaMA's (tests/torch/llama_ref.py); the
feed-forward of every layer is the sparse MoE block:

    router_logits = gate(h)                                  # (N, E)
    p = softmax(router_logits)                               # over all E experts
    w, e = topk(p, top_k); w = w / w.sum()                   # renormalised over the chosen
    y = sum_j w_j * w2_e_j(silu(w1_e_j(h)) * w3_e_j(h))      # SwiGLU experts

Parameter names are HuggingFace's: model.layers.<l>.block_sparse_moe.gate.weight
(E, C) and ...experts.<e>.{w1 (F, C), w2 (C, F), w3 (F, C)}.weight.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))
from llama_ref import LlamaAttention, LlamaConfig, RMSNorm, rope_cos_sin  # noqa: E402


@dataclass
class MixtralConfig(LlamaConfig):
    n_experts: int = 8      # num_local_experts
    top_k: int = 2          # num_experts_per_tok
    # ffn_hidden (intermediate_size) is each expert's width

    @classmethod
    def from_hf(cls, c: dict) -> "MixtralConfig":
        """From an HF config.json (Mixtral keys)."""
        return cls(vocab_size=c["vocab_size"], d_model=c["hidden_size"], n_layers=c["num_hidden_layers"],
                   n_heads=c["num_attention_heads"], n_kv_heads=c["num_key_value_heads"],
                   ffn_hidden=c["intermediate_size"], seq_len=c["max_position_embeddings"],
                   rope_theta=c["rope_theta"], norm_eps=c["rms_norm_eps"],
                   tie_embeddings=c["tie_word_embeddings"], n_experts=c["num_local_experts"],
                   top_k=c["num_experts_per_tok"])


class Expert(nn.Module):
    def __init__(self, C: int, Fh: int):
        super().__init__()
        self.w1 = nn.Linear(C, Fh, bias=False)  # (F, C) gate
        self.w2 = nn.Linear(Fh, C, bias=False)  # (C, F) down
        self.w3 = nn.Linear(C, Fh, bias=False)  # (F, C) up

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SparseMoeBlock(nn.Module):
    def __init__(self, cfg: MixtralConfig):
        super().__init__()
        self.top_k = cfg.top_k
        self.gate = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)  # (E, C)
        self.experts = nn.ModuleList(Expert(cfg.d_model, cfg.ffn_hidden) for _ in range(cfg.n_experts))
        self.last_choice = None  # (N, k) expert ids of the last forward, (N, E) probabilities

    def forward(self, x):
        B, T, C = x.shape
        h = x.reshape(-1, C)                                   # (N, C)
        probs = torch.softmax(self.gate(h), dim=-1)            # (N, E)
        w, chosen = torch.topk(probs, self.top_k, dim=-1)      # (N, k)
        w = w / w.sum(dim=-1, keepdim=True)
        self.last_choice = (chosen, probs)
        y = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.nonzero(chosen == e, as_tuple=True)
            if rows.numel():
                y.index_add_(0, rows, w[rows, slot, None] * expert(h[rows]))
        return y.reshape(B, T, C)


class MixtralDecoderLayer(nn.Module):
    def __init__(self, cfg: MixtralConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.block_sparse_moe = SparseMoeBlock(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.block_sparse_moe(self.post_attention_layernorm(x))


class MixtralModel(nn.Module):
    def __init__(self, cfg: MixtralConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)  # (V, C)
        self.layers = nn.ModuleList(MixtralDecoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)


class MixtralForCausalLM(nn.Module):
    def __init__(self, cfg: MixtralConfig, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.cfg = cfg
        self.model = MixtralModel(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)  # (V, C)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.to(dtype)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (B, T) int64 -> logits (B, T, V)."""
        T = idx.shape[1]
        w = self.model.embed_tokens.weight
        cos, sin = rope_cos_sin(T, self.cfg.head_dim, self.cfg.rope_theta, w.dtype)
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))

    def routing_margin(self) -> float:
        """Smallest gap, over the last forward's tokens and layers, between the
        k-th and (k+1)-th router probability: how far the choice is from a tie."""
        gaps = []
        for layer in self.model.layers:
            _, probs = layer.block_sparse_moe.last_choice
            top = torch.topk(probs, min(self.cfg.top_k + 1, probs.shape[-1]), dim=-1).values
            if top.shape[-1] > self.cfg.top_k:
                gaps.append(float((top[:, self.cfg.top_k - 1] - top[:, self.cfg.top_k]).min()))
        return min(gaps) if gaps else float("inf")

#!/usr/bin/env python3
"""HuggingFace export/import checks of `adgt-ckpt` (tests/hf.cmake).

    hf_check.py CHECK --ckpt-tool adgt-ckpt --fixture adgt_hf_fixture
                --dump-tool adgt-reference-dump --config tests/hf/model.yaml --work DIR
                [--train-tool adgt-train --data-tool adgt-data]

CHECK is one of
  roundtrip   export -> import: the imported step_0 weights equal the original bit for
              bit (single file, sharded, tied), AdamW moments zero, step 0; `info`
  torch       the export, read by tests/hf/safetensors_reader.py into
              tests/torch/llama_ref.py's model (float64), gives adgt's logits for the
              same weights and batch (adgt-reference-dump --checkpoint) to 1e-5
  torch_tied  the same with tie_word_embeddings (no lm_head.weight in the files)
  shards      --max-shard-size 20KB: several shards, an index whose weight_map names
              every tensor exactly once, each shard holding what the index maps to it
  bf16        --dtype bfloat16 equals torch's fp32 -> bfloat16 (round to nearest even)
              on every element, and the import widens it back exactly
  errors      damaged files and configs give errors naming the file and tensor
  train       adgt-train starts from an import (--config <out>/config.yaml --resume <out>/step_0);
              bos/eos ids from a SentencePiece tokenizer reach config.json
  moe_roundtrip  a mixture-of-experts checkpoint (--moe-config) exports as MixtralForCausalLM:
              config.json's Mixtral keys, every expert tensor under its HF name bit for bit
              (single file and shards); the import gives the same weights and model section
  moe_torch   the Mixtral export in tests/hf/mixtral_ref.py's model (float64) gives adgt's
              logits (adgt-reference-dump --checkpoint) to 1e-5; num_experts_per_tok matters
  moe_train   a Mixtral import trains 2 steps with expert parallelism (mpirun -np 2, dp=2 ep=2:
              each rank two experts, sharded checkpoint), the step_2 checkpoint exports whole, and
              a single process resumes from it (ep=2 -> ep=1)
  moe_errors  what Mixtral cannot represent (mixed dense/MoE layers, aux-loss-free bias) is
              refused by name; damaged Mixtral folders (missing / misshapen experts, sliding
              window, top-k) give named import errors; moe_capacity_factor gives a note
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys

import h5py

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from byte_level_tokenizer import byte_level_tokenizer  # noqa: E402
import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "torch"))
import safetensors_reader as st  # noqa: E402
from llama_ref import LlamaConfig, LlamaForCausalLM, read_yaml  # noqa: E402
from mixtral_ref import MixtralConfig, MixtralForCausalLM  # noqa: E402

LOGITS_TOL = 1e-5


class Failure(Exception):
    pass


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise Failure(what)


def run(cmd, ok: bool = True) -> subprocess.CompletedProcess:
    cmd = [str(c) for c in cmd]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if ok and p.returncode != 0:
        raise Failure(f"command failed ({p.returncode}): {' '.join(cmd)}\n"
                      f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def rel_err(a, b) -> float:
    """||a - b|| / ||b|| in float64 (as tests/torch/compare_reference.py)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return math.inf
    den = float(np.linalg.norm(b.ravel()))
    num = float(np.linalg.norm((a - b).ravel()))
    return num / den if den else num


def ckpt_model(step_dir: str) -> dict:
    with h5py.File(os.path.join(step_dir, "checkpoint.h5"), "r") as f:
        return {n: f["model"][n][...] for n in f["model"]}


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(
        np.array_equal(np.ascontiguousarray(a).view(np.uint32), np.ascontiguousarray(b).view(np.uint32)))


class Ctx:
    def __init__(self, a):
        self.a = a
        self.work = os.path.abspath(a.work)
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)

    def path(self, *p) -> str:
        return os.path.join(self.work, *p)

    def checkpoint(self, name: str, *overrides, config: str | None = None) -> str:
        out = run([self.a.fixture, config or self.a.config, self.path(name), 7, *overrides]).stdout
        return out.strip().splitlines()[-1]

    def ckpt(self, *args, ok: bool = True):
        return run([self.a.ckpt_tool, *args], ok)


def hf_model_config(hf_dir: str) -> LlamaConfig:
    """llama_ref's config from the exported config.json (HF key names)."""
    with open(os.path.join(hf_dir, "config.json")) as f:
        c = json.load(f)
    return LlamaConfig(vocab_size=c["vocab_size"], d_model=c["hidden_size"],
                       n_layers=c["num_hidden_layers"], n_heads=c["num_attention_heads"],
                       n_kv_heads=c["num_key_value_heads"], ffn_hidden=c["intermediate_size"],
                       seq_len=c["max_position_embeddings"], rope_theta=c["rope_theta"],
                       norm_eps=c["rms_norm_eps"], tie_embeddings=c["tie_word_embeddings"])


def check_config_json(hf_dir: str, yaml_model: dict, torch_dtype: str) -> None:
    with open(os.path.join(hf_dir, "config.json")) as f:
        c = json.load(f)
    want = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": yaml_model["vocab_size"], "hidden_size": yaml_model["d_model"],
            "intermediate_size": yaml_model["ffn_hidden"],
            "num_hidden_layers": yaml_model["n_layers"],
            "num_attention_heads": yaml_model["n_heads"],
            "num_key_value_heads": yaml_model["n_kv_heads"],
            "max_position_embeddings": yaml_model["seq_len"],
            "rms_norm_eps": yaml_model["norm_eps"], "rope_theta": yaml_model["rope_theta"],
            "tie_word_embeddings": yaml_model["tie_embeddings"], "hidden_act": "silu",
            "torch_dtype": torch_dtype, "attention_bias": False, "mlp_bias": False,
            "head_dim": yaml_model["d_model"] // yaml_model["n_heads"]}
    for k, v in want.items():
        expect(k in c and c[k] == v, f"config.json: {k} = {c.get(k)!r}, expected {v!r}")
    # The byte tokenizer has no bos/eos: the keys are omitted, not invented.
    expect("bos_token_id" not in c and "eos_token_id" not in c, "config.json: unexpected bos/eos ids")


# ---------------------------------------------------------------- checks

def check_roundtrip(c: Ctx) -> None:
    for label, overrides, extra in [("f32", [], []),
                                    ("sharded", [], ["--max-shard-size", "20KB"]),
                                    ("tied", ["model.tie_embeddings=true"], [])]:
        src = c.checkpoint("src_" + label, *overrides)
        hf, imp = c.path("hf_" + label), c.path("imp_" + label)
        c.ckpt("export-hf", src, hf, *extra)
        if label == "f32":  # a byte-level BPE tokenizer.json beside the weights travels with them
            with open(os.path.join(hf, "tokenizer.json"), "w") as f:
                json.dump(byte_level_tokenizer(added=[(255, "<|endoftext|>")]), f)
        out = c.ckpt("import-hf", hf, imp).stdout
        expect("adgt-train --config" in out, f"import-hf output lacks the start command:\n{out}")
        if label == "f32":
            tok = os.path.join(imp, "tokenizer.json")
            expect(os.path.isfile(tok), "import-hf did not copy tokenizer.json")
            with open(os.path.join(imp, "config.yaml")) as f:
                y = f.read()
            expect(f'tokenizer: "{tok}"' in y or f"tokenizer: {tok}" in y,
                   "config.yaml's data.tokenizer does not name tokenizer.json")
            again = c.path("hf_f32_again")  # and the export of the import carries it on
            c.ckpt("export-hf", os.path.join(imp, "step_0"), again)
            with open(tok, "rb") as f1, open(os.path.join(again, "tokenizer.json"), "rb") as f2:
                expect(f1.read() == f2.read(), "export-hf did not copy data.tokenizer's tokenizer.json")
            with open(os.path.join(again, "config.json")) as f:  # its eos named in config.json
                j = json.load(f)
            expect(j.get("eos_token_id") == 255 and "bos_token_id" not in j,
                   f"export-hf: bos/eos ids from tokenizer.json's <|endoftext|>: {j}")
        step0 = os.path.join(imp, "step_0")
        with h5py.File(os.path.join(src, "checkpoint.h5"), "r") as a, \
                h5py.File(os.path.join(step0, "checkpoint.h5"), "r") as b:
            expect(list(a["model"]) == list(b["model"]),
                   f"{label}: tensor lists differ: {list(a['model'])} vs {list(b['model'])}")
            for n in a["model"]:
                expect(same_bits(a["model"][n][...], b["model"][n][...]),
                       f"{label}: imported {n} differs from the original")
                for g in ("optim/exp_avg", "optim/exp_avg_sq"):
                    expect(not np.any(b[g][n][...]), f"{label}: imported {g}/{n} is not zero")
                expect(np.any(a["optim/exp_avg"][n][...]), "fixture moments should be non-zero")
            expect(int(b["meta/step"][()]) == 0 and int(b["meta/samples_seen"][()]) == 0,
                   f"{label}: imported step/samples_seen not 0")
            ya = a["meta/config_yaml"].asstr()[()]
            yb = b["meta/config_yaml"].asstr()[()]

        def model_section(y):
            lines = y.split("model:\n", 1)[1].split("\n")
            return [ln for ln in lines if ln.startswith("  ")][:11]
        expect(model_section(ya) == model_section(yb),
               f"{label}: model sections differ:\n{model_section(ya)}\n{model_section(yb)}")
        with open(os.path.join(imp, "config.yaml")) as f:
            expect(f.read().split("\n", 2)[2] == yb, f"{label}: config.yaml != meta/config_yaml")
        print(f"{label}: {len(list(ckpt_model(src)))} tensors bit-identical after export + import")

    info = c.ckpt("info", os.path.join(c.path("imp_f32"), "step_0")).stdout
    for want in ["step:         0", "samples seen: 0", "checksums:    verified", "LlamaForCausalLM"]:
        expect(want in info, f"info lacks {want!r}:\n{info}")
    info = c.ckpt("info", c.path("src_f32", "step_7"), "--tensors").stdout
    for want in ["step:         7", "samples seen: 14", "model.layers.1.mlp.down_proj.weight"]:
        expect(want in info, f"info lacks {want!r}:\n{info}")
    print(info)
    # Exporting over an existing export needs --force; the replacement is complete.
    p = c.ckpt("export-hf", c.path("src_f32", "step_7"), c.path("hf_f32"), ok=False)
    expect(p.returncode != 0 and "exists and is not empty" in p.stderr, f"no overwrite error: {p.stderr}")
    c.ckpt("export-hf", c.path("src_f32", "step_7"), c.path("hf_f32"), "--force", "--dtype", "bfloat16")
    expect(json.load(open(c.path("hf_f32", "config.json")))["torch_dtype"] == "bfloat16",
           "--force did not replace the export")
    expect(not [d for d in os.listdir(c.work) if ".tmp-" in d or ".old-" in d],
           f"temporary directories left behind: {os.listdir(c.work)}")


def check_torch(c: Ctx, tied: bool) -> None:
    overrides = ["model.tie_embeddings=true"] if tied else []
    src = c.checkpoint("src", *overrides)
    hf = c.path("hf")
    c.ckpt("export-hf", src, hf)
    expect(sorted(os.listdir(hf)) == ["config.json", "model.safetensors"],
           f"unexpected export files {sorted(os.listdir(hf))}")
    tensors = st.read_dir(hf)
    orig = ckpt_model(src)
    expect(set(tensors) == set(orig), f"exported names {sorted(tensors)} != checkpoint {sorted(orig)}")
    expect(("lm_head.weight" in tensors) != tied, "lm_head.weight must be written iff untied")
    for n, v in orig.items():
        expect(same_bits(tensors[n], v), f"exported {n} differs from the checkpoint")
    _, meta, start, _ = st.read_header(os.path.join(hf, "model.safetensors"))
    expect(meta == {"format": "pt"} and start % 8 == 0, f"metadata {meta}, data start {start}")

    with h5py.File(os.path.join(src, "checkpoint.h5"), "r") as f:
        yaml_text = f["meta/config_yaml"].asstr()[()]
    cfg_path = c.path("dump.yaml")
    with open(cfg_path, "w") as f:
        f.write(yaml_text)
    check_config_json(hf, read_yaml(cfg_path)["model"], "float32")
    dump = c.path("dump.h5")
    run([c.a.dump_tool, "--config", cfg_path, "--checkpoint", src, "--out", dump,
         "--dtype", "f32", "--steps", "1"])

    cfg = hf_model_config(hf)
    model = LlamaForCausalLM(cfg, torch.float64)
    names = [n for n, _ in model.named_parameters()]  # a tied lm_head is not listed twice
    expect(set(names) == set(tensors), f"llama_ref parameters {names} != export {sorted(tensors)}")
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(torch.from_numpy(tensors[n]).to(torch.float64))
    with h5py.File(dump, "r") as f:
        tokens = torch.from_numpy(f["batch/tokens"][0].astype(np.int64))  # (B, T+1)
        adgt_logits = f["step0/logits"][...]
        for n in orig:  # the dump ran on exactly the checkpoint's weights
            expect(same_bits(f["model"][n][...].astype(np.float32), orig[n]), f"dump weights {n}")
    with torch.no_grad():
        ref = model(tokens[:, :-1]).reshape(-1, cfg.vocab_size).numpy()
    err = rel_err(adgt_logits, ref)
    print(f"logits ({ref.shape[0]} x {ref.shape[1]}): adgt f32 vs llama_ref f64 on the export: "
          f"rel err {err:.3e} (tolerance {LOGITS_TOL:g})")
    expect(err <= LOGITS_TOL, f"logits rel err {err:.3e} > {LOGITS_TOL:g}")
    # The comparison sees config.json: the wrong rope_theta would fail it.
    cfg.rope_theta = 10000.0
    wrong = LlamaForCausalLM(cfg, torch.float64)
    wrong.load_state_dict(model.state_dict())
    with torch.no_grad():
        err_wrong = rel_err(adgt_logits, wrong(tokens[:, :-1]).reshape(-1, cfg.vocab_size).numpy())
    print(f"control: with rope_theta 10000 instead of the exported {hf_model_config(hf).rope_theta:g}: "
          f"rel err {err_wrong:.3e}")
    expect(err_wrong > 100 * LOGITS_TOL, "the logits comparison does not notice a wrong rope_theta")


def check_shards(c: Ctx) -> None:
    src = c.checkpoint("src")
    hf = c.path("hf")
    out = c.ckpt("export-hf", src, hf, "--max-shard-size", "20KB").stdout
    print(out)
    files = sorted(os.listdir(hf))
    shards = [f for f in files if f.endswith(".safetensors")]
    n = len(shards)
    expect(n >= 3, f"expected several shards, got {files}")
    expect(shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)],
           f"shard names {shards}")
    expect("model.safetensors.index.json" in files and "model.safetensors" not in files, f"{files}")

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        expect(len(keys) == len(set(keys)), f"duplicate keys in the index: {keys}")
        return dict(pairs)
    with open(os.path.join(hf, "model.safetensors.index.json")) as f:
        idx = json.load(f, object_pairs_hook=no_duplicates)
    orig = ckpt_model(src)
    expect(set(idx["weight_map"]) == set(orig), "weight_map does not cover every tensor exactly once")
    expect(set(idx["weight_map"].values()) == set(shards), "weight_map names other files")
    # Order and size: tensors in table order, a shard over 20 KB only when it is one tensor.
    order = [s for s in idx["weight_map"].values()]
    expect(order == sorted(order), "shards are not filled in table order")
    for s in shards:
        header, _, _, data_len = st.read_header(os.path.join(hf, s))
        expect(data_len <= 20_000 or len(header) == 1, f"{s}: {data_len} bytes in {len(header)} tensors")
    tensors = st.read_dir(hf)  # checks shard contents against the index and total_size
    for k, v in orig.items():
        expect(same_bits(tensors[k], v), f"sharded export: {k} differs")
    print(f"{n} shards, {len(tensors)} tensors, index total_size {idx['metadata']['total_size']}")


def check_bf16(c: Ctx) -> None:
    src = c.checkpoint("src")
    hf = c.path("hf")
    c.ckpt("export-hf", src, hf, "--dtype", "bfloat16")
    with open(os.path.join(hf, "config.json")) as f:
        expect(json.load(f)["torch_dtype"] == "bfloat16", "torch_dtype is not bfloat16")
    raw = st.read_dir(hf, raw=True)
    orig = ckpt_model(src)
    with open(os.path.join(hf, "model.safetensors"), "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(hlen))
    expect(all(e["dtype"] == "BF16" for k, e in hdr.items() if k != "__metadata__"), "not all BF16")
    for n, v in orig.items():
        want = torch.from_numpy(v).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        expect(np.array_equal(raw[n], want), f"{n}: bf16 bits differ from torch's rounding")
    ties = raw["model.layers.0.input_layernorm.weight"][:5].tolist()
    print("bf16 of 1+2^-8, 1+3*2^-8, 1+2^-8+2^-20, 1+2^-8-2^-20, -(1+2^-8):",
          [hex(x) for x in ties])
    expect(ties == [0x3F80, 0x3F82, 0x3F81, 0x3F80, 0xBF80], f"round-to-nearest-even cases: {ties}")
    # Import widens bf16 exactly.
    c.ckpt("import-hf", hf, c.path("imp"))
    imported = ckpt_model(c.path("imp", "step_0"))
    for n, bits in raw.items():
        want = (bits.astype(np.uint32) << 16).view(np.float32)
        expect(same_bits(imported[n], want), f"imported bf16 {n} is not the exact widening")
    print(f"{len(orig)} tensors: bf16 export = torch's round-to-nearest-even; import widens exactly")


def check_errors(c: Ctx) -> None:
    src = c.checkpoint("src")
    good = c.path("good")
    c.ckpt("export-hf", src, good)
    sharded = c.path("good_sharded")
    c.ckpt("export-hf", src, sharded, "--max-shard-size", "20KB")
    main = "model.safetensors"
    failures = []

    def case(name: str, want: list, mutate, base: str = good, cmd=None):
        d = c.path("case_" + name)
        shutil.copytree(base, d)
        mutate(d)
        p = c.ckpt(*(cmd or ["import-hf", d, c.path("out_" + name)]), ok=False)
        err = p.stderr.strip()
        missing = [w for w in want if w not in err]
        status = "ok" if p.returncode != 0 and not missing else "FAILED"
        print(f"[{status}] {name}: exit {p.returncode}: {err}")
        if status != "ok":
            failures.append(f"{name}: expected a failure whose message contains {missing or want}")
        expect(not os.path.exists(os.path.join(c.path("out_" + name), "step_0")) or p.returncode == 0,
               f"{name}: a checkpoint was written despite the error")

    def edit_header(fn, fname=main):
        def mutate(d):
            path = os.path.join(d, fname)
            hdr, data = st.split_file(path)
            r = fn(hdr, data)
            st.write_file(path, hdr, r if isinstance(r, bytes) else data)
        return mutate

    def set_length(d):
        path = os.path.join(d, main)
        with open(path, "r+b") as f:
            f.write(struct.pack("<Q", os.path.getsize(path) * 10))

    def break_json(d):
        path = os.path.join(d, main)
        with open(path, "r+b") as f:
            f.seek(8)
            f.write(b"not json")

    def overlap(h, _):
        h["model.layers.0.self_attn.o_proj.weight"]["data_offsets"] = \
            h["model.layers.0.self_attn.q_proj.weight"]["data_offsets"]

    def out_of_range(h, data):
        last = max((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][1])
        b, e = h[last]["data_offsets"]
        h[last]["data_offsets"] = [b + 64, e + 64]

    def extra(h, data):
        h["model.layers.0.self_attn.q_proj.bias"] = {"dtype": "F32", "shape": [32],
                                                     "data_offsets": [len(data), len(data) + 128]}
        return data + bytes(128)

    def truncate(d):
        path = os.path.join(d, main)
        os.truncate(path, os.path.getsize(path) - 100)

    def edit_config(**kv):
        def mutate(d):
            path = os.path.join(d, "config.json")
            cfg = json.load(open(path))
            cfg.update(kv)
            json.dump(cfg, open(path, "w"))
        return mutate

    up = "model.layers.1.mlp.up_proj.weight"
    case("header_length", [f"case_header_length/{main}", "malformed header: its length field says"], set_length)
    case("header_json", [f"case_header_json/{main}", "not valid JSON"], break_json)
    case("overlap", [f"case_overlap/{main}", "q_proj.weight", "o_proj.weight", "overlap"], edit_header(overlap))
    case("out_of_range", [f"case_out_of_range/{main}", "lm_head.weight", "run past the data region"],
         edit_header(out_of_range))
    case("unknown_dtype", [f"case_unknown_dtype/{main}", "tensor model.norm.weight: unknown dtype \"Q4\""],
         edit_header(lambda h, _: h["model.norm.weight"].update(dtype="Q4")))
    case("wrong_shape", [f"case_wrong_shape/{main}: tensor {up} has shape (32,48)", "implies (48,32)"],
         edit_header(lambda h, _: h[up].update(shape=[32, 48])))
    case("missing_tensor", [f"case_missing_tensor/{main}", "tensor model.norm.weight is missing"],
         edit_header(lambda h, _: h.pop("model.norm.weight")))
    case("extra_tensor", [f"case_extra_tensor/{main}", "q_proj.bias", "refusing to drop it"], edit_header(extra))
    case("truncated", [f"case_truncated/{main}", "run past the data region", "truncated"], truncate)
    case("no_config", ["case_no_config/config.json: not found"],
         lambda d: os.remove(os.path.join(d, "config.json")))
    case("no_weights", ["case_no_weights: neither model.safetensors nor model.safetensors.index.json"],
         lambda d: os.remove(os.path.join(d, main)))
    # A dense export relabelled as Mixtral: the router and experts are missing.
    case("mixtral", [f"case_mixtral/{main}: tensor model.layers.0.block_sparse_moe.gate.weight is missing"],
         edit_config(model_type="mixtral", architectures=["MixtralForCausalLM"]))
    case("model_type", ["case_model_type/config.json: model_type \"qwen2\"", "MixtralForCausalLM"],
         edit_config(model_type="qwen2"))
    case("config_mismatch", [f"case_config_mismatch/{main}: tensor model.layers.0.mlp.gate_proj.weight "
                             "has shape (48,32)", "config.json implies (40,32)"],
         edit_config(intermediate_size=40))
    shard_files = sorted(x for x in os.listdir(sharded) if x.endswith(".safetensors"))
    shard1, shard2 = shard_files[0], shard_files[1]
    case("missing_shard", [f"case_missing_shard/{shard2}: not found", "index.json lists it"],
         lambda d: os.remove(os.path.join(d, shard2)), base=sharded)
    case("shard_missing_tensor", [f"case_shard_missing_tensor/{shard1}",
                                  "tensor model.embed_tokens.weight is missing", "maps it here"],
         edit_header(lambda h, _: h.pop("model.embed_tokens.weight"), shard1), base=sharded)
    # Export errors.
    case("export_no_checkpoint", ["checkpoint", "nowhere: no such file or directory"], lambda d: None,
         cmd=["export-hf", c.path("nowhere"), c.path("out_x")])
    case("export_shard_size", ["max shard size \"5 parsecs\""], lambda d: None,
         cmd=["export-hf", src, c.path("out_y"), "--max-shard-size", "5 parsecs"])
    case("export_exists", ["good: exists and is not empty"], lambda d: None,
         cmd=["export-hf", src, good])
    expect(not failures, "\n".join(failures))


def check_train(c: Ctx) -> None:
    if not (c.a.train_tool and c.a.data_tool):
        print("adgt-train / adgt-data not built: skipped")
        return
    src = c.checkpoint("src")
    hf = c.path("hf")
    c.ckpt("export-hf", src, hf)
    text = c.path("corpus.txt")
    with open(text, "w") as f:
        for i in range(400):
            f.write(f"Line {i}: in the beginning the export was imported and trained again.\n")
    data = c.path("data")
    run([c.a.data_tool, "prepare", "--input", text, "--out", data, "--tokenizer", "byte"])
    # bos/eos ids come from a SentencePiece tokenizer (adgt's trained ones: 1 and 2).
    run([c.a.data_tool, "prepare", "--input", text, "--out", c.path("data_sp"), "--vocab-size", 320])
    hf_sp = c.path("hf_sp")
    c.ckpt("export-hf", src, hf_sp, "--tokenizer", c.path("data_sp", "tokenizer.model"))
    for f in ("config.json", "generation_config.json"):
        with open(os.path.join(hf_sp, f)) as fh:
            j = json.load(fh)
        expect(j.get("bos_token_id") == 1 and j.get("eos_token_id") == 2, f"{f}: bos/eos ids {j}")
    base = c.path("base.yaml")
    with open(c.a.config) as f:
        y = f.read()
    y = (y.replace("data/none/train.bin", os.path.join(data, "train.bin"))
          .replace("data/none/val.bin", os.path.join(data, "val.bin"))
          .replace("runs/hf_test/checkpoints", c.path("run", "checkpoints"))
          .replace("runs/hf_test", c.path("run")))
    with open(base, "w") as f:
        f.write(y)
    imp = c.path("imp")
    c.ckpt("import-hf", hf, imp, "--config", base)
    p = run([c.a.train_tool, "--config", os.path.join(imp, "config.yaml"),
             "--resume", os.path.join(imp, "step_0")])
    print(p.stdout)
    expect("resumed from" in p.stdout, "adgt-train did not resume from the import")
    step2 = c.path("run", "checkpoints", "step_2")
    expect(os.path.exists(os.path.join(step2, "COMPLETE")), f"no checkpoint at {step2}")
    # Two AdamW steps at lr 1e-3 move each weight by about 2e-3; a run that had
    # ignored the import (fresh N(0, 0.02) weights vs the fixture's N(0, 0.05))
    # would be ~0.05 away.
    # The trainer's checkpoint (whatever its format version) read back through
    # export-hf, which goes through load_checkpoint.
    c.ckpt("export-hf", step2, c.path("hf_step2"))
    before, after = ckpt_model(os.path.join(imp, "step_0")), st.read_dir(c.path("hf_step2"))
    moved = max(float(np.max(np.abs(after[n] - before[n]))) for n in before)
    print(f"largest weight change over 2 steps from the import: {moved:.2e}")
    expect(0 < moved < 0.01, f"step_2 is not 2 small steps from the import (max change {moved})")


# ---------------------------------------------------------------- mixture of experts (Mixtral)

def moe_checkpoint(c: Ctx, name: str, *overrides) -> str:
    return c.checkpoint(name, *overrides, config=c.a.moe_config)


def check_mixtral_config_json(hf_dir: str, yaml_model: dict, torch_dtype: str = "float32") -> dict:
    with open(os.path.join(hf_dir, "config.json")) as f:
        cj = json.load(f)
    want = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
            "vocab_size": yaml_model["vocab_size"], "hidden_size": yaml_model["d_model"],
            "intermediate_size": yaml_model["expert_ffn_hidden"] or yaml_model["ffn_hidden"],
            "num_hidden_layers": yaml_model["n_layers"], "num_attention_heads": yaml_model["n_heads"],
            "num_key_value_heads": yaml_model["n_kv_heads"], "head_dim": yaml_model["d_model"] // yaml_model["n_heads"],
            "max_position_embeddings": yaml_model["seq_len"], "rms_norm_eps": yaml_model["norm_eps"],
            "rope_theta": yaml_model["rope_theta"], "tie_word_embeddings": yaml_model["tie_embeddings"],
            "hidden_act": "silu", "num_local_experts": yaml_model["n_experts"],
            "num_experts_per_tok": yaml_model["moe_top_k"],
            "router_aux_loss_coef": yaml_model["moe_aux_loss_coef"], "output_router_logits": False,
            "router_jitter_noise": 0.0, "sliding_window": None, "torch_dtype": torch_dtype}
    for k, v in want.items():
        expect(k in cj and cj[k] == v, f"config.json: {k} = {cj.get(k)!r}, expected {v!r}")
    for k in ("mlp_bias", "pretraining_tp", "rope_scaling"):  # LLaMA-only keys
        expect(k not in cj, f"config.json: unexpected LLaMA key {k}")
    return cj


def check_moe_roundtrip(c: Ctx) -> None:
    src = moe_checkpoint(c, "src")
    orig = ckpt_model(src)
    with h5py.File(os.path.join(src, "checkpoint.h5"), "r") as f:
        ya = f["meta/config_yaml"].asstr()[()]
    ypath = c.path("src.yaml")
    with open(ypath, "w") as f:
        f.write(ya)
    ym = read_yaml(ypath)["model"]
    E, Fe, C = ym["n_experts"], ym["expert_ffn_hidden"], ym["d_model"]
    want_shapes = {"model.layers.1.block_sparse_moe.gate.weight": (E, C)}
    for e in range(E):
        want_shapes[f"model.layers.1.block_sparse_moe.experts.{e}.w1.weight"] = (Fe, C)
        want_shapes[f"model.layers.1.block_sparse_moe.experts.{e}.w2.weight"] = (C, Fe)
        want_shapes[f"model.layers.1.block_sparse_moe.experts.{e}.w3.weight"] = (Fe, C)
    expect(not any(".mlp." in n for n in orig), "a Mixtral checkpoint should have no dense mlp tensors")
    for label, extra in [("single", []), ("sharded", ["--max-shard-size", "20KB"])]:
        hf, imp = c.path("hf_" + label), c.path("imp_" + label)
        c.ckpt("export-hf", src, hf, *extra)
        check_mixtral_config_json(hf, ym)
        tensors = st.read_dir(hf)
        expect(list(tensors) == list(orig) if label == "single" else set(tensors) == set(orig),
               f"{label}: exported names {list(tensors)} != checkpoint {list(orig)}")
        for n, shape in want_shapes.items():
            expect(n in tensors and tensors[n].shape == shape, f"{label}: {n} missing or not of shape {shape}")
        for n, v in orig.items():
            expect(same_bits(tensors[n], v), f"{label}: exported {n} differs from the checkpoint")
        if label == "sharded":
            shards = [x for x in os.listdir(hf) if x.endswith(".safetensors")]
            expect(len(shards) >= 3, f"expected several shards, got {shards}")
        out = c.ckpt("import-hf", hf, imp).stdout
        expect("adgt-train --config" in out, f"import-hf output lacks the start command:\n{out}")
        step0 = os.path.join(imp, "step_0")
        with h5py.File(os.path.join(step0, "checkpoint.h5"), "r") as b:
            expect(list(b["model"]) == list(orig), f"{label}: imported tensor list differs")
            for n in orig:
                expect(same_bits(b["model"][n][...], orig[n]), f"{label}: imported {n} differs")
                expect(not np.any(b["optim/exp_avg"][n][...]), f"{label}: imported moments not zero")
            yb = b["meta/config_yaml"].asstr()[()]

        def model_lines(y):
            out = []
            for ln in y.split("model:\n", 1)[1].split("\n"):
                if not ln.startswith("  "):
                    break
                out.append(ln)
            return out
        ma, mb = model_lines(ya), model_lines(yb)
        expect(ma == mb, f"{label}: model sections differ:\n{ma}\n{mb}")
        for key in ("n_experts: 4", "moe_top_k: 2", "moe_every: 1", "expert_ffn_hidden: 24"):
            expect(any(ln.strip() == key for ln in mb), f"{label}: imported config lacks {key}: {mb}")
        print(f"{label}: {len(orig)} tensors ({sum('.experts.' in n for n in orig)} expert weights) "
              f"bit-identical after export + import")
    info = c.ckpt("info", os.path.join(c.path("imp_single"), "step_0"), "--tensors").stdout
    for want in ["MixtralForCausalLM", "experts:      4 per MoE layer (top-2, expert ffn 24, every layer)",
                 "model.layers.1.block_sparse_moe.experts.3.w2.weight", "checksums:    verified"]:
        expect(want in info, f"info lacks {want!r}:\n{info}")
    print(info)
    # bfloat16: round to nearest even, widened back exactly.
    c.ckpt("export-hf", src, c.path("hf_bf16"), "--dtype", "bfloat16")
    raw = st.read_dir(c.path("hf_bf16"), raw=True)
    for n, v in orig.items():
        want = torch.from_numpy(v).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        expect(np.array_equal(raw[n], want), f"bf16 {n}: bits differ from torch's rounding")
    print(f"bf16: {len(raw)} tensors equal torch's fp32 -> bfloat16")


def check_moe_torch(c: Ctx) -> None:
    src = moe_checkpoint(c, "src")
    hf = c.path("hf")
    c.ckpt("export-hf", src, hf)
    tensors = st.read_dir(hf)
    with open(os.path.join(hf, "config.json")) as f:
        cj = json.load(f)
    cfg = MixtralConfig.from_hf(cj)
    model = MixtralForCausalLM(cfg, torch.float64)
    names = [n for n, _ in model.named_parameters()]
    expect(set(names) == set(tensors), f"mixtral_ref parameters {sorted(names)} != export {sorted(tensors)}")
    with torch.no_grad():
        for n, p in model.named_parameters():
            expect(tuple(p.shape) == tensors[n].shape, f"{n}: reference shape {tuple(p.shape)}, export "
                                                       f"{tensors[n].shape}")
            p.copy_(torch.from_numpy(tensors[n]).to(torch.float64))

    with h5py.File(os.path.join(src, "checkpoint.h5"), "r") as f:
        yaml_text = f["meta/config_yaml"].asstr()[()]
    cfg_path = c.path("dump.yaml")
    with open(cfg_path, "w") as f:
        f.write(yaml_text)
    dump = c.path("dump.h5")
    run([c.a.dump_tool, "--config", cfg_path, "--checkpoint", src, "--out", dump, "--dtype", "f32", "--steps", "1"])
    orig = ckpt_model(src)
    with h5py.File(dump, "r") as f:
        tokens = torch.from_numpy(f["batch/tokens"][0].astype(np.int64))  # (B, T+1)
        adgt_logits = f["step0/logits"][...]
        for n in orig:
            expect(same_bits(f["model"][n][...].astype(np.float32), orig[n]), f"dump weights {n}")
    with torch.no_grad():
        ref = model(tokens[:, :-1]).reshape(-1, cfg.vocab_size).numpy()
    margin = model.routing_margin()
    err = rel_err(adgt_logits, ref)
    print(f"logits ({ref.shape[0]} x {ref.shape[1]}): adgt f32 vs mixtral_ref f64 on the Mixtral export: "
          f"rel err {err:.3e} (tolerance {LOGITS_TOL:g}); smallest top-{cfg.top_k} routing margin {margin:.2e}")
    expect(margin > 1e-5, f"routing margin {margin:.2e} too small for a stable comparison")
    expect(err <= LOGITS_TOL, f"logits rel err {err:.3e} > {LOGITS_TOL:g}")
    # The comparison sees config.json's num_experts_per_tok: top-1 would fail it.
    cfg1 = MixtralConfig.from_hf(dict(cj, num_experts_per_tok=1))
    wrong = MixtralForCausalLM(cfg1, torch.float64)
    wrong.load_state_dict(model.state_dict())
    with torch.no_grad():
        err_wrong = rel_err(adgt_logits, wrong(tokens[:, :-1]).reshape(-1, cfg.vocab_size).numpy())
    print(f"control: with num_experts_per_tok 1 instead of {cfg.top_k}: rel err {err_wrong:.3e}")
    expect(err_wrong > 100 * LOGITS_TOL, "the logits comparison does not notice a wrong num_experts_per_tok")


def check_moe_train(c: Ctx) -> None:
    if not (c.a.train_tool and c.a.data_tool and c.a.mpirun):
        print("adgt-train / adgt-data / mpirun not given: skipped")
        return
    src = moe_checkpoint(c, "src")
    hf = c.path("hf")
    c.ckpt("export-hf", src, hf)
    text = c.path("corpus.txt")
    with open(text, "w") as f:
        for i in range(400):
            f.write(f"Line {i}: the experts were exported, imported and trained again.\n")
    data = c.path("data")
    run([c.a.data_tool, "prepare", "--input", text, "--out", data, "--tokenizer", "byte"])
    base = c.path("base.yaml")
    with open(c.a.moe_config) as f:
        y = f.read()
    y = (y.replace("data/none/train.bin", os.path.join(data, "train.bin"))
          .replace("data/none/val.bin", os.path.join(data, "val.bin"))
          .replace("runs/hf_moe_test/checkpoints", c.path("run", "checkpoints"))
          .replace("runs/hf_moe_test", c.path("run")))
    with open(base, "w") as f:
        f.write(y)
    imp = c.path("imp")
    c.ckpt("import-hf", hf, imp, "--config", base)
    # Two steps on two ranks, each holding two of the four experts.
    p = run([c.a.mpirun, 2, c.a.train_tool, "--config", os.path.join(imp, "config.yaml"),
             "--resume", os.path.join(imp, "step_0"), "--set", "parallel.dp=2", "--set", "parallel.ep=2",
             "--set", "train.global_batch=4", "--set", "checkpoint.interval=2"])
    print(p.stdout)
    expect("resumed from" in p.stdout, "adgt-train did not resume from the import")
    step2 = c.path("run", "checkpoints", "step_2")
    expect(os.path.exists(os.path.join(step2, "COMPLETE")), f"no checkpoint at {step2}")
    with h5py.File(os.path.join(step2, "checkpoint.h5"), "r") as f:
        dims = [int(x) for x in f["meta/layout_dims"][...]]
        expect(dims == [1, 2, 1, 2], f"meta/layout_dims {dims}, expected tp 1 dp 2 pp 1 ep 2")
        p_ = f["meta/pieces"]
        writers = {}
        for t, r in zip(p_["tensor"], p_["rank"]):
            t = t.decode()
            if t.startswith("model/") and ".experts." in t:
                writers.setdefault(t, set()).add(int(r))
        # Contiguous placement: experts 0, 1 on rank 0 (ep rank 0), 2, 3 on rank 1.
        for t, rs in writers.items():
            e = int(t.split(".experts.")[1].split(".")[0])
            expect(rs == {e // 2}, f"{t} written by ranks {rs}, expected rank {e // 2}")
        expect(len(writers) == 2 * 4 * 3, f"{len(writers)} expert tensors in the index")
    c.ckpt("export-hf", step2, c.path("hf_step2"))
    before, after = ckpt_model(os.path.join(imp, "step_0")), st.read_dir(c.path("hf_step2"))
    expect(set(before) == set(after), "the exported step_2 lacks tensors")
    moved = max(float(np.max(np.abs(after[n] - before[n]))) for n in before)
    moved_experts = min(float(np.max(np.abs(after[n] - before[n]))) for n in before if ".experts." in n)
    print(f"largest weight change over 2 steps from the import: {moved:.2e}; every expert moved "
          f"(smallest largest change {moved_experts:.2e})")
    expect(0 < moved < 0.01, f"step_2 is not 2 small steps from the import (max change {moved})")
    expect(moved_experts > 0, "an expert did not train (or was not saved)")
    # ep=2 -> one process holding every expert.
    p = run([c.a.train_tool, "--config", os.path.join(imp, "config.yaml"), "--resume", step2,
             "--set", "train.steps=3", "--set", "train.global_batch=4", "--set", "checkpoint.interval=3"])
    expect("resumed from" in p.stdout and os.path.exists(c.path("run", "checkpoints", "step_3", "COMPLETE")),
           f"single-process resume from the ep=2 checkpoint failed:\n{p.stdout}")
    print("resumed the ep=2 checkpoint in one process (ep=1) and saved step 3")


def check_moe_errors(c: Ctx) -> None:
    failures = []

    def expect_fail(name: str, args: list, want: list):
        p = c.ckpt(*args, ok=False)
        err = p.stderr.strip()
        missing = [w for w in want if w not in err]
        status = "ok" if p.returncode != 0 and not missing else "FAILED"
        print(f"[{status}] {name}: exit {p.returncode}: {err}")
        if status != "ok":
            failures.append(f"{name}: expected a failure whose message contains {missing or want}")

    # Export refusals: what MixtralForCausalLM cannot represent.
    mixed = moe_checkpoint(c, "mixed", "model.moe_every=2")
    expect_fail("export_mixed_layers", ["export-hf", mixed, c.path("out_mixed")],
                ["export of", "as MixtralForCausalLM", "model.moe_every=2 mixes dense and mixture-of-experts"])
    aux_free = moe_checkpoint(c, "aux_free", "model.moe_aux_free=true")
    expect_fail("export_aux_free", ["export-hf", aux_free, c.path("out_aux_free")],
                ["model.moe_aux_free=true", "selection bias"])
    for d in ("out_mixed", "out_aux_free"):
        expect(not os.path.exists(c.path(d)), f"{d}: a refused export left a directory")
    # Capacity: exported with a note (Mixtral is dropless).
    capped = moe_checkpoint(c, "capped", "model.moe_capacity_factor=1.25")
    p = c.ckpt("export-hf", capped, c.path("out_capped"))
    expect("note: model.moe_capacity_factor=" in p.stderr and "dropless" in p.stderr,
           f"no capacity note: {p.stderr}")

    # Import errors on damaged Mixtral folders.
    src = moe_checkpoint(c, "src")
    good = c.path("good")
    c.ckpt("export-hf", src, good)
    main_file = "model.safetensors"

    def case(name: str, want: list, mutate):
        d = c.path("case_" + name)
        shutil.copytree(good, d)
        mutate(d)
        expect_fail(name, ["import-hf", d, c.path("out_" + name)], [f"case_{name}/"] + want)
        expect(not os.path.exists(os.path.join(c.path("out_" + name), "step_0")),
               f"{name}: a checkpoint was written despite the error")

    def edit_header(fn):
        def mutate(d):
            path = os.path.join(d, main_file)
            hdr, data = st.split_file(path)
            fn(hdr)
            st.write_file(path, hdr, data)
        return mutate

    def edit_config(**kv):
        def mutate(d):
            path = os.path.join(d, "config.json")
            cfg = json.load(open(path))
            cfg.update(kv)
            json.dump(cfg, open(path, "w"))
        return mutate

    w1 = "model.layers.1.block_sparse_moe.experts.3.w1.weight"
    w2 = "model.layers.0.block_sparse_moe.experts.2.w2.weight"
    case("missing_expert", [f"{main_file}: tensor {w1} is missing"], edit_header(lambda h: h.pop(w1)))
    case("expert_shape", [f"tensor {w2} has shape (24,32)", "config.json implies (32,24)"],
         edit_header(lambda h: h[w2].update(shape=[24, 32])))
    case("fewer_experts", ["tensor model.layers.0.block_sparse_moe.gate.weight has shape (4,32)",
                           "config.json implies (3,32)"], edit_config(num_local_experts=3))
    case("top_k", ["config.json: num_experts_per_tok=5 is larger than num_local_experts=4"],
         edit_config(num_experts_per_tok=5))
    case("sliding_window", ["config.json: \"sliding_window\": 8 is not supported"], edit_config(sliding_window=8))
    case("expert_act", ["hidden_act \"gelu\""], edit_config(hidden_act="gelu"))
    expect(not failures, "\n".join(failures))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("check", choices=["roundtrip", "torch", "torch_tied", "shards", "bf16", "errors", "train",
                                      "moe_roundtrip", "moe_torch", "moe_train", "moe_errors"])
    ap.add_argument("--ckpt-tool", required=True)
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--dump-tool", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--moe-config", help="the mixture-of-experts model (moe_* checks)")
    ap.add_argument("--work", required=True)
    ap.add_argument("--train-tool")
    ap.add_argument("--data-tool")
    ap.add_argument("--mpirun", help="tests/parallel/mpirun.sh (moe_train)")
    a = ap.parse_args()
    c = Ctx(a)
    try:
        if a.check in ("torch", "torch_tied"):
            check_torch(c, a.check == "torch_tied")
        else:
            globals()["check_" + a.check](c)
    except Failure as e:
        print(f"FAILED: {e}")
        return 1
    print(f"hf_{a.check}: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

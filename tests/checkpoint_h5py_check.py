#!/usr/bin/env python3
"""Checks the checkpoint format against an independent reader and writer.

1. adgt_checkpoint_fixture writes steps 10, 20, 30 with keep=2; h5py must find
   exactly step_20 and step_30, each tensor under model/<HF name> (and
   optim/exp_avg[_sq]/<name>) with the LlamaForCausalLM shape derived here from
   meta/config_yaml, values bitwise equal to the formula the fixture used, and
   a crc32 attribute equal to zlib.crc32 of the little-endian float32 bytes.
2. h5py writes a checkpoint from scratch (following docs/checkpoint-format.md);
   the C++ loader must return exactly its values and meta fields.
3. The same with one wrong crc32 attribute: the loader must fail naming it.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import zlib

import h5py
import numpy as np
import yaml


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def hf_table(model):
    """(name, shape) in HF LlamaForCausalLM order, written independently of core/model/param_table.cpp."""
    V, C, L = model["vocab_size"], model["d_model"], model["n_layers"]
    H, KV, F = model["n_heads"], model["n_kv_heads"], model["ffn_hidden"]
    hd = C // H
    t = [("model.embed_tokens.weight", (V, C))]
    for layer in range(L):
        p = f"model.layers.{layer}."
        t += [
            (p + "input_layernorm.weight", (C,)),
            (p + "self_attn.q_proj.weight", (H * hd, C)),
            (p + "self_attn.k_proj.weight", (KV * hd, C)),
            (p + "self_attn.v_proj.weight", (KV * hd, C)),
            (p + "self_attn.o_proj.weight", (C, H * hd)),
            (p + "post_attention_layernorm.weight", (C,)),
            (p + "mlp.gate_proj.weight", (F, C)),
            (p + "mlp.up_proj.weight", (F, C)),
            (p + "mlp.down_proj.weight", (C, F)),
        ]
    t.append(("model.norm.weight", (C,)))
    if not model.get("tie_embeddings", False):
        t.append(("lm_head.weight", (V, C)))
    return t


def crc32(a):
    return zlib.crc32(np.ascontiguousarray(a, dtype="<f4").tobytes()) & 0xFFFFFFFF


def fixture_values(k, shape):
    n = int(np.prod(shape))
    v = k + np.arange(n, dtype=np.float64) * 0.001
    return [x.astype(np.float32).reshape(shape) for x in (v, -v, v * v)]


def bits_equal(a, b):
    return a.shape == b.shape and np.array_equal(
        np.ascontiguousarray(a, dtype="<f4").view("<u4"), np.ascontiguousarray(b, dtype="<f4").view("<u4"))


def check_written(root):
    entries = sorted(os.listdir(root))
    check(entries == ["step_20", "step_30"], f"keep=2 should leave step_20, step_30 under {root}; found {entries}")
    step_dir = os.path.join(root, "step_30")
    path = os.path.join(step_dir, "checkpoint.h5")
    marker = dict(line.split("=", 1) for line in open(os.path.join(step_dir, "COMPLETE")).read().splitlines()
                  if "=" in line)
    check(int(marker["bytes"]) == os.path.getsize(path), f"COMPLETE bytes={marker['bytes']} != file size")
    check(int(marker["step"]) == 30, "COMPLETE step")
    with h5py.File(path, "r") as f:
        meta = f["meta"]
        check(int(meta["format_version"][()]) == 1, "meta/format_version")
        check(int(meta["step"][()]) == 30, "meta/step")
        check(int(meta["samples_seen"][()]) == 240, "meta/samples_seen")
        check(int(meta["seed"][()]) == 0xDEADBEEFCAFEF00D, f"meta/seed = {meta['seed'][()]!r}")
        cfg_text = meta["config_yaml"].asstr()[()]
        check(meta["config_yaml"].attrs["crc32"] == zlib.crc32(cfg_text.encode()), "meta/config_yaml crc32")
        rng = meta["rng_state"][()]
        check(rng.dtype == np.uint64 and rng.tolist() == [30, 42, 2**64 - 1], f"meta/rng_state = {rng!r}")
        check(meta["rng_state"].attrs["crc32"] == zlib.crc32(rng.astype("<u8").tobytes()), "meta/rng_state crc32")
        table = hf_table(yaml.safe_load(cfg_text)["model"])
        for gi, group in enumerate(["model", "optim/exp_avg", "optim/exp_avg_sq"]):
            g = f[group]
            names = list(g)  # creation order is tracked: parameter-table order
            check(names == [n for n, _ in table], f"{group}: names/order {names} != HF table")
            for k, (name, shape) in enumerate(table):
                ds = g[name]
                where = f"{path}:{group}/{name}"
                check(isinstance(ds, h5py.Dataset), f"{where} is not a dataset")
                check(ds.dtype == np.dtype("<f4"), f"{where} dtype {ds.dtype}")
                check(ds.shape == shape, f"{where} shape {ds.shape} != {shape}")
                check(ds.chunks is None, f"{where} is chunked; expected contiguous")
                got = ds[...]
                want = fixture_values(k, shape)[gi]
                check(bits_equal(got, want), f"{where} values differ from the fixture formula")
                check(int(ds.attrs["crc32"]) == crc32(got), f"{where} crc32 attr != zlib.crc32")
        # Spot check with the exact access path the docs promise.
        w = f["model/model.layers.1.mlp.up_proj.weight"][...]
        k = [n for n, _ in table].index("model.layers.1.mlp.up_proj.weight")
        check(w.shape == (40, 16) and w[3, 5] == np.float32(k + (3 * 16 + 5) * 0.001), "up_proj spot check")
    print(f"ok: h5py reads {len(table)} tensors x 3 groups from {path}")
    return table, cfg_text


def write_with_h5py(step_dir, table, cfg_text, rng, bad_crc=None):
    os.makedirs(step_dir)
    path = os.path.join(step_dir, "checkpoint.h5")
    arrays = {}
    with h5py.File(path, "w") as f:
        for group in ["model", "optim/exp_avg", "optim/exp_avg_sq"]:
            g = f.create_group(group)
            for name, shape in table:
                a = rng.standard_normal(shape).astype(np.float32)
                arrays[(group, name)] = a
                ds = g.create_dataset(name, data=a)
                c = crc32(a)
                ds.attrs["crc32"] = np.uint32(c ^ 1 if (group, name) == bad_crc else c)
        m = f.create_group("meta")
        m["format_version"] = np.int64(1)
        m["step"] = np.int64(77)
        m["samples_seen"] = np.int64(616)
        m["seed"] = np.uint64(2**63 + 5)
        m["config_yaml"] = cfg_text  # variable-length UTF-8, h5py's default
        m["config_yaml"].attrs["crc32"] = np.uint32(zlib.crc32(cfg_text.encode()))
        words = np.array([7, 2**64 - 2], dtype="<u8")
        m["rng_state"] = words
        m["rng_state"].attrs["crc32"] = np.uint32(zlib.crc32(words.tobytes()))
    with open(os.path.join(step_dir, "COMPLETE"), "w") as f:
        f.write("adgt checkpoint\nformat_version=1\nstep=77\nfile=checkpoint.h5\n")
    return arrays


def check_read(fixture, workdir, table, cfg_text):
    rng = np.random.default_rng(0)
    step_dir = os.path.join(workdir, "from_h5py", "step_77")
    arrays = write_with_h5py(step_dir, table, cfg_text, rng)
    out = os.path.join(workdir, "loaded.bin")
    r = subprocess.run([fixture, "load", step_dir, out], capture_output=True, text=True)
    check(r.returncode == 0, f"fixture load failed: {r.stderr}")
    meta = json.loads(r.stdout)
    check(meta["step"] == 77 and meta["samples_seen"] == 616 and meta["seed"] == 2**63 + 5, f"meta {meta}")
    check(meta["config_yaml"] == cfg_text, "config_yaml differs after load")
    check(meta["rng_state"] == [7, 2**64 - 2], f"rng_state {meta['rng_state']}")
    flat = np.fromfile(out, dtype="<f4")
    want = np.concatenate([arrays[(g, n)].ravel() for g in ["model", "optim/exp_avg", "optim/exp_avg_sq"]
                           for n, _ in table])
    check(bits_equal(flat, want), "C++ load of the h5py-written checkpoint returned different values")
    print(f"ok: C++ loads the checkpoint h5py wrote ({flat.size} floats)")

    bad = ("model", "model.layers.1.self_attn.k_proj.weight")
    step_dir = os.path.join(workdir, "bad_crc", "step_77")
    write_with_h5py(step_dir, table, cfg_text, rng, bad_crc=bad)
    r = subprocess.run([fixture, "load", step_dir, out], capture_output=True, text=True)
    check(r.returncode != 0, "a wrong crc32 attribute was not detected")
    check("tensor model/model.layers.1.self_attn.k_proj.weight fails its checksum" in r.stderr,
          f"checksum error does not name the tensor: {r.stderr}")
    print("ok: a wrong crc32 attribute is reported by tensor name")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    root = os.path.join(a.workdir, "written")
    for step in (10, 20, 30):
        r = subprocess.run([a.fixture, "write", root, str(step), "2"], capture_output=True, text=True)
        check(r.returncode == 0, f"fixture write failed: {r.stderr}")
    table, cfg_text = check_written(root)
    check_read(a.fixture, a.workdir, table, cfg_text)
    print("checkpoint_h5py: all checks passed")


if __name__ == "__main__":
    main()

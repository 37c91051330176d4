"""A small, independent safetensors reader and writer for the tests (no
`safetensors` package): written from the format's description, not from
adgt's C++.

    8 bytes   N, little-endian uint64
    N bytes   JSON header {name: {"dtype", "shape", "data_offsets": [b, e]}, "__metadata__": {...}}
    rest      data; offsets are relative to its first byte

`read_file` validates what it reads (length, offsets in range and matching
dtype x shape, no overlaps) and returns float32 numpy arrays (BF16 widened
exactly) or, with raw=True, the stored bits. `write_file` writes any header
verbatim, so tests can craft damaged files.
"""
from __future__ import annotations

import json
import os
import struct

import numpy as np

SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
         "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


class FormatError(ValueError):
    pass


def read_header(path: str):
    """Returns (header dict without __metadata__, metadata, data_start, data_len)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if size < 8:
            raise FormatError(f"{path}: shorter than 8 bytes")
        (n,) = struct.unpack("<Q", f.read(8))
        if n > size - 8:
            raise FormatError(f"{path}: header length {n} beyond the file ({size} bytes)")
        header = json.loads(f.read(n).decode("utf-8"))
    meta = header.pop("__metadata__", {})
    data_len = size - 8 - n
    spans = []
    for name, e in header.items():
        if e["dtype"] not in SIZES:
            raise FormatError(f"{path}: {name}: unknown dtype {e['dtype']}")
        b, end = e["data_offsets"]
        need = SIZES[e["dtype"]] * int(np.prod(e["shape"], dtype=np.int64))
        if not (0 <= b <= end <= data_len) or end - b != need:
            raise FormatError(f"{path}: {name}: bad data_offsets {e['data_offsets']}")
        spans.append((b, end, name))
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise FormatError(f"{path}: {n0} and {n1} overlap")
    return header, meta, 8 + n, data_len


def read_file(path: str, raw: bool = False) -> dict:
    """name -> numpy array in the stored shape: float32 (F32, BF16, F16 widened),
    or with raw=True the stored bits (uint16 for BF16/F16, uint32 for F32)."""
    header, _, start, _ = read_header(path)
    out = {}
    with open(path, "rb") as f:
        for name, e in header.items():
            b, end = e["data_offsets"]
            f.seek(start + b)
            buf = f.read(end - b)
            dt = e["dtype"]
            if dt == "F32":
                a = np.frombuffer(buf, dtype="<u4" if raw else "<f4")
            elif dt == "BF16":
                bits = np.frombuffer(buf, dtype="<u2")
                a = bits if raw else (bits.astype(np.uint32) << 16).view(np.float32)
            elif dt == "F16":
                a = np.frombuffer(buf, dtype="<u2" if raw else "<f2")
                if not raw:
                    a = a.astype(np.float32)
            else:
                raise FormatError(f"{path}: {name}: dtype {dt} not handled by the test reader")
            out[name] = a.reshape(e["shape"]).copy()
    return out


def read_dir(d: str, raw: bool = False) -> dict:
    """Every tensor of an HF directory: model.safetensors, or the index and its
    shards. With an index, checks that weight_map names each tensor once, that
    each shard holds exactly the tensors mapped to it, and total_size."""
    index = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_file(os.path.join(d, "model.safetensors"), raw)
    with open(index) as f:
        idx = json.load(f)
    wm = idx["weight_map"]
    out, total = {}, 0
    for shard in sorted(set(wm.values())):
        header, _, _, _ = read_header(os.path.join(d, shard))
        mapped = {n for n, s in wm.items() if s == shard}
        if set(header) != mapped:
            raise FormatError(f"{shard}: holds {sorted(header)}, index maps {sorted(mapped)}")
        for n, e in header.items():
            total += e["data_offsets"][1] - e["data_offsets"][0]
        part = read_file(os.path.join(d, shard), raw)
        dup = set(part) & set(out)
        if dup:
            raise FormatError(f"{shard}: tensors also in another shard: {sorted(dup)}")
        out.update(part)
    if idx["metadata"]["total_size"] != total:
        raise FormatError(f"index total_size {idx['metadata']['total_size']} != {total}")
    return out


def write_file(path: str, header: dict, data: bytes, pad: bool = True) -> None:
    """Writes `header` (a dict, serialised as JSON) and `data` verbatim."""
    text = json.dumps(header).encode("utf-8")
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(data)


def split_file(path: str):
    """(header dict including __metadata__, data bytes) of an existing file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
        return header, f.read()

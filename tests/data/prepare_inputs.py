#!/usr/bin/env python3
"""adgt-data prepare over a corpus of several files (docs/data-format.md,
"Inputs"): a directory holding JSON lines, a gzip-compressed JSON-lines file
in a subfolder and a file of no known format, with bad records among the
lines. The shards are version 2 with the document index, and their tokens
are computed here from the same documents: with the byte tokenizer (no
end-of-document token) "\n\n" between documents; with a tokenizer.json that
has <|endoftext|>, each document ends with it; every 10th document is
validation. --bos without a beginning token is refused; one text file is
still one document split into blocks (version 1); every bad record is named
in bad_records.txt; with --on-bad-record fail the first one is the error.

usage: prepare_inputs.py --data ADGT_DATA --text INPUT_TXT --work DIR
"""
import argparse
import gzip
import json
import os
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from byte_level_tokenizer import byte_alphabet, byte_level_tokenizer  # noqa: E402


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--text", required=True, help="a UTF-8 text whose paragraphs become the documents")
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    corpus = os.path.join(a.work, "corpus")
    os.makedirs(os.path.join(corpus, "sub"))
    paras = [p.strip("\n") for p in open(a.text, encoding="utf-8").read().split("\n\n") if p.strip()]
    paras[3] += " caf\u00e9 \u65e5\u672c \U0001F600 \"quoted\" back\\slash"
    half = len(paras) // 2
    first, second = paras[:half], paras[half:]
    # a.jsonl: the first half, with four bad records and an empty line among them.
    lines = [json.dumps({"id": i, "text": d}) for i, d in enumerate(first)]
    lines.insert(2, "this is not json")                        # line 3
    lines.insert(5, json.dumps({"id": -1, "body": "no text"}))  # line 6
    lines.insert(7, json.dumps({"id": -2, "text": 12}))        # line 8
    lines.insert(9, "")                                       # line 10: no record
    raw = ("\n".join(lines) + "\n").encode()
    raw += b'{"text": "bad \xc3\x28 utf8"}\n'                   # the last line: ill-formed UTF-8
    with open(os.path.join(corpus, "a.jsonl"), "wb") as f:
        f.write(raw)
    with gzip.open(os.path.join(corpus, "sub", "b.jsonl.gz"), "wt", encoding="utf-8") as f:
        for d in second:
            f.write(json.dumps({"text": d}) + "\n")
    with open(os.path.join(corpus, "README.md"), "w") as f:
        f.write("not a corpus file\n")
    joined = os.path.join(a.work, "joined.txt")
    with open(joined, "w", encoding="utf-8") as f:
        f.write("\n\n".join(paras))
    n_lines = raw.count(b"\n")

    failures = []
    k = 10  # --val-fraction 0.1

    def shard(path):
        raw = open(path, "rb").read()
        version, dtype, count, vocab, docs = struct.unpack_from("<IIQQQ", raw, 8)
        width = 2 if dtype == 1 else 4
        toks = list(struct.unpack_from(f"<{count}{'H' if width == 2 else 'I'}", raw, 64))
        starts = list(struct.unpack_from(f"<{docs}q", raw, 64 + width * count)) if version == 2 else [0]
        return version, toks, starts

    def expected(ids_of, eos, gap):
        out = {0: ([], []), 1: ([], [])}
        for d, text in enumerate(paras):
            toks, starts = out[1 if d % k == k - 1 else 0]
            if gap and toks:
                toks += gap
            starts.append(len(toks))
            toks += ids_of(text) + ([eos] if eos is not None else [])
        return out

    # The byte tokenizer has no end-of-document token: "\n\n" between documents.
    got = run([a.data, "prepare", "--input", corpus, "--out", os.path.join(a.work, "dir"), "--tokenizer", "byte",
               "--val-fraction", "0.1"])
    if got.returncode:
        sys.exit(f"FAILED: prepare exited {got.returncode}:\n{got.stderr}")
    want = expected(lambda t: list(t.encode()), None, [10, 10])
    for s, name in ((0, "train.bin"), (1, "val.bin")):
        version, toks, starts = shard(os.path.join(a.work, "dir", name))
        if version != 2 or toks != want[s][0] or starts != want[s][1]:
            failures.append(f"byte {name}: version {version}, {len(toks)} tokens, starts {starts[:5]}...; "
                            f"want {len(want[s][0])} tokens, starts {want[s][1][:5]}...")
    meta = json.load(open(os.path.join(a.work, "dir", "meta.json")))
    src = meta["source"]
    if src.get("documents") != len(paras) or src.get("bad_records") != 4 or len(src.get("files", [])) != 2:
        failures.append(f"meta.json source: {src} (want {len(paras)} documents, 4 bad records, 2 files)")
    # A tokenizer.json with an end-of-document token (GPT-2's byte alphabet, no merges): every
    # document ends with it; --bos is refused (it has no beginning token).
    byte_id = {b: i for i, b in enumerate(byte_alphabet()[0])}
    tj = os.path.join(a.work, "tokenizer.json")
    with open(tj, "w") as f:
        json.dump(byte_level_tokenizer([(256, "<|endoftext|>")]), f)
    got = run([a.data, "prepare", "--input", corpus, "--out", os.path.join(a.work, "eos"), "--tokenizer", tj,
               "--val-fraction", "0.1"])
    if got.returncode:
        failures.append(f"prepare with tokenizer.json exited {got.returncode}: {got.stderr}")
    else:
        want = expected(lambda t: [byte_id[b] for b in t.encode()], 256, None)
        for s, name in ((0, "train.bin"), (1, "val.bin")):
            version, toks, starts = shard(os.path.join(a.work, "eos", name))
            if toks != want[s][0] or starts != want[s][1]:
                failures.append(f"eos {name}: {len(toks)} tokens, want {len(want[s][0])}; starts {starts[:4]} "
                                f"want {want[s][1][:4]}")
    # tokenizer_config.json beside the file names the end token (here a second added token).
    cfg_dir = os.path.join(a.work, "with_config")
    os.makedirs(cfg_dir)
    spec = json.load(open(tj))
    spec["added_tokens"].append({"id": 257, "content": "<|eot|>", "special": True})
    json.dump(spec, open(os.path.join(cfg_dir, "tokenizer.json"), "w"))
    json.dump({"eos_token": {"content": "<|eot|>"}}, open(os.path.join(cfg_dir, "tokenizer_config.json"), "w"))
    got = run([a.data, "prepare", "--input", corpus, "--out", os.path.join(a.work, "eot"), "--tokenizer",
               os.path.join(cfg_dir, "tokenizer.json"), "--val-fraction", "0.1"])
    if got.returncode or "eos 257" not in got.stdout:
        failures.append(f"tokenizer_config.json's eos_token: exit {got.returncode}, {got.stdout}{got.stderr}")
    nobos = run([a.data, "prepare", "--input", corpus, "--out", os.path.join(a.work, "bos"), "--tokenizer", tj, "--bos"])
    if nobos.returncode == 0 or "no beginning-of-document token" not in nobos.stderr:
        failures.append(f"--bos without a bos token: exit {nobos.returncode}, {nobos.stderr!r}")
    # One text file is one document: split into blocks as before (version 1).
    ref = run([a.data, "prepare", "--input", joined, "--out", os.path.join(a.work, "ref"), "--tokenizer", "byte"])
    if ref.returncode or shard(os.path.join(a.work, "ref", "train.bin"))[0] != 1:
        failures.append(f"one text file: exit {ref.returncode}, not a version 1 shard")
    bad = open(os.path.join(a.work, "dir", "bad_records.txt")).read().splitlines()
    want_bad = [("a.jsonl:3:", "not a JSON value"), ("a.jsonl:6:", "no field 'text'"),
                ("a.jsonl:8:", "number, not a string"), (f"a.jsonl:{n_lines}:", "not valid UTF-8")]
    if len(bad) != 4 or any(w[0] not in b or w[1] not in b for w, b in zip(want_bad, bad)):
        failures.append("bad_records.txt:\n" + "\n".join(bad))
    strict = run([a.data, "prepare", "--input", os.path.join(corpus, "*.jsonl"), os.path.join(corpus, "sub"),
                  "--out", os.path.join(a.work, "strict"), "--tokenizer", "byte", "--on-bad-record", "fail"])
    if strict.returncode == 0 or "a.jsonl:3: not a JSON value" not in strict.stderr:
        failures.append(f"--on-bad-record fail: exit {strict.returncode}, stderr {strict.stderr!r}")
    if failures:
        sys.exit("FAILED:\n" + "\n".join(failures))
    print(f"ok: {len(paras)} documents from 2 files (JSON lines, gzip): byte and tokenizer.json (eos) shards "
          f"equal the documents' own encodings with their index; 4 bad records named; --on-bad-record fail "
          f"names the first")


if __name__ == "__main__":
    main()

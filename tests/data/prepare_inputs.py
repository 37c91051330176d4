#!/usr/bin/env python3
"""adgt-data prepare over a corpus of several files (docs/data-format.md,
"Inputs"): a directory holding JSON lines, a gzip-compressed JSON-lines file
in a subfolder and a file of no known format, with bad records among the
lines. The shards must equal, byte for byte, those prepared from one text
file holding the same documents joined by blank lines (written here, from
the same documents); every bad record is named in bad_records.txt; with
--on-bad-record fail the first one is the error.

usage: prepare_inputs.py --data ADGT_DATA --text INPUT_TXT --work DIR
"""
import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys


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
    ref = run([a.data, "prepare", "--input", joined, "--out", os.path.join(a.work, "ref"), "--tokenizer", "byte",
               "--val-fraction", "0.1"])
    got = run([a.data, "prepare", "--input", corpus, "--out", os.path.join(a.work, "dir"), "--tokenizer", "byte",
               "--val-fraction", "0.1"])
    if ref.returncode or got.returncode:
        sys.exit(f"FAILED: prepare exited {ref.returncode}/{got.returncode}:\n{ref.stderr}\n{got.stderr}")
    for shard in ("train.bin", "val.bin"):
        if open(os.path.join(a.work, "ref", shard), "rb").read() != open(os.path.join(a.work, "dir", shard), "rb").read():
            failures.append(f"{shard} differs from the one of the joined text")
    meta = json.load(open(os.path.join(a.work, "dir", "meta.json")))
    src = meta["source"]
    if src.get("documents") != len(paras) or src.get("bad_records") != 4 or len(src.get("files", [])) != 2:
        failures.append(f"meta.json source: {src} (want {len(paras)} documents, 4 bad records, 2 files)")
    bad = open(os.path.join(a.work, "dir", "bad_records.txt")).read().splitlines()
    want = [("a.jsonl:3:", "not a JSON value"), ("a.jsonl:6:", "no field 'text'"),
            ("a.jsonl:8:", "number, not a string"), (f"a.jsonl:{n_lines}:", "not valid UTF-8")]
    if len(bad) != 4 or any(w[0] not in b or w[1] not in b for w, b in zip(want, bad)):
        failures.append("bad_records.txt:\n" + "\n".join(bad))
    if "README.md" not in got.stderr or "4 bad records skipped" not in got.stderr:
        failures.append("stderr does not name the file left out and the skipped records:\n" + got.stderr)
    strict = run([a.data, "prepare", "--input", os.path.join(corpus, "*.jsonl"), os.path.join(corpus, "sub"),
                  "--out", os.path.join(a.work, "strict"), "--tokenizer", "byte", "--on-bad-record", "fail"])
    if strict.returncode == 0 or "a.jsonl:3: not a JSON value" not in strict.stderr:
        failures.append(f"--on-bad-record fail: exit {strict.returncode}, stderr {strict.stderr!r}")
    if failures:
        sys.exit("FAILED:\n" + "\n".join(failures))
    print(f"ok: {len(paras)} documents from 2 files (JSON lines, gzip) equal the joined text's shards; "
          f"4 bad records named; --on-bad-record fail names the first")


if __name__ == "__main__":
    main()

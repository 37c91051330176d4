#!/usr/bin/env python3
"""Peak memory of `adgt-data prepare` against corpus size (docs/data-format.md,
"Streaming and --resume"): writes two deterministic JSON-lines corpora
(default 100 MB and 1 GB, 8 files each, documents of 0.5-8 KB of words),
prepares each with a byte-level tokenizer.json (GPT-2's byte alphabet and
<|endoftext|>, tests/byte_level_tokenizer.py) under `/usr/bin/time -v`, and
prints each run's peak RSS and tokens/s, the large/small RSS ratio at each
worker count (the target: within 1.10, memory flat in the corpus size) and
the tokens/s of --workers 2 over --workers 1 (with the CPU seconds of each
run and the load average, since a shared machine moves wall-clock rates). Each run is checked: it exits
0 and meta.json's token and document counts add up to the shards' headers.
Everything is written under --work and removed at the end (--keep keeps it).

usage: bench_prepare_memory.py --data ADGT_DATA --work DIR [--sizes-mb 100 1000] [--workers 1 2] [--keep]
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from byte_level_tokenizer import byte_level_tokenizer  # noqa: E402

WORDS = ("the and of to in that shall unto he lord his they be is him not them it with all thou thy was "
         "which my for me but ye i are said upon this have from by on at as or an so no").split()


def line_pool(n=4096, seed=1):
    """n lines of 4-24 words from a fixed LCG: the documents are made of them."""
    s, pool = seed, []
    for _ in range(n):
        words = []
        s = (s * 1103515245 + 12345) % 2147483648
        for _ in range(4 + s % 21):
            s = (s * 1103515245 + 12345) % 2147483648
            words.append(WORDS[(s >> 16) % len(WORDS)])
        pool.append(" ".join(words))
    return pool


def write_corpus(root, mb, files=8):
    """`mb` MB of JSON lines in `files` files; the same bytes every time."""
    os.makedirs(root, exist_ok=True)
    pool, s, target = line_pool(), 7, mb * 1_000_000
    per_file = target // files
    for f in range(files):
        with open(os.path.join(root, f"part-{f:03d}.jsonl"), "w", encoding="utf-8") as out:
            written, chunk = 0, []
            while written < per_file:
                s = (s * 6364136223846793005 + 1442695040888963407) % 2**64
                n_lines = 4 + (s >> 40) % 96
                lines = [pool[(s >> (i % 48)) % len(pool)] for i in range(n_lines)]
                rec = json.dumps({"text": "\n".join(lines)}) + "\n"
                chunk.append(rec)
                written += len(rec)
                if len(chunk) >= 4096:
                    out.write("".join(chunk))
                    chunk = []
            out.write("".join(chunk))


def shard_header(path):
    with open(path, "rb") as f:
        h = f.read(64)
    _, _, count, _, docs = struct.unpack_from("<IIQQQ", h, 8)
    return count, docs


def prepare(data, corpus, out, tok, workers):
    """One run under /usr/bin/time -v: (peak RSS MiB, tokens/s, seconds)."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = ["/usr/bin/time", "-v", data, "prepare", "--input", corpus, "--out", out, "--tokenizer", tok,
           "--workers", str(workers), "--progress", "lines"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"FAILED: {' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1))
    cpu = sum(float(re.search(rf"{k} time \(seconds\): ([0-9.]+)", r.stderr).group(1)) for k in ("User", "System"))
    m = re.search(r"read\+encode\+write ([0-9.]+) \(([0-9.]+) tokens/s", r.stdout)
    meta = json.load(open(os.path.join(out, "meta.json")))
    for side in ("train", "val"):
        count, docs = shard_header(os.path.join(out, f"{side}.bin"))
        if count != meta[side]["tokens"] or docs != meta[side]["documents"]:
            sys.exit(f"FAILED: {out}/{side}.bin holds {count} tokens, {docs} documents; meta.json says "
                     f"{meta[side]['tokens']}, {meta[side]['documents']}")
    tokens = meta["train"]["tokens"] + meta["val"]["tokens"]
    return rss_kb / 1024.0, float(m.group(2)), float(m.group(1)), tokens, meta["source"]["documents"], cpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="the adgt-data executable")
    ap.add_argument("--work", required=True, help="a scratch directory (removed at the end)")
    ap.add_argument("--sizes-mb", type=int, nargs=2, default=[100, 1000])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    data = os.path.abspath(a.data)
    os.makedirs(a.work, exist_ok=True)
    tok = os.path.join(a.work, "tokenizer.json")
    json.dump(byte_level_tokenizer([(256, "<|endoftext|>")]), open(tok, "w"))
    rows = {}
    try:
        for mb in a.sizes_mb:
            corpus = os.path.join(a.work, f"corpus-{mb}mb")
            write_corpus(corpus, mb)
            for w in a.workers:
                rss, tok_s, secs, tokens, docs, cpu = prepare(data, corpus, os.path.join(a.work, "out"), tok, w)
                rows[(mb, w)] = (rss, tok_s)
                print(f"{mb:5d} MB  workers {w}: peak RSS {rss:7.1f} MiB, {tokens} tokens, {docs} documents, "
                      f"{secs:.1f} s, {tok_s / 1e6:.2f} M tokens/s, {cpu:.1f} CPU s", flush=True)
            shutil.rmtree(corpus)
            shutil.rmtree(os.path.join(a.work, "out"), ignore_errors=True)
    finally:
        if not a.keep:
            shutil.rmtree(a.work, ignore_errors=True)
    small, large = a.sizes_mb
    ok = True
    for w in a.workers:
        ratio = rows[(large, w)][0] / rows[(small, w)][0]
        ok &= ratio <= 1.10
        print(f"workers {w}: peak RSS {large} MB / {small} MB = {ratio:.3f} (target <= 1.10: "
              f"{'met' if ratio <= 1.10 else 'NOT met'})")
    load = os.getloadavg()[0]
    print(f"load average {load:.1f} on {os.cpu_count()} cores (tokens/s are wall-clock: a loaded machine lowers them)")
    if 1 in a.workers and 2 in a.workers:
        for mb in a.sizes_mb:
            print(f"{mb} MB: tokens/s workers 2 / workers 1 = {rows[(mb, 2)][1] / rows[(mb, 1)][1]:.2f} "
                  f"(ceiling: 2.00 on 2 free cores)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

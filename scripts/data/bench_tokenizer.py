#!/usr/bin/env python3
"""Tokenizer throughput, adgt against HuggingFace tokenizers on the same text
and machine in the same run (docs/data-format.md, "Tokenizers"): bytes per
second of `adgt-data encode --jsonl` (the whole process: reading the JSON
lines, encoding, printing the ids) with 1 and 2 OpenMP threads, and of
tokenizers' encode_batch (add_special_tokens=False) with 1 and 2 rayon
threads, each the best of --reps runs, alternated. The texts come from
tests/data/hf_tokenizer_parity.py (--work of that script holds
texts.jsonl and the tokenizer files after a run with --mb 10).

With --prepare CORPUS.jsonl (lines of {"text": ...}): `adgt-data prepare`
of that corpus, the whole process, on one core (`taskset -c 0`, --workers 1:
the reading and appending threads share that core) and with --workers 2 on
the machine's cores, against tokenizers' encode_batch of the same texts on
one core (one rayon thread, pinned likewise): issue 44's "on one core >= 1.0x
HF tokenizers, >= 1.8x with 2 workers".

usage: bench_tokenizer.py --data ADGT_DATA --tokenizer TOKENIZER_JSON --texts TEXTS_JSONL [--reps 3]
       bench_tokenizer.py --data ADGT_DATA --tokenizer TOKENIZER_JSON --prepare CORPUS_JSONL [--reps 3]
"""
import shutil
import tempfile
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, ".deps", "python"))


def hf_rate(tok_path, texts, threads, nbytes):
    code = ("import json,sys,time;sys.path.insert(0,sys.argv[3]);from tokenizers import Tokenizer;"
            "t=Tokenizer.from_file(sys.argv[1]);x=[json.loads(l) for l in open(sys.argv[2])];"
            "s=time.time();t.encode_batch(x,add_special_tokens=False);print(time.time()-s)")
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, "-c", code, tok_path, texts, os.path.join(ROOT, ".deps", "python")],
                         env=env, capture_output=True, text=True, check=True)
    return nbytes / float(out.stdout.strip())


def adgt_rate(data, tok_path, texts, threads, nbytes):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    t0 = time.time()
    subprocess.run([data, "encode", "--tokenizer", tok_path, "--jsonl", texts], env=env,
                   stdout=subprocess.DEVNULL, check=True)
    return nbytes / (time.time() - t0)


def hf_prepare_rate(tok_path, corpus, nbytes):
    """tokenizers' encode_batch of the corpus's texts, one rayon thread on core 0."""
    code = ("import json,sys,time;sys.path.insert(0,sys.argv[3]);from tokenizers import Tokenizer;"
            "t=Tokenizer.from_file(sys.argv[1]);x=[json.loads(l)['text'] for l in open(sys.argv[2])];"
            "s=time.time();t.encode_batch(x,add_special_tokens=False);print(time.time()-s)")
    env = dict(os.environ, RAYON_NUM_THREADS="1")
    out = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", code, tok_path, corpus,
                          os.path.join(ROOT, ".deps", "python")],
                         env=env, capture_output=True, text=True, check=True)
    return nbytes / float(out.stdout.strip())


def prepare_seconds(data, tok_path, corpus, workers, work):
    """Wall seconds of `adgt-data prepare` (the whole process), --workers 1 on core 0."""
    out = os.path.join(work, f"w{workers}")
    shutil.rmtree(out, ignore_errors=True)
    cmd = [data, "prepare", "--input", corpus, "--tokenizer", tok_path, "--out", out,
           "--workers", str(workers), "--progress", "off"]
    if workers == 1:
        cmd = ["taskset", "-c", "0"] + cmd
    t0 = time.time()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True)
    return time.time() - t0


def bench_prepare(a):
    nbytes = sum(len(json.loads(l)["text"].encode()) for l in open(a.prepare))
    best = {}
    with tempfile.TemporaryDirectory() as work:
        for _ in range(a.reps):
            for w in (1, 2):
                best[w] = min(best.get(w, 1e30), prepare_seconds(a.data, a.tokenizer, a.prepare, w, work))
            best["hf"] = max(best.get("hf", 0), hf_prepare_rate(a.tokenizer, a.prepare, nbytes))
    r1, r2 = nbytes / best[1], nbytes / best[2]
    print(f"| prepare {os.path.basename(a.prepare)} ({nbytes / 1e6:.1f} MB of text), "
          f"{os.path.basename(a.tokenizer)} | MB/s | against |")
    print("|---|---|---|")
    print(f"| HF tokenizers encode_batch, one core | {best['hf'] / 1e6:.2f} | |")
    print(f"| adgt-data prepare --workers 1, one core (taskset -c 0) | {r1 / 1e6:.2f} | "
          f"{r1 / best['hf']:.2f}x HF (issue 44: >= 1.0x) |")
    print(f"| adgt-data prepare --workers 2 | {r2 / 1e6:.2f} | {r2 / r1:.2f}x one core (issue 44: >= 1.8x) |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--texts")
    ap.add_argument("--prepare", help="a JSON-lines corpus ({\"text\": ...}) to prepare")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    if a.prepare:
        return bench_prepare(a)
    if not a.texts:
        ap.error("--texts or --prepare is required")
    nbytes = sum(len(json.loads(l).encode()) for l in open(a.texts))
    best = {}
    for _ in range(a.reps):
        for threads in (1, 2):
            for name, f in (("hf", lambda t: hf_rate(a.tokenizer, a.texts, t, nbytes)),
                            ("adgt", lambda t: adgt_rate(a.data, a.tokenizer, a.texts, t, nbytes))):
                best[(name, threads)] = max(best.get((name, threads), 0), f(threads))
    print(f"| {os.path.basename(a.tokenizer)}, {nbytes / 1e6:.1f} MB | 1 thread MB/s | 2 threads MB/s | 2 / 1 |")
    print("|---|---|---|---|")
    for name in ("hf", "adgt"):
        r1, r2 = best[(name, 1)], best[(name, 2)]
        print(f"| {'HF tokenizers encode_batch' if name == 'hf' else 'adgt-data encode (whole process)'} | "
              f"{r1 / 1e6:.2f} | {r2 / 1e6:.2f} | {r2 / r1:.2f}x |")
    print(f"adgt / HF, one thread: {best[('adgt', 1)] / best[('hf', 1)]:.2f}x; two threads: "
          f"{best[('adgt', 2)] / best[('hf', 2)]:.2f}x")


if __name__ == "__main__":
    main()

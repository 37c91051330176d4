#!/usr/bin/env python3
"""Tokenizer throughput, adgt against HuggingFace tokenizers on the same text
and machine in the same run (docs/data-format.md, "Tokenizers"): bytes per
second of `adgt-data encode --jsonl` (the whole process: reading the JSON
lines, encoding, printing the ids) with 1 and 2 OpenMP threads, and of
tokenizers' encode_batch (add_special_tokens=False) with 1 and 2 rayon
threads, each the best of --reps runs, alternated. The texts come from
tests/data/hf_tokenizer_parity.py (--work of that script holds
texts.jsonl and the tokenizer files after a run with --mb 10).

usage: bench_tokenizer.py --data ADGT_DATA --tokenizer TOKENIZER_JSON --texts TEXTS_JSONL [--reps 3]
"""
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--texts", required=True)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
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

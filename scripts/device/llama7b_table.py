#!/usr/bin/env python3
"""The LLaMA-7B stage's table (scripts/device/check.sh stage 6): tokens/s and
MFU (mean over the steps after the first, from metrics.jsonl), the peak of the
backend's device buffers (the run's summary line) against the --dry-run
estimate's total.

usage: llama7b_table.py METRICS.jsonl RUN.log DRYRUN.txt [DTYPE (bf16)]
"""
import json
import re
import sys

recs = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
log, dry = open(sys.argv[2]).read(), open(sys.argv[3]).read()
peak = re.search(r"device memory:\s+([\d.]+) GiB", log)
est = re.search(r"total\s+([\d.]+) GiB", dry)
last = recs[1:] or recs
tps = sum(r["tokens_per_s"] for r in last) / len(last)
mfu = sum(r["mfu"] for r in last) / len(last)
print("| LLaMA-7B, one GPU | tokens/s | MFU | peak device GiB (backend buffers) | --dry-run estimate GiB |")
print("|---|---|---|---|---|")
dtype = sys.argv[4] if len(sys.argv) > 4 else "bf16"
print(f"| seq 4096, micro-batch 1, selective recompute, {dtype} | {tps:.0f} | {100 * mfu:.1f}% | "
      f"{peak.group(1) if peak else '?'} | {est.group(1) if est else '?'} |")

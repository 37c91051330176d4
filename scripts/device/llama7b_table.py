#!/usr/bin/env python3
"""The LLaMA-7B stage's table (scripts/device/check.sh stage 6): tokens/s and
MFU (mean over the steps after the first, from metrics.jsonl), the peak of the
backend's device buffers (the run's summary line) against the --dry-run
estimate's total; and the energy per token of those steps (NVML's mean power
over them / their tokens per second) against the dry run's power model
(issue 48: within 15%), where both were measured.

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

# Energy per token of the steps after the first: W / (tokens/s), from the
# intervals whose telemetry holds power readings (a 1 s sampler and shorter
# steps leave some without).
powered = [r for r in last if r.get("telemetry", {}).get("power_w", {}).get("samples", 0) > 0]
pred = re.search(r"energy:\s+([\d.eE+-]+) J/token, (\d+) W mean", dry)
if powered:
    watts = sum(r["telemetry"]["power_w"]["mean"] for r in powered) / len(powered)
    jpt = sum(r["telemetry"]["power_w"]["mean"] / r["tokens_per_s"] for r in powered) / len(powered)
    line = f"energy per token ({dtype}, steps after the first, NVML): {jpt:.4g} J/token at {watts:.0f} W"
    if pred:
        p, pw = float(pred.group(1)), float(pred.group(2))
        line += f"; the power model predicts {p:.4g} J/token at {pw:.0f} W: {100 * (p / jpt - 1):+.1f}% (issue 48: within 15%)"
    print(line)
else:
    print(f"energy per token ({dtype}): no power readings in the steps after the first"
          + (f" (the power model predicts {pred.group(1)} J/token)" if pred else ""))

#!/usr/bin/env bash
# Per-rank memory of the LLaMA configs at their natural layouts, with and
# without activation recompute, from `adgt-train --dry-run` (bf16 on CUDA,
# micro-batch 1, seq 4096): the table in docs/memory.md.
#   scripts/memory_table.sh [build/apps/adgt-train]
set -euo pipefail
bin=${1:-build/apps/adgt-train}
cd "$(dirname "$0")/.."
# name | config | GPUs | --set overrides
layouts=(
  "7B|configs/llama-7b.yaml|1|parallel.dp=1"
  "7B|configs/llama-7b.yaml|8|parallel.dp=8 parallel.zero=1"
  "13B|configs/llama-13b.yaml|8|parallel.tp=2 parallel.dp=4 parallel.zero=1 parallel.sequence_parallel=true"
  "34B|configs/llama-34b.yaml|64|parallel.tp=8 parallel.pp=2 parallel.dp=4 parallel.zero=1 parallel.sequence_parallel=true"
  "70B|configs/llama-70b.yaml|256|parallel.tp=8 parallel.pp=8 parallel.dp=4 parallel.zero=1 parallel.sequence_parallel=true"
)
gib() { grep -E "^    $1 " | awk '{print $2}'; }
printf '| model | GPUs | layout | weights+grads+AdamW GiB | activations GiB: none / selective / full | total GiB: none / selective / full |\n'
printf '|---|---|---|---|---|---|\n'
for l in "${layouts[@]}"; do
  IFS='|' read -r name cfg gpus sets <<<"$l"
  args=(--config "$cfg" --dry-run --set train.device=cuda --set train.dtype=bf16
        --set train.micro_batch=1 --set model.seq_len=4096)
  for s in $sets; do args+=(--set "$s"); done
  # global_batch: a multiple of dp (micro_batch 1)
  dp=$(sed -n 's/.*parallel.dp=\([0-9]*\).*/\1/p' <<<"$sets")
  args+=(--set train.global_batch=$((dp * 8)))
  act=() tot=()
  for rc in none selective full; do
    out=$("$bin" "${args[@]}" --set train.recompute=$rc)
    act+=("$(gib activations <<<"$out")")
    tot+=("$(gib total <<<"$out")")
    if [[ $rc == none ]]; then
      p=$(gib parameters <<<"$out"); g=$(gib gradients <<<"$out"); o=$(gib optimizer <<<"$out")
      static=$(awk -v a="$p" -v b="$g" -v c="$o" 'BEGIN{printf "%.2f", a+b+c}')
    fi
  done
  printf '| %s | %s | %s | %s | %s / %s / %s | %s / %s / %s |\n' "$name" "$gpus" "$sets" "$static" \
    "${act[@]}" "${tot[@]}"
done

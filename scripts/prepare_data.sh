#!/usr/bin/env bash
# Prepares the default corpus: the King James Bible (Debian's bible-kjv), as
# plain text, tokenized with a 4096-piece SentencePiece BPE model into token
# shards. Usage: scripts/prepare_data.sh [OUT_DIR=data/kjv] [ADGT_DATA=build/apps/adgt-data]
# ADGT_TOKENIZER=byte gives byte-level shards (vocabulary 256) instead.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-data/kjv}"
ADGT_DATA="${2:-build/apps/adgt-data}"
TOKENIZER="${ADGT_TOKENIZER:-bpe}"
if [ -f "$OUT/train.bin" ] && [ -f "$OUT/val.bin" ] && { [ "$TOKENIZER" = byte ] || [ -f "$OUT/tokenizer.model" ]; }; then
  echo "prepare_data: $OUT already prepared"
  exit 0
fi
command -v bible >/dev/null || { echo "prepare_data: 'bible' not found; run scripts/install_deps.sh" >&2; exit 1; }
mkdir -p "$OUT"
# Whole text, Genesis 1:1 to Revelation 22:21; strip verse numbers and chapter headings' indentation.
bible gen1:1-rev22:21 | sed -E 's/^ +[0-9]+ //; s/^ +//' > "$OUT/kjv.txt"
echo "prepare_data: $(wc -c < "$OUT/kjv.txt") bytes of text in $OUT/kjv.txt"
if [ "$TOKENIZER" = byte ]; then
  "$ADGT_DATA" prepare --input "$OUT/kjv.txt" --out "$OUT" --tokenizer byte
else
  "$ADGT_DATA" prepare --input "$OUT/kjv.txt" --out "$OUT" --vocab-size 4096
fi

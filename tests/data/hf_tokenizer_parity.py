#!/usr/bin/env python3
"""adgt's tokenizer.json reader against HuggingFace `tokenizers` (the oracle,
unpacked into .deps/python by scripts/install_deps.sh; docs/data-format.md,
"Tokenizers"). Two byte-level BPE tokenizers are trained here by `tokenizers`
itself -- GPT-2 style (the ByteLevel pre-tokenizer with its regex) and Llama
3 style (a Split on Llama 3's regex, then ByteLevel without one, with
ignore_merges) -- on a mixed text: English, CJK, emoji, combining marks,
right-to-left scripts, numbers, runs of spaces, tabs and newlines,
contractions in both cases, special tokens inside the text -- and the Llama 3
style again with 300 whole words added to its vocabulary without merges, so
that ignore_merges decides their ids. Every text's ids
from `adgt-data encode --jsonl` must equal tokenizers' encode(text,
add_special_tokens=False).ids, and decode(encode(text)) == text in adgt.

usage: hf_tokenizer_parity.py --data ADGT_DATA --text CORPUS_TXT --work DIR [--mb 0.3]
"""
import argparse
import json
import os
import random
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, ".deps", "python"))
try:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError as e:
    sys.exit(f"FAILED: HuggingFace tokenizers not found in .deps/python ({e}); run scripts/install_deps.sh")

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
EXTRA = ["日本語のテキストです。東京は晴れ。", "中文文本，包含标点符号！", "한국어 문장입니다.",
         "emoji 😀👍🏽👨‍👩‍👧 and flags 🇫🇷", "combining e\u0301 a\u0308 n\u0303 \u0915\u094D\u0937",
         "עברית מימין לשמאל", "العربية من اليمين", "Ελληνικά κείμενα", "кириллица Текст",
         "numbers 1 22 333 4444 55555 3.14159 1,000,000 ٣٤٥ ೧೨", "  leading and trailing  ",
         "tabs\tand\t\ttabs", "windows\r\nlines\r\n\r\n", "many     spaces      here",
         "IT'S I'LL WE'VE THEY'RE he's she'd", "\n\n\nnewlines\n\n", "mixed\u00a0nbsp\u2003em space",
         "zero\u200bwidth joiner\u200d", "math ∑∫√∞ ≤ ≥", "<|endoftext|> inside <|endoftext|>text",
         "<|begin_of_text|>Hello<|eot_id|> world<|end_of_text|>", "café naïve résumé", "$100 @user #tag 100%",
         "snake_case camelCase kebab-case", "'quoted' \"double\" `back`", "a", " ", ""]


def corpus(text_path, mb, seed):
    random.seed(seed)
    base = open(text_path, encoding="utf-8").read()
    lines = base.split("\n")
    out, size = [], 0
    while size < mb * 1e6:
        r = random.random()
        if r < 0.35:
            i = random.randrange(len(lines))
            t = "\n".join(lines[i:i + random.randint(1, 12)])
        elif r < 0.7:
            t = " ".join(random.choice(EXTRA) for _ in range(random.randint(1, 6)))
        else:  # a mix of both, with odd whitespace between
            t = random.choice(lines) + random.choice([" ", "  ", "\t", "\n", "\r\n", "\n\n  "]) + random.choice(EXTRA)
        out.append(t)
        size += len(t.encode())
    return out + EXTRA


def train(kind, texts, path):
    if kind == "gpt2":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        specials = ["<|endoftext|>"]
    else:
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=specials, show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.save(path)
    return tok


def with_whole_words(path, texts, out_path):
    """The Llama-3-style tokenizer.json with 300 frequent words of `texts`
    that its merges do not reach added to the vocabulary (new ids, no merges)
    and ignore_merges on, as Llama 3's: a pre-token found whole in the
    vocabulary is one id, whatever the merges would make of it. Returns the
    oracle and whether ignore_merges changes its ids on `texts` (it must, or
    the case would not test it)."""
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    base = Tokenizer.from_file(path)
    counts = {}
    for t in texts:
        for w, _ in base.pre_tokenizer.pre_tokenize_str(t):
            if len(w) >= 4 and w not in j["model"]["vocab"]:
                counts[w] = counts.get(w, 0) + 1
    next_id = max(list(j["model"]["vocab"].values()) + [a["id"] for a in j["added_tokens"]]) + 1
    for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:300]:
        j["model"]["vocab"][w] = next_id
        next_id += 1
    j["model"]["ignore_merges"] = True
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    j["model"]["ignore_merges"] = False
    off = Tokenizer.from_str(json.dumps(j))
    tok = Tokenizer.from_file(out_path)
    on_ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    off_ids = [e.ids for e in off.encode_batch(texts, add_special_tokens=False)]
    return tok, on_ids != off_ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--mb", type=float, default=0.3, help="megabytes of text compared per tokenizer")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    train_texts = corpus(a.text, 0.3, 1)
    texts = corpus(a.text, a.mb, 2)
    jl = os.path.join(a.work, "texts.jsonl")
    with open(jl, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps(t) + "\n")
    failed = []
    for kind in ("gpt2", "llama3", "llama3_words"):
        path = os.path.join(a.work, f"{kind}.tokenizer.json")
        if kind == "llama3_words":
            tok, matters = with_whole_words(os.path.join(a.work, "llama3.tokenizer.json"), texts, path)
            if not matters:
                failed.append("llama3_words: ignore_merges changes no id of the texts; the case tests nothing")
        else:
            tok = train(kind, train_texts, path)
        want = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
        r = subprocess.run([a.data, "encode", "--tokenizer", path, "--jsonl", jl, "--check-roundtrip"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            failed.append(f"{kind}: adgt-data encode exited {r.returncode}: {r.stderr.strip()}")
            continue
        got = [[int(x) for x in l.split()] for l in r.stdout.split("\n")[:len(texts)]]
        bad = [i for i in range(len(texts)) if got[i] != want[i]]
        n_ids = sum(len(w) for w in want)
        print(f"{kind}: {len(texts)} texts, {sum(len(t.encode()) for t in texts)} bytes, {n_ids} ids, "
              f"vocab {tok.get_vocab_size()}: {len(bad)} texts differ; decode(encode(x)) == x for all")
        for i in bad[:3]:
            failed.append(f"{kind}: text {i + 1} {texts[i]!r}:\n  tokenizers {want[i]}\n  adgt       {got[i]}")
    if failed:
        sys.exit("FAILED:\n" + "\n".join(failed))
    print("ok: 0 differing ids")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""adgt-data prepare streams a corpus of several files (docs/data-format.md,
"Streaming and --resume"), and what it writes does not depend on how:

  - every output file of one case equals, byte for byte, the golden
    fixture (prepare_stream_golden.json: SHA-256 of each file, made by
    adgt-data before it streamed, which read the whole corpus and encoded
    it at once);
  - --workers 1, --workers 2 with batches of 3 documents, and a run stopped
    after 2 of the 5 input files (ADGT_DATA_TEST_STOP_AFTER_FILES) then
    --resume'd, give the same bytes in every file, journal included;
  - an unfinished directory is refused without --resume (naming --resume and
    --force), --resume with another option is refused naming it, and
    --force starts it over (the same bytes again).

Cases: byte (no end token: "\\n\\n" between documents), tokenizer.json with
end and beginning tokens (--bos), a SentencePiece model trained here (two
passes over the stream), and a corpus of fewer documents than k (the last
document goes to validation).

usage: prepare_stream.py --data ADGT_DATA --work DIR [--case NAME ...] [--write-golden]
"""
import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from byte_level_tokenizer import byte_level_tokenizer  # noqa: E402

GOLDEN = os.path.join(HERE, "prepare_stream_golden.json")
WORDS = ("the and of to in that shall unto he lord his they be is him not them it with all thou thy was "
         "which my for me but ye i are said upon this have caf\u00e9 \u65e5\u672c \U0001F600").split()


def lcg_words(state, n):
    out = []
    for _ in range(n):
        state = (state * 1103515245 + 12345) % 2147483648
        out.append(WORDS[(state // 65536) % len(WORDS)])
    return state, out


def documents(n, seed):
    """n documents of 1-4 lines (some with a blank line or a '\\r' inside)."""
    docs, state = [], seed
    for d in range(n):
        lines = []
        for i in range(1 + d % 4):
            state, w = lcg_words(state, 3 + (state >> 7) % 12)
            lines.append(" ".join(w) + ("\r" if (d + i) % 9 == 0 else ""))
            if d % 7 == 3 and i == 0:
                lines.append("")
        docs.append("\n".join(lines))
    return docs


def write_corpus(root, n, seed):
    """Five files in three formats, with bad records and an empty text."""
    docs = documents(n, seed)
    q = len(docs) // 4
    os.makedirs(os.path.join(root, "c"))

    def jsonl(path, part, bad=False):
        lines = [json.dumps({"id": i, "text": t}) for i, t in enumerate(part)]
        if bad:
            lines.insert(1, "not json")
            lines.insert(3, json.dumps({"text": 7}))
            lines.insert(4, json.dumps({"text": ""}))
        return ("\n".join(lines) + "\n").encode()

    open(os.path.join(root, "a.jsonl"), "wb").write(jsonl("a", docs[:q], bad=True))
    with open(os.path.join(root, "b.jsonl.gz"), "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
            f.write(jsonl("b", docs[q:2 * q]))
    open(os.path.join(root, "c", "d.jsonl"), "wb").write(jsonl("d", docs[2 * q:3 * q]))
    open(os.path.join(root, "c", "e.txt"), "w", encoding="utf-8").write(docs[3 * q])  # one document
    open(os.path.join(root, "f.jsonl"), "wb").write(jsonl("f", docs[3 * q + 1:]) + b'{"text": "x\xc3\x28"}\n')


def cases(work):
    tj = os.path.join(work, "tok", "tokenizer.json")
    os.makedirs(os.path.dirname(tj), exist_ok=True)
    json.dump(byte_level_tokenizer([(256, "<|endoftext|>"), (257, "<|begin_of_text|>")]), open(tj, "w"))
    return {
        "byte": (200, ["--tokenizer", "byte", "--val-fraction", "0.1"]),
        "json_bos": (200, ["--tokenizer", "tok/tokenizer.json", "--bos", "--val-fraction", "0.1"]),
        "bpe": (200, ["--vocab-size", "320", "--val-fraction", "0.1"]),
        "last_to_val": (30, ["--tokenizer", "byte", "--val-fraction", "0.02"]),  # k = 50 > 30 documents
    }


QUIET = ["--progress", "off"]  # (left out for the adgt-data from before streaming, which had no progress)


def run(exe, args, cwd, env=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([exe, "prepare", "--input", "corpus", "--out", "out"] + QUIET + args,
                          cwd=cwd, env=e, capture_output=True, text=True)


def files_of(d):
    return {os.path.relpath(os.path.join(r, f), d): open(os.path.join(r, f), "rb").read()
            for r, _, fs in os.walk(d) for f in fs}


def one_case(exe, work, name, n, args, golden, write_golden):
    """Returns the failures of one case."""
    cw = os.path.join(work, name)
    shutil.rmtree(cw, ignore_errors=True)
    os.makedirs(cw)
    write_corpus(os.path.join(cw, "corpus"), n, seed=len(name))
    if not os.path.exists(os.path.join(cw, "tok")):
        shutil.copytree(os.path.join(work, "tok"), os.path.join(cw, "tok"))
    fails, results = [], {}

    def finished(label, res):
        if res.returncode:
            fails.append(f"{name}/{label}: exit {res.returncode}: {res.stderr}")
            return
        results[label] = files_of(os.path.join(cw, "out"))
        shutil.move(os.path.join(cw, "out"), os.path.join(cw, label))

    finished("workers1", run(exe, args + ["--workers", "1"], cw))
    if write_golden:
        golden[name] = {f: hashlib.sha256(b).hexdigest() for f, b in results.get("workers1", {}).items()}
        return fails
    finished("workers2", run(exe, args + ["--workers", "2"], cw, {"ADGT_DATA_TEST_BATCH_DOCS": "3"}))
    stop = run(exe, args + ["--workers", "2"], cw, {"ADGT_DATA_TEST_STOP_AFTER_FILES": "2"})
    if stop.returncode == 0 or "stopped after 2 input file(s)" not in stop.stderr:
        fails.append(f"{name}: the stop hook: exit {stop.returncode}, {stop.stderr!r}")
    again = run(exe, args, cw)
    if again.returncode == 0 or "--resume" not in again.stderr or "--force" not in again.stderr:
        fails.append(f"{name}: an unfinished --out without --resume: exit {again.returncode}, {again.stderr!r}")
    changed = list(args)
    changed[changed.index("--val-fraction") + 1] = "0.25"
    other = run(exe, changed + ["--resume"], cw)
    if other.returncode == 0 or "option val_fraction" not in other.stderr:
        fails.append(f"{name}: --resume with another --val-fraction: exit {other.returncode}, {other.stderr!r}")
    resumed = run(exe, args + ["--resume", "--workers", "2"], cw)
    if "resuming after 2 of 5 input file(s)" not in resumed.stdout:
        fails.append(f"{name}: --resume did not say where it goes on: {resumed.stdout!r}")
    finished("resumed", resumed)
    run(exe, args, cw, {"ADGT_DATA_TEST_STOP_AFTER_FILES": "3"})
    finished("forced", run(exe, args + ["--force"], cw))  # an unfinished --out started over
    ref = results.get("workers1", {})
    for label in ("workers2", "resumed", "forced"):
        got = results.get(label)
        if got is None:
            continue
        if sorted(got) != sorted(ref):
            fails.append(f"{name}/{label}: files {sorted(got)}, workers1 wrote {sorted(ref)}")
        fails += [f"{name}/{label}: {f} differs from workers1's" for f in ref if f in got and got[f] != ref[f]]
    want = golden.get(name)
    have = {f: hashlib.sha256(b).hexdigest() for f, b in ref.items() if f != "prepare.journal.jsonl"}
    if want is None:
        fails.append(f"{name}: no golden fixture in {GOLDEN}")
    elif ref and have != want:
        diff = sorted(set(want) ^ set(have)) or [f for f in want if want[f] != have.get(f)]
        fails.append(f"{name}: differs from the golden fixture (the whole-corpus encoding): {diff}")
    return fails


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--case", action="append")
    ap.add_argument("--write-golden", action="store_true",
                    help="record --data's output as the fixture (run with adgt-data from before streaming)")
    a = ap.parse_args()
    exe = os.path.abspath(a.data)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    golden = {} if a.write_golden else json.load(open(GOLDEN))
    if a.write_golden:
        QUIET.clear()
    all_cases = cases(a.work)
    fails = []
    for name in a.case or sorted(all_cases):
        n, args = all_cases[name]
        fails += one_case(exe, a.work, name, n, args, golden, a.write_golden)
    if a.write_golden:
        json.dump(golden, open(GOLDEN, "w"), indent=1, sort_keys=True)
        open(GOLDEN, "a").write("\n")
        print(f"wrote {GOLDEN}")
    if fails:
        sys.exit("FAILED:\n" + "\n".join(fails))
    print(f"ok: {', '.join(a.case or sorted(all_cases))}: workers 1, workers 2 in batches of 3 and a resumed "
          f"run write the same bytes, equal to the whole-corpus fixture")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""adgt-data prepare on Parquet files (docs/data-format.md, "Inputs") against
the same documents as JSON lines. pyarrow (the wheel scripts/install_deps.sh
unpacks into .deps/pyarrow) writes the fixtures here:

  corpus/a.parquet      the first half of the paragraphs: a string column
                        `text` in row groups of 7 rows, with a null, an
                        empty string, an int64 column `id` and a struct
                        column `meta` {body: string, n: int32}
  corpus/sub/b.parquet  the second half: large_string, zstd, row groups of 5
  meta_b.parquet        the second half again, as the struct column meta {body}
  dict.parquet          the first half again, `text` dictionary-encoded in
                        Arrow (dictionary<values=string>: pandas' categoricals,
                        read back as a dictionary array), a null among them
  damaged.parquet       9 rows in 3 row groups with page checksums, a page
                        of row group 1 overwritten
  junk.parquet          not Parquet at all

and the same documents as JSON lines beside them (a null text is a bad
record there too). Checks: the byte-tokenizer shards of the Parquet corpus
equal those of the JSON lines, byte for byte (also with --text-field
meta.body); every null row is a bad record named FILE:ROW with its row group;
a damaged row group is one bad record (the other row groups read, the
shards those of the JSON lines without it) and with --on-bad-record fail the
error; a file that is not Parquet is one bad record. The error tests in
tests/data.cmake use the files written here.

usage: parquet_inputs.py --data ADGT_DATA --text INPUT_TXT --work DIR [--pyarrow DIR]
"""
import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def import_pyarrow(where):
    sys.path.insert(0, where)
    # The wheel refuses a NumPy older than 2 (Debian 12 has 1.24) when NumPy
    # is importable; writing Parquet needs none, so it is kept from loading.
    sys.modules["numpy"] = None
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as e:
        sys.exit(f"FAILED: pyarrow not importable from {where} ({e}); run scripts/install_deps.sh")
    return pyarrow, pyarrow.parquet


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def write_jsonl(path, docs, key=("text",)):
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            rec = d
            for k in reversed(key):
                rec = {k: rec}
            f.write(json.dumps(rec) + "\n")


def write_fixtures(pa, pq, paras, work):
    """The Parquet corpus, its JSON-lines twin, the damaged and junk files."""
    corpus, twin = os.path.join(work, "corpus"), os.path.join(work, "twin")
    for d in (corpus, twin):
        os.makedirs(os.path.join(d, "sub"))
    half = len(paras) // 2
    first = paras[:half]
    first.insert(3, None)   # row 4 (row group 0): a null, a bad record
    first.insert(10, "")    # row 11: an empty text, skipped as in JSON lines
    first.insert(16, None)  # row 17 (row group 2)
    second = paras[half:]
    pq.write_table(pa.table({
        "id": pa.array(range(len(first)), pa.int64()),
        "text": pa.array(first, pa.string()),
        "meta": pa.array([{"body": d, "n": i} for i, d in enumerate(first)],
                         pa.struct([("body", pa.string()), ("n", pa.int32())])),
    }), os.path.join(corpus, "a.parquet"), row_group_size=7)
    pq.write_table(pa.table({"text": pa.array(second, pa.large_string())}),
                   os.path.join(corpus, "sub", "b.parquet"), row_group_size=5, compression="zstd")
    write_jsonl(os.path.join(twin, "a.jsonl"), first)
    write_jsonl(os.path.join(twin, "sub", "b.jsonl"), second)
    os.makedirs(os.path.join(twin + "_meta", "sub"))
    write_jsonl(os.path.join(twin + "_meta", "a.jsonl"), first, ("meta", "body"))
    write_jsonl(os.path.join(twin + "_meta", "sub", "b.jsonl"), second, ("meta", "body"))
    pq.write_table(pa.table({"meta": pa.array([{"body": d} for d in second])}),
                   os.path.join(work, "meta_b.parquet"), row_group_size=5)

    pq.write_table(pa.table({"text": pa.array(first, pa.string()).dictionary_encode()}),
                   os.path.join(work, "dict.parquet"), row_group_size=7)

    # damaged.parquet: plain pages with checksums; bytes inside row group 1's page overwritten.
    nine = paras[:9]
    damaged = os.path.join(work, "damaged.parquet")
    pq.write_table(pa.table({"text": nine}), damaged, row_group_size=3, write_page_checksum=True,
                   compression="NONE", use_dictionary=False)
    col = pq.ParquetFile(damaged).metadata.row_group(1).column(0)
    raw = bytearray(open(damaged, "rb").read())
    end = col.data_page_offset + col.total_compressed_size
    raw[end - 12:end - 4] = b"########"
    open(damaged, "wb").write(raw)
    write_jsonl(os.path.join(work, "damaged_twin.jsonl"), nine[:3] + nine[6:])
    with open(os.path.join(work, "junk.parquet"), "w") as f:
        f.write("PAR1 but not Parquet\n")
    return corpus, twin


def prepare(data, inputs, out, *extra):
    return run([data, "prepare", "--input", *inputs, "--out", out, "--tokenizer", "byte", "--val-fraction", "0.1",
                *extra])


def same_shards(a, b):
    return all(filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False) for n in ("train.bin", "val.bin"))


def check_pair(failures, what, data, parquet_inputs, jsonl_inputs, out, *extra):
    """prepare on the Parquet inputs and on their JSON-lines twins: the same shards, byte for byte."""
    p = prepare(data, parquet_inputs, out + "_parquet", *extra)
    j = prepare(data, jsonl_inputs, out + "_jsonl", *extra)
    if p.returncode or j.returncode:
        failures.append(f"{what}: prepare exited {p.returncode} (Parquet) / {j.returncode} (JSON lines):\n"
                        f"{p.stderr}{j.stderr}")
    elif not same_shards(out + "_parquet", out + "_jsonl"):
        failures.append(f"{what}: the Parquet shards differ from the JSON lines' (cmp train.bin, val.bin)")


def bad_lines(out):
    path = os.path.join(out, "bad_records.txt")
    return open(path).read().splitlines() if os.path.exists(path) else []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--text", required=True, help="a UTF-8 text whose paragraphs become the documents")
    ap.add_argument("--work", required=True)
    ap.add_argument("--pyarrow", default=os.path.join(ROOT, ".deps", "pyarrow"),
                    help="the folder holding the pyarrow package")
    a = ap.parse_args()
    pa, pq = import_pyarrow(a.pyarrow)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    paras = [p.strip("\n") for p in open(a.text, encoding="utf-8").read().split("\n\n") if p.strip()]
    paras[5] += " caf\u00e9 \u65e5\u672c \U0001F600 \"quoted\" back\\slash"
    corpus, twin = write_fixtures(pa, pq, paras, a.work)
    failures = []
    w = lambda *p: os.path.join(a.work, *p)  # noqa: E731

    check_pair(failures, "corpus", a.data, [corpus], [twin], w("out"))
    want_bad = [("a.parquet:4: ", "row group 0: 'text' is null"), ("a.parquet:17: ", "row group 2: 'text' is null")]
    bad = bad_lines(w("out_parquet"))
    if len(bad) != 2 or any(x[0] not in b or x[1] not in b for x, b in zip(want_bad, bad)):
        failures.append("corpus: bad_records.txt:\n" + "\n".join(bad))
    meta = json.load(open(w("out_parquet", "meta.json")))["source"]
    if meta.get("bad_records") != 2 or meta.get("documents") != len(paras):
        failures.append(f"corpus: meta.json source {meta}; want {len(paras)} documents, 2 bad records")
    check_pair(failures, "--text-field meta.body", a.data, [os.path.join(corpus, "a.parquet"), w("meta_b.parquet")],
               [os.path.join(twin + "_meta", "a.jsonl"), os.path.join(twin + "_meta", "sub", "b.jsonl")],
               w("meta"), "--text-field", "meta.body")
    check_pair(failures, "dictionary column", a.data, [w("dict.parquet")], [os.path.join(twin, "a.jsonl")],
               w("dict"))
    if pq.read_schema(w("dict.parquet")).field("text").type != pa.dictionary(pa.int32(), pa.string()):
        failures.append(f"dict.parquet: written as {pq.read_schema(w('dict.parquet')).field('text').type}")
    bad = bad_lines(w("dict_parquet"))
    if len(bad) != 2 or "dict.parquet:4: row group 0: 'text' is null" not in bad[0]:
        failures.append("dictionary column: bad_records.txt:\n" + "\n".join(bad))
    check_pair(failures, "damaged row group", a.data, [w("damaged.parquet")], [w("damaged_twin.jsonl")], w("damaged"))
    bad = bad_lines(w("damaged_parquet"))
    if len(bad) != 1 or not bad[0].startswith(w("damaged.parquet") + ":4: row group 1 (rows 4-6): ") or \
            "checksum" not in bad[0] or "the rest of the row group is lost" not in bad[0]:
        failures.append("damaged row group: bad_records.txt:\n" + "\n".join(bad))
    strict = prepare(a.data, [w("damaged.parquet")], w("strict"), "--on-bad-record", "fail")
    if strict.returncode == 0 or "damaged.parquet:4: row group 1 (rows 4-6)" not in strict.stderr:
        failures.append(f"--on-bad-record fail: exit {strict.returncode}, stderr {strict.stderr!r}")
    junk = prepare(a.data, [w("junk.parquet"), w("damaged_twin.jsonl")], w("junk"))
    bad = bad_lines(w("junk"))
    if junk.returncode or len(bad) != 1 or "junk.parquet:1: not a readable Parquet file" not in bad[0]:
        failures.append(f"junk.parquet: exit {junk.returncode}, bad_records {bad}, stderr {junk.stderr!r}")
    if failures:
        sys.exit("FAILED:\n" + "\n".join(failures))
    groups = [pq.ParquetFile(os.path.join(corpus, *f)).num_row_groups for f in (["a.parquet"], ["sub", "b.parquet"])]
    print(f"ok: {len(paras)} documents from Parquet (string, large_string and a dictionary of strings, zstd, "
          f"{groups[0]}+{groups[1]} row groups, a struct field) give the JSON lines' shards byte for byte; nulls, a damaged row group and a "
          f"file that is not Parquet named as bad records")


if __name__ == "__main__":
    main()

"""Damaged inputs for adgt-data and adgt-train: the fuzz set of
docs/data-format.md ("Damaged inputs").

    python3 scripts/data/fuzz_inputs.py --out DIR --count 500 --seed 1

writes DIR/cNNNN/ (one folder a case: the damaged file(s)), DIR/anchor.txt
(a good document some cases read beside the damaged one) and
DIR/cases.jsonl, one case a line:

  id       "c0042"
  class    the kind of damage: gz, zst, utf8_txt, utf8_jsonl, json, tokenizer_json,
           tokenizer_text, spm_model, megatron, llmc, adgt_shard, train_shard, parquet
           (made only where pyarrow is unpacked in .deps/pyarrow)
  what     the damage in words
  argv     the command; {data} {train} {model} {root} {work} are the
           runner's (scripts/data/fuzz_run.py)
  expect   error       exit != 0, the message naming `needle`
           skip        exit 0, WORK/out/bad_records.txt naming `needle`
                       bad_min..bad_max times (bad_max null: no bound)
           ok-or-skip  valid but unusual (a huge number, duplicate keys):
                       exit 0, bad records within bad_min..bad_max
           error-or-ok a change the reader may not see (a SentencePiece
                       model cut at a field boundary): exit 0, or an error
                       naming `needle`
  needle   "cNNNN/FILE": the damaged file as every message names it

Deterministic: the same --seed and --count give the same bytes (stdlib
random, one generator per case seeded by "seed:index:class"). The classes
take turns in the order of CLASSES (some listed twice: more ways to go
wrong), so 40 cases cover them all.
"""
import argparse
import json
import os
import random
import shutil
import sys

from fuzz.common import Case, good_paragraphs
from fuzz.streams import gz_case, zst_case
from fuzz.text import json_case, utf8_jsonl_case, utf8_txt_case
from fuzz.parquet import parquet_case
from fuzz.token_files import adgt_shard_case, llmc_case, megatron_case, train_shard_case
from fuzz.tokenizers import spm_model_case, tokenizer_json_case, tokenizer_text_case


CLASSES = [
    ('gz', gz_case), ('zst', zst_case), ('utf8_txt', utf8_txt_case), ('utf8_jsonl', utf8_jsonl_case),
    ('json', json_case), ('json', json_case), ('tokenizer_json', tokenizer_json_case),
    ('tokenizer_json', tokenizer_json_case), ('tokenizer_text', tokenizer_text_case), ('spm_model', spm_model_case), ('megatron', megatron_case),
    ('megatron', megatron_case), ('llmc', llmc_case), ('adgt_shard', adgt_shard_case),
    ('adgt_shard', adgt_shard_case), ('train_shard', train_shard_case),
    ('parquet', parquet_case),
]


def generate(out, count, seed, only=None, skip=()):
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    anchor = random.Random(f'{seed}:anchor')
    with open(os.path.join(out, 'anchor.txt'), 'w') as f:
        f.write('\n\n'.join(good_paragraphs(anchor, 20)) + '\n')
    classes = [(n, fn) for n, fn in CLASSES if (not only or n in only) and n not in skip]
    cases, turn = [], 0
    while len(cases) < count:
        name, fn = classes[turn % len(classes)]
        turn += 1
        cid = 'c%04d' % len(cases)
        rng = random.Random(f'{seed}:{len(cases)}:{name}')
        c = Case(out, cid, name)
        rec = fn(c, rng)
        if rec is None:  # a class with nothing to make here (parquet without pyarrow)
            os.rmdir(c.dir)
            continue
        cases.append(rec)
        if turn > 100 * (count + 1):
            sys.exit('fuzz_inputs.py: no class makes cases (--only %s?)' % only)
    with open(os.path.join(out, 'cases.jsonl'), 'w') as f:
        for r in cases:
            f.write(json.dumps(r) + '\n')
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--out', required=True, help='folder for the cases (emptied first)')
    ap.add_argument('--count', type=int, default=500)
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--only', help='comma-separated classes')
    ap.add_argument('--skip', default='', help='comma-separated classes to leave out')
    args = ap.parse_args()
    cases = generate(args.out, args.count, args.seed, set(args.only.split(',')) if args.only else None,
                     set(filter(None, args.skip.split(','))))
    per = {}
    for r in cases:
        per[r['class']] = per.get(r['class'], 0) + 1
    print(f'{len(cases)} cases in {args.out}: ' + ', '.join(f'{k} {v}' for k, v in sorted(per.items())))


if __name__ == '__main__':
    main()

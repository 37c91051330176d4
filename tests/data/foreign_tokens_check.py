"""Megatron-LM and llm.c token files, read in place (docs/data-format.md).

Writes the token ids of an adgt shard as a Megatron indexed dataset
(PREFIX.bin + PREFIX.idx, laid out as megatron/core/datasets/indexed_dataset.py
writes them) and as llm.c shards (dev/data/data_common.py: 256 int32 header,
then the tokens), with numpy and struct only, then checks one of:

  read    adgt-data info lists all three token for token equal
  train   adgt-train on the Megatron and on the llm.c files logs the same
          losses (==) as on the adgt shard
  errors  bad magic, wrong version, float dtype, a .bin whose length the index
          does not describe, and a token id >= model.vocab_size are errors
          naming the file
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np

MEGATRON_CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5,
                  np.float64: 6, np.float32: 7, np.uint16: 8}


def read_adgt(path):
    """The tokens of an adgt shard, by the header of docs/data-format.md."""
    raw = open(path, 'rb').read()
    assert raw[:8] == b'ADGTTOK\0', path
    version, dtype, count, vocab = struct.unpack_from('<IIQQ', raw, 8)
    assert version in (1, 2) and dtype in (1, 2), path
    return np.frombuffer(raw, dtype=np.uint16 if dtype == 1 else np.uint32, count=count,
                         offset=64).astype(np.int64)


def documents(tokens):
    """Cut the byte-level text after each blank line ("\\n\\n")."""
    nl = np.flatnonzero((tokens[:-1] == 10) & (tokens[1:] == 10)) + 2
    ends = [int(e) for e in nl if e < len(tokens)] + [len(tokens)]
    starts = [0] + ends[:-1]
    return list(zip(starts, ends))


def write_megatron(prefix, tokens, dtype, docs, code=None, version=1, seqs_per_doc=2):
    """One document = up to seqs_per_doc sequences, as Megatron's builder
    (add_item per sequence, end_document per document) records them."""
    lengths, doc_idx = [], [0]
    for s, e in docs:
        cut = s + (e - s) // 2 if seqs_per_doc == 2 and e - s >= 2 else e
        for a, b in ((s, cut), (cut, e)):
            if b > a:
                lengths.append(b - a)
        doc_idx.append(len(lengths))
    itemsize = np.dtype(dtype).itemsize
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) * itemsize
    with open(prefix + '.bin', 'wb') as f:
        f.write(np.asarray(tokens, dtype=dtype).tobytes())
    with open(prefix + '.idx', 'wb') as f:
        f.write(b'MMIDIDX\x00\x00')
        f.write(struct.pack('<Q', version))
        f.write(struct.pack('<B', MEGATRON_CODES[dtype] if code is None else code))
        f.write(struct.pack('<Q', len(lengths)))
        f.write(struct.pack('<Q', len(doc_idx)))
        f.write(np.array(lengths, dtype=np.int32).tobytes())
        f.write(pointers.tobytes())
        f.write(np.array(doc_idx, dtype=np.int64).tobytes())


def write_llmc(path, tokens, magic=20240520, version=1, dtype=np.uint16):
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = magic, version, len(tokens)
    with open(path, 'wb') as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=dtype).tobytes())


def write_all(args):
    w = args.work
    shutil.rmtree(w, ignore_errors=True)
    os.makedirs(w)
    train = read_adgt(os.path.join(args.shards, 'train.bin'))
    val = read_adgt(os.path.join(args.shards, 'val.bin'))
    # train: uint16 (what Megatron picks for small vocabularies), val: int32.
    write_megatron(os.path.join(w, 'mega_train'), train, np.uint16, documents(train))
    write_megatron(os.path.join(w, 'mega_val'), val, np.int32, documents(val))
    # train: GPT-2 layout (uint16), val: Llama 3 layout (uint32).
    write_llmc(os.path.join(w, 'llmc_train.bin'), train)
    write_llmc(os.path.join(w, 'llmc_val.bin'), val, magic=20240801, version=7, dtype=np.uint32)
    return train, val


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)


def info(exe, shard, head):
    p = run([exe, 'info', '--shard', shard, '--head', str(head)])
    if p.returncode != 0:
        sys.exit(f'FAIL: adgt-data info {shard}: {p.stderr}')
    lines = p.stdout.split('\n')
    return lines[0], np.array(lines[1].split(), dtype=np.int64) if head else None


def check_read(args, train, val):
    w = args.work
    cases = [('train', train, [os.path.join(args.shards, 'train.bin'), os.path.join(w, 'mega_train'),
                               os.path.join(w, 'mega_train.bin'), os.path.join(w, 'mega_train.idx'),
                               os.path.join(w, 'llmc_train.bin')]),
             ('val', val, [os.path.join(args.shards, 'val.bin'), os.path.join(w, 'mega_val'),
                           os.path.join(w, 'llmc_val.bin')])]
    for name, want, shards in cases:
        vocab = int(want.max()) + 1
        for s in shards:
            head, got = info(args.data_exe, s, len(want))
            if not np.array_equal(got, want):
                bad = int(np.flatnonzero(got != want)[0]) if len(got) == len(want) else -1
                sys.exit(f'FAIL: {s}: tokens differ from the adgt {name} shard (first at {bad})')
            if f'{len(want)} tokens' not in head:
                sys.exit(f'FAIL: {s}: wrong token count in "{head}"')
            if 'mega' in s and f'vocab {vocab}, ' not in head:
                sys.exit(f'FAIL: {s}: vocab should be the largest id + 1 = {vocab}: "{head}"')
            if 'mega' in s and f'{len(documents(want))} documents' not in head:
                sys.exit(f'FAIL: {s}: expected {len(documents(want))} documents: "{head}"')
            print(f'ok: {os.path.basename(s)}: {head}')


def train_losses(args, tag, tr, va):
    out = os.path.join(args.work, 'run_' + tag)
    shutil.rmtree(out, ignore_errors=True)
    cmd = [args.train_exe, '--config', args.model]
    for s in [f'data.train={tr}', f'data.val={va}', f'log.dir={out}', f'checkpoint.dir={out}/ckpt',
              'train.steps=4', 'train.eval_interval=2', 'checkpoint.interval=0']:
        cmd += ['--set', s]
    p = run(cmd, env=dict(os.environ, OMP_NUM_THREADS='1'))
    if p.returncode != 0:
        sys.exit(f'FAIL: {" ".join(cmd)} exited {p.returncode}\n{p.stdout[-3000:]}{p.stderr[-3000:]}')
    with open(os.path.join(out, 'metrics.jsonl')) as f:
        recs = [json.loads(l) for l in f if l.strip()]
    return [(r['step'], k, v) for r in recs for k, v in sorted(r.items()) if 'loss' in k]


def check_train(args):
    w = args.work
    ref = train_losses(args, 'adgt', os.path.join(args.shards, 'train.bin'),
                       os.path.join(args.shards, 'val.bin'))
    if not any(k != 'loss' for _, k, _ in ref) or len(ref) < 4:
        sys.exit(f'FAIL: expected train and validation losses, got {ref}')
    for tag, tr, va in [('megatron', os.path.join(w, 'mega_train'), os.path.join(w, 'mega_val.idx')),
                        ('llmc', os.path.join(w, 'llmc_train.bin'), os.path.join(w, 'llmc_val.bin'))]:
        got = train_losses(args, tag, tr, va)
        if got != ref:
            sys.exit(f'FAIL: {tag} losses {got} != adgt shard losses {ref}')
        print(f'ok: {tag}: {len(got)} losses equal to the adgt shard\'s, e.g. {got[-1]}')


def expect_error(cmd, *needles):
    p = run(cmd)
    if p.returncode == 0 or not all(n in p.stderr for n in needles):
        sys.exit(f'FAIL: {" ".join(cmd)}: expected an error naming {needles}, got exit '
                 f'{p.returncode}\n{p.stdout[-2000:]}{p.stderr[-2000:]}')
    print(f'ok: {needles}: {p.stderr.strip().splitlines()[-1]}')


def check_errors(args):
    w = args.work
    shutil.rmtree(w, ignore_errors=True)
    os.makedirs(w)
    toks = np.arange(100) % 50
    docs = [(0, 40), (40, 100)]
    j = lambda n: os.path.join(w, n)
    info_cmd = lambda s: [args.data_exe, 'info', '--shard', s]

    write_megatron(j('magic'), toks, np.uint16, docs)
    raw = bytearray(open(j('magic.idx'), 'rb').read())
    raw[0:1] = b'X'
    open(j('magic.idx'), 'wb').write(raw)
    expect_error(info_cmd(j('magic')), 'magic.idx', 'bad magic')
    expect_error(info_cmd(j('magic.idx')), 'magic.idx', 'bad magic')

    write_megatron(j('version'), toks, np.uint16, docs, version=2)
    expect_error(info_cmd(j('version')), 'version.idx', 'version 2')

    write_megatron(j('float'), toks.astype(np.float32), np.float32, docs)
    expect_error(info_cmd(j('float')), 'float.idx', 'float32')

    write_megatron(j('short'), toks, np.uint16, docs)
    open(j('short.bin'), 'ab').write(b'\0\0')
    expect_error(info_cmd(j('short.bin')), 'short.bin', '100 uint16 tokens', '202 bytes')

    write_llmc(j('llmc_magic.bin'), toks, magic=20240519)
    expect_error(info_cmd(j('llmc_magic.bin')), 'llmc_magic.bin', 'bad magic')
    write_llmc(j('llmc_version.bin'), toks, version=2)
    expect_error(info_cmd(j('llmc_version.bin')), 'llmc_version.bin', 'version 2')
    write_llmc(j('llmc_short.bin'), toks[:-1])
    raw = bytearray(open(j('llmc_short.bin'), 'rb').read())
    raw[8:12] = struct.pack('<i', 100)
    open(j('llmc_short.bin'), 'wb').write(raw)
    expect_error(info_cmd(j('llmc_short.bin')), 'llmc_short.bin', 'truncated')

    # An id the model's 256-entry embedding cannot hold, in each format.
    big = np.concatenate([toks, [300]]).astype(np.int64)
    big = np.concatenate([big] * 4)
    write_megatron(j('big'), big, np.uint16, [(0, len(big))])
    write_llmc(j('big_llmc.bin'), big)
    for s in (j('big'), j('big_llmc.bin')):
        expect_error([args.train_exe, '--config', args.model, '--set', f'data.train={s}',
                      '--set', f'data.val={s}', '--set', f'log.dir={w}/log',
                      '--set', f'checkpoint.dir={w}/ckpt'],
                     'data.train', os.path.basename(s), 'token id 300', 'model.vocab_size=256')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('check', choices=['read', 'train', 'errors'])
    ap.add_argument('--data-exe', required=True)
    ap.add_argument('--train-exe')
    ap.add_argument('--shards', required=True, help='folder with the adgt train.bin/val.bin')
    ap.add_argument('--model', help='the model config (tests/layouts/model.yaml)')
    ap.add_argument('--work', required=True)
    args = ap.parse_args()
    args.work = os.path.join(args.work, args.check)
    if args.check == 'errors':
        check_errors(args)
        return
    train, val = write_all(args)
    check_read(args, train, val) if args.check == 'read' else check_train(args)


if __name__ == '__main__':
    main()

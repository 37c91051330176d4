"""Damaged inputs for adgt-data and adgt-train: the fuzz set of
docs/data-format.md ("Damaged inputs").

    python3 scripts/data/fuzz_inputs.py --out DIR --count 500 --seed 1

writes DIR/cNNNN/ (one folder a case: the damaged file(s)), DIR/anchor.txt
(a good document some cases read beside the damaged one) and
DIR/cases.jsonl, one case a line:

  id       "c0042"
  class    the kind of damage: gz, zst, utf8_txt, utf8_jsonl, json, tokenizer_json,
           tokenizer_text, spm_model, megatron, llmc, adgt_shard, train_shard (parquet: the
           place kept for the Parquet reader, see parquet_case)
  what     the damage in words
  argv     the command; {data} {train} {model} {root} {work} are the
           runner's (scripts/data/fuzz_run.py)
  expect   error       exit != 0, the message naming `needle`
           skip        exit 0, WORK/out/bad_records.txt naming `needle`
                       bad_min..bad_max times (bad_max null: no bound)
           ok-or-skip  valid but unusual (a huge number, duplicate keys):
                       exit 0, bad records within bad_min..bad_max
  needle   "cNNNN/FILE": the damaged file as every message names it

Deterministic: the same --seed and --count give the same bytes (stdlib
random, one generator per case seeded by "seed:index"). Classes take turns
(case i is of class i mod the number of classes), so 40 cases cover them all.
"""
import argparse
import gzip
import json
import os
import random
import shutil
import struct
import sys

# ---- good content -----------------------------------------------------------

WORDS = ('the and of to in that shall unto he lord his they be is him not them it with all '
         'thou thy was which my for me but ye i are said upon this have é 中文 😀 ß').split()


def sentence(rng, n=None):
    return ' '.join(rng.choice(WORDS) for _ in range(n or rng.randint(3, 12)))


def good_paragraphs(rng, n):
    return [('\n'.join(sentence(rng) for _ in range(rng.randint(1, 3)))) for _ in range(n)]


def good_jsonl_line(rng, field='text'):
    return json.dumps({field: sentence(rng), 'id': rng.randint(0, 10**6)}, ensure_ascii=rng.random() < 0.5)


# ---- invalid UTF-8 ------------------------------------------------------------

BAD_UTF8 = [
    (b'\x80', 'a lone continuation byte'),
    (b'\xbf\xbf', 'two lone continuation bytes'),
    (b'\xc0\xaf', 'an overlong "/" (C0)'),
    (b'\xc1\xbf', 'an overlong (C1)'),
    (b'\xe0\x80\xaf', 'a three-byte overlong'),
    (b'\xf0\x80\x80\xaf', 'a four-byte overlong'),
    (b'\xed\xa0\x80', 'a high surrogate U+D800'),
    (b'\xed\xbf\xbf', 'a low surrogate U+DFFF'),
    (b'\xed\xa0\xbd\xed\xb8\x80', 'a surrogate pair in CESU-8'),
    (b'\xf4\x90\x80\x80', 'a code point above U+10FFFF'),
    (b'\xf5\x80\x80\x80', 'a lead byte F5'),
    (b'\xff', 'the byte FF'),
    (b'\xfe\xff', 'a UTF-16 byte order mark'),
    (b'\xe2\x82', 'a three-byte sequence cut after two'),
    (b'\xf0\x9f\x98', 'a four-byte sequence cut after three'),
    (b'\xc3', 'a two-byte lead alone'),
    (b'\xe2\x28\xa1', 'a bad second byte'),
]


def damage_utf8(rng, text):
    """text (str) with one invalid sequence spliced in; (bytes, what)."""
    raw = text.encode()
    seq, what = rng.choice(BAD_UTF8)
    # At a character boundary (a split inside a character is damage too, but
    # then the sequence named would not be the only one).
    cut = len(text[:rng.randint(0, len(text))].encode())
    return raw[:cut] + seq + raw[cut:], what


def utf8_ok(b):
    try:
        b.decode('utf-8')  # strict: no overlongs, surrogates or > U+10FFFF, as adgt's valid_utf8
        return True
    except UnicodeDecodeError:
        return False


# ---- case bookkeeping ---------------------------------------------------------

class Case:
    def __init__(self, root, cid, cls):
        self.root, self.id, self.cls = root, cid, cls
        self.dir = os.path.join(root, cid)
        os.makedirs(self.dir)
        self.rec = {'id': cid, 'class': cls}

    def write(self, name, data):
        with open(os.path.join(self.dir, name), 'wb') as f:
            f.write(data if isinstance(data, bytes) else data.encode())
        return '{root}/' + self.id + '/' + name

    def done(self, what, argv, expect, needle, bad_min=0, bad_max=None):
        self.rec.update(what=what, argv=argv, expect=expect, needle=self.id + '/' + needle,
                        bad_min=bad_min, bad_max=bad_max)
        return self.rec


def prepare_argv(inputs, rng, mode, extra=()):
    """adgt-data prepare over `inputs` (with the anchor text when asked),
    byte tokenizer (no training: fast)."""
    argv = ['{data}', 'prepare', '--input', *inputs, '--out', '{work}/out', '--tokenizer', 'byte',
            '--val-fraction', '0']
    if mode == 'fail':
        argv += ['--on-bad-record', 'fail']
    return argv + list(extra)


def prepare_case(c, rng, name, data, what, n_bad, n_either=0, good_inside=True, extra=()):
    """A prepare case over one damaged file: in skip mode (most) it must be
    skipped and counted n_bad..n_bad+n_either times; with --on-bad-record fail
    an error naming it (when it holds a bad record for sure)."""
    path = c.write(name, data)
    mode = 'fail' if (n_bad > 0 and rng.random() < 0.25) else 'skip'
    inputs = [path] if (good_inside and rng.random() < 0.5) else [path, '{root}/anchor.txt']
    if inputs[0] == path and len(inputs) == 2 and rng.random() < 0.5:
        inputs.reverse()
    argv = prepare_argv(inputs, rng, mode, extra)
    if mode == 'fail':
        return c.done(what + ' (--on-bad-record fail)', argv, 'error', name)
    expect = 'skip' if n_bad > 0 else 'ok-or-skip'
    bad_max = None if n_bad is None else n_bad + n_either
    return c.done(what, argv, expect, name, bad_min=n_bad or 0, bad_max=bad_max)


# ---- compressed streams -------------------------------------------------------

def gz_clean(b):
    """Whether b is a whole, undamaged gzip file (every member complete, no
    trailing bytes): the oracle for gzip damage."""
    import zlib
    if not b:
        return False
    while b:
        d = zlib.decompressobj(31)
        try:
            d.decompress(b)
        except zlib.error:
            return False
        if not d.eof:
            return False
        b = d.unused_data
    return True


_P1, _P2, _P3 = 11400714785074694791, 14029467366897019727, 1609587929392839161
_P4, _P5, _M = 9650029242287828579, 2870177450012600261, (1 << 64) - 1


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc, lane):
    return (_rotl((acc + lane * _P2) & _M, 31) * _P1) & _M


def xxh64(data, seed=0):
    """XXH64 (the zstd frame checksum), from the xxHash specification."""
    n, i = len(data), 0
    u64 = lambda k: struct.unpack_from('<Q', data, k)[0]
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M, (seed + _P2) & _M, seed, (seed - _P1) & _M]
        while i + 32 <= n:
            v = [_round(v[k], u64(i + 8 * k)) for k in range(4)]
            i += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M
        for x in v:
            h = ((h ^ _round(0, x)) * _P1 + _P4) & _M
    else:
        h = (seed + _P5) & _M
    h = (h + n) & _M
    while i + 8 <= n:
        h = (_rotl(h ^ _round(0, u64(i)), 27) * _P1 + _P4) & _M
        i += 8
    if i + 4 <= n:
        h = (_rotl(h ^ ((struct.unpack_from('<I', data, i)[0] * _P1) & _M), 23) * _P2 + _P3) & _M
        i += 4
    while i < n:
        h = (_rotl(h ^ ((data[i] * _P5) & _M), 11) * _P1) & _M
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _M
    h ^= h >> 29
    h = (h * _P3) & _M
    return h ^ (h >> 32)


def zstd_frame(data, rng):
    """A zstd frame of raw and RLE blocks with a content checksum (RFC 8878),
    written by hand (no zstd module needed); also the byte ranges whose
    change the checksum must catch (block payloads, the checksum)."""
    out = bytearray(b'\x28\xb5\x2f\xfd')
    out += bytes([0x04, 0x38])  # checksum flag; window 2^17
    payload_ranges = []
    i = 0
    while True:
        n = min(len(data) - i, rng.randint(1, 300))
        last = i + n >= len(data)
        chunk = data[i:i + n]
        if n >= 4 and chunk == chunk[:1] * n:
            out += struct.pack('<I', 1 | (1 << 1) | (n << 3))[:3] + chunk[:1]
            payload_ranges.append((len(out) - 1, len(out)))
        else:
            out += struct.pack('<I', (1 if last else 0) | (n << 3))[:3]
            payload_ranges.append((len(out), len(out) + n))
            out += chunk
        if last and n >= 4 and chunk == chunk[:1] * n:
            out[len(out) - 4] |= 1  # the RLE block's header: mark it last
        i += n
        if last:
            break
    out += struct.pack('<Q', xxh64(bytes(data)))[:4]
    payload_ranges.append((len(out) - 4, len(out)))
    return bytes(out), payload_ranges


def compressed_content(rng):
    """(name stem, bytes, extra prepare flags): good text or JSON lines."""
    kind = rng.choice(['txt', 'txt_split', 'jsonl'])
    if kind == 'jsonl':
        return 'in.jsonl', ('\n'.join(good_jsonl_line(rng) for _ in range(rng.randint(1, 40))) + '\n').encode(), (), kind
    paras = good_paragraphs(rng, rng.randint(1, 30))
    extra = ('--split-on-blank-lines',) if kind == 'txt_split' else ()
    return 'in.txt', '\n\n'.join(paras).encode() + b'\n', extra, kind


def damage_stream(rng, comp, good, payload_ranges, header_len):
    """One damage of a compressed file: (bytes, what, exactly one bad record?)."""
    how = rng.choice(['truncate', 'truncate', 'zero', 'garbage_after_header', 'flip', 'flip',
                      'trailing', 'not_compressed'])
    if how == 'truncate':
        k = rng.randint(1, len(comp) - 1)
        return comp[:k], f'cut at byte {k} of {len(comp)}', True
    if how == 'zero':
        return b'', 'zero-length', True
    if how == 'garbage_after_header':
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 400)))
        return comp[:header_len] + junk, f'a valid header, then {len(junk)} random bytes', False
    if how == 'flip':
        n = rng.randint(1, 3)
        b = bytearray(comp)
        ranges = payload_ranges or [(header_len, len(comp))]
        for _ in range(n):
            lo, hi = rng.choice(ranges)
            p = rng.randrange(lo, hi)
            b[p] ^= rng.randint(1, 255)
        return bytes(b), f'{n} byte(s) changed after the header', False
    if how == 'trailing':
        junk = b'\x00' + bytes(rng.randrange(256) for _ in range(rng.randint(0, 30)))
        return comp + junk, f'{len(junk)} bytes of garbage after the stream', True
    return good, 'plain text under a compressed name', True


def gz_case(c, rng):
    stem, good, extra, kind = compressed_content(rng)
    comp = gzip.compress(good, mtime=0)
    data, what, one = damage_stream(rng, comp, good, None, 10)
    if gz_clean(data):  # a change the format cannot see (a padding bit): valid
        return prepare_case(c, rng, stem + '.gz', data, 'gzip: ' + what + ' (still valid)', 0)
    n_bad = 1
    n_either = 0 if (one or kind == 'txt') else None
    return compressed_prepare(c, rng, stem + '.gz', data, 'gzip: ' + what, n_bad, n_either, extra)


def zst_case(c, rng):
    stem, good, extra, kind = compressed_content(rng)
    comp, ranges = zstd_frame(good, rng)
    data, what, one = damage_stream(rng, comp, good, ranges, 6)
    n_either = 0 if (one or kind == 'txt') else None
    return compressed_prepare(c, rng, stem + '.zst', data, 'zstd: ' + what, 1, n_either, extra)


def compressed_prepare(c, rng, name, data, what, n_bad, n_either, extra):
    rec = prepare_case(c, rng, name, data, what, n_bad, 0, good_inside=False, extra=extra)
    if rec['expect'] == 'skip' and n_either is None:
        rec['bad_max'] = None  # garbage decoded before the damage is seen may hold bad records too
    return rec


# ---- invalid UTF-8 in text and JSON lines -----------------------------------------

def text_documents(data, split):
    """The documents adgt reads from a .txt (docs/data-format.md, "Inputs"):
    the whole file, or with --split-on-blank-lines the runs of non-blank lines."""
    if not split:
        return [data]
    lines = data.split(b'\n')
    if lines and lines[-1] == b'':
        lines.pop()
    docs, cur = [], []
    for l in lines:
        if all(ch in b' \t\r' for ch in l):
            if cur:
                docs.append(b'\n'.join(cur))
            cur = []
        else:
            cur.append(l)
    if cur:
        docs.append(b'\n'.join(cur))
    return docs


def utf8_txt_case(c, rng):
    paras = good_paragraphs(rng, rng.randint(1, 12))
    split = rng.random() < 0.6
    sep = rng.choice(['\n\n', '\r\n\r\n', '\n \n', '\n\t\n\n'])
    blobs = [p.encode() for p in paras]
    hit = sorted(rng.sample(range(len(blobs)), rng.randint(1, len(blobs))))
    whats = []
    for i in hit:
        blobs[i], what = damage_utf8(rng, paras[i])
        whats.append(what)
    data = sep.encode().join(blobs) + (b'\n' if rng.random() < 0.7 else b'')
    n_bad = sum(not utf8_ok(d) for d in text_documents(data, split) if d)
    extra = ('--split-on-blank-lines',) if split else ()
    good_inside = split and n_bad < len(text_documents(data, split))
    return prepare_case(c, rng, 'in.txt', data, f'{len(hit)} of {len(paras)} paragraphs with ' +
                        ', '.join(sorted(set(whats))) + (' (split)' if split else ' (one document)'),
                        n_bad, extra=extra, good_inside=good_inside)


def utf8_jsonl_case(c, rng):
    lines, n_bad, whats = [], 0, set()
    for _ in range(rng.randint(1, 20)):
        if rng.random() < 0.5:
            lines.append(good_jsonl_line(rng).encode())
            continue
        n_bad += 1
        s = sentence(rng)
        how = rng.choice(['raw', 'raw', 'escape', 'key'])
        if how == 'raw':
            bad, what = damage_utf8(rng, s)
            lines.append(b'{"text": "' + bad + b'", "id": 1}')
        elif how == 'escape':
            esc, what = rng.choice([('\\ud800', 'a lone high surrogate escape'),
                                    ('\\udfff', 'a lone low surrogate escape'),
                                    ('\\udc00\\ud800', 'surrogate escapes in the wrong order'),
                                    ('\\ud83d\\u0041', 'a high surrogate escape before a non-surrogate')])
            lines.append(('{"text": "' + s + esc + '"}').encode())
        else:
            bad, what = damage_utf8(rng, 'key')
            lines.append(b'{"' + bad + b'": 1, "text": "' + s.encode() + b'"}')
        whats.add(what)
    if n_bad == 0:
        lines.append(b'{"text": "\xff"}')
        n_bad, whats = 1, {'the byte FF'}
    good_inside = n_bad < len(lines)
    return prepare_case(c, rng, 'in.jsonl', b'\n'.join(lines) + b'\n',
                        f'{n_bad} of {len(lines)} lines with ' + ', '.join(sorted(whats)), n_bad,
                        good_inside=good_inside)


# ---- bad JSON lines ---------------------------------------------------------------------

def deep(rng, depth):
    kind = rng.choice(['[]', '{}'])
    if kind == '[]':
        return '[' * depth + ']' * depth
    return '{"a":' * depth + '1' + '}' * depth


def bad_json_line(rng, field):
    """(line, verdict, what): verdict 'bad' (must be skipped and counted) or
    'either' (valid JSON some readers refuse: counted or kept, both fine)."""
    s = sentence(rng)
    nest = (lambda v: '{"meta": {"body": ' + v + '}}') if field == 'meta.body' else (lambda v: '{"text": ' + v + '}')
    options = [
        (nest('"' + s), 'bad', 'an unterminated string'),
        (nest('"' + s + '"')[:-1], 'bad', 'a missing closing brace'),
        (nest('"' + s + '",'), 'bad', 'a trailing comma'),
        (nest(str(rng.randint(-9, 10**9))), 'bad', 'a number for the text'),
        (nest('null'), 'bad', 'null for the text'),
        (nest('true'), 'bad', 'a boolean for the text'),
        (nest('["' + s + '"]'), 'bad', 'an array for the text'),
        (nest('{"x": "' + s + '"}'), 'bad', 'an object for the text'),
        ('{"other": "' + s + '"}', 'bad', 'no text field'),
        ('{"meta": "' + s + '"}', 'bad', 'a string where an object is nested'),
        ('{"meta": {"title": "' + s + '"}}', 'bad', 'a nested key missing'),
        ('["' + s + '"]', 'bad', 'an array, not an object'),
        (str(rng.randint(0, 99)), 'bad', 'a number, not an object'),
        ('"' + s + '"', 'bad', 'a string, not an object'),
        ("{'text': '" + s + "'}", 'bad', 'single quotes'),
        (nest('"' + s + '"') + ' // c', 'bad', 'a comment'),
        (nest('NaN'), 'bad', 'NaN'),
        (nest('"a\x01b"'), 'bad', 'a raw control character in a string'),
        (nest('"a\x00b"'), 'bad', 'a raw NUL in a string'),
        (nest('"bad \\x escape"'), 'bad', 'an invalid escape'),
        (nest('"\\u12"'), 'bad', 'a short \\u escape'),
        (nest(deep(rng, rng.choice([100, 5000, 100000]))), 'bad', 'deep nesting as the text'),
        (deep(rng, rng.choice([1000, 100000, 400000])), 'bad', 'a deeply nested line'),
        ('{"a": ' + deep(rng, 20000) + ', ' + nest('"' + s + '"')[1:], 'either', 'deep nesting beside the text'),
        (nest('"' + s + '"')[:-1] + ', "n": 1e999999}', 'either', 'a number past double range'),
        (nest('"' + s + '"')[:-1] + ', "n": ' + '9' * rng.choice([30, 400, 20000]) + '}', 'either',
         'a huge integer'),
        (nest('"' + s + '"')[:-1] + ', "n": -1e-999999}', 'either', 'a number below double range'),
        (nest('"' + s + '"')[:-1] + ', "text": 5, "meta": 5}', 'either', 'duplicate keys'),
        (nest('"' + s + '"')[:rng.randint(1, len(nest('"' + s + '"')) - 1)], 'bad', 'a line cut short'),
    ]
    return rng.choice(options)


def json_case(c, rng):
    field = rng.choice(['text', 'text', 'meta.body'])
    lines, n_bad, n_either, whats = [], 0, 0, set()
    for _ in range(rng.randint(1, 15)):
        if rng.random() < 0.4:
            v = sentence(rng)
            lines.append(json.dumps({'meta': {'body': v}} if field == 'meta.body' else {'text': v}))
            continue
        line, verdict, what = bad_json_line(rng, field)
        lines.append(line)
        whats.add(what)
        n_bad += verdict == 'bad'
        n_either += verdict == 'either'
    if not whats:
        line, verdict, what = bad_json_line(rng, field)
        lines.append(line)
        whats.add(what)
        n_bad += verdict == 'bad'
        n_either += verdict == 'either'
    extra = ('--text-field', field) if field != 'text' else ()
    good_inside = len(lines) > n_bad + n_either
    what = f'{n_bad + n_either} of {len(lines)} lines: ' + ', '.join(sorted(whats))
    data = '\n'.join(lines).encode() + b'\n'
    if n_bad == 0:  # only lines some readers refuse: no error in fail mode either
        path = c.write('in.jsonl', data)
        argv = prepare_argv([path, '{root}/anchor.txt'], rng, 'skip', extra)
        return c.done(what, argv, 'ok-or-skip', 'in.jsonl', 0, n_either)
    return prepare_case(c, rng, 'in.jsonl', data, what, n_bad, n_either, good_inside=good_inside, extra=extra)


# ---- tokenizer files ------------------------------------------------------------------

def byte_alphabet():
    """GPT-2's bytes_to_unicode: the printable stand-in of each byte."""
    bs = list(range(ord('!'), ord('~') + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(ch) for b, ch in zip(bs, cs)}


def good_tokenizer():
    """A small byte-level BPE tokenizer.json of the kind adgt reads."""
    ab = byte_alphabet()
    vocab = {ab[b]: b for b in range(256)}
    merges = []
    for a, b in [('t', 'h'), ('th', 'e'), ('Ġ', 't'), ('a', 'n'), ('an', 'd'), ('Ġ', 'a')]:
        vocab[a + b] = len(vocab)
        merges.append(a + ' ' + b)
    return {'version': '1.0', 'truncation': None, 'padding': None,
            'added_tokens': [{'id': len(vocab), 'content': '<|endoftext|>', 'single_word': False,
                              'lstrip': False, 'rstrip': False, 'normalized': False, 'special': True}],
            'normalizer': None,
            'pre_tokenizer': {'type': 'ByteLevel', 'add_prefix_space': False, 'trim_offsets': True,
                              'use_regex': True},
            'post_processor': None, 'decoder': {'type': 'ByteLevel'},
            'model': {'type': 'BPE', 'dropout': None, 'unk_token': None, 'continuing_subword_prefix': None,
                      'end_of_word_suffix': None, 'fuse_unk': False, 'byte_fallback': False,
                      'vocab': vocab, 'merges': merges}}


def tokenizer_damages(rng, t):
    """(mutator of the dict, what); each leaves a file adgt must refuse."""
    m = t['model']
    some_tok = rng.choice(list(m['vocab']))
    big = rng.choice([-1, -(2 ** 40), 2 ** 31, 2 ** 40, 2 ** 63, 2 ** 64 - 1, 10 ** 30])
    return [
        (lambda: t.pop('model'), 'no model'),
        (lambda: t.update(model=rng.choice([None, 5, 'BPE', [1, 2]])), 'model of the wrong type'),
        (lambda: m.pop('type'), 'no model.type'),
        (lambda: m.update(type=rng.choice(['WordPiece', 'Unigram', 7, None, ['BPE']])), 'model.type wrong'),
        (lambda: m.pop('vocab'), 'no model.vocab'),
        (lambda: m.update(vocab=rng.choice([[], {}, 'x', 3, [['a', 1]]])), 'model.vocab of the wrong type'),
        (lambda: m['vocab'].update({some_tok: rng.choice(['1', 1.5, None, [], -3, 2 ** 25, big])}),
         'a vocabulary id of the wrong type or range'),
        (lambda: m['vocab'].pop(byte_alphabet()[rng.randrange(256)]), 'a byte of the alphabet missing'),
        (lambda: m.update(merges=rng.choice(['t h', 5, {'a': 'b'}, [5], [['t']], [['t', 'h', 'e']], [[1, 2]]])),
         'model.merges of the wrong type'),
        (lambda: m['merges'].append(rng.choice(['t', 't h e', 'zz qq', 'Ġ', ' ', ''])), 'a bad merge'),
        (lambda: m['merges'].insert(0, 'q z'), 'a merge whose result is not in the vocabulary'),
        (lambda: m.update({rng.choice(['byte_fallback', 'dropout', 'continuing_subword_prefix',
                                       'end_of_word_suffix']): rng.choice([True, 0.1, '##', 'x', [1], {}])}),
         'an unsupported model option (or one of the wrong type)'),
        (lambda: t.update(added_tokens=rng.choice([5, 'x', {'id': 1}, [5], [{'id': 1}], [{'content': 'x'}]])),
         'added_tokens of the wrong type'),
        (lambda: t['added_tokens'][0].update(id=rng.choice(['7', None, 1.5, [], big])),
         'an added token id of the wrong type or range'),
        (lambda: t['added_tokens'][0].update(content=rng.choice(['', 5, None])), 'an added token content bad'),
        (lambda: t['added_tokens'][0].update({rng.choice(['lstrip', 'single_word']): rng.choice([True, 'yes', 1])}),
         'an added token option bad'),
        (lambda: t.update(normalizer=rng.choice([{'type': 'NFC'}, 'NFC', 5, [1], {'type': 5}])), 'a normalizer'),
        (lambda: t.update(pre_tokenizer=rng.choice([None, 5, 'ByteLevel', {'type': 'Whitespace'}, {'type': 5},
                                                     {'type': 'ByteLevel', 'add_prefix_space': True},
                                                     {'type': 'ByteLevel', 'use_regex': 'yes'},
                                                     {'type': 'Sequence', 'pretokenizers': 5},
                                                     {'type': 'Sequence', 'pretokenizers': [5, 'x']},
                                                     {'type': 'Sequence', 'pretokenizers': {'a': 1}},
                                                     {'type': 'Sequence', 'pretokenizers': []}])),
         'a pre_tokenizer bad'),
        (lambda: t.update(pre_tokenizer={'type': 'Sequence', 'pretokenizers': [
            {'type': 'Split', 'pattern': rng.choice([{'Regex': '(unclosed'}, {'Regex': 5}, {}, 'x', None,
                                                     {'Regex': '[z-a]'}, {'Regex': '\\'}]),
             'behavior': 'Isolated', 'invert': False},
            {'type': 'ByteLevel', 'add_prefix_space': False, 'use_regex': False}]}), 'a Split pattern bad'),
    ]


def tokenizer_json_case(c, rng):
    t = good_tokenizer()
    dmg = tokenizer_damages(rng, t)
    fn, what = rng.choice(dmg + [(None, 'cut'), (None, 'garbage'), (None, 'deep')])
    if what == 'cut':
        s = json.dumps(t)
        k = rng.randint(0, len(s) - 1)
        data, what = s[:k].encode(), f'cut at byte {k} of {len(s)}'
    elif what == 'garbage':
        data = bytes(rng.randrange(256) for _ in range(rng.randint(1, 300)))
        what = 'random bytes'
    elif what == 'deep':
        data, what = deep(rng, rng.choice([1000, 200000])).encode(), 'deep nesting'
    else:
        fn()
        data = json.dumps(t).encode()
    path = c.write('tokenizer.json', data)
    if rng.random() < 0.7:
        argv = ['{data}', 'encode', '--tokenizer', path, '--text', sentence(rng)]
    else:
        argv = prepare_argv(['{root}/anchor.txt'], rng, 'skip')
        argv[argv.index('byte')] = path
    return c.done('tokenizer.json: ' + what, argv, 'error', 'tokenizer.json')


def tokenizer_text_case(c, rng):
    """A good tokenizer.json given text that is not UTF-8 (adgt-data encode
    --text: the one way in that no reader has checked first)."""
    path = c.write('tokenizer.json', json.dumps(good_tokenizer()))
    where = rng.choice(['alone', 'end', 'inside'])
    if where != 'inside':  # at the very end, where PCRE2 read past the text
        seq, what = rng.choice(BAD_UTF8)
        bad, what = (b'' if where == 'alone' else sentence(rng).encode()) + seq, what + ' ' + where
    else:
        bad, what = damage_utf8(rng, sentence(rng))
    text = bad.decode('utf-8', 'surrogateescape')  # the bytes themselves reach the command line
    argv = ['{data}', 'encode', '--tokenizer', path, '--text', text]
    return c.done('encode --text with ' + what, argv, 'error', 'tokenizer.json')


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def spm_model(rng):
    """A small SentencePiece ModelProto in protobuf wire form (pieces with
    scores and types, a BPE trainer spec)."""
    def field(num, wire, payload):
        return varint(num << 3 | wire) + (varint(len(payload)) + payload if wire == 2 else payload)
    pieces = [('<unk>', 2), ('<s>', 3), ('</s>', 3)] + [(w, 1) for w in ['▁the', '▁and', 'a', 'b', 'e', 't', 'h']]
    out = b''
    for i, (p, typ) in enumerate(pieces):
        body = field(1, 2, p.encode()) + field(2, 5, struct.pack('<f', -float(i))) + field(3, 0, varint(typ))
        out += field(1, 2, body)
    trainer = field(3, 0, varint(2)) + field(4, 0, varint(len(pieces)))  # model_type BPE, vocab_size
    return out + field(2, 2, trainer)


def spm_model_case(c, rng):
    good = spm_model(rng)
    how = rng.choice(['cut', 'garbage', 'empty', 'flip'])
    if how == 'cut':
        k = rng.randint(1, len(good) - 1)
        data, what = good[:k], f'cut at byte {k} of {len(good)}'
    elif how == 'garbage':
        data, what = bytes(rng.randrange(256) for _ in range(rng.randint(1, 500))), 'random bytes'
    elif how == 'empty':
        data, what = b'', 'zero-length'
    else:
        b = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.choice([0xFF, 0x80, 0x00, 0x0A, 0x7F])
        data, what = bytes(b), 'bytes changed'
    path = c.write('tok.model', data)
    argv = ['{data}', 'encode', '--tokenizer', path, '--text', sentence(rng)]
    # Some changes leave a model SentencePiece loads: then it must just work.
    return c.done('SentencePiece .model: ' + what, argv, 'error' if how in ('empty', 'garbage') else 'error-or-ok',
                  'tok.model')


# ---- token files ----------------------------------------------------------------------

MEGATRON_DTYPES = {1: ('B', 1), 2: ('b', 1), 3: ('h', 2), 4: ('i', 4), 5: ('q', 8), 6: ('d', 8), 7: ('f', 4), 8: ('H', 2)}


def tokens(rng, n=None, top=250):
    return [rng.randrange(top) for _ in range(n or rng.randint(20, 400))]


def megatron_files(toks, code, seqs):
    """Megatron-LM's indexed dataset (indexed_dataset.py): PREFIX.idx, PREFIX.bin;
    one document a sequence."""
    fmt, size = MEGATRON_DTYPES[code]
    bin_ = struct.pack('<%d%s' % (len(toks), fmt), *toks)
    lengths, pos = [], 0
    for s in seqs:
        lengths.append(s)
    pointers = []
    for n in lengths:
        pointers.append(pos * size)
        pos += n
    doc_idx = list(range(len(lengths) + 1))
    head = b'MMIDIDX\x00\x00' + struct.pack('<QBQQ', 1, code, len(lengths), len(doc_idx))
    idx = (head + struct.pack('<%di' % len(lengths), *lengths) + struct.pack('<%dq' % len(pointers), *pointers) +
           struct.pack('<%dq' % len(doc_idx), *doc_idx))
    return bytearray(idx), bytearray(bin_)


def cut_lengths(rng, n):
    seqs, left = [], n
    while left > 0:
        k = min(left, rng.randint(1, 60))
        seqs.append(k)
        left -= k
    return seqs


def megatron_damage(rng, idx, bin_, S, D, code):
    """Changes idx/bin in place so that the pair is invalid; returns what."""
    size = MEGATRON_DTYPES[code][1]
    lens_at, ptrs_at, docs_at = 34, 34 + 4 * S, 34 + 12 * S
    how = rng.choice(['magic', 'version', 'dtype', 'dtype_float', 'length', 'pointer', 'counts', 'cut_idx',
                      'cut_bin', 'grow_bin', 'doc_first', 'doc_last', 'doc_middle', 'empty_idx', 'no_bin'])
    if how == 'magic':
        idx[rng.randrange(9)] ^= rng.randint(1, 255)
    elif how == 'version':
        idx[9:17] = struct.pack('<Q', rng.choice([0, 2, 3, 2 ** 63, 2 ** 64 - 1]))
    elif how == 'dtype':
        new = rng.choice([0, 9, 42, 255] + [k for k, (_, sz) in MEGATRON_DTYPES.items() if sz != size and k not in (6, 7)])
        idx[17] = new
    elif how == 'dtype_float':
        idx[17] = rng.choice([6, 7])
    elif how == 'length':
        i = rng.randrange(S)
        struct.pack_into('<i', idx, lens_at + 4 * i, rng.choice([-1, -(2 ** 31), 2 ** 31 - 1,
                                                                struct.unpack_from('<i', idx, lens_at + 4 * i)[0] + rng.randint(1, 1000)]))
    elif how == 'pointer':
        i = rng.randrange(S)
        struct.pack_into('<q', idx, ptrs_at + 8 * i, rng.choice([-8, 2 ** 62, len(bin_) * 4 + 1, 2 ** 63 - 1,
                                                               struct.unpack_from('<q', idx, ptrs_at + 8 * i)[0] + 1]))
    elif how == 'counts':
        at = rng.choice([18, 26])
        struct.pack_into('<Q', idx, at, rng.choice([0, 2 ** 64 - 1, 2 ** 40, 2 ** 41, struct.unpack_from('<Q', idx, at)[0] + rng.randint(1, 9)]))
        if at == 26 and struct.unpack_from('<Q', idx, at)[0] == 0:
            struct.pack_into('<Q', idx, at, D + 1)
    elif how == 'cut_idx':
        del idx[rng.randrange(len(idx)):]
    elif how == 'cut_bin':
        del bin_[rng.randrange(len(bin_)):]
    elif how == 'grow_bin':
        bin_ += bytes(rng.randint(1, 3 * size))
    elif how == 'doc_first':
        struct.pack_into('<q', idx, docs_at, rng.choice([1, -1, S, 2 ** 62]))
    elif how == 'doc_last':
        struct.pack_into('<q', idx, docs_at + 8 * (D - 1), rng.choice([S - 1, S + 1, -1, 2 ** 63 - 1]))
    elif how == 'doc_middle' and D > 2:
        d = rng.randrange(1, D - 1)
        struct.pack_into('<q', idx, docs_at + 8 * d, rng.choice([S + 1, 2 ** 62, -5, 2 ** 63 - 1]))
    elif how == 'empty_idx':
        del idx[:]
    elif how == 'no_bin':
        return 'no .bin beside the .idx', False
    else:
        struct.pack_into('<q', idx, docs_at, 3)
        how = 'doc_first'
    return how, True


def megatron_case(c, rng):
    code = rng.choice([1, 4, 5, 8, 3, 8])
    toks = tokens(rng, top=120 if code in (1, 2) else 250)
    seqs = cut_lengths(rng, len(toks))
    idx, bin_ = megatron_files(toks, code, seqs)
    what, keep_bin = megatron_damage(rng, idx, bin_, len(seqs), len(seqs) + 1, code)
    c.write('mega.idx', bytes(idx))
    if keep_bin:
        c.write('mega.bin', bytes(bin_))
    name = rng.choice(['mega', 'mega.idx', 'mega.bin'] if keep_bin else ['mega', 'mega.idx'])
    argv = token_file_argv(rng, '{root}/' + c.id + '/' + name)
    return c.done(f'Megatron {MEGATRON_DTYPES[code][0]} index: {what}', argv, 'error', 'mega')


def token_file_argv(rng, path):
    if rng.random() < 0.8:
        return ['{data}', 'info', '--shard', path, '--head', '1000000']
    return ['{data}', 'order', '--shard', path, '--seq-len', '4', '--seed', '1', '--count', '4']


def llmc_file(toks, magic=20240520, version=1, count=None):
    head = struct.pack('<3i', magic, version, len(toks) if count is None else count) + bytes(1012)
    return bytearray(head + struct.pack('<%d%s' % (len(toks), 'H' if magic == 20240520 else 'I'), *toks))


def llmc_case(c, rng):
    toks = tokens(rng)
    llama = rng.random() < 0.4
    magic, version = (20240801, 7) if llama else (20240520, 1)
    how = rng.choice(['magic', 'version', 'count_past', 'count_short', 'count_negative', 'cut', 'header_only_cut',
                      'other_magic_layout'])
    if how == 'magic':
        data = llmc_file(toks, rng.choice([0, 20240519, 20240521, 1, -1, 0x4F544744]), version)
    elif how == 'version':
        data = llmc_file(toks, magic, rng.choice([0, 2, 7 if not llama else 1, -1, 2 ** 31 - 1]))
    elif how == 'count_past':
        data = llmc_file(toks, magic, version, count=len(toks) + rng.choice([1, 1000, 2 ** 31 - 1 - len(toks)]))
    elif how == 'count_short':
        data = llmc_file(toks, magic, version, count=len(toks) - rng.randint(1, len(toks)))
    elif how == 'count_negative':
        data = llmc_file(toks, magic, version, count=rng.choice([-1, -(2 ** 31)]))
    elif how == 'cut':
        data = llmc_file(toks, magic, version)
        del data[rng.randrange(1024, len(data)):]
    elif how == 'header_only_cut':
        data = llmc_file(toks, magic, version)
        del data[rng.randrange(4, 1024):]
    else:  # the uint16 layout under the uint32 magic and the other way round
        data = llmc_file(toks, magic, version)
        struct.pack_into('<2i', data, 0, *((20240520, 1) if llama else (20240801, 7)))
    c.write('shard.bin', bytes(data))
    argv = token_file_argv(rng, '{root}/' + c.id + '/shard.bin')
    return c.done(f'llm.c {"uint32" if llama else "uint16"} shard: {how}', argv, 'error', 'shard.bin')


def adgt_shard(toks, vocab=256, docs=None, version=None, dtype=None, count=None, documents=None):
    """An adgt token shard (docs/data-format.md): the 64-byte header, the
    tokens (uint16 when they fit, whatever the header's dtype says), the
    document index (version 2)."""
    docs = [0] if docs is None else docs
    payload = 1 if max(toks) < 65536 else 2
    dtype = dtype or payload
    version = version or (2 if docs else 1)
    head = b'ADGTTOK\x00' + struct.pack('<IIQQQ', version, dtype, len(toks) if count is None else count, vocab,
                                        len(docs) if documents is None else documents) + bytes(24)
    body = struct.pack('<%d%s' % (len(toks), 'H' if payload == 1 else 'I'), *toks)
    return bytearray(head + body + struct.pack('<%dq' % len(docs), *docs))


def adgt_shard_damage(rng, toks, docs):
    """(bytes, what, whether `order` sees it: it reads the header, not the tokens)."""
    how = rng.choice(['cut', 'magic', 'version', 'version1_docs', 'version2_nodocs', 'dtype', 'vocab',
                      'vocab_u16', 'vocab_below_ids', 'count', 'documents', 'doc_past_end', 'doc_order',
                      'doc_first', 'trailing', 'zero'])
    if not docs and how in ('version1_docs', 'doc_past_end', 'doc_order', 'doc_first'):
        how = 'cut'  # a version 1 shard: no document index to damage
    payload = 1 if max(toks) < 65536 else 2
    kw = {'vocab': max(toks) + 1}
    if how == 'version':
        kw['version'] = rng.choice([3, 7, 2 ** 32 - 1])
    elif how == 'version1_docs':
        kw['version'] = 1
    elif how == 'version2_nodocs':
        kw.update(version=2, documents=0)
    elif how == 'dtype':
        kw['dtype'] = rng.choice([3, 255, 2 ** 32 - 1, 3 - payload])
    elif how == 'vocab':
        kw['vocab'] = rng.choice([2 ** 31 + 1, 2 ** 40, 2 ** 64 - 1])
    elif how == 'vocab_u16':
        kw.update(vocab=rng.choice([65537, 2 ** 20]), dtype=1)
    elif how == 'vocab_below_ids':
        kw['vocab'] = rng.randint(1, max(toks))
    elif how == 'count':
        kw['count'] = rng.choice([len(toks) + rng.randint(1, 5), max(0, len(toks) - rng.randint(1, 5)),
                                  2 ** 63, 2 ** 64 - 1])
    elif how == 'documents':
        kw['documents'] = rng.choice([len(docs) + 1, len(docs) + 1000, 2 ** 61, 2 ** 64 - 1])
    data = adgt_shard(toks, docs=docs, **kw)
    end = len(data)
    if how == 'cut':
        del data[rng.randrange(end):]
    elif how == 'magic':
        data[rng.randrange(8)] ^= rng.randint(1, 255)
    elif how in ('doc_past_end', 'doc_order', 'doc_first'):
        i = rng.randrange(len(docs)) if how != 'doc_first' else 0
        at = end - 8 * (len(docs) - i)
        v = {'doc_past_end': rng.choice([len(toks), len(toks) + 1, 2 ** 62, 2 ** 63 - 1]),
             'doc_order': rng.choice([-1, -(2 ** 63)]) if i == 0 else docs[i - 1],
             'doc_first': rng.choice([1, -1, len(toks) - 1])}[how]
        struct.pack_into('<q', data, at, v)
    elif how == 'trailing':
        data += bytes(rng.randint(1, 7))
    elif how == 'zero':
        data = bytearray()
    return bytes(data), how, how != 'vocab_below_ids'


def adgt_shard_case(c, rng):
    toks = tokens(rng, top=rng.choice([256, 300, 70000]))
    ndocs = rng.randint(1, 6)
    docs = [0] + sorted(rng.sample(range(1, len(toks)), ndocs - 1)) if rng.random() < 0.8 else []
    data, what, order_sees = adgt_shard_damage(rng, toks, docs)
    c.write('tok.bin', data)
    path = '{root}/' + c.id + '/tok.bin'
    argv = token_file_argv(rng, path) if order_sees else ['{data}', 'info', '--shard', path, '--head', '1000000']
    return c.done(f'adgt shard ({len(toks)} tokens, {len(docs)} documents): {what}', argv, 'error', 'tok.bin')


def train_shard_case(c, rng):
    """Damaged token files read by adgt-train itself (model.vocab_size 256):
    a header vocabulary that hides larger ids, ids past the model's
    vocabulary, a cut file."""
    toks = tokens(rng, n=rng.randint(300, 600), top=256)
    # Inside the windows two steps read (16 of seq_len 32 each: every window
    # of a file this short), so that the run reads the bad id.
    toks[rng.randrange((len(toks) - 1) // 32 * 32)] = rng.choice([256, 300, 65535])
    how = rng.choice(['adgt_header_lies', 'adgt_cut', 'megatron_big_id', 'llmc_big_id', 'llmc_cut'])
    if how == 'adgt_header_lies':
        name, data = 'train.bin', adgt_shard(toks, vocab=256)
    elif how == 'adgt_cut':
        name, data = 'train.bin', adgt_shard([t % 256 for t in toks], vocab=256)
        del data[rng.randrange(len(data)):]
    elif how == 'megatron_big_id':
        name = 'mega'
        idx, bin_ = megatron_files(toks, 8, cut_lengths(rng, len(toks)))
        c.write('mega.idx', bytes(idx))
        data = bin_
        c.write('mega.bin', bytes(bin_))
    elif how == 'llmc_big_id':
        name, data = 'train.bin', llmc_file(toks)
    else:
        name, data = 'train.bin', llmc_file([t % 256 for t in toks])
        del data[rng.randrange(len(data)):]
    if name != 'mega':
        c.write(name, bytes(data))
    path = '{root}/' + c.id + '/' + name
    argv = ['{train}', '--config', '{model}', '--set', 'data.train=' + path, '--set', 'data.val=' + path,
            '--set', 'train.steps=2', '--set', 'train.warmup_steps=1', '--set', 'train.eval_interval=0', '--set', 'log.dir={work}/log',
            '--set', 'checkpoint.dir={work}/ckpt', '--set', 'checkpoint.interval=0']
    return c.done('adgt-train on ' + how, argv, 'error', name)


def parquet_case(c, rng):
    """The place kept for Parquet inputs (the Parquet reader is work in hand
    elsewhere): wrong column type (int64 or binary where the text is a
    string), the text column missing, a truncated footer, bad UTF-8 in a
    string column, a row group cut short. Fill in with pyarrow-written files
    once adgt-data reads Parquet; until then no case is made (None) and the
    class takes no turns."""
    return None


CLASSES = [
    ('gz', gz_case), ('zst', zst_case), ('utf8_txt', utf8_txt_case), ('utf8_jsonl', utf8_jsonl_case),
    ('json', json_case), ('json', json_case), ('tokenizer_json', tokenizer_json_case),
    ('tokenizer_json', tokenizer_json_case), ('tokenizer_text', tokenizer_text_case), ('spm_model', spm_model_case), ('megatron', megatron_case),
    ('megatron', megatron_case), ('llmc', llmc_case), ('adgt_shard', adgt_shard_case),
    ('adgt_shard', adgt_shard_case), ('train_shard', train_shard_case),
    ('parquet', parquet_case),
]


def generate(out, count, seed, only=None):
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    anchor = random.Random(f'{seed}:anchor')
    with open(os.path.join(out, 'anchor.txt'), 'w') as f:
        f.write('\n\n'.join(good_paragraphs(anchor, 20)) + '\n')
    classes = [(n, fn) for n, fn in CLASSES if not only or n in only]
    cases, turn = [], 0
    while len(cases) < count:
        name, fn = classes[turn % len(classes)]
        turn += 1
        cid = 'c%04d' % len(cases)
        rng = random.Random(f'{seed}:{len(cases)}:{name}')
        c = Case(out, cid, name)
        rec = fn(c, rng)
        if rec is None:  # a class with nothing to make here (parquet)
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
    args = ap.parse_args()
    cases = generate(args.out, args.count, args.seed, set(args.only.split(',')) if args.only else None)
    per = {}
    for r in cases:
        per[r['class']] = per.get(r['class'], 0) + 1
    print(f'{len(cases)} cases in {args.out}: ' + ', '.join(f'{k} {v}' for k, v in sorted(per.items())))


if __name__ == '__main__':
    main()

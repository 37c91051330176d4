"""Damaged tokenizer.json and SentencePiece .model files, and text that is
not UTF-8 for a good tokenizer.json (scripts/data/fuzz_inputs.py)."""
import json
import struct

from fuzz.common import BAD_UTF8, damage_utf8, prepare_argv, sentence
from fuzz.text import deep


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

"""What every class of damaged input shares: good text to damage, invalid
UTF-8 sequences, the case record and the adgt-data prepare command
(scripts/data/fuzz_inputs.py)."""
import json
import os


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

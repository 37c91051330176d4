"""Invalid UTF-8 in .txt and .jsonl files and bad JSON lines
(scripts/data/fuzz_inputs.py)."""
import json

from fuzz.common import damage_utf8, good_jsonl_line, good_paragraphs, prepare_argv, prepare_case, sentence, utf8_ok


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

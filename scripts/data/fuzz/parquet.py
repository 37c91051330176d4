"""Damaged Parquet inputs (scripts/data/fuzz_inputs.py), written by pyarrow
(the wheel scripts/install_deps.sh unpacks into .deps/pyarrow): the text
column of the wrong type (int64, binary, a struct without the named field),
the column missing, the file cut anywhere (its footer gone), random bytes
changed in a file written with page checksums, nulls in the text column,
and a file that is not Parquet at all. Without pyarrow no case is made (the
class takes no turns)."""
import os
import sys

from fuzz.common import good_paragraphs, prepare_argv

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_PA = None


def _pyarrow():
    """(pyarrow, pyarrow.parquet), or None when the wheel is not unpacked."""
    global _PA
    if _PA is None:
        sys.path.insert(0, os.path.join(_ROOT, '.deps', 'pyarrow'))
        # The wheel refuses Debian's NumPy 1.24 when NumPy is importable;
        # writing Parquet needs none.
        saved = sys.modules.get('numpy', 'absent')
        sys.modules['numpy'] = None
        try:
            import pyarrow
            import pyarrow.parquet
            _PA = (pyarrow, pyarrow.parquet)
        except ImportError:
            _PA = False
        finally:
            if saved == 'absent':
                del sys.modules['numpy']
            else:
                sys.modules['numpy'] = saved
    return _PA or None


def _parquet_bytes(pa, pq, rng, nulls=False):
    docs = good_paragraphs(rng, rng.randint(3, 30))
    text = [None if nulls and rng.random() < 0.3 else d for d in docs]
    table = pa.table({
        'text': pa.array(text, type=rng.choice([pa.string(), pa.large_string()])),
        'id': pa.array(list(range(len(docs))), type=pa.int64()),
        'raw': pa.array([d.encode() for d in docs], type=pa.binary()),
        'meta': pa.array([{'n': i} for i in range(len(docs))], type=pa.struct([('n', pa.int32())])),
    })
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=rng.randint(1, 8), write_page_checksum=True,
                   compression=rng.choice(['none', 'snappy', 'zstd']))
    return sink.getvalue().to_pybytes(), sum(t is None for t in text)


def parquet_case(c, rng):
    pa = _pyarrow()
    if pa is None:
        return None
    data, _ = _parquet_bytes(*pa, rng, nulls=rng.random() < 0.25)
    kind = rng.randrange(6)
    name = 'in.parquet'
    if kind < 3:  # a column that is not text, or not there: a named error
        field, what = [('id', 'an int64 column'), ('raw', 'a binary column'),
                       (rng.choice(['nope', 'meta.body', 'text.x']), 'a missing field')][kind]
        c.write(name, data)
        argv = prepare_argv(['{root}/' + c.id + '/' + name], rng, 'skip') + ['--text-field', field]
        return c.done(f'parquet: --text-field {field}, {what}', argv, 'error', name)
    mode = 'fail' if rng.random() < 0.25 else 'skip'
    if kind == 3:  # cut: the footer (or part of it) is gone, the whole file is one bad record
        k = rng.randrange(len(data) - 1)
        data, what, n_bad, either = data[:k], f'cut at byte {k} of {len(data)}', 1, 0
    elif kind == 4:  # bytes changed: pages with checksums are caught, other damage may pass
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        data, what, n_bad, either = bytes(b), 'bytes changed (page checksums on)', None, None
    else:
        data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))
        what, n_bad, either = 'not Parquet at all', 1, 0
    path = c.write(name, data)
    argv = prepare_argv([path, '{root}/anchor.txt'], rng, mode)
    if n_bad is None:  # a changed byte the reader cannot see may leave the file readable
        return c.done('parquet: ' + what, argv, 'error-or-ok', name)
    if mode == 'fail':
        return c.done('parquet: ' + what + ' (--on-bad-record fail)', argv, 'error', name)
    return c.done('parquet: ' + what, argv, 'skip', name, bad_min=n_bad, bad_max=n_bad + either)

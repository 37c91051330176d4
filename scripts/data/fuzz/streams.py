"""Damaged .gz and .zst files (scripts/data/fuzz_inputs.py): cut, empty,
garbage after a valid header, changed bytes, trailing garbage, not
compressed at all."""
import gzip
import struct
import zlib

from fuzz.common import good_jsonl_line, good_paragraphs, prepare_case


def gz_clean(b):
    """Whether b is a whole, undamaged gzip file (every member complete, no
    trailing bytes): the oracle for gzip damage."""
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

"""Damaged Megatron, llm.c and adgt token files, read by adgt-data info and
order and by adgt-train (scripts/data/fuzz_inputs.py)."""
import struct


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

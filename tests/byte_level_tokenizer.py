"""A tokenizer.json of GPT-2's byte-level alphabet alone (256 tokens, no
merges), for tests that need a tokenizer.json without training one
(tests/hf/hf_check.py, tests/data/prepare_inputs.py)."""


def byte_alphabet():
    """GPT-2's bytes_to_unicode as two lists: byte values, and the code point
    of each one's character, in vocabulary order (token id = index)."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return bs, cs


def byte_level_tokenizer(added=()) -> dict:
    """The tokenizer.json; `added`: [(id, content)] added special tokens."""
    _, cs = byte_alphabet()
    return {"version": "1.0",
            "added_tokens": [{"id": i, "content": c, "special": True} for i, c in added],
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                              "use_regex": True},
            "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "vocab": {chr(c): i for i, c in enumerate(cs)}, "merges": []}}

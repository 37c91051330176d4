// HuggingFace tokenizer.json files of the byte-level BPE kind (GPT-2,
// Llama 3, Mistral-NeMo, ...; docs/data-format.md, "Tokenizers"), encoded
// as the `tokenizers` library encodes them with add_special_tokens=False:
//
//   1. added tokens (special or not) are cut out of the text first, matched
//      literally, longest first at each position;
//   2. the pre-tokenizer splits the rest: ByteLevel with use_regex (the GPT-2
//      pattern), or a Sequence of Split(Regex, Isolated) and ByteLevel
//      without its regex (Llama 3); regexes run on PCRE2 with Unicode
//      properties (the pattern as written in the file);
//   3. each piece's bytes become the byte-level alphabet's characters (GPT-2's
//      bytes_to_unicode) and BPE merges them, the lowest-ranked pair first
//      (leftmost among equals); with ignore_merges a piece that is itself in
//      the vocabulary is taken whole.
// decode() maps tokens back to bytes (added tokens as their text). Anything
// else in a tokenizer.json -- a normalizer, a pre-tokenizer or model of
// another kind, added tokens that strip spaces or match single words only,
// continuing-subword prefixes, dropout -- is refused by load with an error
// naming the file and the key, so no text is ever tokenized differently from
// `tokenizers` without a word.
#pragma once
#include <memory>
#include <string>

#include "core/data/tokenizer.hpp"

namespace adgt {

// Whether `spec` names a tokenizer.json (by its name: *.json).
bool is_hf_tokenizer_spec(const std::string& spec);

// Loads `path`; throws std::runtime_error naming the file and key on
// anything unsupported (above) or malformed.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path);

}  // namespace adgt

// Tokenizers: text <-> token ids. Two kinds behind one interface:
//   "sentencepiece"  a SentencePiece .model file (adgt-data trains BPE ones);
//   "byte"           byte-level: id = byte value, vocab 256, no specials.
// Both are lossless on UTF-8 text: decode(encode(s)) == s. SentencePiece
// models trained here keep text unnormalised (identity normalisation, no
// dummy prefix, whitespace kept) and fall back to byte pieces for anything
// outside the vocabulary, so encodings of consecutive pieces of a text can be
// concatenated.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace adgt {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // spec: path to a SentencePiece .model file, or "byte". Throws naming the
  // file when it cannot be read or is not a SentencePiece model.
  static std::unique_ptr<Tokenizer> load(const std::string& spec);
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  // Throws on ids outside [0, vocab_size()).
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::string kind() const = 0;  // "sentencepiece", "hf-bpe" or "byte"
  // The end- and beginning-of-document tokens (-1: the tokenizer has none).
  virtual int32_t eos_id() const { return -1; }
  virtual int32_t bos_id() const { return -1; }
  // result[i] == encode(texts[i]), computed in parallel (OpenMP). The
  // SentencePiece tokenizer also encodes each distinct word only once across
  // all texts (see tokenizer.cpp), which makes large corpora ~10x faster.
  virtual std::vector<std::vector<int32_t>> encode_batch(
      const std::vector<std::string_view>& texts) const;
};

// Whether `tok` encodes word by word with a cache (SentencePiece models whose
// pieces never span a space-after-text or a newline, with no dummy prefix and
// no normalisation -- all models trained here). For tests and diagnostics.
bool uses_word_cache(const Tokenizer& tok);

// Trains a SentencePiece BPE model on the text file `corpus_path`; writes
// <model_prefix>.model and <model_prefix>.vocab. Throws naming the file or the
// vocab size on failure.
void train_sentencepiece(const std::string& corpus_path, const std::string& model_prefix,
                         int vocab_size);

// The same on text in memory; `source` names it in error messages. Settings
// (all fixed, so the result is a pure function of text and vocab size):
// model_type=bpe, byte_fallback, identity normalisation, no dummy prefix,
// whitespace kept, digits split, character_coverage 0.9995, unk/bos/eos =
// 0/1/2, one thread. Lines longer than 4096 bytes are cut at spaces, and at
// most 2,000,000 lines / 64 MiB are used: every k-th line, evenly spread, when
// the text has more (no random sampling).
void train_sentencepiece_text(std::string_view text, const std::string& model_prefix,
                              int vocab_size, const std::string& source = "<text>");

// The k of "every k-th line" above for a text of `lines` non-blank lines
// holding `bytes` bytes (1 when under both caps).
size_t sentencepiece_sample_step(size_t lines, size_t bytes);
// The training itself on lines already chosen (non-blank, no '\n'): what
// train_sentencepiece_text does after sampling. A streamed corpus counts its
// lines first, then hands over every k-th one (the same model, bounded memory).
void train_sentencepiece_lines(const std::vector<std::string_view>& lines, const std::string& model_prefix,
                               int vocab_size, const std::string& source);

// Smallest/largest vocab size train_sentencepiece accepts: 256 byte pieces,
// 3 specials, and room for characters and merges.
inline constexpr int kMinSentencePieceVocab = 320;
inline constexpr int kMaxSentencePieceVocab = 1 << 20;

}  // namespace adgt

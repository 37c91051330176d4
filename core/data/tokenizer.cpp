#include "core/data/tokenizer.hpp"

#include "core/data/hf_tokenizer.hpp"
#include "core/data/parallel_for.hpp"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

namespace adgt {
namespace {

// ---------------------------------------------------------------- byte-level
class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s(ids.size(), '\0');
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] > 255)
        throw std::runtime_error("byte tokenizer: id " + std::to_string(ids[i]) + " at position " +
                                 std::to_string(i) + " is outside [0, 256)");
      s[i] = static_cast<char>(static_cast<unsigned char>(ids[i]));
    }
    return s;
  }
  int64_t vocab_size() const override { return 256; }
  std::string kind() const override { return "byte"; }
};

// ------------------------------------------------------------- SentencePiece
// Word units: a single '\n', or a run of spaces followed by a run of bytes that
// are neither space nor newline (either run may be empty, not both). For a
// BPE model with no dummy prefix and identity normalisation, a piece that
// spans no unit boundary (no '\n', no U+2581 after a non-U+2581 character)
// cannot be formed across units, and SentencePiece's merge order (score, then
// position) within a unit does not depend on its neighbours -- so encoding
// unit by unit and concatenating equals encoding the whole text.
template <class F>
void for_each_unit(std::string_view t, F&& f) {
  size_t i = 0;
  const size_t n = t.size();
  while (i < n) {
    size_t j = i;
    if (t[j] == '\n') {
      ++j;
    } else {
      while (j < n && t[j] == ' ') ++j;
      while (j < n && t[j] != ' ' && t[j] != '\n') ++j;
    }
    f(t.substr(i, j - i));
    i = j;
  }
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) : path_(path) {
    const auto st = sp_.Load(path);
    if (!st.ok())
      throw std::runtime_error("tokenizer '" + path + "': cannot load SentencePiece model (" +
                               st.ToString() +
                               "); pass a .model file (adgt-data prepare writes "
                               "DIR/tokenizer.model) or \"byte\"");
    vocab_ = sp_.GetPieceSize();
    word_cache_ = check_word_cache();
  }
  std::vector<int32_t> encode(const std::string& text) const override {
    if (!word_cache_) return sp_encode(text);
    return std::move(encode_batch({std::string_view(text)})[0]);
  }
  std::vector<std::vector<int32_t>> encode_batch(
      const std::vector<std::string_view>& texts) const override {
    if (!word_cache_) return Tokenizer::encode_batch(texts);
    // 1. Distinct units, and each text as a list of unit numbers (serial).
    std::unordered_map<std::string_view, uint32_t> index;
    std::vector<std::string_view> uniq;
    std::vector<std::vector<uint32_t>> seq(texts.size());
    for (size_t t = 0; t < texts.size(); ++t) {
      seq[t].reserve(texts[t].size() / 4);
      for_each_unit(texts[t], [&](std::string_view u) {
        const auto [it, added] = index.try_emplace(u, static_cast<uint32_t>(uniq.size()));
        if (added) uniq.push_back(u);
        seq[t].push_back(it->second);
      });
    }
    // 2. Encode each distinct unit once (parallel).
    std::vector<std::vector<int32_t>> enc(uniq.size());
    parallel_for(static_cast<int64_t>(uniq.size()), 256,
                 [&](int64_t u) { enc[u] = sp_encode(uniq[u]); });
    // 3. Assemble (parallel over texts).
    std::vector<std::vector<int32_t>> out(texts.size());
    parallel_for(static_cast<int64_t>(texts.size()), 1, [&](int64_t t) {
      size_t n = 0;
      for (uint32_t u : seq[t]) n += enc[u].size();
      out[t].reserve(n);
      for (uint32_t u : seq[t]) out[t].insert(out[t].end(), enc[u].begin(), enc[u].end());
    });
    return out;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::vector<int> v(ids.begin(), ids.end());
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] < 0 || v[i] >= vocab_)
        throw std::runtime_error("tokenizer '" + path_ + "': id " + std::to_string(v[i]) +
                                 " at position " + std::to_string(i) + " is outside [0, " +
                                 std::to_string(vocab_) + ")");
    std::string out;
    const auto st = sp_.Decode(v, &out);
    if (!st.ok())
      throw std::runtime_error("tokenizer '" + path_ + "': decode failed: " + st.ToString());
    return out;
  }
  int64_t vocab_size() const override { return vocab_; }
  std::string kind() const override { return "sentencepiece"; }
  int32_t eos_id() const override { return sp_.eos_id() >= 0 && sp_.eos_id() < vocab_ ? sp_.eos_id() : -1; }
  int32_t bos_id() const override { return sp_.bos_id() >= 0 && sp_.bos_id() < vocab_ ? sp_.bos_id() : -1; }
  bool word_cache() const { return word_cache_; }

 private:
  std::vector<int32_t> sp_encode(std::string_view text) const {
    std::vector<int> ids;
    const auto st = sp_.Encode(text, &ids);
    if (!st.ok())
      throw std::runtime_error("tokenizer '" + path_ + "': encode failed: " + st.ToString());
    return std::vector<int32_t>(ids.begin(), ids.end());
  }

  // Whether unit-by-unit encoding is exact for this model (see for_each_unit):
  // a scan of the pieces, then a probe that also catches a dummy prefix and
  // normalisation.
  bool check_word_cache() const {
    static const std::string kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's space
    for (int id = 0; id < vocab_; ++id) {
      if (sp_.IsControl(id) || sp_.IsUnknown(id) || sp_.IsByte(id) || sp_.IsUnused(id)) continue;
      const std::string& p = sp_.IdToPiece(id);
      if (p.find('\n') != std::string::npos) return false;
      size_t lead = 0;
      while (p.compare(lead, kSpace.size(), kSpace) == 0) lead += kSpace.size();
      if (p.find(kSpace, lead) != std::string::npos) return false;
    }
    const std::string probe =
        "The  quick brown\nfox,  jumps 12.5 times!\n\n   Over\tthe lazy dog's ba\xc3\xa7k \n";
    const auto whole = sp_encode(probe);
    std::vector<int32_t> units;
    for_each_unit(probe, [&](std::string_view u) {
      const auto e = sp_encode(u);
      units.insert(units.end(), e.begin(), e.end());
    });
    std::string back;
    const auto st = sp_.Decode(std::vector<int>(whole.begin(), whole.end()), &back);
    return st.ok() && whole == units && back == probe;
  }

  std::string path_;
  sentencepiece::SentencePieceProcessor sp_;
  int64_t vocab_ = 0;
  bool word_cache_ = false;
};

// Feeds prepared sentences to the SentencePiece trainer.
class VectorIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& v) : v_(v) {}
  bool done() const override { return i_ >= v_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return v_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& v_;
  size_t i_ = 0;
};

constexpr size_t kMaxTrainLineBytes = 4096;
constexpr size_t kMaxTrainLines = 2'000'000;
constexpr size_t kMaxTrainBytes = size_t{64} << 20;

// Cuts `line` into pieces of at most kMaxTrainLineBytes, at a space when there
// is one in the second half of the window, else at a UTF-8 character start.
void push_cut(std::string_view line, std::vector<std::string>& out) {
  while (line.size() > kMaxTrainLineBytes) {
    size_t cut = line.rfind(' ', kMaxTrainLineBytes);
    if (cut == std::string_view::npos || cut < kMaxTrainLineBytes / 2) {
      cut = kMaxTrainLineBytes;
      while (cut > 0 && (static_cast<unsigned char>(line[cut]) & 0xC0) == 0x80) --cut;
      if (cut == 0) cut = kMaxTrainLineBytes;
    }
    out.emplace_back(line.substr(0, cut));
    line.remove_prefix(cut);
  }
  if (!line.empty()) out.emplace_back(line);
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& spec) {
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  if (is_hf_tokenizer_spec(spec)) return load_hf_tokenizer(spec);
  return std::make_unique<SentencePieceTokenizer>(spec);
}

size_t sentencepiece_sample_step(size_t lines, size_t bytes) {
  return std::max<size_t>({1, (lines + kMaxTrainLines - 1) / kMaxTrainLines, (bytes + kMaxTrainBytes - 1) / kMaxTrainBytes});
}

void train_sentencepiece_text(std::string_view text, const std::string& model_prefix,
                              int vocab_size, const std::string& source) {
  // Split into lines (no '\n'; a trailing '\r' is kept: identity normalisation).
  std::vector<std::string_view> lines;
  size_t total = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    if (line.find_first_not_of(" \t\r") != std::string_view::npos) {
      lines.push_back(line);
      total += line.size();
    }
    pos = nl + 1;
  }
  // Deterministic subsample: every k-th line when over the caps.
  const size_t k = sentencepiece_sample_step(lines.size(), total);
  std::vector<std::string_view> sampled;
  sampled.reserve(lines.size() / k + 1);
  for (size_t i = 0; i < lines.size(); i += k) sampled.push_back(lines[i]);
  train_sentencepiece_lines(sampled, model_prefix, vocab_size, source);
}

void train_sentencepiece_lines(const std::vector<std::string_view>& lines, const std::string& model_prefix,
                               int vocab_size, const std::string& source) {
  if (vocab_size < kMinSentencePieceVocab || vocab_size > kMaxSentencePieceVocab)
    throw std::runtime_error("vocab size " + std::to_string(vocab_size) + " for '" + source +
                             "' is out of range; use a value in [" +
                             std::to_string(kMinSentencePieceVocab) + ", " +
                             std::to_string(kMaxSentencePieceVocab) +
                             "] (256 byte pieces + specials + merges), or --tokenizer byte");
  if (lines.empty())
    throw std::runtime_error("tokenizer training text '" + source +
                             "' has no non-blank lines; give it some text");
  std::vector<std::string> sentences;
  sentences.reserve(lines.size());
  for (std::string_view l : lines) push_cut(l, sentences);

  const std::unordered_map<std::string, std::string> args = {
      {"model_prefix", model_prefix},
      {"vocab_size", std::to_string(vocab_size)},
      {"model_type", "bpe"},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "false"},
      {"remove_extra_whitespaces", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"split_digits", "true"},
      {"character_coverage", "0.9995"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"num_threads", "1"},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"max_sentence_length", std::to_string(kMaxTrainLineBytes + 16)},
      {"hard_vocab_limit", "false"},
      {"minloglevel", "2"},
  };
  sentencepiece::SetRandomGeneratorSeed(1234);
  VectorIterator it(sentences);
  const auto st = sentencepiece::SentencePieceTrainer::Train(args, &it);
  if (!st.ok())
    throw std::runtime_error(
        "training a SentencePiece model (vocab size " + std::to_string(vocab_size) + ") on '" +
        source + "' into '" + model_prefix + ".model' failed: " + st.ToString() +
        (st.ToString().find("smaller than required_chars") != std::string::npos
             ? " -- the text has many distinct characters; use a larger vocab size"
             : " -- try another vocab size"));
}

void train_sentencepiece(const std::string& corpus_path, const std::string& model_prefix,
                         int vocab_size) {
  std::ifstream in(corpus_path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open tokenizer training text '" + corpus_path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  train_sentencepiece_text(ss.str(), model_prefix, vocab_size, corpus_path);
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(
    const std::vector<std::string_view>& texts) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  parallel_for(static_cast<int64_t>(texts.size()), 1,
               [&](int64_t i) { out[i] = encode(std::string(texts[i])); });
  return out;
}

bool uses_word_cache(const Tokenizer& tok) {
  const auto* sp = dynamic_cast<const SentencePieceTokenizer*>(&tok);
  return sp && sp->word_cache();
}

}  // namespace adgt

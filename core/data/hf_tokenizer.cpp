// HuggingFace byte-level BPE tokenizer.json (hf_tokenizer.hpp).
#include "core/data/hf_tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <omp.h>
#include <pcre2.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/data/parallel_for.hpp"
#include "core/data/text_sources.hpp"

namespace adgt {
namespace {

using json = nlohmann::json;

// The GPT-2 pattern ByteLevel's use_regex applies (tokenizers' byte_level.rs).
constexpr const char* kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the
// others for 256 + n in order. (Every code point is below U+0800.)
struct ByteAlphabet {
  std::string of[256];                        // byte -> its character, UTF-8
  std::unordered_map<uint32_t, uint8_t> back;  // character -> byte
  ByteAlphabet() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + n++);
      of[b] = utf8(cp);
      back[cp] = uint8_t(b);
    }
  }
};
const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

// A PCRE2 pattern compiled for UTF-8 with Unicode properties (JIT when
// available): every match in order, as [begin, end) byte offsets.
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                          &err, &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw std::runtime_error(where + ": the regex does not compile at offset " + std::to_string(off) + ": " +
                               reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // the interpreter otherwise
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  template <class Fn>
  void for_each_match(std::string_view s, Fn fn) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    PCRE2_SIZE at = 0;
    while (at < s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at,
                                 PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      if (ov[1] == ov[0]) {  // an empty match: step over one character
        at = ov[0] + 1;
        while (at < s.size() && (static_cast<unsigned char>(s[at]) & 0xC0) == 0x80) ++at;
        continue;
      }
      fn(size_t(ov[0]), size_t(ov[1]));
      at = ov[1];
    }
    pcre2_match_data_free(md);
  }

 private:
  pcre2_code* code_ = nullptr;
};

// One step of the pre-tokenizer on a piece of text: into sub-pieces.
struct SplitStep {
  std::unique_ptr<Regex> re;
  bool isolated_gaps = true;  // Split(Isolated): the text between matches is a piece too
};

// One thread's memory of the pre-tokens it has merged: a piece's ids, kept
// across batches. It forgets everything when it holds max_words pieces or
// 64 MiB of them (24 bytes a slot, two slots a piece, plus its bytes and
// ids), so a corpus of ever new words keeps it bounded.
class WordCache {
 public:
  // The caches of `threads` threads together hold about 2^18 pieces.
  explicit WordCache(size_t threads = 1)
      : max_words_(std::max<size_t>(size_t(1) << 13, (size_t(1) << 18) / threads)),
        slots_(2 * std::bit_ceil(max_words_)) {}

  // The ids of `piece` (a pointer and a count, valid until the next call),
  // made by merge() the first time.
  template <class Merge>
  std::pair<const int32_t*, size_t> ids_of(std::string_view piece, Merge merge) {
    const uint64_t h = hash(piece);
    const size_t mask = slots_.size() - 1;
    size_t i = size_t(h) & mask;
    for (; slots_[i].hash != 0; i = (i + 1) & mask) {
      const Slot& sl = slots_[i];
      if (sl.hash == h && sl.key_len == piece.size() &&
          std::memcmp(keys_.data() + sl.key_off, piece.data(), piece.size()) == 0)
        return {ids_.data() + sl.ids_off, sl.ids_len};
    }
    if (piece.size() > kMaxBytes / 4) {  // not kept: a piece of megabytes is met once
      uncached_ = merge();
      return {uncached_.data(), uncached_.size()};
    }
    if (words_ >= max_words_ || keys_.size() + piece.size() > kMaxBytes) {
      // full: start again (the slot found empty stays right)
      std::fill(slots_.begin(), slots_.end(), Slot{});
      keys_.clear(), ids_.clear(), words_ = 0;
      for (i = size_t(h) & mask; slots_[i].hash != 0; i = (i + 1) & mask) {
      }
    }
    const std::vector<int32_t> m = merge();
    slots_[i] = Slot{h, uint32_t(keys_.size()), uint32_t(piece.size()), uint32_t(ids_.size()), uint32_t(m.size())};
    keys_.append(piece);
    ids_.insert(ids_.end(), m.begin(), m.end());
    ++words_;
    return {ids_.data() + slots_[i].ids_off, m.size()};
  }

 private:
  // Open addressing over one flat array (half full at most), the pieces'
  // bytes and ids in two arenas: a lookup touches one or two cache lines,
  // where a node-based map chased three pointers (a quarter of the encode
  // time went there).
  struct Slot {
    uint64_t hash = 0;  // 0: empty
    uint32_t key_off = 0, key_len = 0, ids_off = 0, ids_len = 0;
  };
  static uint64_t hash(std::string_view s) {  // FNV-1a, then mixed; never 0
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const char c : s) h = (h ^ uint8_t(c)) * 0x100000001b3ULL;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 32;
    return h | 1;
  }
  static constexpr size_t kMaxBytes = size_t(64) << 20;  // of pieces (and of their ids: fewer)
  size_t max_words_, words_ = 0;
  std::vector<Slot> slots_;
  std::vector<int32_t> uncached_;
  std::string keys_;
  std::vector<int32_t> ids_;
};

class HfBpeTokenizer final : public Tokenizer {
 public:
  explicit HfBpeTokenizer(const std::string& path) : path_(path) {
    const json j = read_json();
    try {
      parse(j);
    } catch (const json::exception& e) {  // a field of another JSON type than the reader asks for
      throw std::runtime_error(path_ + ": a field has the wrong JSON type (" + e.what() +
                               "); not a tokenizer.json adgt reads (docs/data-format.md, \"Tokenizers\")");
    }
  }

  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids;
    std::unordered_map<std::string, std::vector<int32_t>> cache;
    for_each_piece(text, [&](int32_t added, std::string_view piece) {
      if (added >= 0) {
        ids.push_back(added);
        return;
      }
      std::string key(piece);
      auto it = cache.find(key);
      if (it == cache.end()) it = cache.emplace(std::move(key), bpe(piece)).first;
      ids.insert(ids.end(), it->second.begin(), it->second.end());
    });
    return ids;
  }

  // Each text on one thread, start to end; a thread's word cache (its
  // pre-tokens and their ids, kept from batch to batch) spares the merging
  // of words it has met. Nothing is shared between the threads while they
  // run, so the work has no serial step and scales with them; a thread
  // merges a word again only after its cache was full and emptied.
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string_view>& texts) const override {
    std::lock_guard<std::mutex> lock(caches_mu_);  // one batch at a time owns the caches
    const size_t threads = size_t(omp_get_max_threads());
    if (caches_.size() < threads) caches_.assign(threads, WordCache(threads));
    std::vector<std::vector<int32_t>> out(texts.size());
    parallel_for(int64_t(texts.size()), 16, [&](int64_t t) {
      WordCache& cache = caches_[size_t(omp_get_thread_num())];
      std::vector<int32_t>& ids = out[size_t(t)];
      for_each_piece(texts[size_t(t)], [&](int32_t added, std::string_view piece) {
        if (added >= 0) {
          ids.push_back(added);
          return;
        }
        const auto [from, n] = cache.ids_of(piece, [&] { return bpe(piece); });
        ids.insert(ids.end(), from, from + n);
      });
    });
    return out;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    const ByteAlphabet& ab = alphabet();
    for (size_t i = 0; i < ids.size(); ++i) {
      const int32_t id = ids[i];
      if (id < 0 || id >= int32_t(tokens_.size()) || (tokens_[size_t(id)].empty() && !is_added(id)))
        throw std::runtime_error(path_ + ": id " + std::to_string(id) + " at position " + std::to_string(i) +
                                 " is not in the vocabulary");
      if (is_added(id)) {
        out += tokens_[size_t(id)];
        continue;
      }
      const std::string& t = tokens_[size_t(id)];
      for (size_t k = 0; k < t.size();) {  // the byte-level characters back to bytes
        uint32_t cp;
        const auto c = static_cast<unsigned char>(t[k]);
        int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : 3;
        cp = len == 1 ? c : len == 2 ? (c & 0x1F) : (c & 0x0F);
        for (int j = 1; j < len && k + size_t(j) < t.size(); ++j) cp = (cp << 6) | (t[k + size_t(j)] & 0x3F);
        const auto b = ab.back.find(cp);
        if (b == ab.back.end())
          throw std::runtime_error(path_ + ": token " + std::to_string(id) + " holds a character outside the " +
                                   "byte-level alphabet");
        out += char(b->second);
        k += size_t(len);
      }
    }
    return out;
  }

  int64_t vocab_size() const override { return int64_t(tokens_.size()); }
  std::string kind() const override { return "hf-bpe"; }
  int32_t eos_id() const override { return eos_; }
  int32_t bos_id() const override { return bos_; }

 private:
  json read_json() const {
    std::ifstream in(path_, std::ios::binary);
    if (!in) throw std::runtime_error(path_ + ": cannot open the tokenizer");
    try {
      return json::parse(in);
    } catch (const json::exception& e) {
      throw std::runtime_error(path_ + ": not a JSON file (" + e.what() + ")");
    }
  }

  [[noreturn]] void refuse(const std::string& key, const std::string& why) const {
    throw std::runtime_error(path_ + ": " + key + ": " + why +
                             " (adgt reads byte-level BPE tokenizer.json files: docs/data-format.md, \"Tokenizers\")");
  }

  void parse(const json& j) {
    if (!j.is_object()) refuse("(top)", "not a JSON object");
    if (j.contains("normalizer") && !j["normalizer"].is_null())
      refuse("normalizer", "type " + j["normalizer"].value("type", std::string("?")) + " is not supported");
    parse_model(j.value("model", json()));
    parse_pre_tokenizer(j.value("pre_tokenizer", json()));
    if (j.contains("added_tokens")) parse_added(j["added_tokens"]);
    find_specials();
  }

  // The added token named `content`, or -1.
  int32_t added_id(const std::string& content) const {
    for (const auto& [c, id] : added_)
      if (c == content) return id;
    return -1;
  }

  // eos/bos: tokenizer_config.json's eos_token/bos_token when that file lies
  // beside this one (a string or {"content": ...}), else the first added
  // token with a name models use for them.
  void find_specials() {
    const auto named = [&](const json& cfg, const char* key) -> int32_t {
      if (!cfg.contains(key)) return -1;
      const json& v = cfg[key];
      if (v.is_string()) return added_id(v.get<std::string>());
      if (v.is_object() && v.contains("content") && v["content"].is_string())
        return added_id(v["content"].get<std::string>());
      return -1;
    };
    std::string dir = path_.substr(0, path_.find_last_of('/') == std::string::npos ? 0 : path_.find_last_of('/') + 1);
    std::ifstream in(dir + "tokenizer_config.json", std::ios::binary);
    if (in) {
      const json cfg = json::parse(in, nullptr, false);
      if (cfg.is_object()) {
        eos_ = named(cfg, "eos_token");
        bos_ = named(cfg, "bos_token");
      }
    }
    for (const char* n : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>"})
      if (eos_ < 0) eos_ = added_id(n);
    for (const char* n : {"<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>"})
      if (bos_ < 0) bos_ = added_id(n);
  }

  void parse_model(const json& m) {
    if (!m.is_object() || m.value("type", std::string()) != "BPE")
      refuse("model.type", "'" + (m.is_object() ? m.value("type", std::string("?")) : std::string("?")) +
                               "' (only BPE)");
    if (m.contains("dropout") && !m["dropout"].is_null()) refuse("model.dropout", "dropout is not supported");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(k) && !m[k].is_null() && !(m[k].is_string() && m[k].get<std::string>().empty()))
        refuse(std::string("model.") + k, "is not supported");
    if (m.value("byte_fallback", false)) refuse("model.byte_fallback", "is not supported (a byte-level model needs none)");
    ignore_merges_ = m.value("ignore_merges", false);
    const json& vocab = m.value("vocab", json());
    if (!vocab.is_object() || vocab.empty()) refuse("model.vocab", "missing or empty");
    for (const auto& [tok, id] : vocab.items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > (int64_t(1) << 24))
        refuse("model.vocab[" + tok + "]", "not an id in [0, 2^24]");
      const auto i = size_t(id.get<int64_t>());
      if (tokens_.size() <= i) tokens_.resize(i + 1);
      tokens_[i] = tok;
      vocab_.emplace(tok, int32_t(i));
    }
    const json& merges = m.value("merges", json::array());
    if (!merges.is_array()) refuse("model.merges", std::string("a JSON ") + merges.type_name() + ", not an array");
    int32_t rank = 0;
    for (const json& mg : merges) {
      std::string a, b;
      if (mg.is_string()) {  // "a b"
        const std::string s = mg.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          refuse("model.merges[" + std::to_string(rank) + "]", "'" + s + "' is not two tokens");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
        a = mg[0].get<std::string>();
        b = mg[1].get<std::string>();
      } else {
        refuse("model.merges[" + std::to_string(rank) + "]", "neither \"a b\" nor [\"a\", \"b\"]");
      }
      const auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
      if (ia == vocab_.end() || ib == vocab_.end() || iab == vocab_.end())
        refuse("model.merges[" + std::to_string(rank) + "]", "'" + a + " " + b + "' merges tokens not in the vocabulary");
      merges_.emplace(pair_key(ia->second, ib->second), std::make_pair(rank, iab->second));
      ++rank;
    }
    const ByteAlphabet& ab = alphabet();
    for (int b = 0; b < 256; ++b) {
      const auto it = vocab_.find(ab.of[b]);
      if (it == vocab_.end())
        refuse("model.vocab", "byte " + std::to_string(b) + " of the byte-level alphabet has no token");
      byte_id_[b] = it->second;
    }
  }

  // ByteLevel's own fields: add_prefix_space must be false (a space
  // prepended to the text) -- supported only when false, as in GPT-2 and
  // Llama 3 files; use_regex chooses the GPT-2 split.
  void byte_level(const json& p, const std::string& key) {
    if (p.value("add_prefix_space", false)) refuse(key + ".add_prefix_space", "true is not supported");
    if (p.value("use_regex", true)) {
      SplitStep s;
      s.re = std::make_unique<Regex>(kByteLevelPattern, path_ + ": " + key);
      s.isolated_gaps = true;
      steps_.push_back(std::move(s));
    }
    byte_level_ = true;
  }

  void split(const json& p, const std::string& key) {
    const json& pat = p.value("pattern", json());
    std::string re;
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      re = pat["Regex"].get<std::string>();
    } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
      const std::string lit = pat["String"].get<std::string>();
      for (char c : lit) {  // the literal, quoted for PCRE2
        if (std::string("\\^$.|?*+()[]{}").find(c) != std::string::npos) re += '\\';
        re += c;
      }
    } else {
      refuse(key + ".pattern", "neither {\"Regex\": ...} nor {\"String\": ...}");
    }
    if (p.value("behavior", std::string()) != "Isolated") refuse(key + ".behavior", "only Isolated is supported");
    if (p.value("invert", false)) refuse(key + ".invert", "true is not supported");
    SplitStep s;
    s.re = std::make_unique<Regex>(re, path_ + ": " + key);
    steps_.push_back(std::move(s));
  }

  void parse_pre_tokenizer(const json& p) {
    if (!p.is_object()) refuse("pre_tokenizer", "missing (a byte-level BPE file has ByteLevel)");
    const std::string type = p.value("type", std::string());
    if (type == "ByteLevel") {
      byte_level(p, "pre_tokenizer");
    } else if (type == "Sequence") {
      const json& list = p.value("pretokenizers", json::array());
      if (!list.is_array())
        refuse("pre_tokenizer.pretokenizers", std::string("a JSON ") + list.type_name() + ", not an array");
      for (size_t i = 0; i < list.size(); ++i) {
        const std::string key = "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]";
        const std::string t = list[i].value("type", std::string());
        if (t == "Split" && !byte_level_) split(list[i], key);
        else if (t == "ByteLevel" && !byte_level_) byte_level(list[i], key);
        else refuse(key + ".type", "'" + t + "' here is not supported (Split steps, then ByteLevel)");
      }
    } else {
      refuse("pre_tokenizer.type", "'" + type + "' is not supported (ByteLevel, or a Sequence of Split and ByteLevel)");
    }
    if (!byte_level_) refuse("pre_tokenizer", "no ByteLevel step: not a byte-level BPE file");
  }

  void parse_added(const json& list) {
    if (!list.is_array()) refuse("added_tokens", std::string("a JSON ") + list.type_name() + ", not an array");
    for (size_t i = 0; i < list.size(); ++i) {
      const json& t = list[i];
      const std::string key = "added_tokens[" + std::to_string(i) + "]";
      if (!t.is_object() || !t.contains("id") || !t.contains("content") || !t["content"].is_string())
        refuse(key, "needs id and content");
      for (const char* k : {"single_word", "lstrip", "rstrip"})
        if (t.value(k, false)) refuse(key + "." + k, "true is not supported");
      const std::string content = t["content"].get<std::string>();
      if (content.empty()) refuse(key + ".content", "empty");
      if (!t["id"].is_number_integer() || t["id"].get<int64_t>() < 0 || t["id"].get<int64_t>() > (int64_t(1) << 24))
        refuse(key + ".id", "not an id in [0, 2^24]");
      const auto id = size_t(t["id"].get<int64_t>());
      if (tokens_.size() <= id) tokens_.resize(id + 1);
      tokens_[id] = content;
      added_.emplace_back(content, int32_t(id));
      if (added_ids_.size() <= id) added_ids_.resize(id + 1, 0);
      added_ids_[id] = 1;
    }
    // Longest first: at a position the longest added token that matches wins.
    std::stable_sort(added_.begin(), added_.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
    for (const auto& a : added_) added_first_[static_cast<unsigned char>(a.first[0])] = 1;
  }

  bool is_added(int32_t id) const { return size_t(id) < added_ids_.size() && added_ids_[size_t(id)]; }

  static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  // Calls fn(added id, "") for each added token and fn(-1, piece) for each
  // pre-token, in text order. The text must be UTF-8: the regexes run
  // without PCRE2's own check (it would rescan the text at every match), and
  // PCRE2 on ill-formed UTF-8 is undefined (a lone 0xFF byte crashed it).
  template <class Fn>
  void for_each_piece(std::string_view text, Fn fn) const {
    if (!data::valid_utf8(text))
      throw std::runtime_error(path_ + ": the text to encode is not valid UTF-8 (a tokenizer.json splits UTF-8 "
                               "text; adgt-data prepare skips such documents as bad records)");
    size_t start = 0;
    const auto plain = [&](std::string_view seg) { split_steps(seg, 0, fn); };
    if (!added_.empty()) {
      for (size_t i = 0; i < text.size();) {
        // Only where some added token begins with this byte (Llama 3 has 256 of them).
        if (!added_first_[static_cast<unsigned char>(text[i])]) {
          ++i;
          continue;
        }
        bool hit = false;
        for (const auto& [content, id] : added_) {
          if (text.compare(i, content.size(), content) == 0) {
            if (i > start) plain(text.substr(start, i - start));
            fn(id, std::string_view());
            i += content.size();
            start = i;
            hit = true;
            break;
          }
        }
        if (!hit) ++i;
      }
    }
    if (start < text.size()) plain(text.substr(start));
  }

  template <class Fn>
  void split_steps(std::string_view seg, size_t step, Fn& fn) const {
    if (seg.empty()) return;
    if (step == steps_.size()) {
      fn(-1, seg);
      return;
    }
    const SplitStep& s = steps_[step];
    size_t last = 0;
    s.re->for_each_match(seg, [&](size_t b, size_t e) {
      if (b > last && s.isolated_gaps) split_steps(seg.substr(last, b - last), step + 1, fn);
      split_steps(seg.substr(b, e - b), step + 1, fn);
      last = e;
    });
    if (last < seg.size()) split_steps(seg.substr(last), step + 1, fn);
  }

  // BPE over one pre-token's bytes.
  std::vector<int32_t> bpe(std::string_view piece) const {
    const ByteAlphabet& ab = alphabet();
    if (ignore_merges_) {
      std::string whole;
      for (unsigned char c : piece) whole += ab.of[c];
      const auto it = vocab_.find(whole);
      if (it != vocab_.end()) return {it->second};
    }
    std::vector<int32_t> sym(piece.size());
    for (size_t i = 0; i < piece.size(); ++i) sym[i] = byte_id_[static_cast<unsigned char>(piece[i])];
    // The pair of lowest rank, leftmost among equals, merged until none is left.
    for (;;) {
      int32_t best_rank = std::numeric_limits<int32_t>::max(), best_id = -1;
      size_t best = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        const auto it = merges_.find(pair_key(sym[i], sym[i + 1]));
        if (it != merges_.end() && it->second.first < best_rank) {
          best_rank = it->second.first;
          best_id = it->second.second;
          best = i;
        }
      }
      if (best_id < 0) break;
      sym[best] = best_id;
      sym.erase(sym.begin() + long(best) + 1);
    }
    return sym;
  }

  std::string path_;
  std::vector<std::string> tokens_;  // id -> token (byte-level characters; an added token's text)
  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (a, b) -> (rank, merged id)
  std::vector<std::pair<std::string, int32_t>> added_;                // longest first
  std::vector<char> added_ids_;
  char added_first_[256] = {};  // bytes an added token begins with
  std::vector<SplitStep> steps_;
  bool byte_level_ = false, ignore_merges_ = false;
  int32_t eos_ = -1, bos_ = -1;
  int32_t byte_id_[256] = {};
  mutable std::mutex caches_mu_;
  mutable std::vector<WordCache> caches_;  // one per OpenMP thread (encode_batch)
};

}  // namespace

bool is_hf_tokenizer_spec(const std::string& spec) {
  return spec.size() >= 5 && spec.compare(spec.size() - 5, 5, ".json") == 0;
}

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path) {
  return std::make_unique<HfBpeTokenizer>(path);
}

}  // namespace adgt

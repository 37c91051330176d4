// The data pipeline: token shards, the train/val split, the sampler, and the
// tokenizers. References are independent: shard bytes are checked against the
// documented layout by hand, SentencePiece encodings against the library's own
// processor, sampler windows against the arithmetic of the definition.
#include <sentencepiece_processor.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/data/sampler.hpp"
#include "core/data/token_shard.hpp"
#include "core/data/tokenizer.hpp"

namespace fs = std::filesystem;
using namespace adgt;
using Catch::Matchers::Contains;

namespace {

// A fresh directory per test case (ctest may run cases in parallel).
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::path(ADGT_BINARY_DIR) / "tmp" / "data_test" / name) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
template <class T>
T get(const std::string& bytes, size_t off) {
  T v;
  std::memcpy(&v, bytes.data() + off, sizeof v);
  return v;
}
template <class T>
void put(std::string& bytes, size_t off, T v) {
  std::memcpy(bytes.data() + off, &v, sizeof v);
}

// Shard whose token j is j % vocab: window contents are predictable.
std::string make_ramp_shard(const TempDir& d, int64_t n, int64_t vocab,
                            const char* name = "ramp.bin") {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) t[j] = static_cast<int32_t>(j % vocab);
  write_token_shard(d.file(name), t, vocab);
  return d.file(name);
}

// A deterministic pseudo-English text with UTF-8, runs of spaces, tabs, blank lines.
std::string generated_text(size_t bytes, uint32_t seed) {
  static const char* ascii[] = {"ka", "lo", "mi", "ra", "the", "and", "en", "tor", "vi", "su"};
  static const char* utf8[] = {"\xc3\xa9", "\xe6\x97\xa5", "\xf0\x9f\x99\x82"};  // é 日 🙂
  std::mt19937 rng(seed);
  std::string s;
  while (s.size() < bytes) {
    const int words = 3 + rng() % 12;
    for (int w = 0; w < words; ++w) {
      const int n = 1 + rng() % 3;
      for (int k = 0; k < n; ++k) {
        const uint32_t r = rng() % 100;
        s += r < 97 ? ascii[r % 10] : utf8[r - 97];  // some multi-byte UTF-8
      }
      const uint32_t p = rng() % 20;
      s += p == 0 ? ",  " : p == 1 ? ". " : p == 2 ? "\t" : " ";
    }
    s += rng() % 6 == 0 ? "\n\n" : "\n";
  }
  return s;
}

}  // namespace

// ---------------------------------------------------------------- token shards

TEST_CASE("token shard: uint16 round trip and the documented header bytes", "[data]") {
  TempDir d("shard_u16");
  const std::vector<int32_t> toks = {0, 1, 2, 65535, 300, 7, 65534, 0};
  write_token_shard(d.file("a.bin"), toks, 65536);
  const std::string raw = slurp(d.file("a.bin"));
  REQUIRE(raw.size() == 64 + 2 * toks.size());
  CHECK(std::memcmp(raw.data(), "ADGTTOK\0", 8) == 0);
  CHECK(get<uint32_t>(raw, 8) == 1);
  CHECK(get<uint32_t>(raw, 12) == 1);
  CHECK(get<uint64_t>(raw, 16) == toks.size());
  CHECK(get<uint64_t>(raw, 24) == 65536);
  for (size_t i = 32; i < 64; ++i) CHECK(raw[i] == 0);
  CHECK(get<uint16_t>(raw, 64 + 2 * 3) == 65535);

  const TokenShard s(d.file("a.bin"));
  CHECK(s.size() == static_cast<int64_t>(toks.size()));
  CHECK(s.vocab_size() == 65536);
  CHECK(s.dtype_name() == std::string("uint16"));
  CHECK(s.path() == d.file("a.bin"));
  std::vector<int32_t> all(toks.size());
  s.read(0, s.size(), all.data());
  CHECK(all == toks);
  int32_t mid[3];
  s.read(3, 3, mid);
  CHECK(mid[0] == 65535);
  CHECK(mid[1] == 300);
  CHECK(mid[2] == 7);
  s.read(s.size(), 0, mid);  // empty read at the end is fine
}

TEST_CASE("token shard: uint32 round trip for vocab > 65536", "[data]") {
  TempDir d("shard_u32");
  std::vector<int32_t> toks(1000);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<int32_t>((i * 7919) % 100000);
  toks[5] = 99999;
  toks[6] = 65536;
  write_token_shard(d.file("b.bin"), toks, 100000);
  const std::string raw = slurp(d.file("b.bin"));
  REQUIRE(raw.size() == 64 + 4 * toks.size());
  CHECK(get<uint32_t>(raw, 12) == 2);
  CHECK(get<uint32_t>(raw, 64 + 4 * 6) == 65536);
  TokenShard s(d.file("b.bin"));
  CHECK(s.dtype_name() == std::string("uint32"));
  std::vector<int32_t> back(toks.size());
  s.read(0, s.size(), back.data());
  CHECK(back == toks);

  // Move-only: the moved-to shard keeps working, the moved-from one is empty.
  TokenShard t = std::move(s);
  CHECK(t.size() == 1000);
  int32_t one;
  t.read(5, 1, &one);
  CHECK(one == 99999);
  CHECK(s.size() == 0);
}

TEST_CASE("token shard: empty shard, bad tokens and out-of-range reads", "[data]") {
  TempDir d("shard_edges");
  write_token_shard(d.file("empty.bin"), {}, 256);
  const TokenShard e(d.file("empty.bin"));
  CHECK(e.size() == 0);
  CHECK(token_dtype_for_vocab(65536) == kTokenDtypeU16);
  CHECK(token_dtype_for_vocab(65537) == kTokenDtypeU32);

  CHECK_THROWS_WITH(write_token_shard(d.file("bad.bin"), {1, 256}, 256),
                    Contains("bad.bin") && Contains("256"));
  CHECK_THROWS_WITH(write_token_shard(d.file("bad.bin"), {-1}, 256), Contains("bad.bin"));
  CHECK_FALSE(fs::exists(d.file("bad.bin")));

  write_token_shard(d.file("s.bin"), {1, 2, 3}, 10);
  const TokenShard s(d.file("s.bin"));
  int32_t buf[4];
  CHECK_THROWS_WITH(s.read(2, 2, buf), Contains("s.bin"));
  CHECK_THROWS(s.read(-1, 1, buf));
  CHECK_THROWS(s.read(0, -1, buf));
  CHECK_THROWS(s.read(4, 0, buf));
}

TEST_CASE("token shard: version 2 keeps the document index; damaged indexes are named", "[data]") {
  TempDir d("shard_v2");
  std::vector<int32_t> toks(50);
  std::iota(toks.begin(), toks.end(), 0);
  write_token_shard(d.file("v2.bin"), toks, 70000, {0, 7, 30});  // uint32 tokens
  const TokenShard s(d.file("v2.bin"));
  CHECK(s.size() == 50);
  CHECK(s.document_starts() == std::vector<int64_t>{0, 7, 30});
  std::vector<int32_t> got(50);
  s.read(0, 50, got.data());
  CHECK(got == toks);
  const std::string raw = slurp(d.file("v2.bin"));
  CHECK(raw.size() == 64 + 50 * 4 + 3 * 8);
  CHECK(get<uint32_t>(raw, 8) == 2);
  CHECK(get<uint64_t>(raw, 32) == 3);
  // Without starts: version 1, one document.
  write_token_shard(d.file("v1.bin"), toks, 1000);
  CHECK(get<uint32_t>(slurp(d.file("v1.bin")), 8) == 1);
  CHECK(TokenShard(d.file("v1.bin")).document_starts() == std::vector<int64_t>{0});
  CHECK_THROWS_WITH(write_token_shard(d.file("bad.bin"), toks, 1000, {0, 9, 9}), Contains("not ascending"));
  CHECK_THROWS_WITH(write_token_shard(d.file("bad.bin"), toks, 1000, {3}), Contains("not ascending"));
  std::string b = raw;
  put<int64_t>(b, 64 + 50 * 4 + 8, 60);  // a start past the tokens
  spit(d.file("past.bin"), b);
  CHECK_THROWS_WITH(TokenShard(d.file("past.bin")), Contains("past.bin") && Contains("document index entry 1"));
  spit(d.file("cut.bin"), raw.substr(0, raw.size() - 8));
  CHECK_THROWS_WITH(TokenShard(d.file("cut.bin")), Contains("cut.bin"));
}

TEST_CASE("token shard: corrupt or truncated files are rejected, naming the file", "[data]") {
  TempDir d("shard_corrupt");
  std::vector<int32_t> toks(100);
  std::iota(toks.begin(), toks.end(), 0);
  write_token_shard(d.file("good.bin"), toks, 1000);
  const std::string good = slurp(d.file("good.bin"));

  auto with = [&](const std::string& name, const std::string& bytes) {
    spit(d.file(name), bytes);
    return d.file(name);
  };
  std::string b = good;
  b[0] = 'X';
  const std::string magic = with("magic.bin", b);
  CHECK_THROWS_WITH(TokenShard(magic), Contains("magic.bin") && Contains("magic"));

  b = good;
  put<uint32_t>(b, 8, 3);
  const std::string version = with("version.bin", b);
  CHECK_THROWS_WITH(TokenShard(version), Contains("version.bin") && Contains("version 3"));
  b = good;
  put<uint32_t>(b, 8, 2);  // version 2 promises a document index
  const std::string noindex = with("noindex.bin", b);
  CHECK_THROWS_WITH(TokenShard(noindex), Contains("noindex.bin") && Contains("without a document index"));

  b = good;
  put<uint32_t>(b, 12, 3);
  const std::string dtype = with("dtype.bin", b);
  CHECK_THROWS_WITH(TokenShard(dtype), Contains("dtype.bin") && Contains("dtype"));

  b = good;
  put<uint32_t>(b, 12, 2);  // says uint32, but holds 100 uint16 tokens
  const std::string wrong_width = with("width.bin", b);
  CHECK_THROWS_WITH(TokenShard(wrong_width), Contains("width.bin") && Contains("truncated"));

  const std::string trunc = with("trunc.bin", good.substr(0, good.size() - 1));
  CHECK_THROWS_WITH(TokenShard(trunc), Contains("trunc.bin") && Contains("truncated"));

  const std::string extra = with("extra.bin", good + "xx");
  CHECK_THROWS_WITH(TokenShard(extra), Contains("extra.bin"));

  const std::string header = with("header.bin", good.substr(0, 40));
  CHECK_THROWS_WITH(TokenShard(header), Contains("header.bin") && Contains("64-byte header"));

  CHECK_THROWS_WITH(TokenShard(d.file("missing.bin")), Contains("missing.bin"));
  CHECK_NOTHROW(TokenShard(d.file("good.bin")));

  // A header vocabulary below the ids: the ids are checked as they are read.
  b = good;
  put<uint64_t>(b, 24, 50);
  const TokenShard low(with("low_vocab.bin", b));
  std::vector<int32_t> out(100);
  CHECK_NOTHROW(low.read(0, 50, out.data()));
  CHECK_THROWS_WITH(low.read(40, 20, out.data()),
                    Contains("low_vocab.bin") && Contains("token 50 has id 50") && Contains("vocab size 50"));
}

// ---------------------------------------------------------------- split rule

TEST_CASE("split_text: contiguous blocks at line ends, every k-th to val", "[data]") {
  const std::string text = generated_text(300000, 7);
  const TextSplit sp = split_text(text, 0.05);
  CHECK(sp.k == 20);
  CHECK(sp.block_bytes == (static_cast<int64_t>(text.size()) + 79) / 80);
  REQUIRE(sp.blocks.size() >= 40);
  size_t pos = 0, val_bytes = 0;
  for (size_t b = 0; b < sp.blocks.size(); ++b) {
    const auto& blk = sp.blocks[b];
    CHECK(blk.begin == pos);
    CHECK(blk.end > blk.begin);
    if (blk.end < text.size()) CHECK(text[blk.end - 1] == '\n');
    CHECK(blk.val == (b % 20 == 19));
    if (blk.val) val_bytes += blk.end - blk.begin;
    pos = blk.end;
  }
  CHECK(pos == text.size());
  const double frac = double(val_bytes) / double(text.size());
  CHECK(frac > 0.03);
  CHECK(frac < 0.07);

  const TextSplit none = split_text(text, 0.0);
  CHECK(none.k == 0);
  CHECK(std::none_of(none.blocks.begin(), none.blocks.end(), [](auto& b) { return b.val; }));
  // A small text still gets a validation block.
  const TextSplit small = split_text(generated_text(3000, 1), 0.05);
  CHECK(std::any_of(small.blocks.begin(), small.blocks.end(), [](auto& b) { return b.val; }));
  CHECK_THROWS_WITH(split_text(text, 0.7), Contains("--val-fraction"));
  CHECK_THROWS(split_text(text, -0.1));
}

// ---------------------------------------------------------------- sampler

TEST_CASE("sampler: every window exactly once per epoch, for many window counts", "[data]") {
  TempDir d("sampler_perm");
  for (int64_t W : {1, 2, 3, 4, 5, 7, 16, 17, 100, 1000, 4097}) {
    const int64_t seq = 3;
    const std::string path = make_ramp_shard(d, W * seq + 1 + (W % 3), 50000);  // leftover < seq
    const TokenShard shard(path);
    const Sampler s(shard, seq, 42);
    REQUIRE(s.windows_per_epoch() == W);
    for (int64_t e = 0; e < 3; ++e) {
      std::vector<int64_t> seen;
      for (int64_t p = 0; p < W; ++p) seen.push_back(s.window_of(e * W + p));
      std::sort(seen.begin(), seen.end());
      std::vector<int64_t> all(W);
      std::iota(all.begin(), all.end(), 0);
      INFO("W=" << W << " epoch " << e);
      CHECK(seen == all);
    }
  }
}

TEST_CASE("sampler: samples are the defined windows, orders differ by seed and epoch", "[data]") {
  TempDir d("sampler_order");
  const int64_t seq = 8, V = 60000;
  const TokenShard shard(make_ramp_shard(d, 1000 * seq + 5, V));
  const Sampler a(shard, seq, 1), b(shard, seq, 2);
  const int64_t W = a.windows_per_epoch();
  REQUIRE(W == 1000);
  std::vector<int32_t> out(seq + 1);
  for (int64_t i : {0, 1, 999, 1000, 123456}) {
    a.sample(i, out.data());
    const int64_t w = a.window_of(i);
    for (int64_t j = 0; j <= seq; ++j) CHECK(out[j] == (w * seq + j) % V);
  }
  auto order = [&](const Sampler& s, int64_t epoch) {
    std::vector<int64_t> o;
    for (int64_t p = 0; p < W; ++p) o.push_back(s.window_of(epoch * W + p));
    return o;
  };
  const auto a0 = order(a, 0), a1 = order(a, 1), b0 = order(b, 0);
  CHECK(a0 != a1);
  CHECK(a0 != b0);
  // Shuffled, not a rotation of the identity: few fixed points, few +1 steps.
  int fixed = 0, steps = 0;
  for (int64_t p = 0; p < W; ++p) {
    fixed += a0[p] == p;
    if (p) steps += a0[p] == a0[p - 1] + 1;
  }
  CHECK(fixed < 20);
  CHECK(steps < 20);
}

TEST_CASE("sampler: a pure function of (seed, index), whatever the reader layout", "[data]") {
  TempDir d("sampler_pure");
  const int64_t seq = 16;
  const TokenShard shard(make_ramp_shard(d, 37 * seq + 9, 65536));
  const TokenShard again(shard.path());
  const Sampler one(shard, seq, 1234), two(again, seq, 1234);
  const int64_t N = 5 * one.windows_per_epoch() + 3;
  std::vector<std::vector<int32_t>> single(N, std::vector<int32_t>(seq + 1));
  for (int64_t i = 0; i < N; ++i) {
    one.sample(i, single[i].data());
    CHECK(one.window_of(i) == two.window_of(i));
  }
  for (int64_t n : {2, 3, 4, 8}) {
    std::vector<std::vector<int32_t>> merged(N);
    for (int64_t r = 0; r < n; ++r) {
      const Sampler rank(shard, seq, 1234);  // each rank builds its own
      for (int64_t i = r; i < N; i += n) {
        merged[i].resize(seq + 1);
        rank.sample(i, merged[i].data());
      }
    }
    INFO("n=" << n);
    CHECK(merged == single);
  }
}

TEST_CASE("sampler and eval windows: short shards and bounds", "[data]") {
  TempDir d("sampler_short");
  const TokenShard tiny(make_ramp_shard(d, 8, 100, "tiny.bin"));
  CHECK_THROWS_WITH(Sampler(tiny, 8, 1), Contains("tiny.bin") && Contains("seq_len"));
  const Sampler exact(tiny, 7, 1);  // 8 tokens = one window of 7+1
  CHECK(exact.windows_per_epoch() == 1);
  CHECK(exact.window_of(5) == 0);
  CHECK_THROWS(exact.window_of(-1));

  const TokenShard val(make_ramp_shard(d, 4 * 10 + 3, 1000, "val.bin"));
  CHECK(num_eval_windows(val, 10) == 4);
  CHECK(num_eval_windows(tiny, 8) == 0);
  std::vector<int32_t> out(11);
  for (int64_t i = 0; i < 4; ++i) {
    eval_window(val, 10, i, out.data());
    for (int64_t j = 0; j <= 10; ++j) CHECK(out[j] == i * 10 + j);
  }
  CHECK_THROWS_WITH(eval_window(val, 10, 4, out.data()), Contains("val.bin"));
  CHECK_THROWS(eval_window(val, 10, -1, out.data()));
}

// ---------------------------------------------------------------- tokenizers

TEST_CASE("byte tokenizer: round-trips arbitrary bytes", "[data]") {
  const auto tok = Tokenizer::load("byte");
  CHECK(tok->kind() == "byte");
  CHECK(tok->vocab_size() == 256);
  std::string all;
  for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
  const auto ids = tok->encode(all);
  REQUIRE(ids.size() == 256);
  for (int c = 0; c < 256; ++c) CHECK(ids[c] == c);
  CHECK(tok->decode(ids) == all);
  std::mt19937 rng(3);
  std::string junk(5000, '\0');
  for (auto& ch : junk) ch = static_cast<char>(rng());
  CHECK(tok->decode(tok->encode(junk)) == junk);
  const auto batch = tok->encode_batch({all, junk, ""});
  CHECK(batch[1] == tok->encode(junk));
  CHECK(batch[2].empty());
  CHECK_THROWS(tok->decode({256}));
  CHECK_THROWS(tok->decode({-1}));
}

TEST_CASE("sentencepiece: trained model round-trips text and matches the library", "[data]") {
  TempDir d("sentencepiece");
  const std::string corpus = generated_text(200000, 11);
  spit(d.file("corpus.txt"), corpus);
  train_sentencepiece(d.file("corpus.txt"), d.file("m"), 400);
  REQUIRE(fs::exists(d.file("m.model")));
  REQUIRE(fs::exists(d.file("m.vocab")));

  const auto tok = Tokenizer::load(d.file("m.model"));
  CHECK(tok->kind() == "sentencepiece");
  CHECK(tok->vocab_size() == 400);
  CHECK(uses_word_cache(*tok));

  sentencepiece::SentencePieceProcessor ref;
  REQUIRE(ref.Load(d.file("m.model")).ok());
  const std::vector<std::string> samples = {
      corpus.substr(0, 20000),
      generated_text(5000, 99),  // unseen text from the same source
      "  leading spaces, trailing spaces   \n\n\ttabs\tand\r\nCRLF\n",
      "unseen: \xce\xa9mega \xe2\x9c\x93 \xf0\x9d\x84\x9e 12345 x",  // Ωmega ✓ 𝄞
      "",
      "\n",
  };
  for (const auto& s : samples) {
    const auto ids = tok->encode(s);
    INFO("text: " << s.substr(0, 60));
    CHECK(tok->decode(ids) == s);
    const auto lib = ref.EncodeAsIds(s);
    CHECK(std::vector<int32_t>(lib.begin(), lib.end()) == ids);
    for (int32_t id : ids) CHECK((id >= 0 && id < tok->vocab_size()));
  }
  std::vector<std::string_view> views(samples.begin(), samples.end());
  const auto batch = tok->encode_batch(views);
  for (size_t i = 0; i < samples.size(); ++i) CHECK(batch[i] == tok->encode(samples[i]));
  // It compresses the training text (merges were learned).
  CHECK(tok->encode(samples[0]).size() * 2 < samples[0].size());
  CHECK_THROWS(tok->decode({400}));

  // Deterministic: training again gives the same pieces.
  train_sentencepiece(d.file("corpus.txt"), d.file("m2"), 400);
  CHECK(slurp(d.file("m.vocab")) == slurp(d.file("m2.vocab")));
}

TEST_CASE("sentencepiece: errors name the file or the vocab size", "[data]") {
  TempDir d("sentencepiece_errors");
  spit(d.file("c.txt"), generated_text(2000, 1));
  CHECK_THROWS_WITH(train_sentencepiece(d.file("c.txt"), d.file("m"), 100),
                    Contains("vocab size 100"));
  CHECK_THROWS_WITH(train_sentencepiece(d.file("nope.txt"), d.file("m"), 400),
                    Contains("nope.txt"));
  spit(d.file("blank.txt"), "  \n\n \n");
  CHECK_THROWS_WITH(train_sentencepiece(d.file("blank.txt"), d.file("m"), 400),
                    Contains("blank.txt"));
  CHECK_THROWS_WITH(Tokenizer::load(d.file("nope.model")), Contains("nope.model"));
  spit(d.file("junk.model"), "not a model");
  CHECK_THROWS_WITH(Tokenizer::load(d.file("junk.model")), Contains("junk.model"));
}

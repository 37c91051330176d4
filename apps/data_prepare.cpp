// adgt-data prepare: the pieces its two paths share (data_prepare.hpp).
#include "apps/data_prepare.hpp"

#include <cstdio>
#include <fstream>
#include <stdexcept>

#include "core/data/hf_tokenizer.hpp"
#include "core/data/tokenizer.hpp"

namespace adgt_data {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

std::string hex64(uint64_t v) {
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(v));
  return hash;
}

void report_skipped(const std::vector<std::string>& passed, const std::vector<adgt::data::BadRecord>& bad,
                    const fs::path& dir) {
  if (!passed.empty())
    std::fprintf(stderr, "adgt-data: note: %zu file(s) of no known format left out (the first: %s)\n",
                 passed.size(), passed.front().c_str());
  const fs::path bad_path = dir / "bad_records.txt";
  std::error_code ec;
  if (bad.empty()) {
    fs::remove(bad_path, ec);
    return;
  }
  std::ofstream out(bad_path);
  for (const adgt::data::BadRecord& b : bad) out << b.file << ":" << b.line << ": " << b.why << "\n";
  std::fprintf(stderr, "adgt-data: warning: %s; all of them in %s\n", adgt::data::bad_summary(bad).c_str(),
               bad_path.string().c_str());
}

// Checks the tokenizer arguments before any work (the vocab size is in range,
// or the tokenizer is "byte" or a file), then creates --out.
void check_tokenizer_args(const PrepareArgs& a) {
  std::error_code ec;
  if (a.tokenizer.empty()) {
    if (a.vocab_size < adgt::kMinSentencePieceVocab || a.vocab_size > adgt::kMaxSentencePieceVocab)
      throw std::runtime_error(
          "--vocab-size " + std::to_string(a.vocab_size) + " is out of range; use a value in [" +
          std::to_string(adgt::kMinSentencePieceVocab) + ", " +
          std::to_string(adgt::kMaxSentencePieceVocab) + "], or --tokenizer byte");
  } else if (a.tokenizer != "byte" && !fs::is_regular_file(a.tokenizer, ec)) {
    throw std::runtime_error("--tokenizer '" + a.tokenizer +
                             "' is not a file; pass a SentencePiece .model, a HuggingFace tokenizer.json "
                             "or \"byte\"");
  }
  fs::create_directories(a.out, ec);
  if (ec)
    throw std::runtime_error("--out '" + a.out + "': cannot create directory: " + ec.message());
}

TokenizerChoice given_tokenizer(const PrepareArgs& a, const fs::path& dir) {
  std::error_code ec;
  TokenizerChoice t;
  const fs::path model_dst = dir / "tokenizer.model", vocab_dst = dir / "tokenizer.vocab";
  if (a.tokenizer == "byte") {
    t.spec = "byte";
    t.meta = {{"kind", "byte"}, {"path", "byte"}, {"trained", false}};
    fs::remove(model_dst, ec);  // no stale model from an earlier run beside byte shards
    fs::remove(vocab_dst, ec);
  } else if (adgt::is_hf_tokenizer_spec(a.tokenizer)) {
    // A tokenizer.json, copied into dir under that name (no .model beside it).
    adgt::Tokenizer::load(a.tokenizer);  // fail here, naming the original and the key
    const fs::path json_dst = dir / "tokenizer.json";
    if (!fs::exists(json_dst) || !fs::equivalent(a.tokenizer, json_dst)) {
      fs::copy_file(a.tokenizer, json_dst, fs::copy_options::overwrite_existing, ec);
      if (ec)
        throw std::runtime_error("cannot copy --tokenizer '" + a.tokenizer + "' to '" + json_dst.string() +
                                 "': " + ec.message());
      // tokenizer_config.json names the end and beginning tokens: it goes along.
      const fs::path cfg_src = fs::path(a.tokenizer).parent_path() / "tokenizer_config.json";
      if (fs::is_regular_file(cfg_src, ec))
        fs::copy_file(cfg_src, dir / "tokenizer_config.json", fs::copy_options::overwrite_existing, ec);
      else
        fs::remove(dir / "tokenizer_config.json", ec);
    }
    fs::remove(model_dst, ec);
    fs::remove(vocab_dst, ec);
    t.spec = json_dst.string();
    t.meta = {{"kind", "hf-bpe"}, {"path", t.spec}, {"trained", false}, {"copied_from", a.tokenizer}};
  } else if (!a.tokenizer.empty()) {
    adgt::Tokenizer::load(a.tokenizer);  // fail here, naming the original, if it is not a model
    if (!fs::exists(model_dst) || !fs::equivalent(a.tokenizer, model_dst)) {
      fs::copy_file(a.tokenizer, model_dst, fs::copy_options::overwrite_existing, ec);
      if (ec)
        throw std::runtime_error("cannot copy --tokenizer '" + a.tokenizer + "' to '" +
                                 model_dst.string() + "': " + ec.message());
      const fs::path vocab_src = fs::path(a.tokenizer).replace_extension(".vocab");
      if (fs::is_regular_file(vocab_src, ec))
        fs::copy_file(vocab_src, vocab_dst, fs::copy_options::overwrite_existing, ec);
      else
        fs::remove(vocab_dst, ec);
    }
    t.spec = model_dst.string();
    t.meta = {{"kind", "sentencepiece"},
              {"path", t.spec},
              {"trained", false},
              {"copied_from", a.tokenizer}};
  }
  return t;
}

TokenizerChoice trained_tokenizer(const PrepareArgs& a, const fs::path& dir) {
  TokenizerChoice t;
  t.spec = (dir / "tokenizer").string() + ".model";
  t.meta = {{"kind", "sentencepiece"},
            {"path", t.spec},
            {"trained", true},
            {"vocab_size_requested", a.vocab_size},
            {"model_type", "bpe"}};
  return t;
}

void write_meta(const std::string& path, const nlohmann::json& meta) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream mf(tmp);
    mf << meta.dump(2) << "\n";
    if (!mf) throw std::runtime_error("cannot write '" + tmp + "'");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw std::runtime_error("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
}

}  // namespace adgt_data

// adgt-data prepare: the pieces its two paths share (apps/adgt_data.cpp: one
// document, split into blocks; apps/data_prepare_stream.cpp: several
// documents, streamed). docs/data-format.md.
#pragma once
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/data/text_sources.hpp"
#include "core/data/token_shard.hpp"

namespace adgt_data {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0);
uint64_t fnv1a64(std::string_view s);
std::string hex64(uint64_t v);

struct PrepareArgs {
  std::vector<std::string> inputs;  // files, directories, globs (core/data/text_sources.hpp)
  std::string input;                // how the inputs are named in messages
  std::string out, tokenizer;
  int vocab_size = 4096;
  double val_fraction = 0.05;
  adgt::data::SourceOptions source;
  std::string on_bad_record = "skip";
  bool eos = true, bos = false;  // documents: end (and begin) each with the tokenizer's token
  int workers = 0;               // encoding threads (0: OpenMP's default, every core)
  std::string progress = "auto";  // auto, bar, lines, off (core/data/prepare/progress_meter.hpp)
  bool resume = false;            // go on from DIR/prepare.journal.jsonl
  bool force = false;             // start over even when DIR holds an unfinished prepare
};

// Says what was passed over and skipped: on stderr, and every bad record in
// DIR/bad_records.txt ("FILE:LINE: why"; removed when there is none).
void report_skipped(const std::vector<std::string>& passed, const std::vector<adgt::data::BadRecord>& bad,
                    const fs::path& dir);

// Checks the tokenizer arguments before any work (the vocab size is in range,
// or the tokenizer is "byte" or a file), then creates --out.
void check_tokenizer_args(const PrepareArgs& a);

// The tokenizer the shards are written with: its spec (for Tokenizer::load)
// and its entry in meta.json.
struct TokenizerChoice {
  std::string spec;
  nlohmann::json meta;
};

// "byte", or a given SentencePiece model or tokenizer.json, copied into dir
// (with what goes along). Without --tokenizer: nothing (train one and call
// trained_tokenizer).
TokenizerChoice given_tokenizer(const PrepareArgs& a, const fs::path& dir);
// The entry of a SentencePiece model just trained into DIR/tokenizer.model.
TokenizerChoice trained_tokenizer(const PrepareArgs& a, const fs::path& dir);

// meta.json, written whole or not at all (a .tmp renamed into place).
void write_meta(const std::string& path, const nlohmann::json& meta);

// The streamed path: several documents (docs/data-format.md, "Documents"
// and "Streaming and --resume").
int prepare_documents(const PrepareArgs& a, const adgt::data::Inputs& in, Clock::time_point t_start);

}  // namespace adgt_data

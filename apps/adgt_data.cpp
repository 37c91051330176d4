// adgt-data: text -> tokenizer + token shards (docs/data-format.md).
//
//   adgt-data prepare --input PATH [PATH ...] --out DIR [--vocab-size 4096 | --tokenizer MODEL|byte]
//                     [--val-fraction 0.05] [--text-field text] [--split-on-blank-lines]
//                     [--on-bad-record skip|fail] [--workers N] [--progress auto|bar|lines|off]
//                     [--resume | --force]
//   adgt-data encode  --tokenizer SPEC --text "..."       ids, one line
//   adgt-data decode  --tokenizer SPEC --ids "1 2 3"      text
//   adgt-data info    --shard FILE [--head N]             header (+ first N tokens)
//   adgt-data order   --shard FILE --seq-len T --seed S [--start I] [--count N]
//                                                         windows samples I.. read
#include <CLI/CLI.hpp>

#include "apps/cli_parse.hpp"
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/data/hf_tokenizer.hpp"
#include "core/data/sampler.hpp"
#include "core/data/text_sources.hpp"
#include "core/data/token_shard.hpp"
#include "core/data/tokenizer.hpp"

#include "apps/data_prepare.hpp"
#include "core/data/prepare/journal.hpp"
#include "core/data/prepare/progress_meter.hpp"

using namespace adgt_data;

namespace {

// A corpus of at most one document: its text (split into blocks as a text
// file always was), with what was read and what was skipped.
struct Corpus {
  std::string text;
  std::vector<std::string> files, passed;
  int64_t documents = 0, empty = 0;
  std::vector<adgt::data::BadRecord> bad;
  std::string bad_summary;
};

struct SecondDocument {};  // thrown to stop reading: the corpus has several documents

// Reads the inputs until a second document turns up: then nothing (the
// streamed path reads them); else the corpus of the one document (or none).
std::optional<Corpus> read_single_document(const PrepareArgs& a, const adgt::data::Inputs& in) {
  Corpus c;
  c.files = in.files;
  c.passed = in.passed;
  adgt::data::SourceOptions o = a.source;
  o.fail_on_bad = a.on_bad_record == "fail";
  adgt::data::DocumentSource src(o);
  try {
    for (const std::string& f : c.files)
      src.read(f, [&](std::string_view d) {
        if (src.documents() > 1) throw SecondDocument{};
        c.text = d;
      });
  } catch (const SecondDocument&) {
    return std::nullopt;
  }
  c.documents = src.documents();
  c.empty = src.empty();
  c.bad = src.bad();
  c.bad_summary = src.bad_summary();
  return c;
}

// The tokenizer of one document split into blocks: given, or a BPE model
// trained on the training blocks of `text` only (the tokenizer never sees
// validation text).
TokenizerChoice make_tokenizer(const PrepareArgs& a, const fs::path& dir, const std::string& text,
                               const adgt::TextSplit& split) {
  if (!a.tokenizer.empty()) return given_tokenizer(a, dir);
  std::string train_text;
  train_text.reserve(text.size());
  for (const auto& b : split.blocks)
    if (!b.val) train_text.append(text, b.begin, b.end - b.begin);
  const std::string prefix = (dir / "tokenizer").string();
  std::printf("training SentencePiece BPE (vocab %d) on %zu bytes of %s ...\n", a.vocab_size,
              train_text.size(), a.input.c_str());
  std::fflush(stdout);
  adgt::train_sentencepiece_text(train_text, prefix, a.vocab_size, a.input);
  return trained_tokenizer(a, dir);
}

// The token ids of the training and validation blocks, and the text bytes
// behind each.
struct EncodedSplit {
  std::vector<int32_t> train, val;
  size_t train_bytes = 0, val_bytes = 0, val_blocks = 0;
  std::vector<int32_t> first_ids;  // block 0's ids, for the lossless check
};

// The text of block b.
std::string_view block_text(const std::string& text, const adgt::TextSplit& split, size_t b) {
  return std::string_view(text).substr(split.blocks[b].begin, split.blocks[b].end - split.blocks[b].begin);
}

// Encodes the blocks in parallel and appends each to its side of the split.
EncodedSplit encode_split(const adgt::Tokenizer& tok, const std::string& text, const adgt::TextSplit& split) {
  std::vector<std::string_view> pieces;
  for (size_t b = 0; b < split.blocks.size(); ++b) pieces.push_back(block_text(text, split, b));
  auto encoded = tok.encode_batch(pieces);
  EncodedSplit out;
  for (size_t i = 0; i < encoded.size(); ++i) {
    auto& dst = split.blocks[i].val ? out.val : out.train;
    dst.insert(dst.end(), encoded[i].begin(), encoded[i].end());
    (split.blocks[i].val ? out.val_bytes : out.train_bytes) += pieces[i].size();
    out.val_blocks += split.blocks[i].val;
  }
  out.first_ids = std::move(encoded.front());
  return out;
}

// meta.json: the source, tokenizer, dtype, the split's rule and both shards.
nlohmann::json prepare_meta(const PrepareArgs& a, const Corpus& corpus, const adgt::TextSplit& split,
                            const nlohmann::json& tok_meta, int64_t vocab, bool lossless, const EncodedSplit& enc,
                            const std::string& train_path, const std::string& val_path) {
  const std::string& text = corpus.text;
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(fnv1a64(text)));
  nlohmann::json source = {{"path", a.input}, {"bytes", text.size()}, {"fnv1a64", hash}};
  if (corpus.files.size() > 1 || corpus.documents > 1 || !corpus.bad.empty()) {
    source["files"] = corpus.files;
    source["documents"] = corpus.documents;
    source["bad_records"] = corpus.bad.size();
    source["joined_by"] = "a blank line between documents";
  }
  return {
      {"format", "adgt token shard v1 (docs/data-format.md)"},
      {"source", source},
      {"tokenizer", tok_meta},
      {"vocab_size", vocab},
      {"dtype", adgt::token_dtype_for_vocab(vocab) == adgt::kTokenDtypeU16 ? "uint16" : "uint32"},
      {"lossless", lossless},
      {"split",
       {{"val_fraction", a.val_fraction},
        {"k", split.k},
        {"block_bytes", split.block_bytes},
        {"blocks", split.blocks.size()},
        {"val_blocks", enc.val_blocks},
        {"rule",
         "blocks of ~block_bytes cut at blank lines/newlines; block b is val iff "
         "k > 0 and b % k == k-1 (last block if none qualifies)"}}},
      {"train", {{"path", train_path}, {"tokens", enc.train.size()}, {"text_bytes", enc.train_bytes}}},
      {"val", {{"path", val_path}, {"tokens", enc.val.size()}, {"text_bytes", enc.val_bytes}}},
  };
}

int prepare(const PrepareArgs& a) {
  const auto t_start = Clock::now();
  if (a.workers > 0) omp_set_num_threads(a.workers);
  adgt::data::progress_mode(a.progress);  // a bad --progress fails before any work
  const adgt::data::Inputs in = adgt::data::expand_inputs(a.inputs);
  const std::string journal = (fs::path(a.out) / adgt::data::kJournalName).string();
  const auto j = a.force ? std::nullopt : adgt::data::read_journal(journal);
  if (j && !j->done && !a.resume)
    throw std::runtime_error("--out '" + a.out + "' holds an unfinished prepare (" + journal + ": " +
                             std::to_string(j->files.size()) + " input file(s) done); pass --resume to go on " +
                             "from there, or --force to start over");
  if (j && a.resume) return prepare_documents(a, in, t_start);  // only the streamed path keeps a journal
  const std::optional<Corpus> one = read_single_document(a, in);
  if (!one) return prepare_documents(a, in, t_start);
  const Corpus& corpus = *one;
  std::error_code ec;
  fs::remove(journal, ec);  // one document: no journal (and none left from another run)
  const std::string& text = corpus.text;
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    throw std::runtime_error("--input '" + a.input + "' is empty (no non-blank text" +
                             (corpus.bad.empty() ? std::string(")") : "; " + corpus.bad_summary + ")"));
  const adgt::TextSplit split = adgt::split_text(text, a.val_fraction);
  check_tokenizer_args(a);
  const fs::path dir(a.out);
  const double t_read = seconds_since(t_start);

  // ---- tokenizer ----
  const auto t_tok = Clock::now();
  TokenizerChoice choice = make_tokenizer(a, dir, text, split);
  const std::string& tok_spec = choice.spec;
  const auto tok = adgt::Tokenizer::load(tok_spec);
  const int64_t vocab = tok->vocab_size();
  choice.meta["vocab_size"] = vocab;
  if (a.tokenizer.empty() && vocab < a.vocab_size)
    std::printf(
        "note: the text supports only %lld pieces; the vocab is %lld, not --vocab-size %d\n",
        static_cast<long long>(vocab), static_cast<long long>(vocab), a.vocab_size);
  const double t_train = seconds_since(t_tok);

  // ---- encode, block by block, in parallel ----
  const auto t_enc = Clock::now();
  const EncodedSplit enc = encode_split(*tok, text, split);
  const double t_encode = seconds_since(t_enc);

  // Lossless check on the first block (cheap; catches normalising models).
  const bool lossless = tok->decode(enc.first_ids) == block_text(text, split, 0);
  if (!lossless)
    std::fprintf(stderr,
                 "adgt-data: warning: tokenizer '%s' does not reproduce the text exactly "
                 "(decode(encode(block 0)) != block 0); it normalises text\n",
                 tok_spec.c_str());

  // ---- write ----
  const auto t_wr = Clock::now();
  const std::string train_path = (dir / "train.bin").string(),
                    val_path = (dir / "val.bin").string();
  adgt::write_token_shard(train_path, enc.train, vocab);
  adgt::write_token_shard(val_path, enc.val, vocab);
  if (enc.val.empty())
    std::fprintf(stderr,
                 "adgt-data: warning: %s is empty (--val-fraction %g); evaluation "
                 "will have nothing to read\n",
                 val_path.c_str(), a.val_fraction);
  report_skipped(corpus.passed, corpus.bad, dir);
  const nlohmann::json meta = prepare_meta(a, corpus, split, choice.meta, vocab, lossless, enc, train_path, val_path);
  const std::string meta_path = (dir / "meta.json").string();
  write_meta(meta_path, meta);
  const double t_write = seconds_since(t_wr);

  if (corpus.files.size() > 1 || corpus.documents > 1)
    std::printf("inputs     %zu file(s), %lld documents, %zu bad record(s) skipped\n", corpus.files.size(),
                static_cast<long long>(corpus.documents), corpus.bad.size());
  std::printf("source     %s: %zu bytes, %zu blocks of ~%lld bytes, %zu to val (k=%lld)\n",
              a.input.c_str(), text.size(), split.blocks.size(),
              static_cast<long long>(split.block_bytes), enc.val_blocks,
              static_cast<long long>(split.k));
  std::printf("tokenizer  %s (%s), vocab %lld\n", tok_spec.c_str(), tok->kind().c_str(),
              static_cast<long long>(vocab));
  std::printf("train      %s: %zu tokens (%.3f bytes/token)\n", train_path.c_str(), enc.train.size(),
              enc.train.empty() ? 0.0 : double(enc.train_bytes) / double(enc.train.size()));
  std::printf("val        %s: %zu tokens (%.3f bytes/token)\n", val_path.c_str(), enc.val.size(),
              enc.val.empty() ? 0.0 : double(enc.val_bytes) / double(enc.val.size()));
  std::printf("meta       %s\n", meta_path.c_str());
  std::printf("time       %.2f s total: read %.2f, tokenizer %.2f, encode %.2f, write %.2f\n",
              seconds_since(t_start), t_read, t_train, t_encode, t_write);
  return 0;
}

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::istringstream is(s);
  std::string tok;
  while (is >> tok) {
    try {
      size_t used = 0;
      const long v = std::stol(tok, &used);
      if (used != tok.size()) throw std::invalid_argument(tok);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::logic_error&) {
      throw std::runtime_error("--ids: '" + tok + "' is not an integer token id");
    }
  }
  return ids;
}

// The prepare subcommand and its options, into `pa`.
CLI::App* add_prepare(CLI::App& app, PrepareArgs& pa) {
  auto* prep =
      app.add_subcommand("prepare", "text -> DIR/{tokenizer.model,train.bin,val.bin,meta.json}");
  prep->add_option("--input", pa.inputs,
                   "UTF-8 text: files, directories (recursed) or globs; .txt, .jsonl, .json, each "
                   "optionally .gz or .zst")
      ->required()
      ->expected(1, -1);
  prep->add_option("--text-field", pa.source.text_field,
                   "JSON lines: the field holding a document's text (a.b: nested)")
      ->capture_default_str();
  prep->add_flag("--split-on-blank-lines", pa.source.split_on_blank_lines,
                 ".txt: blank lines separate documents (else a file is one document)");
  prep->add_option("--on-bad-record", pa.on_bad_record,
                   "a record that is not UTF-8, not JSON or lacks the text field: skip (named in "
                   "DIR/bad_records.txt) or fail")
      ->check(CLI::IsMember({"skip", "fail"}))
      ->capture_default_str();
  prep->add_flag("--eos,!--no-eos", pa.eos,
                 "several documents: end each with the tokenizer's end-of-document token (default on)");
  prep->add_flag("--bos", pa.bos, "several documents: begin each with the beginning-of-document token");
  prep->add_option("--workers", pa.workers,
                   "encoding threads (default: every core); several documents: one more thread reads ahead")
      ->check(CLI::NonNegativeNumber);
  prep->add_option("--progress", pa.progress,
                   "on stderr: bar (one line redrawn), lines (every few seconds), off, or auto (bar on a "
                   "terminal, else lines)")
      ->check(CLI::IsMember({"auto", "bar", "lines", "off"}))
      ->capture_default_str();
  auto* resume = prep->add_flag("--resume", pa.resume,
                                "go on from where an interrupted prepare into --out stopped (its "
                                "prepare.journal.jsonl); the output is that of an uninterrupted run");
  prep->add_flag("--force", pa.force, "start over even when --out holds an unfinished prepare")->excludes(resume);
  prep->add_option("--out", pa.out, "output directory (created)")->required();
  auto* vs = prep->add_option("--vocab-size", pa.vocab_size,
                              "train a SentencePiece BPE tokenizer of this size")
                 ->capture_default_str();
  auto* tk = prep->add_option("--tokenizer", pa.tokenizer,
                              "use this SentencePiece .model or HuggingFace tokenizer.json (copied to DIR) "
                              "or \"byte\"");
  vs->excludes(tk);
  prep->add_option("--val-fraction", pa.val_fraction, "fraction of blocks held out (every k-th)")
      ->capture_default_str();
  return prep;
}

// encode: the ids of --text, or of each JSON string of --jsonl (one line of
// ids each, encoded as one batch); with --check-roundtrip exit 1 naming the
// first text decode(encode(text)) does not give back.
int encode_command(const std::string& spec, const std::string& text, const std::string& jsonl, bool roundtrip) {
  const auto tok = adgt::Tokenizer::load(spec);
  std::vector<std::string> texts;
  if (jsonl.empty()) {
    texts.push_back(text);
  } else {
    std::ifstream in(jsonl, std::ios::binary);
    if (!in) throw std::runtime_error("--jsonl '" + jsonl + "': cannot open");
    int64_t n = 0;
    for (std::string line; std::getline(in, line);) {
      ++n;
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_string()) throw std::runtime_error(jsonl + ":" + std::to_string(n) + ": not a JSON string");
      texts.push_back(j.get<std::string>());
    }
  }
  const std::vector<std::string_view> views(texts.begin(), texts.end());
  const auto encoded = tok->encode_batch(views);
  for (const auto& v : encoded) {
    for (size_t i = 0; i < v.size(); ++i) std::printf(i ? " %d" : "%d", v[i]);
    std::printf("\n");
  }
  if (roundtrip)
    for (size_t t = 0; t < texts.size(); ++t)
      if (tok->decode(encoded[t]) != texts[t]) {
        std::fflush(stdout);
        std::fprintf(stderr, "adgt-data: text %zu does not come back from decode(encode(text))\n", t + 1);
        return 1;
      }
  return 0;
}

// info: a token file's header (format, documents), then its first `head` tokens.
void info_command(const std::string& shard, int64_t head) {
  const adgt::TokenShard s(shard);
  std::printf("%s: %lld tokens, vocab %lld, dtype %s", s.path().c_str(),
              static_cast<long long>(s.size()), static_cast<long long>(s.vocab_size()),
              s.dtype_name());
  if (s.format() == adgt::TokenFileFormat::Adgt && s.document_starts().size() > 1)
    std::printf(" (%lld documents)", static_cast<long long>(s.document_starts().size()));
  if (s.format() != adgt::TokenFileFormat::Adgt)
    std::printf(" (%s, %lld documents; vocab = largest id + 1)",
                adgt::token_file_format_name(s.format()),
                static_cast<long long>(s.document_starts().size()));
  std::printf("\n");
  const int64_t n = std::min<int64_t>(std::max<int64_t>(head, 0), s.size());
  std::vector<int32_t> v(static_cast<size_t>(n));
  s.read(0, n, v.data());
  for (int64_t i = 0; i < n; ++i) std::printf(i ? " %d" : "%d", v[i]);
  if (n) std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"adgt-data: train a tokenizer and write token shards (docs/data-format.md)"};
  app.require_subcommand(1);

  PrepareArgs pa;
  CLI::App* prep = add_prepare(app, pa);

  std::string spec, text, ids, shard;
  int64_t head = 0;
  auto* enc = app.add_subcommand("encode", "print the token ids of --text");
  std::string jsonl;
  enc->add_option("--tokenizer", spec, "SentencePiece .model, tokenizer.json or \"byte\"")->required();
  auto* txt = enc->add_option("--text", text, "text to encode");
  auto* jl = enc->add_option("--jsonl", jsonl,
                             "a file of JSON strings, one a line: one line of ids each (a batch, in parallel)");
  txt->excludes(jl);
  bool roundtrip = false;
  enc->add_flag("--check-roundtrip", roundtrip,
                "also decode each encoding: exit 1 naming the first text that does not come back");
  auto* dec = app.add_subcommand("decode", "print the text of --ids");
  dec->add_option("--tokenizer", spec, "SentencePiece .model, tokenizer.json or \"byte\"")->required();
  dec->add_option("--ids", ids, "space-separated token ids")->required();
  auto* info = app.add_subcommand("info", "print a token shard's header");
  info->add_option("--shard", shard, "token shard (.bin)")->required();
  info->add_option("--head", head, "also print the first N tokens");

  int64_t seq_len = 0, start = 0, count = 16;
  uint64_t seed = 0;
  auto* order =
      app.add_subcommand("order", "print the windows the sampler reads for samples --start..");
  order->add_option("--shard", shard, "token shard (.bin)")->required();
  order->add_option("--seq-len", seq_len, "model.seq_len")->required();
  order->add_option("--seed", seed, "train.seed")->required();
  order->add_option("--start", start, "first global sample index")->capture_default_str();
  order->add_option("--count", count, "how many samples")->capture_default_str();

  ADGT_CLI_PARSE(app, argc, argv);
  try {
    if (prep->parsed()) {
      pa.input = pa.inputs.size() == 1 ? pa.inputs[0]
                                       : std::to_string(pa.inputs.size()) + " inputs (" + pa.inputs[0] + ", ...)";
      return prepare(pa);
    }
    if (enc->parsed()) {
      if (txt->count() == 0 && jl->count() == 0) throw std::runtime_error("encode: give --text or --jsonl");
      return encode_command(spec, text, jsonl, roundtrip);
    } else if (dec->parsed()) {
      std::cout << adgt::Tokenizer::load(spec)->decode(parse_ids(ids)) << "\n";
    } else if (info->parsed()) {
      info_command(shard, head);
    } else if (order->parsed()) {
      const adgt::TokenShard s(shard);
      const adgt::Sampler sampler(s, seq_len, seed);
      std::printf("# windows_per_epoch %lld\n",
                  static_cast<long long>(sampler.windows_per_epoch()));
      for (int64_t i = 0; i < count; ++i)
        std::printf(i ? " %lld" : "%lld", static_cast<long long>(sampler.window_of(start + i)));
      std::printf("\n");
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "adgt-data: error: %s\n", e.what());
    return 1;
  }
}

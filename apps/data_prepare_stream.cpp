// adgt-data prepare over several documents, streamed (docs/data-format.md,
// "Documents" and "Streaming and --resume"): each input file is read a batch
// of documents at a time, the batch encoded on --workers threads and
// appended to the shards; after each file the shards are fsynced and a line
// goes into DIR/prepare.journal.jsonl (the reading runs ahead on a thread
// of its own, core/data/prepare/batch_reader.hpp), so memory stays flat in the corpus
// size and an interrupted run goes on with --resume. The bytes written are
// those of encoding the whole corpus at once.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <optional>
#include <stdexcept>

#include "apps/data_prepare.hpp"
#include "core/data/parallel_for.hpp"
#include "core/data/prepare/batch_reader.hpp"
#include "core/data/prepare/journal.hpp"
#include "core/data/prepare/progress_meter.hpp"
#include "core/data/prepare/shard_appender.hpp"
#include "core/data/tokenizer.hpp"

namespace adgt_data {
namespace {

using adgt::data::PrepareState;
using adgt::data::ShardAppender;

constexpr size_t kBatchBytes = size_t(4) << 20;  // text encoded at once
constexpr size_t kBatchDocs = 1 << 16;

// Document d is validation iff k > 0 and d % k == k-1 (and, when none is,
// the last one: finish_split).
int64_t split_k(double val_fraction) {
  if (!(val_fraction >= 0.0 && val_fraction <= 0.5))
    throw std::runtime_error("--val-fraction " + std::to_string(val_fraction) +
                             " is out of range; use a value in [0, 0.5] (e.g. 0.05)");
  return val_fraction > 0 ? std::max<int64_t>(2, std::llround(1.0 / val_fraction)) : 0;
}
bool is_val(int64_t k, int64_t d) { return k > 0 && d % k == k - 1; }

adgt::data::SourceOptions source_options(const PrepareArgs& a) {
  adgt::data::SourceOptions o = a.source;
  o.fail_on_bad = a.on_bad_record == "fail";
  return o;
}

// Calls fn(d, text) for every document of the corpus, d from 0.
template <class Fn>
void for_each_document(const PrepareArgs& a, const adgt::data::Inputs& in, Fn fn) {
  adgt::data::DocumentSource src(source_options(a));
  int64_t d = 0;
  for (const std::string& f : in.files) src.read(f, [&](std::string_view text) { fn(d++, text); });
}

// Calls fn(line) for each non-blank line of a document (a line of the
// tokenizer's training text: the documents each followed by "\n").
template <class Fn>
void for_each_training_line(std::string_view doc, Fn fn) {
  for (size_t pos = 0; pos <= doc.size();) {
    size_t nl = doc.find('\n', pos);
    if (nl == std::string_view::npos) nl = doc.size();
    const std::string_view line = doc.substr(pos, nl - pos);
    if (line.find_first_not_of(" \t\r") != std::string_view::npos) fn(line);
    pos = nl + 1;
  }
}

// Trains DIR/tokenizer.model on the training documents the way
// train_sentencepiece_text trains on them joined (tokenizer.hpp), in two
// passes: the first counts their non-blank lines and bytes, the second keeps
// every k-th line (at most 2,000,000 lines / about 64 MiB in memory).
void train_streamed(const PrepareArgs& a, const adgt::data::Inputs& in, int64_t k, const fs::path& dir) {
  size_t lines = 0, bytes = 0, text = 0, last_lines = 0, last_bytes = 0, last_text = 0;
  int64_t n = 0;
  for_each_document(a, in, [&](int64_t d, std::string_view doc) {
    n = d + 1;
    last_lines = last_bytes = 0;
    last_text = is_val(k, d) ? 0 : doc.size() + 1;
    if (is_val(k, d)) return;
    text += doc.size() + 1;
    for_each_training_line(doc, [&](std::string_view l) { ++last_lines, last_bytes += l.size(); });
    lines += last_lines, bytes += last_bytes;
  });
  const bool last_to_val = k > 0 && n < k;  // no d % k == k-1: the last document is validation
  if (last_to_val) lines -= last_lines, bytes -= last_bytes, text -= last_text;
  std::printf("training SentencePiece BPE (vocab %d) on %zu bytes of %s ...\n", a.vocab_size, text,
              a.input.c_str());
  std::fflush(stdout);
  const size_t step = adgt::sentencepiece_sample_step(lines, bytes);
  std::string kept;
  std::vector<size_t> ends;
  size_t i = 0;
  for_each_document(a, in, [&](int64_t d, std::string_view doc) {
    if (is_val(k, d) || (last_to_val && d == n - 1)) return;
    for_each_training_line(doc, [&](std::string_view l) {
      if (i++ % step == 0) kept.append(l), ends.push_back(kept.size());
    });
  });
  std::vector<std::string_view> sample;
  for (size_t j = 0; j < ends.size(); ++j)
    sample.push_back(std::string_view(kept).substr(j ? ends[j - 1] : 0, ends[j] - (j ? ends[j - 1] : 0)));
  adgt::train_sentencepiece_lines(sample, (dir / "tokenizer").string(), a.vocab_size, a.input);
}

// FNV-1a-64 of a tokenizer's file ("byte" for the byte tokenizer).
std::string tokenizer_hash(const std::string& spec) {
  if (spec == "byte") return "byte";
  std::ifstream f(spec, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read tokenizer '" + spec + "'");
  const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return hex64(fnv1a64(all));
}

// The journal's first line: what decides the output (the options, the
// input files and their sizes); the tokenizer is added once it is made.
nlohmann::json journal_header(const PrepareArgs& a, const adgt::data::Inputs& in) {
  nlohmann::json inputs = nlohmann::json::array();
  for (const std::string& f : in.files) inputs.push_back({{"path", f}, {"bytes", fs::file_size(f)}});
  const nlohmann::json options = {
      {"val_fraction", a.val_fraction}, {"text_field", a.source.text_field},
      {"split_on_blank_lines", a.source.split_on_blank_lines}, {"on_bad_record", a.on_bad_record},
      {"eos", a.eos}, {"bos", a.bos}, {"tokenizer", a.tokenizer}, {"vocab_size", a.tokenizer.empty() ? a.vocab_size : 0}};
  return {{"journal", "adgt-data prepare"}, {"version", 1}, {"options", options}, {"inputs", inputs}};
}

// Throws naming the first option or input file that differs from the journal's.
void check_resumable(const nlohmann::json& was, const nlohmann::json& now, const std::string& journal) {
  const std::string fix = "; rerun with the inputs and options it records, or pass --force to start over";
  for (const auto& [key, value] : now.at("options").items())
    if (!was.at("options").contains(key) || was["options"][key] != value)
      throw std::runtime_error("--resume: " + journal + " records option " + key + " = " +
                               (was["options"].contains(key) ? was["options"][key].dump() : "(none)") +
                               ", this run has " + value.dump() + fix);
  const auto &a = was.at("inputs"), &b = now.at("inputs");
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i)
    if (i >= a.size() || i >= b.size() || a[i] != b[i])
      throw std::runtime_error("--resume: " + journal + " records " + std::to_string(a.size()) +
                               " input file(s), this run has " + std::to_string(b.size()) + "; input " +
                               std::to_string(i + 1) + " was " + (i < a.size() ? a[i].dump() : "(none)") +
                               ", now " + (i < b.size() ? b[i].dump() : "(none)") + fix);
}

// How documents are written: [bos] ids [eos], or the ids of "\n\n" between
// them when the tokenizer has no end token.
struct DocumentFrame {
  int32_t eos = -1, bos = -1;
  std::vector<int32_t> gap;
};

DocumentFrame document_frame(const PrepareArgs& a, const adgt::Tokenizer& tok, const std::string& spec,
                             bool quiet) {
  DocumentFrame f;
  f.eos = a.eos ? tok.eos_id() : -1;
  f.bos = a.bos ? tok.bos_id() : -1;
  if (a.bos && f.bos < 0)
    throw std::runtime_error("--bos: tokenizer '" + spec + "' has no beginning-of-document token");
  if (f.eos < 0 && a.eos) {
    f.gap = tok.encode("\n\n");
    if (!quiet)
      std::fprintf(stderr, "adgt-data: note: tokenizer '%s' has no end-of-document token; documents are "
                           "separated by the text \"\\n\\n\" instead\n", spec.c_str());
  }
  return f;
}

// The streamed corpus: shards, tokenizer, the running state.
struct Stream {
  const adgt::Tokenizer& tok;
  DocumentFrame frame;
  int64_t k = 0;
  ShardAppender* shard[2];
  PrepareState& st;
};

// A batch of documents with their ids and hashes (for the corpus's hash).
struct EncodedBatch {
  std::vector<std::string> docs;
  std::vector<std::vector<int32_t>> ids;
  std::vector<uint64_t> hashes;
};

// Encodes a batch of documents on all threads.
EncodedBatch encode_batch(const adgt::Tokenizer& tok, std::vector<std::string>&& docs) {
  EncodedBatch e;
  e.docs = std::move(docs);
  if (e.docs.empty()) return e;
  const std::vector<std::string_view> views(e.docs.begin(), e.docs.end());
  e.ids = tok.encode_batch(views);
  e.hashes.resize(e.docs.size());
  adgt::parallel_for(int64_t(e.docs.size()), 64, [&](int64_t i) { e.hashes[size_t(i)] = fnv1a64(e.docs[size_t(i)]); });
  return e;
}

// Appends an encoded batch to the shards, in order.
void append_batch(Stream& s, const EncodedBatch& e) {
  const std::vector<int32_t> eos{s.frame.eos}, bos{s.frame.bos};
  for (size_t i = 0; i < e.docs.size(); ++i) {
    const int64_t d = s.st.documents;
    const int side = is_val(s.k, d) ? 1 : 0;
    ShardAppender& out = *s.shard[side];
    if (!s.frame.gap.empty() && out.tokens() > 0) out.append(s.frame.gap);
    out.begin_document();
    if (s.frame.bos >= 0) out.append(bos);
    out.append(e.ids[i]);
    if (s.frame.eos >= 0) out.append(eos);
    if (d == 0) s.st.lossless = s.tok.decode(e.ids[i]) == e.docs[i];
    s.st.side[side].tokens = out.tokens();
    s.st.side[side].text_bytes += int64_t(e.docs[i].size());
    ++s.st.side[side].documents;
    s.st.doc_hash = (s.st.doc_hash ^ e.hashes[i]) * 0x100000001b3ULL;
    s.st.last_doc_bytes = int64_t(e.docs[i].size());
    ++s.st.documents;
  }
}

// The in-order append of one batch on a thread of its own while the workers
// encode the next (the append is serial: on the main thread the workers would
// wait for it). At most one is in flight; wait() before reading the state.
class Appender {
 public:
  explicit Appender(Stream& s)
      : s_(s), documents_(s.st.documents), tokens_(s.st.side[0].tokens + s.st.side[1].tokens) {}
  ~Appender() {
    if (pending_.valid()) pending_.wait();  // an error is already being thrown
  }
  void start(EncodedBatch&& e) {
    wait();
    pending_ = std::async(std::launch::async, [this, e = std::move(e)] {
      append_batch(s_, e);
      documents_ = s_.st.documents;
      tokens_ = s_.st.side[0].tokens + s_.st.side[1].tokens;
    });
  }
  // The documents and tokens of the batches appended so far (for the progress).
  int64_t documents() const { return documents_; }
  int64_t tokens() const { return tokens_; }
  void wait() {
    if (pending_.valid()) pending_.get();  // rethrows the append's error
  }

 private:
  Stream& s_;
  std::future<void> pending_;
  std::atomic<int64_t> documents_{0}, tokens_{0};
};

// Reads (on the reader's thread), encodes (on --workers threads) and writes
// input files from st.files_done on; after each, the shards are fsynced and
// its journal line written.
void stream_files(const PrepareArgs& a, const adgt::data::Inputs& in, Stream& s, const std::string& journal) {
  std::vector<int64_t> sizes;
  int64_t total = 0, done = 0;
  for (const std::string& f : in.files) sizes.push_back(int64_t(fs::file_size(f))), total += sizes.back();
  for (int64_t f = 0; f < s.st.files_done; ++f) done += sizes[size_t(f)];
  adgt::data::ProgressMeter progress(adgt::data::progress_mode(a.progress), total, done);
  const char* stop_env = std::getenv("ADGT_DATA_TEST_STOP_AFTER_FILES");  // tests: an interruption
  const int64_t stop_after = stop_env ? std::atoll(stop_env) : -1;
  const char* batch_env = std::getenv("ADGT_DATA_TEST_BATCH_DOCS");  // tests: batches cut mid-file
  const size_t batch_docs = batch_env && std::atoll(batch_env) > 0 ? size_t(std::atoll(batch_env)) : kBatchDocs;
  adgt::data::BatchReader reader(in.files, size_t(s.st.files_done), source_options(a), kBatchBytes, batch_docs);
  Appender appender(s);
  for (adgt::data::DocumentBatch b; reader.next(b);) {
    EncodedBatch e = encode_batch(s.tok, std::move(b.docs));
    appender.start(std::move(e));  // after the previous batch's append
    if (!b.file_end) {
      progress.update(done + b.file_bytes_read, appender.documents(), appender.tokens());
      continue;
    }
    appender.wait();
    const int64_t tokens = s.st.side[0].tokens + s.st.side[1].tokens;
    progress.update(done + b.file_bytes_read, s.st.documents, tokens);
    const size_t bad_from = s.st.bad.size();
    s.st.bad.insert(s.st.bad.end(), b.bad.begin(), b.bad.end());
    s.st.empty += b.empty;
    s.shard[0]->sync();
    s.shard[1]->sync();
    s.st.files_done = int64_t(b.file) + 1;
    adgt::data::append_journal(journal, adgt::data::file_record(s.st, int64_t(b.file), in.files[b.file], bad_from));
    done += sizes[b.file];
    progress.update(done, s.st.documents, tokens);
    if (s.st.files_done == stop_after)
      throw std::runtime_error("stopped after " + std::to_string(stop_after) +
                               " input file(s) (ADGT_DATA_TEST_STOP_AFTER_FILES); go on with --resume");
  }
  appender.wait();
  progress.finish();
}

// When no document had d % k == k-1, the last one goes to validation: off
// the end of the training shard (with the separator before it), into val.
void finish_split(Stream& s) {
  if (s.k == 0 || s.st.side[1].documents > 0) return;
  const int64_t sep = s.st.side[0].documents > 1 ? int64_t(s.frame.gap.size()) : 0;
  const std::vector<int32_t> ids = s.shard[0]->take_last_document(sep);
  s.shard[1]->begin_document();
  s.shard[1]->append(ids);
  s.st.side[0] = {s.shard[0]->tokens(), s.st.side[0].documents - 1, s.st.side[0].text_bytes - s.st.last_doc_bytes};
  s.st.side[1] = {s.shard[1]->tokens(), 1, s.st.last_doc_bytes};
}

nlohmann::json documents_meta(const PrepareArgs& a, const adgt::data::Inputs& in, const PrepareState& st,
                              const TokenizerChoice& choice, int64_t vocab, const DocumentFrame& fr, int64_t k,
                              const std::string& train_path, const std::string& val_path) {
  const auto& t = st.side[0];
  const auto& v = st.side[1];
  return {
      {"format", "adgt token shard v2 with a document index (docs/data-format.md)"},
      {"source",
       {{"path", a.input}, {"files", in.files}, {"documents", st.documents}, {"bad_records", st.bad.size()},
        {"bytes", t.text_bytes + v.text_bytes}, {"fnv1a64_of_documents", hex64(st.doc_hash)}}},
      {"tokenizer", choice.meta},
      {"vocab_size", vocab},
      {"dtype", adgt::token_dtype_for_vocab(vocab) == adgt::kTokenDtypeU16 ? "uint16" : "uint32"},
      {"lossless", st.lossless == 1},
      {"documents",
       {{"eos_id", fr.eos}, {"bos_id", fr.bos}, {"separator", fr.gap.empty() ? "eos token" : "\"\\n\\n\" (no eos token)"}}},
      {"split",
       {{"val_fraction", a.val_fraction},
        {"k", k},
        {"rule", "document d is val iff k > 0 and d % k == k-1 (the last document if none qualifies)"}}},
      {"train", {{"path", train_path}, {"tokens", t.tokens}, {"documents", t.documents}, {"text_bytes", t.text_bytes}}},
      {"val", {{"path", val_path}, {"tokens", v.tokens}, {"documents", v.documents}, {"text_bytes", v.text_bytes}}},
  };
}

// The tokenizer and the state to start from: a resumed journal's, or made
// new (trained, or the given one copied) with a new journal.
TokenizerChoice open_run(const PrepareArgs& a, const adgt::data::Inputs& in, int64_t k, const fs::path& dir,
                         const std::string& journal, PrepareState& st, bool& resumed, bool& done) {
  nlohmann::json header = journal_header(a, in);
  const auto j = a.resume ? adgt::data::read_journal(journal) : std::nullopt;
  if (j) {
    check_resumable(j->header, header, journal);
    const auto& t = j->header.at("tokenizer");
    TokenizerChoice choice{t.at("spec").get<std::string>(), t.at("meta")};
    if (tokenizer_hash(choice.spec) != t.at("fnv1a64").get<std::string>())
      throw std::runtime_error("--resume: tokenizer '" + choice.spec + "' is not the one " + journal +
                               " records (its FNV-1a-64 differs); pass --force to start over");
    for (const auto& rec : j->files) adgt::data::apply_file_record(st, rec, journal);
    resumed = true;
    done = j->done;
    return choice;
  }
  if (a.resume)
    std::fprintf(stderr, "adgt-data: note: --resume: no %s in %s; starting from the beginning\n",
                 adgt::data::kJournalName, a.out.c_str());
  std::error_code ec;
  fs::remove(journal, ec);
  if (!a.tokenizer.empty()) return given_tokenizer(a, dir);
  train_streamed(a, in, k, dir);
  return trained_tokenizer(a, dir);
}

}  // namespace

int prepare_documents(const PrepareArgs& a, const adgt::data::Inputs& in, Clock::time_point t_start) {
  const int64_t k = split_k(a.val_fraction);
  check_tokenizer_args(a);
  const fs::path dir(a.out);
  const std::string journal = (dir / adgt::data::kJournalName).string();
  const auto t_tok = Clock::now();
  PrepareState st;
  bool resumed = false, done = false;
  TokenizerChoice choice = open_run(a, in, k, dir, journal, st, resumed, done);
  if (done) {
    std::printf("nothing to resume: %s says %s is complete\n", journal.c_str(), a.out.c_str());
    return 0;
  }
  const auto tok = adgt::Tokenizer::load(choice.spec);
  const int64_t vocab = tok->vocab_size();
  choice.meta["vocab_size"] = vocab;
  const DocumentFrame frame = document_frame(a, *tok, choice.spec, false);
  const double t_train = seconds_since(t_tok);
  const std::string train_path = (dir / "train.bin").string(), val_path = (dir / "val.bin").string();
  std::optional<ShardAppender> train, val;
  if (resumed) {
    train.emplace(train_path, vocab, st.side[0].tokens, st.side[0].documents);
    val.emplace(val_path, vocab, st.side[1].tokens, st.side[1].documents);
  } else {
    train.emplace(train_path, vocab);
    val.emplace(val_path, vocab);
  }
  const int64_t tokens_before = st.side[0].tokens + st.side[1].tokens;
  if (!resumed) {
    nlohmann::json header = journal_header(a, in);
    header["tokenizer"] = {{"spec", choice.spec}, {"meta", choice.meta}, {"fnv1a64", tokenizer_hash(choice.spec)}};
    adgt::data::start_journal(journal, header);
  } else {
    std::printf("resuming after %lld of %zu input file(s) (%lld documents)\n", static_cast<long long>(st.files_done),
                in.files.size(), static_cast<long long>(st.documents));
  }
  const auto t_enc = Clock::now();
  Stream s{*tok, frame, k, {&*train, &*val}, st};
  stream_files(a, in, s, journal);
  finish_split(s);
  const double t_stream = seconds_since(t_enc);
  if (st.lossless == 0)
    std::fprintf(stderr, "adgt-data: warning: tokenizer '%s' does not reproduce the text exactly "
                         "(decode(encode(document 0)) != document 0); it normalises text\n", choice.spec.c_str());
  train->finish();
  val->finish();
  if (st.side[1].tokens == 0)
    std::fprintf(stderr, "adgt-data: warning: %s is empty (--val-fraction %g); evaluation will have nothing to read\n",
                 val_path.c_str(), a.val_fraction);
  report_skipped(in.passed, st.bad, dir);
  const std::string meta_path = (dir / "meta.json").string();
  write_meta(meta_path, documents_meta(a, in, st, choice, vocab, frame, k, train_path, val_path));
  adgt::data::append_journal(journal, {{"done", true}});
  const int64_t tokens = st.side[0].tokens + st.side[1].tokens - tokens_before;  // written by this run
  std::printf("inputs     %zu file(s), %lld documents, %zu bad record(s) skipped\n", in.files.size(),
              static_cast<long long>(st.documents), st.bad.size());
  std::printf("tokenizer  %s (%s), vocab %lld, eos %d, bos %d\n", choice.spec.c_str(), tok->kind().c_str(),
              static_cast<long long>(vocab), frame.eos, frame.bos);
  std::printf("train      %s: %lld tokens, %lld documents\n", train_path.c_str(),
              static_cast<long long>(st.side[0].tokens), static_cast<long long>(st.side[0].documents));
  std::printf("val        %s: %lld tokens, %lld documents (every %lld-th)\n", val_path.c_str(),
              static_cast<long long>(st.side[1].tokens), static_cast<long long>(st.side[1].documents),
              static_cast<long long>(k));
  std::printf("meta       %s\n", meta_path.c_str());
  std::printf("time       %.2f s total: tokenizer %.2f, read+encode+write %.2f (%.0f tokens/s, %d threads)\n",
              seconds_since(t_start), t_train, t_stream, t_stream > 0 ? double(tokens) / t_stream : 0.0,
              omp_get_max_threads());
  return 0;
}

}  // namespace adgt_data

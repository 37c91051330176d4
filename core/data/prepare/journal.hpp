// adgt-data prepare's journal, DIR/prepare.journal.jsonl (docs/data-format.md,
// "Streaming and --resume"): one JSON object a line. The first line says
// what is being made (the options and inputs that decide the output, and the
// tokenizer); then one line per input file, written only once that file's
// tokens are durable in the shards' temporary files, holding the running
// state after it; the last line {"done": true} once the shards are in place.
// Each line is appended and fsynced; a line cut short by a crash is not a
// line (read_journal drops it and cuts the file back).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/data/text_sources.hpp"

namespace adgt::data {

inline constexpr const char* kJournalName = "prepare.journal.jsonl";

struct Journal {
  nlohmann::json header;             // line 1
  std::vector<nlohmann::json> files;  // one per finished input file, in order
  bool done = false;
};

// The journal at `path`, or nothing when there is no such file. Throws
// naming the file and line when a complete line is not a JSON object or the
// first line is not a journal header.
std::optional<Journal> read_journal(const std::string& path);

// A new journal holding `header` (written to PATH.tmp, fsynced, renamed).
void start_journal(const std::string& path, const nlohmann::json& header);
// Appends one line and fsyncs it.
void append_journal(const std::string& path, const nlohmann::json& line);

// What a streamed prepare has done after some input files: its running
// totals, the state a resume starts from.
struct PrepareState {
  struct Side {
    int64_t tokens = 0, documents = 0, text_bytes = 0;
  };
  int64_t files_done = 0;
  int64_t documents = 0, empty = 0;      // documents handed on; empty texts skipped
  int64_t last_doc_bytes = 0;            // the text bytes of the last document
  uint64_t doc_hash = 0xcbf29ce484222325ULL;  // FNV-1a-64 over the documents' own hashes
  Side side[2];                          // train, val
  int lossless = -1;                     // decode(encode(document 0)) == document 0; -1: not yet known
  std::vector<BadRecord> bad;            // every bad record so far
};

// The journal line for file `index` (`path`), holding `s` and the bad
// records of that file (s.bad from `bad_from` on).
nlohmann::json file_record(const PrepareState& s, int64_t index, const std::string& path, size_t bad_from);
// `s` advanced by one file line (its counts replace s's; its bad records
// are appended). Throws naming the journal when a field is missing.
void apply_file_record(PrepareState& s, const nlohmann::json& rec, const std::string& journal_path);

}  // namespace adgt::data

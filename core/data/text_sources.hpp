// The documents of a corpus on disk (docs/data-format.md, "Inputs"): the
// files named by paths, directories (recursed) and glob patterns; each file
// plain text (.txt: the whole file one document, or documents separated by
// blank lines) or JSON lines (.jsonl, .json: one object per line, the
// document's text in a string field, "a.b" for a nested one), each
// optionally compressed (.gz, .zst; byte_stream.hpp), or Parquet (.parquet:
// each row of a string column a document; parquet_source.hpp). Files are
// read as streams (a JSONL file of any size in bounded memory).
//
// A bad record -- text that is not UTF-8, a line that is not a JSON object,
// a missing or non-string text field, a compressed stream that is damaged or
// ends early, a null Parquet value, a Parquet row group that does not decode -- is either skipped and kept in bad() with the file, line and
// reason (the default: nothing is dropped without being named), or, with
// fail_on_bad, a std::runtime_error with the same words.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace adgt::data {

enum class TextFormat { Text, JsonLines, Parquet };

struct Inputs {
  std::vector<std::string> files;   // each once, in the order found
  std::vector<std::string> passed;  // files inside a directory not of a known format
};

// Every file named by `args`, each once, in the order given; a directory's
// files (recursed) and a glob's matches in sorted order. Inside a directory
// only files of a known name (.txt, .jsonl, .json, each optionally .gz or
// .zst; .parquet) count (the others are listed in `passed`, to be said), and hidden
// files and folders (a name starting with '.') are left out; a file named
// itself or matched by a glob is read whatever its name (text_format_of).
// Throws naming an argument that names no file, or a Parquet file named in a
// build that reads none.
Inputs expand_inputs(const std::vector<std::string>& args);

// By the name, a .gz/.zst suffix aside: .jsonl and .json are JSON lines,
// .parquet Parquet (a std::runtime_error naming the file and the fix in a
// build without Arrow, or when compressed outside), anything else plain text
// (a file named directly, as adgt-data always read it).
TextFormat text_format_of(const std::string& path);
bool known_format(const std::string& path);

// Whether s is well-formed UTF-8 (no overlong forms, surrogates or code
// points above U+10FFFF).
bool valid_utf8(std::string_view s);

struct SourceOptions {
  std::string text_field = "text";    // JSON lines, Parquet: the text's field ("a.b": nested)
  bool split_on_blank_lines = false;  // .txt: blank lines separate documents
  bool fail_on_bad = false;           // the first bad record is an error
};

struct BadRecord {
  std::string file;
  int64_t line = 0;  // 1-based; for a .txt document, its first line; for Parquet, the row
  std::string why;
};

// "N bad records skipped (K in FILE, ...; the first: ...)" or "" when none.
std::string bad_summary(const std::vector<BadRecord>& bad);

class ByteStream;

class DocumentSource {
 public:
  using DocumentFn = std::function<void(std::string_view)>;
  explicit DocumentSource(SourceOptions o = {});
  // Calls `doc` with each non-empty document of `path`, in file order.
  void read(const std::string& path, const DocumentFn& doc);

  const std::vector<BadRecord>& bad() const { return bad_; }
  int64_t documents() const { return documents_; }  // handed to `doc`
  int64_t empty() const { return empty_; }          // empty texts, skipped
  int64_t text_bytes() const { return text_bytes_; }  // bytes of the documents handed on
  // "N bad records skipped (K in FILE, ...)" or "" when none.
  std::string bad_summary() const { return data::bad_summary(bad_); }
  // Inside `doc`: the bytes of the file being read consumed so far
  // (compressed bytes for .gz and .zst); 0 outside read().
  int64_t file_bytes_read() const;

 private:
  void bad(const std::string& file, int64_t line, const std::string& why);
  void emit(const std::string& file, int64_t line, std::string_view text, const DocumentFn& doc);
  void json_line(const std::string& file, int64_t line, std::string_view text, const DocumentFn& doc);

  SourceOptions o_;
  const ByteStream* stream_ = nullptr;  // during read()
  std::vector<std::string> field_path_;
  std::vector<BadRecord> bad_;
  std::string line_text_;  // a JSON line's text (json_text_line.hpp)
  int64_t documents_ = 0, empty_ = 0, text_bytes_ = 0;
};

}  // namespace adgt::data

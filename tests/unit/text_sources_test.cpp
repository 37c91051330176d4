// The corpus readers (core/data/byte_stream.hpp, core/data/text_sources.hpp):
// every file is written here, its documents known; they are read back
// through plain, gzip and zstd streams, from files, directories and globs,
// and every bad-record class is named with its file and line.
#include <catch2/catch.hpp>
#include <zlib.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/data/byte_stream.hpp"
#include "core/data/text_sources.hpp"

namespace fs = std::filesystem;
using adgt::data::ByteStream;
using adgt::data::DocumentSource;
using adgt::data::SourceOptions;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("adgt_text_sources_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_file(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}

std::string gzip(const std::string& s) {
  z_stream z{};
  REQUIRE(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::string out(deflateBound(&z, uLong(s.size())) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(s.data()));
  z.avail_in = uInt(s.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string zstd(const std::string& s) {
  std::string out(ZSTD_compressBound(s.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), s.data(), s.size(), 3);
  REQUIRE_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

std::vector<std::string> read_all(DocumentSource& src, const std::string& path) {
  std::vector<std::string> docs;
  src.read(path, [&](std::string_view d) { docs.emplace_back(d); });
  return docs;
}

std::string stream_all(const std::string& path) {
  ByteStream in(path);
  std::string all, buf(777, '\0');  // an odd chunk size: reads cross every boundary
  for (size_t n; (n = in.read(buf.data(), buf.size())) > 0;) all.append(buf, 0, n);
  return all;
}

// Documents with the text a corpus has: several scripts, emoji, quotes and
// escapes that JSON must carry, long and short.
std::vector<std::string> sample_docs(int n, uint32_t seed) {
  const std::vector<std::string> words = {"In", "the", "beginning", "\xE6\x97\xA5\xE6\x9C\xAC", "\xF0\x9F\x98\x80",
                                          "caf\xC3\xA9", "\"quoted\"", "back\\slash", "tab\there",
                                          "\xD7\xA9\xD7\x9C\xD7\x95\xD7\x9D", "e\xCC\x81", "42"};
  std::mt19937 g(seed);
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    std::string d;
    const int len = 1 + int(g() % 400);
    for (int k = 0; k < len; ++k) d += (k ? " " : "") + words[g() % words.size()];
    out.push_back(d);
  }
  return out;
}

std::string jsonl(const std::vector<std::string>& docs, const std::string& field = "text") {
  std::string s;
  for (const std::string& d : docs) {
    std::string e;
    for (char c : d) {
      if (c == '"') e += "\\\"";
      else if (c == '\\') e += "\\\\";
      else if (c == '\t') e += "\\t";
      else if (c == '\n') e += "\\n";
      else e += c;
    }
    s += "{\"id\": 1, \"" + field + "\": \"" + e + "\"}\n";
  }
  return s;
}

}  // namespace

TEST_CASE("corpus: plain, gzip and zstd streams give the same bytes", "[data]") {
  const fs::path d = fresh_dir("streams");
  std::string text;
  for (const std::string& s : sample_docs(300, 1)) text += s + "\n";
  REQUIRE(text.size() > (size_t(1) << 17));  // more than two of the reader's chunks
  write_file(d / "a.txt", text);
  write_file(d / "a.txt.gz", gzip(text));
  write_file(d / "a.txt.zst", zstd(text));
  // Two gzip members and two zstd frames, one after the other (concatenated files).
  const std::string half = text.substr(0, text.size() / 2), rest = text.substr(text.size() / 2);
  write_file(d / "b.txt.gz", gzip(half) + gzip(rest));
  write_file(d / "b.txt.zst", zstd(half) + zstd(rest));
  for (const char* f : {"a.txt", "a.txt.gz", "a.txt.zst", "b.txt.gz", "b.txt.zst"}) {
    INFO(f);
    CHECK(stream_all((d / f).string()) == text);
  }
  // Cut short, or damaged: a named error, never a silent short read.
  const std::string gz = gzip(text), zs = zstd(text);
  write_file(d / "cut.txt.gz", gz.substr(0, gz.size() / 2));
  write_file(d / "cut.txt.zst", zs.substr(0, zs.size() / 2));
  std::string bad_gz = gz;
  bad_gz[bad_gz.size() / 2] ^= 0x55;
  write_file(d / "bad.txt.gz", bad_gz);
  const auto error_of = [&](const char* f) {
    try {
      stream_all((d / f).string());
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(error_of("cut.txt.gz").find("cut.txt.gz: the gzip stream is truncated") != std::string::npos);
  CHECK(error_of("cut.txt.zst").find("cut.txt.zst: the zstd stream is truncated") != std::string::npos);
  // Empty: no member or frame at all is damage too (gzip -t, zstd -t), not an empty text.
  write_file(d / "empty.txt.gz", "");
  write_file(d / "empty.txt.zst", "");
  CHECK(error_of("empty.txt.gz").find("empty.txt.gz: the file is empty, not a gzip stream") != std::string::npos);
  CHECK(error_of("empty.txt.zst").find("empty.txt.zst: the file is empty, not a zstd stream") != std::string::npos);
  write_file(d / "empty.txt", "");
  CHECK(stream_all((d / "empty.txt").string()).empty());
  const std::string e = error_of("bad.txt.gz");
  CHECK((e.find("bad.txt.gz: damaged gzip data") != std::string::npos ||
         e.find("bad.txt.gz: the gzip stream is truncated") != std::string::npos));
}

TEST_CASE("corpus: JSON lines, nested fields and text documents", "[data]") {
  const fs::path d = fresh_dir("docs");
  const std::vector<std::string> docs = sample_docs(50, 2);
  write_file(d / "x.jsonl", jsonl(docs));
  write_file(d / "x.jsonl.zst", zstd(jsonl(docs)));
  DocumentSource plain;
  CHECK(read_all(plain, (d / "x.jsonl").string()) == docs);
  CHECK(read_all(plain, (d / "x.jsonl.zst").string()) == docs);
  CHECK(plain.documents() == 100);
  CHECK(plain.bad().empty());
  // A nested field ("meta.body"), the last line without its newline.
  std::string nested;
  for (const std::string& s : {"one", "two"}) nested += "{\"meta\": {\"body\": \"" + std::string(s) + "\"}}\n";
  nested += "{\"meta\": {\"body\": \"three\"}}";
  write_file(d / "n.json", nested);
  SourceOptions o;
  o.text_field = "meta.body";
  DocumentSource src(o);
  CHECK(read_all(src, (d / "n.json").string()) == std::vector<std::string>{"one", "two", "three"});
  // Text: a whole file is one document; with split_on_blank_lines, runs of
  // lines between blank ones are.
  write_file(d / "t.txt", "Para one\nline two\n\n \n\nPara two\n");
  DocumentSource whole;
  CHECK(read_all(whole, (d / "t.txt").string()) == std::vector<std::string>{"Para one\nline two\n\n \n\nPara two\n"});
  SourceOptions split;
  split.split_on_blank_lines = true;
  DocumentSource paras(split);
  CHECK(read_all(paras, (d / "t.txt").string()) == std::vector<std::string>{"Para one\nline two", "Para two"});
}

TEST_CASE("corpus: every bad record is skipped and named, or fails with --on-bad-record fail", "[data]") {
  const fs::path d = fresh_dir("bad");
  const std::string lines =
      "{\"text\": \"good one\"}\n"          // 1
      "not json\n"                          // 2
      "{\"body\": \"no text field\"}\n"     // 3
      "{\"text\": 7}\n"                     // 4
      "{\"text\": \"bad \xC3\x28 utf8\"}\n" // 5: ill-formed UTF-8 inside the string
      "\n"                                  // 6: an empty line is no record
      "{\"text\": \"\"}\n"                  // 7: empty text, skipped and counted
      "[1, 2]\n"                            // 8: not an object
      "{\"text\": \"good two\"}\n";         // 9
  write_file(d / "b.jsonl", lines);
  DocumentSource src;
  CHECK(read_all(src, (d / "b.jsonl").string()) == std::vector<std::string>{"good one", "good two"});
  REQUIRE(src.bad().size() == 5);
  const std::vector<int64_t> at = {2, 3, 4, 5, 8};
  const std::vector<std::string> why = {"not a JSON value", "no field 'text'", "number, not a string",
                                        "not valid UTF-8", "not an object"};
  for (size_t i = 0; i < at.size(); ++i) {
    INFO(i);
    CHECK(src.bad()[i].line == at[i]);
    CHECK(src.bad()[i].file == (d / "b.jsonl").string());
    CHECK(src.bad()[i].why.find(why[i]) != std::string::npos);
  }
  CHECK(src.empty() == 1);
  CHECK(src.bad_summary().find("5 bad records skipped (5 in ") == 0);
  // A text document that is not UTF-8 (an overlong '/', a lone surrogate).
  write_file(d / "u.txt", "fine\n\nover\xC0\xAFlong\n\nsur\xED\xA0\x80rogate\n");
  SourceOptions split;
  split.split_on_blank_lines = true;
  DocumentSource paras(split);
  CHECK(read_all(paras, (d / "u.txt").string()) == std::vector<std::string>{"fine"});
  REQUIRE(paras.bad().size() == 2);
  CHECK(paras.bad()[0].line == 3);
  CHECK(paras.bad()[1].line == 5);
  // A truncated compressed file: the documents before the cut stand, the
  // rest is one bad record naming the file.
  const std::vector<std::string> docs = sample_docs(400, 3);
  const std::string z = gzip(jsonl(docs));
  write_file(d / "cut.jsonl.gz", z.substr(0, z.size() * 3 / 4));
  DocumentSource cut;
  const std::vector<std::string> got = read_all(cut, (d / "cut.jsonl.gz").string());
  REQUIRE(!got.empty());
  REQUIRE(got.size() < docs.size());
  CHECK(std::equal(got.begin(), got.end(), docs.begin()));
  REQUIRE(cut.bad().size() == 1);
  CHECK(cut.bad()[0].why.find("truncated") != std::string::npos);
  // --on-bad-record fail: the first bad record is the error.
  SourceOptions fail;
  fail.fail_on_bad = true;
  DocumentSource strict(fail);
  try {
    read_all(strict, (d / "b.jsonl").string());
    FAIL("no error");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("b.jsonl:2: not a JSON value") != std::string::npos);
  }
}

TEST_CASE("corpus: inputs from files, directories and globs", "[data]") {
  const fs::path d = fresh_dir("inputs");
  write_file(d / "src" / "b.jsonl", "{\"text\": \"b\"}\n");
  write_file(d / "src" / "a.jsonl.gz", gzip("{\"text\": \"a\"}\n"));
  write_file(d / "src" / "sub" / "c.txt", "c");
  write_file(d / "src" / "README.md", "not a corpus file");
  write_file(d / "src" / ".cache" / "x.jsonl", "{\"text\": \"hidden\"}\n");
  write_file(d / "other" / "z.txt", "z");
  const std::string src = (d / "src").string();
  const adgt::data::Inputs in =
      adgt::data::expand_inputs({src, (d / "other" / "*.txt").string(), (d / "src" / "b.jsonl").string()});
  CHECK(in.files == std::vector<std::string>{src + "/a.jsonl.gz", src + "/b.jsonl", src + "/sub/c.txt",
                                             (d / "other" / "z.txt").string()});
  CHECK(in.passed == std::vector<std::string>{src + "/README.md"});
  const auto error_of = [](const std::vector<std::string>& a) {
    try {
      adgt::data::expand_inputs(a);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(error_of({(d / "missing").string()}).find("no such file, directory or match") != std::string::npos);
  // Named directly, a file of another name is text (as adgt-data always read
  // it); a Parquet file is Parquet (in a build without Arrow: refused by
  // name, with the fix), and refused when compressed outside.
  CHECK(adgt::data::expand_inputs({(d / "src" / "README.md").string()}).files ==
        std::vector<std::string>{(d / "src" / "README.md").string()});
  CHECK(adgt::data::text_format_of("x/notes") == adgt::data::TextFormat::Text);
  write_file(d / "t.parquet", "PAR1");
  const std::string parquet = error_of({(d / "t.parquet").string()});
  CHECK((parquet == "no error" || parquet.find("t.parquet: this build reads no Parquet") != std::string::npos));
  CHECK((parquet != "no error" || adgt::data::text_format_of("x/t.parquet") == adgt::data::TextFormat::Parquet));
  write_file(d / "t.parquet.gz", "");
  CHECK(error_of({(d / "t.parquet.gz").string()}).find("t.parquet.gz: a compressed Parquet file") != std::string::npos);
  CHECK(error_of({(d / "nothing*.jsonl").string()}).find("nothing*.jsonl") != std::string::npos);
}

TEST_CASE("corpus: UTF-8 validation against the standard's edge cases", "[data]") {
  using adgt::data::valid_utf8;
  CHECK(valid_utf8("plain ASCII"));
  CHECK(valid_utf8("\xC2\x80"));              // U+0080, the first 2-byte
  CHECK(valid_utf8("\xEF\xBF\xBF"));          // U+FFFF
  CHECK(valid_utf8("\xF4\x8F\xBF\xBF"));      // U+10FFFF, the last
  CHECK_FALSE(valid_utf8("\xC1\xBF"));        // overlong 2-byte
  CHECK_FALSE(valid_utf8("\xE0\x9F\xBF"));    // overlong 3-byte
  CHECK_FALSE(valid_utf8("\xF0\x8F\xBF\xBF")); // overlong 4-byte
  CHECK_FALSE(valid_utf8("\xED\xA0\x80"));    // U+D800, a surrogate
  CHECK_FALSE(valid_utf8("\xF4\x90\x80\x80")); // above U+10FFFF
  CHECK_FALSE(valid_utf8("\x80"));            // a lone continuation byte
  CHECK_FALSE(valid_utf8("\xE2\x82"));        // cut short
  CHECK_FALSE(valid_utf8("\xF5\x80\x80\x80"));
}

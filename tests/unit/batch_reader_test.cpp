// The read-ahead of input files (core/data/prepare/batch_reader.hpp) against
// DocumentSource read directly: the same documents in the same order, each
// file closed by one batch with its bad records; an error comes after the
// batches before it; dropping the reader while it waits does not hang.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/data/prepare/batch_reader.hpp"

namespace fs = std::filesystem;
using adgt::data::BatchReader;
using adgt::data::DocumentBatch;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("adgt_batch_reader_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// n JSON lines {"text": "PREFIX i ..."} and one bad line after the first.
std::string write_jsonl(const fs::path& p, const std::string& prefix, int n) {
  std::ofstream out(p);
  for (int i = 0; i < n; ++i) {
    out << "{\"text\": \"" << prefix << " " << i << std::string(size_t(i % 13), 'x') << "\"}\n";
    if (i == 0) out << "not json\n";
  }
  return p.string();
}

}  // namespace

TEST_CASE("batch reader: DocumentSource's documents in order, one end batch per file", "[data]") {
  const fs::path dir = fresh_dir("order");
  const std::vector<std::string> files = {write_jsonl(dir / "a.jsonl", "a", 50), write_jsonl(dir / "b.jsonl", "b", 7),
                                          write_jsonl(dir / "c.jsonl", "c", 120)};
  std::vector<std::string> want;
  adgt::data::DocumentSource src;
  for (size_t f = 1; f < files.size(); ++f) src.read(files[f], [&](std::string_view d) { want.emplace_back(d); });
  for (const size_t batch_docs : {size_t(1), size_t(4), size_t(1000)}) {
    BatchReader reader(files, 1, {}, 1 << 20, batch_docs, 1);
    std::vector<std::string> got;
    std::vector<size_t> ended;
    for (DocumentBatch b; reader.next(b);) {
      CHECK(b.docs.size() <= batch_docs);
      got.insert(got.end(), b.docs.begin(), b.docs.end());
      if (b.file_end) {
        ended.push_back(b.file);
        REQUIRE(b.bad.size() == 1);
        CHECK(b.bad[0].file == files[b.file]);
        CHECK(b.bad[0].line == 2);
      }
    }
    CHECK(got == want);
    CHECK(ended == std::vector<size_t>{1, 2});
  }
}

TEST_CASE("batch reader: an error after the batches before it; dropped while waiting", "[data]") {
  const fs::path dir = fresh_dir("error");
  const std::vector<std::string> files = {write_jsonl(dir / "a.jsonl", "a", 5), (dir / "missing.jsonl").string()};
  BatchReader reader(files, 0, {}, 1 << 20, 1000, 2);
  DocumentBatch b;
  REQUIRE(reader.next(b));
  CHECK(b.docs.size() == 5);
  CHECK(b.file_end);
  CHECK_THROWS_WITH(reader.next(b), Catch::Contains("missing.jsonl"));
  const std::vector<std::string> big = {write_jsonl(dir / "big.jsonl", "b", 5000)};
  { BatchReader dropped(big, 0, {}, 1 << 20, 1, 1); }  // its thread blocked on a full queue: must end
  SUCCEED("dropped without hanging");
}

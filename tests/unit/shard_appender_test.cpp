// A shard written a document at a time (core/data/prepare/shard_appender.hpp)
// against write_token_shard (core/data/token_shard.hpp) on the same tokens
// and starts: the same bytes, also after reopening at a synced point and
// after the last document is taken off; and the journal's file records
// (core/data/prepare/journal.hpp) give back the state they were made from.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/data/prepare/journal.hpp"
#include "core/data/prepare/shard_appender.hpp"
#include "core/data/token_shard.hpp"

namespace fs = std::filesystem;
using adgt::data::ShardAppender;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("adgt_shard_appender_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Documents of 1..40 ids below vocab, from a fixed LCG.
std::vector<std::vector<int32_t>> documents(int n, int64_t vocab) {
  std::vector<std::vector<int32_t>> docs;
  uint64_t s = 12345;
  for (int d = 0; d < n; ++d) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    std::vector<int32_t> ids(1 + (s >> 33) % 40);
    for (auto& t : ids) t = int32_t((s = s * 6364136223846793005ULL + 1) >> 40) % int32_t(vocab);
    docs.push_back(ids);
  }
  return docs;
}

void reference(const fs::path& p, const std::vector<std::vector<int32_t>>& docs, int64_t vocab) {
  std::vector<int32_t> all;
  std::vector<int64_t> starts;
  for (const auto& d : docs) starts.push_back(int64_t(all.size())), all.insert(all.end(), d.begin(), d.end());
  adgt::write_token_shard(p.string(), all, vocab, starts);
}

}  // namespace

TEST_CASE("shard appender: the bytes write_token_shard writes, u16 and u32", "[data]") {
  for (const int64_t vocab : {int64_t(300), int64_t(70000)}) {
    const fs::path dir = fresh_dir("bytes" + std::to_string(vocab));
    const auto docs = documents(5000, vocab);  // > 1 MiB of u32 tokens: several flushes
    reference(dir / "ref.bin", docs, vocab);
    ShardAppender out((dir / "got.bin").string(), vocab);
    for (const auto& d : docs) out.begin_document(), out.append(d);
    out.finish();
    CHECK(bytes_of(dir / "got.bin") == bytes_of(dir / "ref.bin"));
    CHECK_FALSE(fs::exists(dir / "got.bin.tmp"));
    CHECK_FALSE(fs::exists(dir / "got.bin.starts.tmp"));
  }
}

TEST_CASE("shard appender: reopened at a synced point, unsynced tokens are dropped", "[data]") {
  const fs::path dir = fresh_dir("resume");
  const auto docs = documents(300, 1000);
  reference(dir / "ref.bin", docs, 1000);
  const std::string path = (dir / "got.bin").string();
  int64_t tokens = 0, documents = 0;
  {
    ShardAppender out(path, 1000);
    for (size_t d = 0; d < 120; ++d) out.begin_document(), out.append(docs[d]);
    out.sync();
    tokens = out.tokens(), documents = out.documents();
    for (size_t d = 120; d < 150; ++d) out.begin_document(), out.append(docs[d]);  // lost in a "crash"
    out.sync();
  }
  ShardAppender again(path, 1000, tokens, documents);
  for (size_t d = 120; d < docs.size(); ++d) again.begin_document(), again.append(docs[d]);
  again.finish();
  CHECK(bytes_of(path) == bytes_of(dir / "ref.bin"));
  CHECK_THROWS_WITH(ShardAppender((dir / "none.bin").string(), 1000, 1, 1), Catch::Contains("none.bin.tmp"));
}

TEST_CASE("shard appender: the last document taken off, with its separator", "[data]") {
  const fs::path dir = fresh_dir("take");
  const auto docs = documents(10, 500);
  const std::vector<int32_t> sep = {7, 7};
  std::vector<std::vector<int32_t>> joined;  // docs 0..8 with the separator before each but the first
  for (size_t d = 0; d + 1 < docs.size(); ++d) joined.push_back(docs[d]);
  ShardAppender out((dir / "got.bin").string(), 500);
  for (size_t d = 0; d < docs.size(); ++d) {
    if (d) out.append(sep);
    out.begin_document();
    out.append(docs[d]);
  }
  CHECK(out.take_last_document(int64_t(sep.size())) == docs.back());
  out.finish();
  std::vector<int32_t> all;
  std::vector<int64_t> starts;
  for (size_t d = 0; d < joined.size(); ++d) {
    if (d) all.insert(all.end(), sep.begin(), sep.end());
    starts.push_back(int64_t(all.size()));
    all.insert(all.end(), joined[d].begin(), joined[d].end());
  }
  adgt::write_token_shard((dir / "ref.bin").string(), all, 500, starts);
  CHECK(bytes_of(dir / "got.bin") == bytes_of(dir / "ref.bin"));
}

TEST_CASE("shard appender: a token out of range and an empty document are named", "[data]") {
  const fs::path dir = fresh_dir("errors");
  ShardAppender out((dir / "x.bin").string(), 10);
  out.begin_document();
  CHECK_THROWS_WITH(out.append({1, 10}), Catch::Contains("x.bin") && Catch::Contains("id 10"));
  CHECK_THROWS_WITH(out.begin_document(), Catch::Contains("has no tokens"));
}

TEST_CASE("prepare journal: file records give back the state, a torn line is dropped", "[data]") {
  const fs::path dir = fresh_dir("journal");
  const std::string path = (dir / adgt::data::kJournalName).string();
  adgt::data::start_journal(path, {{"journal", "adgt-data prepare"}, {"options", {{"x", 1}}}});
  adgt::data::PrepareState s;
  s.documents = 12, s.empty = 1, s.last_doc_bytes = 33, s.doc_hash = 0x0123456789abcdefULL, s.lossless = 1;
  s.side[0] = {100, 10, 1000};
  s.side[1] = {20, 2, 200};
  s.bad = {{"a.jsonl", 3, "not a JSON value"}};
  adgt::data::append_journal(path, adgt::data::file_record(s, 0, "a.jsonl", 0));
  std::ofstream(path, std::ios::app) << "{\"file\": 1, \"pa";  // a crash inside a write
  const auto j = adgt::data::read_journal(path);
  REQUIRE(j);
  CHECK(j->header["options"]["x"] == 1);
  REQUIRE(j->files.size() == 1);
  CHECK_FALSE(j->done);
  adgt::data::PrepareState r;
  adgt::data::apply_file_record(r, j->files[0], path);
  CHECK(r.files_done == 1);
  CHECK(r.documents == 12);
  CHECK(r.empty == 1);
  CHECK(r.last_doc_bytes == 33);
  CHECK(r.doc_hash == s.doc_hash);
  CHECK(r.lossless == 1);
  CHECK(r.side[0].tokens == 100);
  CHECK(r.side[1].text_bytes == 200);
  REQUIRE(r.bad.size() == 1);
  CHECK(r.bad[0].file == "a.jsonl");
  CHECK(r.bad[0].line == 3);
  CHECK(bytes_of(path).back() == '\n');  // the torn line is gone from the file
}

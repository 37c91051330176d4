// Megatron-LM indexed datasets and llm.c shards read by TokenShard. The files
// are written here byte by byte from each project's documented layout
// (indexed_dataset.py's _IndexWriter, llm.c's write_datafile), independently
// of the reader.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/data/token_shard.hpp"

namespace fs = std::filesystem;
using namespace adgt;
using Catch::Matchers::Contains;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path p = fs::path(ADGT_BINARY_DIR) / "tmp" / "foreign_tokens_test" / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

template <class T>
void append(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

void spit(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(),
                                                                 std::streamsize(bytes.size()));
}

// PREFIX.bin/.idx with element type T (Megatron dtype `code`): documents of
// sequences, `lens[d]` the sequence lengths of document d.
template <class T>
void write_megatron(const fs::path& prefix, const std::vector<int64_t>& toks, uint8_t code,
                    const std::vector<std::vector<int32_t>>& docs, bool modes = false) {
  std::string bin, idx("MMIDIDX\0\0", 9);
  for (int64_t t : toks) append(bin, static_cast<T>(t));
  std::vector<int32_t> lens;
  std::vector<int64_t> doc_idx{0};
  for (const auto& d : docs) {
    lens.insert(lens.end(), d.begin(), d.end());
    doc_idx.push_back(static_cast<int64_t>(lens.size()));
  }
  append<uint64_t>(idx, 1);
  append<uint8_t>(idx, code);
  append<uint64_t>(idx, lens.size());
  append<uint64_t>(idx, doc_idx.size());
  for (int32_t l : lens) append(idx, l);
  int64_t ptr = 0;
  for (int32_t l : lens) append(idx, ptr), ptr += int64_t{l} * int64_t(sizeof(T));
  for (int64_t d : doc_idx) append(idx, d);
  if (modes)
    for (size_t i = 0; i < lens.size(); ++i) append<int8_t>(idx, 0);
  spit(prefix.string() + ".bin", bin);
  spit(prefix.string() + ".idx", idx);
}

std::vector<int32_t> all(const TokenShard& s) {
  std::vector<int32_t> v(static_cast<size_t>(s.size()));
  s.read(0, s.size(), v.data());
  return v;
}

}  // namespace

TEST_CASE("megatron: every integer dtype reads the same tokens and documents", "[data]") {
  const fs::path d = fresh_dir("dtypes");
  const std::vector<int64_t> toks{5, 0, 17, 99, 3, 3, 120, 7, 1};
  const std::vector<std::vector<int32_t>> docs{{2, 1}, {0}, {4, 2}};  // starts 0, 3, 3
  const std::vector<int32_t> want(toks.begin(), toks.end());
  write_megatron<uint8_t>(d / "u8", toks, 1, docs);
  write_megatron<int8_t>(d / "i8", toks, 2, docs);
  write_megatron<int16_t>(d / "i16", toks, 3, docs);
  write_megatron<int32_t>(d / "i32", toks, 4, docs, /*modes=*/true);
  write_megatron<int64_t>(d / "i64", toks, 5, docs);
  write_megatron<uint16_t>(d / "u16", toks, 8, docs);
  for (const char* name : {"u8", "i8", "i16", "i32", "i64", "u16"}) {
    INFO(name);
    for (const std::string spelling : {"", ".bin", ".idx"}) {
      const TokenShard s((d / name).string() + spelling);
      CHECK(s.format() == TokenFileFormat::Megatron);
      CHECK(all(s) == want);
      CHECK(s.vocab_size() == 121);
      CHECK(s.document_starts() == std::vector<int64_t>{0, 3, 3});
    }
  }
  int32_t two[2];
  TokenShard(d.string() + "/u16").read(6, 2, two);
  CHECK((two[0] == 120 && two[1] == 7));
}

TEST_CASE("llm.c: GPT-2 and Llama 3 headers", "[data]") {
  const fs::path d = fresh_dir("llmc");
  const std::vector<int32_t> toks{50256, 1, 2, 65535, 0};
  for (const bool llama : {false, true}) {
    std::string f;
    append<int32_t>(f, llama ? 20240801 : 20240520);
    append<int32_t>(f, llama ? 7 : 1);
    append<int32_t>(f, static_cast<int32_t>(toks.size()));
    f.resize(1024, '\0');
    for (int32_t t : toks) llama ? append<uint32_t>(f, t + 70000) : append<uint16_t>(f, uint16_t(t));
    const fs::path p = d / (llama ? "llama.bin" : "gpt2.bin");
    spit(p, f);
    const TokenShard s(p.string());
    CHECK(s.format() == TokenFileFormat::Llmc);
    CHECK(s.dtype_name() == std::string(llama ? "uint32" : "uint16"));
    std::vector<int32_t> want = toks;
    if (llama)
      for (auto& t : want) t += 70000;
    CHECK(all(s) == want);
    CHECK(s.vocab_size() == (llama ? 65535 + 70001 : 65536));
    CHECK(s.document_starts() == std::vector<int64_t>{0});
  }
}

TEST_CASE("megatron: malformed indexes are errors naming the file", "[data]") {
  const fs::path d = fresh_dir("bad");
  const std::vector<int64_t> toks{1, 2, 3, 4};
  write_megatron<uint16_t>(d / "gap", toks, 8, {{2, 2}});
  std::string idx;
  {
    std::ifstream in(d / "gap.idx", std::ios::binary);
    idx.assign(std::istreambuf_iterator<char>(in), {});
  }
  const int64_t gap = 6;  // second sequence's pointer: 4 -> 6
  std::memcpy(idx.data() + 34 + 8 + 8, &gap, 8);
  spit(d / "gap.idx", idx);
  CHECK_THROWS_WITH(TokenShard((d / "gap").string()),
                    Contains("gap.idx") && Contains("back-to-back"));

  write_megatron<int16_t>(d / "neg", {1, -2, 3}, 3, {{3}});
  CHECK_THROWS_WITH(TokenShard((d / "neg").string()), Contains("neg.bin") && Contains("-2"));

  write_megatron<uint16_t>(d / "cut", toks, 8, {{4}});
  spit(d / "cut.idx", idx.substr(0, 40));
  CHECK_THROWS_WITH(TokenShard((d / "cut").string()), Contains("cut.idx") && Contains("truncated"));

  write_megatron<uint16_t>(d / "empty", {}, 8, {});
  const TokenShard e((d / "empty").string());
  CHECK(e.size() == 0);
  CHECK(e.document_starts().empty());
  CHECK_THROWS_WITH(TokenShard((d / "none").string()), Contains("none"));
  CHECK_FALSE(token_file_exists((d / "none").string()));
  CHECK(token_file_exists((d / "empty").string()));
}

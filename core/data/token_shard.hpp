// Token shards: one memory-mapped binary file of token ids (adgt-data output,
// read by the sampler). Layout, little-endian (docs/data-format.md):
//
//   offset  size  field
//        0     8  magic "ADGTTOK\0"
//        8     4  u32 version (1, or 2 with a document index)
//       12     4  u32 dtype (1 = uint16, 2 = uint32)
//       16     8  u64 token count
//       24     8  u64 vocab size (every token id < vocab size)
//       32     8  u64 document count D (version 2; 0 in version 1)
//       40    24  zero
//       64     -  the tokens, token count * (2 or 4) bytes
//        -   8*D  version 2: i64 token offset where each document starts,
//                 ascending from 0; nothing after
//
// dtype is uint16 when vocab size <= 65536, else uint32.
//
// TokenShard also reads Megatron-LM indexed datasets and llm.c shards in place
// (core/data/foreign_tokens.hpp); their vocab size is the largest id + 1.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/data/foreign_tokens.hpp"

namespace adgt {

inline constexpr char kTokenShardMagic[8] = {'A', 'D', 'G', 'T', 'T', 'O', 'K', '\0'};
inline constexpr uint32_t kTokenShardVersion = 2;  // the newest; version 1 shards still load
inline constexpr uint32_t kTokenDtypeU16 = 1;
inline constexpr uint32_t kTokenDtypeU32 = 2;
inline constexpr int64_t kTokenShardHeaderBytes = 64;

// The dtype code write_token_shard picks for `vocab_size`.
uint32_t token_dtype_for_vocab(int64_t vocab_size);

// Writes `tokens` (each in [0, vocab_size)) to `path`: first to `path`.tmp,
// then renamed over `path`, so a reader never sees a half-written shard.
// Throws naming the file (and the offending token) on any failure.
// With `document_starts` (ascending from 0, each < the token count) the
// shard is version 2 and keeps them; without, version 1.
void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens,
                       int64_t vocab_size, const std::vector<int64_t>& document_starts = {});

enum class TokenFileFormat { Adgt, Megatron, Llmc };
const char* token_file_format_name(TokenFileFormat f);

// True when `path` names something TokenShard can try to open: a file, or the
// prefix of a Megatron PREFIX.idx.
bool token_file_exists(const std::string& path);

// A read-only memory map of a token file. `path` is an adgt shard, an llm.c
// shard, or a Megatron dataset (PREFIX, PREFIX.bin or PREFIX.idx); the format
// comes from the files' first bytes: a PREFIX.idx starting "MMIDIDX" next to
// the data makes it Megatron, else the file's magic decides. Validates the
// headers and the file lengths on open, and for llm.c and Megatron files
// scans every token once (vocab_size() = largest id + 1); throws
// std::runtime_error naming the file and a fix.
class TokenShard {
 public:
  explicit TokenShard(const std::string& path);
  TokenShard(TokenShard&& o) noexcept;
  TokenShard& operator=(TokenShard&& o) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;
  ~TokenShard();

  int64_t size() const { return count_; }  // token count
  // adgt shards: the header's vocab size. llm.c and Megatron files carry none:
  // the largest token id + 1 (0 when empty).
  int64_t vocab_size() const { return vocab_; }
  bool vocab_from_header() const { return format_ == TokenFileFormat::Adgt; }
  TokenFileFormat format() const { return format_; }
  const char* dtype_name() const { return token_elem_name(elem_); }
  const std::string& path() const { return path_; }
  // Token offsets where documents start, ascending: Megatron's document
  // boundaries; {0} for the single stream of an adgt or llm.c file ({} when
  // empty). The sampler ignores them and reads the concatenated stream.
  const std::vector<int64_t>& document_starts() const { return doc_starts_; }

  // out[0, n) = tokens [start, start+n); throws unless 0 <= start, 0 <= n,
  // start+n <= size(). An adgt shard's tokens are checked against its
  // header's vocabulary as they are read (a damaged or hand-made file can
  // hold larger ids; foreign files take theirs from the tokens): an id
  // outside it throws, naming the file and the token.
  void read(int64_t start, int64_t n, int32_t* out) const;

 private:
  void unmap() noexcept;
  void read_adgt_header(const std::string& path, uint64_t file_bytes);

  std::string path_;
  void* map_ = nullptr;  // whole file, PROT_READ
  size_t map_bytes_ = 0;
  const void* tokens_ = nullptr;  // map_ + header bytes
  int64_t count_ = 0;
  int64_t vocab_ = 0;
  TokenElem elem_ = TokenElem::U16;
  TokenFileFormat format_ = TokenFileFormat::Adgt;
  std::vector<int64_t> doc_starts_;
};

// ---- the train/validation split of a text (docs/data-format.md) ----
// The text is cut into blocks of about block_bytes, at paragraph or line
// boundaries; every k-th block (b % k == k-1) goes to validation, the rest to
// training, each side in text order.
struct TextBlock {
  size_t begin = 0, end = 0;  // byte range [begin, end) of the text
  bool val = false;
};
struct TextSplit {
  int64_t k = 0;            // 0: no validation blocks
  int64_t block_bytes = 0;  // target block size B
  std::vector<TextBlock> blocks;
};
// val_fraction in [0, 0.5]; k = round(1/val_fraction). B = min(65536,
// max(256, ceil(len / (4k)))) (65536 when val_fraction = 0). A block starting
// at s ends just after the first blank line ("\n\n") at or after s+B-1 when
// that lies before s+2B, else just after the first '\n' at or after s+B-1, else
// at the end of the text. If no block has b % k == k-1 but there are at least
// two blocks, the last one goes to validation. Throws on a bad val_fraction.
TextSplit split_text(std::string_view text, double val_fraction);

}  // namespace adgt

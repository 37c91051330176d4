// Token files written by other trainers, read in place by TokenShard
// (docs/data-format.md, "Reading Megatron and llm.c token files"):
//
//   Megatron-LM indexed dataset (megatron/core/datasets/indexed_dataset.py):
//     PREFIX.idx  "MMIDIDX\0\0", u64 version 1, u8 dtype code, u64 sequence
//                 count S, u64 document count D, i32 lengths[S], i64 byte
//                 pointers[S], i64 document indices[D] (sequence indices, 0
//                 first, S last), then optionally i8 modes[S] (multimodal)
//     PREFIX.bin  the tokens of every sequence back to back, nothing else
//   llm.c shard (dev/data/data_common.py): 256 int32 header ([0] magic, [1]
//     version, [2] token count), then the tokens; magic 20240520 version 1 is
//     uint16 (GPT-2), magic 20240801 version 7 is uint32 (Llama 3).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace adgt {

// The element type of the token ids in a file.
enum class TokenElem : uint8_t { U8, I8, I16, U16, I32, U32, I64 };
size_t token_elem_bytes(TokenElem e);
const char* token_elem_name(TokenElem e);

inline constexpr char kMegatronIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kMegatronIndexVersion = 1;
inline constexpr int32_t kLlmcMagicGpt2 = 20240520;    // version 1, uint16 tokens
inline constexpr int32_t kLlmcMagicLlama3 = 20240801;  // version 7, uint32 tokens
inline constexpr uint64_t kLlmcHeaderBytes = 256 * 4;

// Where the tokens lie in the tokens file, and where its documents start.
struct TokenLayout {
  TokenElem elem = TokenElem::U16;
  uint64_t offset = 0;  // byte offset of token 0
  uint64_t count = 0;   // tokens
  std::vector<int64_t> document_starts;  // token offsets, ascending
};

// True when the first bytes of a file (`bytes` of them at `head`) are an llm.c
// token shard header's magic.
bool is_llmc_magic(const void* head, uint64_t bytes);

// True when `path` is a readable file that starts with the Megatron index magic.
bool is_megatron_index(const std::string& path);

// Validates an llm.c header against the file's length (`file` maps all
// `file_bytes` of `path`). Throws std::runtime_error naming the file.
TokenLayout llmc_layout(const std::string& path, const void* file, uint64_t file_bytes);

// Reads and validates the Megatron index `idx_path` against its data file
// `bin_path` of `bin_bytes` bytes: known integer dtype, lengths that add up
// to the .bin, contiguous pointers, document indices from 0 to S. Throws
// std::runtime_error naming the file at fault.
TokenLayout megatron_layout(const std::string& idx_path, const std::string& bin_path,
                            uint64_t bin_bytes);

// The largest of `count` token ids of type `elem` at `tokens`. Throws naming
// `path` and the position of the first id that is negative or >= 2^31. A
// file's result is remembered for the process (by device, inode, size and
// modification time), so adgt-train's pre-launch check and the trainer scan a
// Megatron or llm.c file once per rank, not twice.
int64_t max_token_id(const std::string& path, const void* tokens, TokenElem elem, uint64_t count);

}  // namespace adgt

#include "core/data/foreign_tokens.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <compare>
#include <map>
#include <mutex>
#include <cstring>
#include <stdexcept>

namespace adgt {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error("token shard '" + path + "': " + what);
}

template <class T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// A read-only map of a whole file, unmapped on scope exit.
struct FileMap {
  const char* p = nullptr;
  uint64_t bytes = 0;
  explicit FileMap(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      fail(path, std::string("cannot stat: ") + std::strerror(e));
    }
    bytes = static_cast<uint64_t>(st.st_size);
    if (bytes == 0) {
      ::close(fd);
      return;
    }
    void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    const int e = errno;
    ::close(fd);
    if (m == MAP_FAILED) fail(path, std::string("mmap failed: ") + std::strerror(e));
    p = static_cast<const char*>(m);
  }
  ~FileMap() {
    if (p) ::munmap(const_cast<char*>(p), bytes);
  }
  FileMap(const FileMap&) = delete;
  FileMap& operator=(const FileMap&) = delete;
};

// Megatron's DType codes (indexed_dataset.py).
const char* megatron_dtype_name(uint8_t code) {
  switch (code) {
    case 1: return "uint8";
    case 2: return "int8";
    case 3: return "int16";
    case 4: return "int32";
    case 5: return "int64";
    case 6: return "float64";
    case 7: return "float32";
    case 8: return "uint16";
    default: return nullptr;
  }
}

template <class T>
int64_t max_of(const std::string& path, const T* p, uint64_t count) {
  int64_t mx = -1;
  for (uint64_t i = 0; i < count; ++i) {
    const auto v = static_cast<int64_t>(p[i]);
    if (v < 0 || v >= (int64_t{1} << 31)) [[unlikely]]
      fail(path, "token " + std::to_string(i) + " has id " + std::to_string(v) +
                     ", outside [0, 2^31); the file does not hold token ids");
    mx = v > mx ? v : mx;
  }
  return mx;
}

}  // namespace

size_t token_elem_bytes(TokenElem e) {
  switch (e) {
    case TokenElem::U8: case TokenElem::I8: return 1;
    case TokenElem::I16: case TokenElem::U16: return 2;
    case TokenElem::I32: case TokenElem::U32: return 4;
    case TokenElem::I64: return 8;
  }
  return 0;
}

const char* token_elem_name(TokenElem e) {
  switch (e) {
    case TokenElem::U8: return "uint8";
    case TokenElem::I8: return "int8";
    case TokenElem::I16: return "int16";
    case TokenElem::U16: return "uint16";
    case TokenElem::I32: return "int32";
    case TokenElem::U32: return "uint32";
    case TokenElem::I64: return "int64";
  }
  return "?";
}

bool is_llmc_magic(const void* head, uint64_t bytes) {
  if (bytes < 4) return false;
  const auto m = load<int32_t>(static_cast<const char*>(head));
  return m == kLlmcMagicGpt2 || m == kLlmcMagicLlama3;
}

bool is_megatron_index(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char head[sizeof kMegatronIndexMagic];
  const bool ok = ::read(fd, head, sizeof head) == static_cast<ssize_t>(sizeof head) &&
                  std::memcmp(head, kMegatronIndexMagic, sizeof head) == 0;
  ::close(fd);
  return ok;
}

TokenLayout llmc_layout(const std::string& path, const void* file, uint64_t file_bytes) {
  const char* p = static_cast<const char*>(file);
  if (file_bytes < kLlmcHeaderBytes)
    fail(path, "llm.c shard of " + std::to_string(file_bytes) +
                   " bytes is shorter than its 1024-byte header; it is truncated");
  const auto magic = load<int32_t>(p), version = load<int32_t>(p + 4), count = load<int32_t>(p + 8);
  TokenLayout t;
  t.offset = kLlmcHeaderBytes;
  if (magic == kLlmcMagicGpt2) {
    if (version != 1)
      fail(path, "llm.c shard version " + std::to_string(version) +
                     " is not supported (magic 20240520 has version 1, uint16 tokens)");
    t.elem = TokenElem::U16;
  } else if (magic == kLlmcMagicLlama3) {
    if (version != 7)
      fail(path, "llm.c shard version " + std::to_string(version) +
                     " is not supported (magic 20240801 has version 7, uint32 tokens)");
    t.elem = TokenElem::U32;
  } else {
    fail(path, "bad llm.c magic " + std::to_string(magic) + " (expected 20240520 or 20240801)");
  }
  if (count < 0) fail(path, "llm.c header says " + std::to_string(count) + " tokens");
  t.count = static_cast<uint64_t>(count);
  const uint64_t want = kLlmcHeaderBytes + t.count * token_elem_bytes(t.elem);
  if (file_bytes != want)
    fail(path, "llm.c header says " + std::to_string(count) + " " + token_elem_name(t.elem) +
                   " tokens (" + std::to_string(want) + " bytes with the header) but the file is " +
                   std::to_string(file_bytes) + " bytes; it is truncated or corrupt");
  if (t.count) t.document_starts = {0};
  return t;
}

TokenLayout megatron_layout(const std::string& idx_path, const std::string& bin_path,
                            uint64_t bin_bytes) {
  const FileMap idx(idx_path);
  constexpr uint64_t kHead = 34;  // magic 9, version 8, dtype 1, counts 8 + 8
  if (idx.bytes < kHead)
    fail(idx_path, "Megatron index of " + std::to_string(idx.bytes) +
                       " bytes is shorter than its 34-byte header; it is truncated");
  if (std::memcmp(idx.p, kMegatronIndexMagic, sizeof kMegatronIndexMagic) != 0)
    fail(idx_path, "bad magic (expected \"MMIDIDX\\0\\0\"); not a Megatron index");
  const auto version = load<uint64_t>(idx.p + 9);
  if (version != kMegatronIndexVersion)
    fail(idx_path, "Megatron index version " + std::to_string(version) +
                       " is not supported (expected 1)");
  const auto code = load<uint8_t>(idx.p + 17);
  const char* dname = megatron_dtype_name(code);
  if (!dname) fail(idx_path, "Megatron dtype code " + std::to_string(code) + " is unknown");
  TokenLayout t;
  switch (code) {
    case 1: t.elem = TokenElem::U8; break;
    case 2: t.elem = TokenElem::I8; break;
    case 3: t.elem = TokenElem::I16; break;
    case 4: t.elem = TokenElem::I32; break;
    case 5: t.elem = TokenElem::I64; break;
    case 8: t.elem = TokenElem::U16; break;
    default:
      fail(idx_path, std::string("Megatron dtype ") + dname +
                         " holds floats, not token ids; re-tokenize with an integer dtype");
  }
  const auto S = load<uint64_t>(idx.p + 18), D = load<uint64_t>(idx.p + 26);
  constexpr uint64_t kMaxCount = uint64_t{1} << 40;
  if (S > kMaxCount || D > kMaxCount)
    fail(idx_path, "Megatron index claims " + std::to_string(S) + " sequences and " +
                       std::to_string(D) + " documents; it is corrupt");
  const uint64_t plain = kHead + 12 * S + 8 * D;
  if (idx.bytes != plain && idx.bytes != plain + S)  // + S: multimodal modes
    fail(idx_path, "Megatron index is " + std::to_string(idx.bytes) + " bytes but its header (" +
                       std::to_string(S) + " sequences, " + std::to_string(D) +
                       " documents) needs " + std::to_string(plain) +
                       "; it is truncated or corrupt");
  const char* lens = idx.p + kHead;
  const char* ptrs = lens + 4 * S;
  const char* docs = ptrs + 8 * S;
  const uint64_t esz = token_elem_bytes(t.elem);
  std::vector<uint64_t> seq_start(S + 1, 0);  // token offset of each sequence
  for (uint64_t i = 0; i < S; ++i) {
    const auto len = load<int32_t>(lens + 4 * i);
    const auto ptr = load<int64_t>(ptrs + 8 * i);
    if (len < 0) fail(idx_path, "sequence " + std::to_string(i) + " has length " + std::to_string(len));
    if (static_cast<uint64_t>(ptr) != seq_start[i] * esz)
      fail(idx_path, "sequence " + std::to_string(i) + " starts at byte " + std::to_string(ptr) +
                         ", not right after the previous one (" +
                         std::to_string(seq_start[i] * esz) +
                         "); only back-to-back sequences can be read in place");
    seq_start[i + 1] = seq_start[i] + static_cast<uint64_t>(len);
  }
  t.count = seq_start[S];
  if (bin_bytes != t.count * esz)
    fail(bin_path, "the index " + idx_path + " describes " + std::to_string(t.count) + " " +
                       dname + " tokens (" + std::to_string(t.count * esz) +
                       " bytes) but the .bin is " + std::to_string(bin_bytes) +
                       " bytes; the pair is mismatched or truncated");
  if (D < 1 || load<int64_t>(docs) != 0 || load<int64_t>(docs + 8 * (D - 1)) != static_cast<int64_t>(S))
    fail(idx_path, "document indices must run from 0 to the sequence count " + std::to_string(S));
  t.document_starts.reserve(D - 1);
  for (uint64_t d = 0; d + 1 < D; ++d) {
    const auto a = load<int64_t>(docs + 8 * d), b = load<int64_t>(docs + 8 * (d + 1));
    if (b < a || b > static_cast<int64_t>(S))
      fail(idx_path, "document indices decrease or pass the sequence count at document " +
                         std::to_string(d));
    t.document_starts.push_back(static_cast<int64_t>(seq_start[static_cast<uint64_t>(a)]));
  }
  return t;
}

namespace {

// A scanned file as the process saw it: another file, or the same one
// rewritten, has another key.
struct ScanKey {
  uint64_t dev, ino, size;
  int64_t mtime_ns;
  uint64_t count;
  int elem;
  auto operator<=>(const ScanKey&) const = default;
};
std::mutex g_scan_mutex;
std::map<ScanKey, int64_t> g_scans;

int64_t scan_max_token_id(const std::string& path, const void* tokens, TokenElem elem,
                          uint64_t count) {
  switch (elem) {
    case TokenElem::U8: return max_of(path, static_cast<const uint8_t*>(tokens), count);
    case TokenElem::I8: return max_of(path, static_cast<const int8_t*>(tokens), count);
    case TokenElem::I16: return max_of(path, static_cast<const int16_t*>(tokens), count);
    case TokenElem::U16: return max_of(path, static_cast<const uint16_t*>(tokens), count);
    case TokenElem::I32: return max_of(path, static_cast<const int32_t*>(tokens), count);
    case TokenElem::U32: return max_of(path, static_cast<const uint32_t*>(tokens), count);
    case TokenElem::I64: return max_of(path, static_cast<const int64_t*>(tokens), count);
  }
  return -1;
}

}  // namespace

int64_t max_token_id(const std::string& path, const void* tokens, TokenElem elem, uint64_t count) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return scan_max_token_id(path, tokens, elem, count);
  const ScanKey key{uint64_t(st.st_dev), uint64_t(st.st_ino), uint64_t(st.st_size),
                    int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec, count, int(elem)};
  {
    std::lock_guard<std::mutex> lock(g_scan_mutex);
    if (auto it = g_scans.find(key); it != g_scans.end()) return it->second;
  }
  const int64_t m = scan_max_token_id(path, tokens, elem, count);
  std::lock_guard<std::mutex> lock(g_scan_mutex);
  g_scans[key] = m;
  return m;
}

}  // namespace adgt

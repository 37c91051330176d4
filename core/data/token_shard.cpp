#include "core/data/token_shard.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include "kernels/check.hpp"

static_assert(std::endian::native == std::endian::little,
              "token shards are little-endian; add byte swapping for this host");

namespace adgt {
namespace {

[[noreturn]] void shard_error(const std::string& path, const std::string& what) {
  throw std::runtime_error("token shard '" + path + "': " + what);
}

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t dtype;
  uint64_t count;
  uint64_t vocab;
  uint8_t zero[32];
};
static_assert(sizeof(Header) == kTokenShardHeaderBytes);

size_t dtype_bytes(uint32_t dtype) { return dtype == kTokenDtypeU16 ? 2 : 4; }

}  // namespace

uint32_t token_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size <= 65536 ? kTokenDtypeU16 : kTokenDtypeU32;
}

void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens,
                       int64_t vocab_size) {
  if (vocab_size <= 0 || vocab_size > (int64_t{1} << 31))
    shard_error(path, "vocab size " + std::to_string(vocab_size) +
                          " is out of range; it must be in [1, 2^31]");
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size)
      shard_error(path, "token " + std::to_string(i) + " has id " + std::to_string(tokens[i]) +
                            ", outside [0, " + std::to_string(vocab_size) +
                            "); the tokenizer and the vocab size disagree");
  }
  Header h{};
  std::memcpy(h.magic, kTokenShardMagic, 8);
  h.version = kTokenShardVersion;
  h.dtype = token_dtype_for_vocab(vocab_size);
  h.count = tokens.size();
  h.vocab = static_cast<uint64_t>(vocab_size);

  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) shard_error(tmp, std::string("cannot create: ") + std::strerror(errno));
  bool ok = std::fwrite(&h, sizeof h, 1, f) == 1;
  constexpr size_t kChunk = 1 << 16;
  if (h.dtype == kTokenDtypeU16) {
    std::vector<uint16_t> buf;
    for (size_t i = 0; ok && i < tokens.size(); i += kChunk) {
      const size_t n = std::min(kChunk, tokens.size() - i);
      buf.assign(tokens.begin() + i, tokens.begin() + i + n);
      ok = std::fwrite(buf.data(), 2, n, f) == n;
    }
  } else {
    ok = ok && (tokens.empty() || std::fwrite(tokens.data(), 4, tokens.size(), f) == tokens.size());
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    shard_error(tmp, "write failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) shard_error(path, "cannot rename " + tmp + " into place: " + ec.message());
}

TokenShard::TokenShard(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    shard_error(path, std::string("cannot open: ") + std::strerror(errno) +
                          " (make it with `adgt-data prepare`)");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    shard_error(path, std::string("cannot stat: ") + std::strerror(e));
  }
  const auto file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < sizeof(Header)) {
    ::close(fd);
    shard_error(path, "file is " + std::to_string(file_bytes) +
                          " bytes, shorter than the 64-byte header; it is truncated or not a "
                          "token shard");
  }
  map_ = ::mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    shard_error(path, std::string("mmap failed: ") + std::strerror(map_errno));
  }
  map_bytes_ = file_bytes;

  Header h;
  std::memcpy(&h, map_, sizeof h);
  try {
    if (std::memcmp(h.magic, kTokenShardMagic, 8) != 0)
      shard_error(path, "bad magic (expected \"ADGTTOK\\0\"); not a token shard");
    if (h.version != kTokenShardVersion)
      shard_error(path, "version " + std::to_string(h.version) + " is not supported (expected " +
                            std::to_string(kTokenShardVersion) + "); re-run adgt-data prepare");
    if (h.dtype != kTokenDtypeU16 && h.dtype != kTokenDtypeU32)
      shard_error(path,
                  "dtype code " + std::to_string(h.dtype) + " is unknown (1 = uint16, 2 = uint32)");
    if (h.vocab == 0 || h.vocab > (uint64_t{1} << 31))
      shard_error(path, "vocab size " + std::to_string(h.vocab) + " in the header is invalid");
    if (h.dtype == kTokenDtypeU16 && h.vocab > 65536)
      shard_error(path, "dtype uint16 cannot hold vocab size " + std::to_string(h.vocab));
    const uint64_t payload = file_bytes - sizeof(Header);
    const uint64_t esz = dtype_bytes(h.dtype);
    if (h.count > payload / esz)
      shard_error(path, "truncated: the header says " + std::to_string(h.count) + " tokens (" +
                            std::to_string(h.count * esz) + " bytes) but only " +
                            std::to_string(payload) +
                            " bytes follow the header; re-run adgt-data prepare");
    if (h.count * esz != payload)
      shard_error(path, "corrupt: " + std::to_string(payload - h.count * esz) +
                            " bytes follow the " + std::to_string(h.count) +
                            " tokens the header promises; re-run adgt-data prepare");
  } catch (...) {
    unmap();
    throw;
  }
  ::madvise(map_, map_bytes_, MADV_RANDOM);
  tokens_ = static_cast<const char*>(map_) + sizeof(Header);
  count_ = static_cast<int64_t>(h.count);
  vocab_ = static_cast<int64_t>(h.vocab);
  dtype_ = h.dtype;
}

TokenShard::TokenShard(TokenShard&& o) noexcept { *this = std::move(o); }

TokenShard& TokenShard::operator=(TokenShard&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    map_ = o.map_;
    map_bytes_ = o.map_bytes_;
    tokens_ = o.tokens_;
    count_ = o.count_;
    vocab_ = o.vocab_;
    dtype_ = o.dtype_;
    o.map_ = nullptr;
    o.map_bytes_ = 0;
    o.tokens_ = nullptr;
    o.count_ = 0;
  }
  return *this;
}

TokenShard::~TokenShard() { unmap(); }

void TokenShard::unmap() noexcept {
  if (map_) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
}

void TokenShard::read(int64_t start, int64_t n, int32_t* out) const {
  ADGT_CHECK(start >= 0 && n >= 0 && start <= count_ && n <= count_ - start,
             "token shard '" << path_ << "': read of [" << start << ", " << start + n
                             << ") is outside its " << count_ << " tokens");
  if (dtype_ == kTokenDtypeU16) {
    const auto* p = static_cast<const uint16_t*>(tokens_) + start;
    for (int64_t i = 0; i < n; ++i) out[i] = p[i];
  } else {
    std::memcpy(out, static_cast<const uint32_t*>(tokens_) + start,
                static_cast<size_t>(n) * sizeof(int32_t));
  }
}

}  // namespace adgt

namespace adgt {

TextSplit split_text(std::string_view text, double val_fraction) {
  if (!(val_fraction >= 0.0 && val_fraction <= 0.5))
    throw std::runtime_error("--val-fraction " + std::to_string(val_fraction) +
                             " is out of range; use a value in [0, 0.5] (e.g. 0.05)");
  TextSplit sp;
  const auto len = static_cast<int64_t>(text.size());
  if (val_fraction > 0) {
    sp.k = std::max<int64_t>(2, std::llround(1.0 / val_fraction));
    sp.block_bytes =
        std::min<int64_t>(65536, std::max<int64_t>(256, (len + 4 * sp.k - 1) / (4 * sp.k)));
  } else {
    sp.block_bytes = 65536;
  }
  const int64_t B = sp.block_bytes;
  for (int64_t s = 0; s < len;) {
    int64_t end = len;
    if (s + B < len) {
      const size_t para = text.find("\n\n", static_cast<size_t>(s + B - 1));
      if (para != std::string_view::npos && static_cast<int64_t>(para) < s + 2 * B) {
        end = static_cast<int64_t>(para) + 2;
      } else {
        const size_t nl = text.find('\n', static_cast<size_t>(s + B - 1));
        if (nl != std::string_view::npos) end = static_cast<int64_t>(nl) + 1;
      }
    }
    TextBlock b;
    b.begin = static_cast<size_t>(s);
    b.end = static_cast<size_t>(end);
    b.val = sp.k > 0 && static_cast<int64_t>(sp.blocks.size()) % sp.k == sp.k - 1;
    sp.blocks.push_back(b);
    s = end;
  }
  if (sp.k > 0 && sp.blocks.size() >= 2 && static_cast<int64_t>(sp.blocks.size()) < sp.k)
    sp.blocks.back().val = true;
  return sp;
}

}  // namespace adgt

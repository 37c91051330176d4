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
  uint64_t documents;  // version 2: entries of the document index after the tokens (0 in version 1)
  uint8_t zero[24];
};
static_assert(sizeof(Header) == kTokenShardHeaderBytes);

[[noreturn]] void too_short(const std::string& path, uint64_t file_bytes) {
  shard_error(path, "file is " + std::to_string(file_bytes) +
                        " bytes, shorter than the 64-byte header; it is truncated or not a "
                        "token shard");
}

size_t dtype_bytes(uint32_t dtype) { return dtype == kTokenDtypeU16 ? 2 : 4; }

}  // namespace

uint32_t token_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size <= 65536 ? kTokenDtypeU16 : kTokenDtypeU32;
}

void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens,
                       int64_t vocab_size, const std::vector<int64_t>& document_starts) {
  for (size_t i = 0; i < document_starts.size(); ++i)
    if (document_starts[i] < 0 || document_starts[i] >= int64_t(tokens.size()) ||
        (i > 0 && document_starts[i] <= document_starts[i - 1]) || (i == 0 && document_starts[i] != 0))
      shard_error(path, "document start " + std::to_string(i) + " (" + std::to_string(document_starts[i]) +
                            ") is not ascending from 0 inside the " + std::to_string(tokens.size()) + " tokens");
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
  h.version = document_starts.empty() ? 1 : kTokenShardVersion;
  h.dtype = token_dtype_for_vocab(vocab_size);
  h.count = tokens.size();
  h.vocab = static_cast<uint64_t>(vocab_size);
  h.documents = document_starts.size();

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
  ok = ok && (document_starts.empty() ||
              std::fwrite(document_starts.data(), 8, document_starts.size(), f) == document_starts.size());
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    shard_error(tmp, "write failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) shard_error(path, "cannot rename " + tmp + " into place: " + ec.message());
}

const char* token_file_format_name(TokenFileFormat f) {
  switch (f) {
    case TokenFileFormat::Adgt: return "adgt";
    case TokenFileFormat::Megatron: return "megatron";
    case TokenFileFormat::Llmc: return "llm.c";
  }
  return "?";
}

bool token_file_exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec) || std::filesystem::exists(path + ".idx", ec);
}

TokenShard::TokenShard(const std::string& path) : path_(path) {
  // A Megatron dataset is named by its prefix, its .bin or its .idx.
  std::string data = path, index;
  const auto ends = [&](const char* ext) {
    return path.size() > 4 && path.compare(path.size() - 4, 4, ext) == 0;
  };
  const std::string stem = path.size() > 4 ? path.substr(0, path.size() - 4) : path;
  std::error_code ec;
  if (ends(".idx")) {
    index = path;
    data = stem + ".bin";
  } else if (ends(".bin") && is_megatron_index(stem + ".idx")) {
    index = stem + ".idx";
  } else if (!std::filesystem::exists(path, ec) && std::filesystem::exists(path + ".idx", ec)) {
    index = path + ".idx";
    data = path + ".bin";
  }

  const int fd = ::open(data.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    shard_error(data, std::string("cannot open: ") + std::strerror(errno) +
                          (index.empty() ? " (make it with `adgt-data prepare`)"
                                         : " (the data file of Megatron index " + index + ")"));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    shard_error(data, std::string("cannot stat: ") + std::strerror(e));
  }
  const auto file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes > 0) {
    map_ = ::mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED, fd, 0);
    const int map_errno = errno;
    ::close(fd);
    if (map_ == MAP_FAILED) {
      map_ = nullptr;
      shard_error(data, std::string("mmap failed: ") + std::strerror(map_errno));
    }
  } else {
    ::close(fd);
  }
  map_bytes_ = file_bytes;

  try {
    if (!index.empty()) {
      format_ = TokenFileFormat::Megatron;
    } else if (file_bytes >= 8 && std::memcmp(map_, kTokenShardMagic, 8) == 0) {
      format_ = TokenFileFormat::Adgt;
    } else if (is_llmc_magic(map_, file_bytes)) {
      format_ = TokenFileFormat::Llmc;
    } else if (file_bytes >= sizeof kMegatronIndexMagic &&
               std::memcmp(map_, kMegatronIndexMagic, sizeof kMegatronIndexMagic) == 0) {
      shard_error(data, "this is a Megatron index; name it PREFIX.idx (beside PREFIX.bin) "
                        "or give the prefix");
    } else if (file_bytes < sizeof(Header)) {
      too_short(data, file_bytes);
    } else {
      shard_error(data, "bad magic (expected \"ADGTTOK\\0\", an llm.c magic 20240520 or "
                        "20240801, or a Megatron PREFIX.idx beside PREFIX.bin); not a token "
                        "shard");
    }
    if (format_ == TokenFileFormat::Adgt) {
      read_adgt_header(data, file_bytes);
    } else {
      TokenLayout t = format_ == TokenFileFormat::Llmc
                          ? llmc_layout(data, map_, file_bytes)
                          : megatron_layout(index, data, file_bytes);
      tokens_ = static_cast<const char*>(map_) + t.offset;
      count_ = static_cast<int64_t>(t.count);
      elem_ = t.elem;
      doc_starts_ = std::move(t.document_starts);
      ::madvise(map_, map_bytes_, MADV_SEQUENTIAL);
      vocab_ = max_token_id(data, tokens_, elem_, t.count) + 1;
    }
  } catch (...) {
    unmap();
    throw;
  }
  if (map_) ::madvise(map_, map_bytes_, MADV_RANDOM);
}

void TokenShard::read_adgt_header(const std::string& path, uint64_t file_bytes) {
  if (file_bytes < sizeof(Header)) too_short(path, file_bytes);
  Header h;
  std::memcpy(&h, map_, sizeof h);
  if (h.version != 1 && h.version != kTokenShardVersion)
    shard_error(path, "version " + std::to_string(h.version) + " is not supported (1 or " +
                          std::to_string(kTokenShardVersion) + "); re-run adgt-data prepare");
  if (h.version == 1 && h.documents != 0)
    shard_error(path, "corrupt: a version 1 header with a document count");
  if (h.version == 2 && h.documents == 0 && h.count > 0)
    shard_error(path, "corrupt: a version 2 header without a document index");
  if (h.dtype != kTokenDtypeU16 && h.dtype != kTokenDtypeU32)
    shard_error(path,
                "dtype code " + std::to_string(h.dtype) + " is unknown (1 = uint16, 2 = uint32)");
  if (h.vocab == 0 || h.vocab > (uint64_t{1} << 31))
    shard_error(path, "vocab size " + std::to_string(h.vocab) + " in the header is invalid");
  if (h.dtype == kTokenDtypeU16 && h.vocab > 65536)
    shard_error(path, "dtype uint16 cannot hold vocab size " + std::to_string(h.vocab));
  const uint64_t esz = dtype_bytes(h.dtype);
  if (h.documents > (file_bytes - sizeof(Header)) / 8)
    shard_error(path, "truncated: the header says " + std::to_string(h.documents) +
                          " documents, more than the file could index; re-run adgt-data prepare");
  const uint64_t payload = file_bytes - sizeof(Header) - 8 * h.documents;
  if (h.count > payload / esz)
    shard_error(path, "truncated: the header says " + std::to_string(h.count) + " tokens (" +
                          std::to_string(h.count * esz) + " bytes) but only " +
                          std::to_string(payload) +
                          " bytes follow the header; re-run adgt-data prepare");
  if (h.count * esz != payload)
    shard_error(path, "corrupt: " + std::to_string(payload - h.count * esz) +
                          " bytes follow the " + std::to_string(h.count) +
                          " tokens the header promises; re-run adgt-data prepare");
  tokens_ = static_cast<const char*>(map_) + sizeof(Header);
  count_ = static_cast<int64_t>(h.count);
  vocab_ = static_cast<int64_t>(h.vocab);
  elem_ = h.dtype == kTokenDtypeU16 ? TokenElem::U16 : TokenElem::U32;
  if (h.documents == 0) {
    if (count_) doc_starts_ = {0};
    return;
  }
  // Version 2: the document index after the tokens, ascending from 0.
  doc_starts_.resize(size_t(h.documents));
  std::memcpy(doc_starts_.data(), static_cast<const char*>(map_) + sizeof(Header) + h.count * esz,
              size_t(h.documents) * 8);
  for (size_t i = 0; i < doc_starts_.size(); ++i)
    if (doc_starts_[i] < 0 || doc_starts_[i] >= count_ || (i == 0 && doc_starts_[i] != 0) ||
        (i > 0 && doc_starts_[i] <= doc_starts_[i - 1]))
      shard_error(path, "corrupt: document index entry " + std::to_string(i) + " (" +
                            std::to_string(doc_starts_[i]) + ") is not ascending from 0 inside the tokens");
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
    elem_ = o.elem_;
    format_ = o.format_;
    doc_starts_ = std::move(o.doc_starts_);
    o.map_ = nullptr;
    o.map_bytes_ = 0;
    o.tokens_ = nullptr;
    o.count_ = 0;
    o.doc_starts_.clear();
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
  const char* base = static_cast<const char*>(tokens_);
  const auto widen = [&](auto tag) {
    using T = decltype(tag);
    const auto* p = reinterpret_cast<const T*>(base) + start;
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(p[i]);
  };
  switch (elem_) {
    case TokenElem::U8: widen(uint8_t{}); break;
    case TokenElem::I8: widen(int8_t{}); break;
    case TokenElem::I16: widen(int16_t{}); break;
    case TokenElem::U16: widen(uint16_t{}); break;
    case TokenElem::I64: widen(int64_t{}); break;
    case TokenElem::I32:
    case TokenElem::U32:
      if (n) std::memcpy(out, base + start * 4, static_cast<size_t>(n) * sizeof(int32_t));
      break;
  }
  if (format_ == TokenFileFormat::Adgt) {
    // Unsigned: an id of 2^31 or more (uint32 shards) reads as negative.
    const auto vocab = static_cast<uint32_t>(vocab_);
    for (int64_t i = 0; i < n; ++i)
      if (static_cast<uint32_t>(out[i]) >= vocab) [[unlikely]]
        throw std::runtime_error("token shard '" + path_ + "': token " + std::to_string(start + i) + " has id " +
                                 std::to_string(static_cast<uint32_t>(out[i])) + ", outside the header's vocab size " +
                                 std::to_string(vocab_) + "; the file is corrupt (re-run adgt-data prepare)");
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

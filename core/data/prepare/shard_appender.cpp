// A token shard written a document at a time (shard_appender.hpp).
#include "core/data/prepare/shard_appender.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "core/data/token_shard.hpp"

namespace adgt::data {
namespace {

constexpr size_t kFlushBytes = size_t(1) << 20;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error("token shard '" + path + "': " + what);
}

int open_file(const std::string& path, bool create) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_TRUNC : 0), 0644);
  if (fd < 0) fail(path, std::string(create ? "cannot create: " : "cannot open: ") + std::strerror(errno));
  return fd;
}

void read_at(int fd, int64_t offset, void* p, size_t n, const std::string& path) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t got = ::pread(fd, c, n, offset);
    if (got <= 0) fail(path, "read failed (file cut short?)");
    c += got, n -= size_t(got), offset += got;
  }
}

int64_t file_size(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(path, std::string("cannot stat: ") + std::strerror(errno));
  return int64_t(st.st_size);
}

}  // namespace

ShardAppender::ShardAppender(std::string path, int64_t vocab_size)
    : path_(std::move(path)), tmp_(path_ + ".tmp"), starts_tmp_(path_ + ".starts.tmp"), vocab_(vocab_size) {
  if (vocab_size <= 0 || vocab_size > (int64_t{1} << 31))
    fail(path_, "vocab size " + std::to_string(vocab_size) + " is out of range; it must be in [1, 2^31]");
  elem_bytes_ = token_dtype_for_vocab(vocab_size) == kTokenDtypeU16 ? 2 : 4;
  fd_ = open_file(tmp_, true);
  starts_fd_ = open_file(starts_tmp_, true);
  const char zero[kTokenShardHeaderBytes] = {};
  write_at(fd_, 0, zero, sizeof zero, tmp_);  // the header, written by finish()
}

ShardAppender::ShardAppender(std::string path, int64_t vocab_size, int64_t tokens, int64_t documents)
    : path_(std::move(path)), tmp_(path_ + ".tmp"), starts_tmp_(path_ + ".starts.tmp"), vocab_(vocab_size) {
  elem_bytes_ = token_dtype_for_vocab(vocab_size) == kTokenDtypeU16 ? 2 : 4;
  fd_ = open_file(tmp_, false);
  starts_fd_ = open_file(starts_tmp_, false);
  if (file_size(fd_, tmp_) < kTokenShardHeaderBytes + tokens * elem_bytes_)
    fail(tmp_, "holds fewer than the " + std::to_string(tokens) +
                   " tokens the journal recorded; start over with --force");
  if (file_size(starts_fd_, starts_tmp_) < documents * 8)
    fail(starts_tmp_, "holds fewer than the " + std::to_string(documents) +
                          " document starts the journal recorded; start over with --force");
  truncate_to(tokens, documents);
}

ShardAppender::~ShardAppender() {
  if (fd_ >= 0) ::close(fd_);
  if (starts_fd_ >= 0) ::close(starts_fd_);
}

void ShardAppender::write_at(int fd, int64_t offset, const void* p, size_t n, const std::string& what) {
  const auto* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t put = ::pwrite(fd, c, n, offset);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) fail(what, std::string("write failed: ") + std::strerror(errno) + " (disk full?)");
    c += put, n -= size_t(put), offset += put;
  }
}

void ShardAppender::truncate_to(int64_t tokens, int64_t documents) {
  if (::ftruncate(fd_, kTokenShardHeaderBytes + tokens * elem_bytes_) != 0 ||
      ::ftruncate(starts_fd_, documents * 8) != 0)
    fail(tmp_, std::string("cannot truncate: ") + std::strerror(errno));
  tokens_ = flushed_tokens_ = tokens;
  documents_ = flushed_documents_ = documents;
  last_start_ = -1;
  if (documents > 0) read_at(starts_fd_, (documents - 1) * 8, &last_start_, 8, starts_tmp_);
}

void ShardAppender::begin_document() {
  if (tokens_ <= last_start_)
    fail(path_, "document " + std::to_string(documents_) + " starts at token " + std::to_string(tokens_) +
                    ", where the one before it started: it has no tokens");
  if (documents_ == 0 && tokens_ != 0)
    fail(path_, "the first document must start at token 0, not " + std::to_string(tokens_));
  start_buf_.push_back(tokens_);
  last_start_ = tokens_;
  ++documents_;
}

void ShardAppender::append(const std::vector<int32_t>& ids) {
  const size_t at = buf_.size();
  buf_.resize(at + ids.size() * size_t(elem_bytes_));
  char* out = buf_.data() + at;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t t = ids[i];
    if (t < 0 || t >= vocab_)
      fail(path_, "token " + std::to_string(tokens_ + int64_t(i)) + " has id " + std::to_string(t) +
                      ", outside [0, " + std::to_string(vocab_) + "); the tokenizer and the vocab size disagree");
    if (elem_bytes_ == 2) {
      const uint16_t v = uint16_t(t);
      std::memcpy(out + 2 * i, &v, 2);
    } else {
      std::memcpy(out + 4 * i, &t, 4);
    }
  }
  tokens_ += int64_t(ids.size());
  if (buf_.size() >= kFlushBytes) flush();
}

void ShardAppender::flush() {
  write_at(fd_, kTokenShardHeaderBytes + flushed_tokens_ * elem_bytes_, buf_.data(), buf_.size(), tmp_);
  write_at(starts_fd_, flushed_documents_ * 8, start_buf_.data(), start_buf_.size() * 8, starts_tmp_);
  flushed_tokens_ = tokens_;
  flushed_documents_ = documents_;
  buf_.clear();
  start_buf_.clear();
}

void ShardAppender::sync() {
  flush();
  if (::fsync(fd_) != 0 || ::fsync(starts_fd_) != 0)
    fail(tmp_, std::string("fsync failed: ") + std::strerror(errno));
}

std::vector<int32_t> ShardAppender::take_last_document(int64_t separator) {
  flush();
  const int64_t cut_to = last_start_ - separator;
  if (documents_ == 0 || cut_to < 0) fail(path_, "no last document to take");
  std::vector<int32_t> ids(size_t(tokens_ - last_start_));
  std::vector<char> raw(ids.size() * size_t(elem_bytes_));
  read_at(fd_, kTokenShardHeaderBytes + last_start_ * elem_bytes_, raw.data(), raw.size(), tmp_);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (elem_bytes_ == 2) {
      uint16_t v;
      std::memcpy(&v, raw.data() + 2 * i, 2);
      ids[i] = v;
    } else {
      std::memcpy(&ids[i], raw.data() + 4 * i, 4);
    }
  }
  truncate_to(cut_to, documents_ - 1);
  return ids;
}

void ShardAppender::finish() {
  flush();
  // The header as write_token_shard writes it (token_shard.cpp): magic,
  // version, dtype, count, vocab, documents, zero.
  char h[kTokenShardHeaderBytes] = {};
  const uint32_t version = documents_ > 0 ? kTokenShardVersion : 1, dtype = token_dtype_for_vocab(vocab_);
  const uint64_t count = uint64_t(tokens_), vocab = uint64_t(vocab_), docs = uint64_t(documents_);
  std::memcpy(h, kTokenShardMagic, 8);
  std::memcpy(h + 8, &version, 4);
  std::memcpy(h + 12, &dtype, 4);
  std::memcpy(h + 16, &count, 8);
  std::memcpy(h + 24, &vocab, 8);
  std::memcpy(h + 32, &docs, 8);
  write_at(fd_, 0, h, sizeof h, tmp_);
  std::vector<char> chunk(kFlushBytes);
  const int64_t index_at = kTokenShardHeaderBytes + tokens_ * elem_bytes_, index_bytes = documents_ * 8;
  for (int64_t off = 0; off < index_bytes;) {
    const size_t n = size_t(std::min<int64_t>(int64_t(chunk.size()), index_bytes - off));
    read_at(starts_fd_, off, chunk.data(), n, starts_tmp_);
    write_at(fd_, index_at + off, chunk.data(), n, tmp_);
    off += int64_t(n);
  }
  if (::ftruncate(fd_, index_at + index_bytes) != 0 || ::fsync(fd_) != 0)
    fail(tmp_, std::string("cannot finish: ") + std::strerror(errno));
  ::close(fd_);
  ::close(starts_fd_);
  fd_ = starts_fd_ = -1;
  std::error_code ec;
  std::filesystem::rename(tmp_, path_, ec);
  if (ec) fail(path_, "cannot rename " + tmp_ + " into place: " + ec.message());
  std::filesystem::remove(starts_tmp_, ec);
}

}  // namespace adgt::data

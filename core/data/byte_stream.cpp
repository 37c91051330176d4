// A file's bytes, decompressed on the fly (byte_stream.hpp).
#include "core/data/byte_stream.hpp"

#include <zlib.h>
#include <zstd.h>

#include <cstdio>
#include <stdexcept>
#include <vector>

namespace adgt::data {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

constexpr size_t kChunk = size_t(1) << 16;  // compressed bytes read at a time

}  // namespace

Compression compression_of(const std::string& path) {
  if (ends_with(path, ".gz")) return Compression::Gzip;
  if (ends_with(path, ".zst")) return Compression::Zstd;
  return Compression::None;
}

struct ByteStream::Impl {
  Compression kind = Compression::None;
  std::FILE* f = nullptr;
  int64_t consumed = 0;      // file bytes handed to the decompressor (or read, uncompressed)
  int64_t produced = 0;      // decompressed bytes returned
  std::vector<char> in;      // compressed input not yet consumed: [in_pos, in_len)
  size_t in_pos = 0, in_len = 0;
  bool file_done = false;
  // gzip
  z_stream zs{};
  bool z_ready = false;
  bool in_member = false;    // inside a gzip member (started, not ended)
  // zstd
  ZSTD_DCtx* zd = nullptr;
  size_t zstd_hint = 0;      // the last ZSTD_decompressStream result: 0 at a frame's end

  // Refills `in` when empty; false once the file has no more bytes.
  bool refill(const std::string& path) {
    if (in_pos < in_len) return true;
    if (file_done) return false;
    in.resize(kChunk);
    in_len = std::fread(in.data(), 1, kChunk, f);
    in_pos = 0;
    if (in_len < kChunk) {
      if (std::ferror(f)) throw std::runtime_error(path + ": read error after " + std::to_string(consumed) + " bytes");
      file_done = true;
    }
    return in_len > 0;
  }
};

ByteStream::ByteStream(const std::string& path) : path_(path), impl_(std::make_unique<Impl>()) {
  impl_->kind = compression_of(path);
  impl_->f = std::fopen(path.c_str(), "rb");
  if (!impl_->f) throw std::runtime_error(path + ": cannot open for reading");
  if (impl_->kind == Compression::Gzip) {
    if (inflateInit2(&impl_->zs, 15 + 16) != Z_OK) throw std::runtime_error(path + ": zlib: inflateInit2 failed");
    impl_->z_ready = true;
  } else if (impl_->kind == Compression::Zstd) {
    impl_->zd = ZSTD_createDCtx();
    if (!impl_->zd) throw std::runtime_error(path + ": zstd: cannot create a decompression context");
  }
}

ByteStream::~ByteStream() {
  if (impl_->z_ready) inflateEnd(&impl_->zs);
  if (impl_->zd) ZSTD_freeDCtx(impl_->zd);
  if (impl_->f) std::fclose(impl_->f);
}

int64_t ByteStream::file_bytes() const { return impl_->consumed; }

size_t ByteStream::read(char* out, size_t n) {
  Impl& s = *impl_;
  if (n == 0) return 0;
  const auto where = [&] {
    return " (after " + std::to_string(s.consumed) + " compressed bytes, " + std::to_string(s.produced) +
           " bytes of text)";
  };
  if (s.kind == Compression::None) {
    const size_t got = std::fread(out, 1, n, s.f);
    if (got < n && std::ferror(s.f)) throw std::runtime_error(path_ + ": read error" + where());
    s.consumed += int64_t(got);
    s.produced += int64_t(got);
    return got;
  }
  size_t done = 0;
  while (done < n) {
    if (!s.refill(path_)) {
      // The end of the file: it must not fall inside a member or a frame,
      // nor come before the first (gzip -t and zstd -t refuse an empty file).
      if (s.consumed == 0)
        throw std::runtime_error(path_ + ": the file is empty, not a " +
                                 (s.kind == Compression::Gzip ? "gzip" : "zstd") +
                                 " stream (a compressed file holds at least one " +
                                 (s.kind == Compression::Gzip ? "member" : "frame") + ")");
      if (s.kind == Compression::Gzip && s.in_member)
        throw std::runtime_error(path_ + ": the gzip stream is truncated (it ends inside a member)" + where());
      if (s.kind == Compression::Zstd && s.zstd_hint != 0)
        throw std::runtime_error(path_ + ": the zstd stream is truncated (it ends inside a frame)" + where());
      break;
    }
    const size_t avail = s.in_len - s.in_pos;
    size_t used = 0, made = 0;
    if (s.kind == Compression::Gzip) {
      s.zs.next_in = reinterpret_cast<Bytef*>(s.in.data() + s.in_pos);
      s.zs.avail_in = uInt(avail);
      s.zs.next_out = reinterpret_cast<Bytef*>(out + done);
      s.zs.avail_out = uInt(n - done);
      s.in_member = true;
      const int rc = inflate(&s.zs, Z_NO_FLUSH);
      used = avail - s.zs.avail_in;
      made = (n - done) - s.zs.avail_out;
      if (rc == Z_STREAM_END) {
        s.in_member = false;  // the next member, if any, starts afresh
        if (inflateReset(&s.zs) != Z_OK) throw std::runtime_error(path_ + ": zlib: inflateReset failed");
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {  // Z_BUF_ERROR: no progress possible yet
        throw std::runtime_error(path_ + ": damaged gzip data (zlib: " +
                                 std::string(s.zs.msg ? s.zs.msg : zError(rc)) + ")" + where());
      }
    } else {
      ZSTD_inBuffer ib{s.in.data() + s.in_pos, avail, 0};
      ZSTD_outBuffer ob{out + done, n - done, 0};
      const size_t rc = ZSTD_decompressStream(s.zd, &ob, &ib);
      if (ZSTD_isError(rc))
        throw std::runtime_error(path_ + ": damaged zstd data (zstd: " + ZSTD_getErrorName(rc) + ")" + where());
      s.zstd_hint = rc;
      used = ib.pos;
      made = ob.pos;
    }
    s.in_pos += used;
    s.consumed += int64_t(used);
    s.produced += int64_t(made);
    done += made;
    if (used == 0 && made == 0 && s.in_pos < s.in_len) {
      // Input left that the decompressor takes no more of: trailing garbage
      // after the last member or frame.
      throw std::runtime_error(path_ + ": data after the end of the compressed stream" + where());
    }
  }
  return done;
}

}  // namespace adgt::data

// A file's bytes, decompressed on the fly when its name ends in .gz (zlib:
// every gzip member) or .zst (libzstd: every frame), read in order in
// chunks of bounded size (the corpus is never held whole). A stream that
// ends inside a gzip member or a zstd frame, an empty file (no member or
// frame at all), or compressed data that are damaged, is a
// std::runtime_error naming the file and what was read of it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace adgt::data {

enum class Compression { None, Gzip, Zstd };

// By the file's name: .gz, .zst, else none.
Compression compression_of(const std::string& path);

class ByteStream {
 public:
  explicit ByteStream(const std::string& path);  // throws naming the file if it cannot be opened
  ~ByteStream();
  ByteStream(const ByteStream&) = delete;
  ByteStream& operator=(const ByteStream&) = delete;

  // Up to n decompressed bytes into out; 0 at the end of the stream. Throws
  // on damaged or truncated compressed data.
  size_t read(char* out, size_t n);
  // Bytes of the file consumed so far (compressed bytes for .gz and .zst).
  int64_t file_bytes() const;
  const std::string& path() const { return path_; }

 private:
  struct Impl;
  std::string path_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace adgt::data

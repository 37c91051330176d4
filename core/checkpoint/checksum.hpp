// CRC-32 (IEEE 802.3 polynomial, the zlib / PNG / Python `zlib.crc32` variant)
// over raw bytes. Checkpoints store one per tensor so that any tool can verify a
// tensor with `zlib.crc32(arr.astype('<f4').tobytes())`.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace adgt {

// Continues a running CRC: crc32_update(0, p, n) is the CRC of p[0..n);
// crc32_update(crc32_update(0, a, n), b, m) is the CRC of a followed by b.
uint32_t crc32_update(uint32_t crc, const void* data, size_t bytes);
// The table-driven path only (the reference the PCLMUL path is tested against).
uint32_t crc32_update_portable(uint32_t crc, const void* data, size_t bytes);
inline uint32_t crc32(const void* data, size_t bytes) { return crc32_update(0, data, bytes); }
// The CRC of A followed by B, from crc(A), crc(B) and B's length (zlib's crc32_combine).
uint32_t crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t bytes_b);
// The CRCs of many buffers at once, split into 16 MiB pieces spread over
// OpenMP threads and recombined; equal to calling crc32() on each.
struct ByteRange {
  const void* data = nullptr;
  size_t bytes = 0;
};
std::vector<uint32_t> crc32_many(const std::vector<ByteRange>& ranges);

}  // namespace adgt

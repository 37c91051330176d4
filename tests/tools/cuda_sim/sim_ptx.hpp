// Host emulation of the inline-PTX wrappers of kernels/cuda/flash_ptx.cuh,
// same names and signatures, for running flash_attention_kernels.cuh under
// ADGT_CUDA_SIM (include sim_runtime.hpp first). Each follows the PTX ISA's
// description of the instruction; the fragment layouts are those of the PTX
// ISA sections "Matrix Fragments for mma.m16n8k16 with floating point type"
// and "ldmatrix".
//
// LIMITATION: this emulation encodes the same reading of those fragment
// layouts as the kernels' author. It checks the kernels' own logic (tile
// indexing, masking, tails past T, the GQA head mapping, the online softmax,
// the buffer hand-offs between warps and pipeline stages) against an
// independent reference, but it cannot catch a misreading of how the hardware
// lays out fragments: if both got a layout wrong the same way, the test
// passes and the GPU disagrees. Only a run on a GPU checks that.
//
// Shared-memory "addresses" are byte offsets into the kernels' dynamic shared
// memory (adgt::cuda::smem_raw); every access is checked against this
// launch's size and the instruction's alignment.
#pragma once
#include <cmath>

#include "kernels/common/bf16.hpp"
#include "tests/tools/cuda_sim/sim_runtime.hpp"

namespace adgt::cuda_sim {

inline void check_smem(uint32_t addr, uint32_t bytes, uint32_t align) {
  if (addr % align) fail("misaligned shared-memory access");
  if (size_t(addr) + bytes > rt.smem_bytes) fail("shared-memory access past the dynamic size");
}
inline uint16_t smem_b16(uint32_t addr) {
  uint16_t v;
  std::memcpy(&v, adgt::cuda::smem_raw + addr, 2);
  return v;
}
inline uint32_t b16x2(uint16_t lo, uint16_t hi) { return uint32_t(lo) | (uint32_t(hi) << 16); }
inline double bf16_half(uint32_t reg, int half) {
  return double(adgt::bf16_to_float(uint16_t(half ? reg >> 16 : reg & 0xffffu)));
}

}  // namespace adgt::cuda_sim

namespace adgt::cuda {
namespace {

// Shared-window address of a pointer into dynamic shared memory
// (__cvta_generic_to_shared): here its byte offset.
inline uint32_t smem_u32(const void* p) {
  using namespace adgt::cuda_sim;
  const auto* c = static_cast<const unsigned char*>(p);
  if (c < smem_raw || c >= smem_raw + rt.smem_bytes) fail("pointer outside dynamic shared memory");
  return uint32_t(c - smem_raw);
}

// cp.async.{cg,ca}.shared.global [dst], [src], size, src-size: copies
// src-size bytes and zero-fills the rest of `size`. The data is only
// guaranteed once a cp.async.wait_group has retired the copy's committed
// group, so here the destination turns to NaN bytes at issue and the copy
// happens at that wait: a read before the wait, or a refill of a buffer other
// warps still read, gives NaNs or wrong data.
inline void cp_async(uint32_t dst, const void* src, uint32_t size, bool valid) {
  using namespace adgt::cuda_sim;
  check_smem(dst, size, size);
  if (valid) {
    if (reinterpret_cast<uintptr_t>(src) % size) fail("misaligned cp.async source");
    check_global(src, size);
  }
  std::memset(smem_raw + dst, 0xff, size);
  rt.cur->open.push_back(Copy{dst, src, size, valid ? size : 0});
}
inline void cp_async16(uint32_t dst, const void* src, bool valid) { cp_async(dst, src, 16, valid); }
inline void cp_async4(uint32_t dst, const void* src, bool valid) { cp_async(dst, src, 4, valid); }

// cp.async.commit_group: the thread's copies issued since the last commit
// become one group (possibly empty).
inline void cp_async_commit() {
  auto& f = *adgt::cuda_sim::rt.cur;
  f.groups.push_back(std::move(f.open));
  f.open.clear();
}

// cp.async.wait_group N: waits until at most the N most recent committed
// groups of this thread are pending, i.e. completes all older ones.
// Uncommitted copies are not waited for.
template <int N>
inline void cp_async_wait() {
  auto& f = *adgt::cuda_sim::rt.cur;
  while (f.groups.size() > size_t(N)) {
    for (const auto& c : f.groups.front()) {
      if (c.n) std::memcpy(smem_raw + c.dst, c.src, c.n);
      std::memset(smem_raw + c.dst + c.n, 0, c.size - c.n);
    }
    f.groups.pop_front();
  }
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 {r0..r3}, [addr]: four
// 8x8 matrices of b16. Lanes 8i..8i+7 give the 16-byte row addresses of
// matrix i (rows 0..7). Without .trans, lane l gets in r[i] row l/4, columns
// 2(l%4) and 2(l%4)+1 (the lower column in the low half). With .trans the
// matrix is transposed: r[i] holds (row 2(l%4), column l/4) and
// (row 2(l%4)+1, column l/4).
inline void ldsm(uint32_t (&r)[4], uint32_t addr, bool trans) {
  using namespace adgt::cuda_sim;
  check_smem(addr, 16, 16);
  const Slot* s = collective(Slot{trans ? Op::LdsmT : Op::Ldsm, {addr}});
  const unsigned l = threadIdx.x % 32;
  for (int i = 0; i < 4; ++i) {
    if (!trans) {
      const uint32_t row = s[8 * i + l / 4].w[0];
      r[i] = b16x2(smem_b16(row + (l % 4) * 4), smem_b16(row + (l % 4) * 4 + 2));
    } else {
      const uint32_t row0 = s[8 * i + 2 * (l % 4)].w[0], row1 = s[8 * i + 2 * (l % 4) + 1].w[0];
      r[i] = b16x2(smem_b16(row0 + (l / 4) * 2), smem_b16(row1 + (l / 4) * 2));
    }
  }
}
inline void ldsm_x4(uint32_t (&r)[4], uint32_t addr) { ldsm(r, addr, false); }
inline void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) { ldsm(r, addr, true); }

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: D(16x8) = A(16x16)
// B(16x8) + C, D = C in place. With g = lane/4 and t = lane%4:
//   A: a[0] = (row g,   k 2t, 2t+1), a[1] = (row g+8, k 2t, 2t+1),
//      a[2] = (row g,   k 2t+8, +9), a[3] = (row g+8, k 2t+8, +9);
//   B: b0 = (k 2t, 2t+1, column g), b1 = (k 2t+8, 2t+9, column g);
//   C/D: c[0], c[1] = (row g, columns 2t, 2t+1), c[2], c[3] = row g+8;
// the lower k (or column) in the low half of each register. The bf16
// products are exact; here the 16-term dot product is summed in double and
// added to C with one rounding to fp32 (the hardware's fp32 accumulation
// differs in the last bits).
inline void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  using namespace adgt::cuda_sim;
  const Slot* s = collective(Slot{Op::Mma, {a[0], a[1], a[2], a[3], b0, b1}});
  auto A = [&](int row, int k) {  // lane (row%8)*4 + (k%8)/2, register (row/8) + 2(k/8)
    return bf16_half(s[(row % 8) * 4 + (k % 8) / 2].w[row / 8 + 2 * (k / 8)], k % 2);
  };
  auto B = [&](int k, int col) {  // lane col*4 + (k%8)/2, register b(k/8)
    return bf16_half(s[col * 4 + (k % 8) / 2].w[4 + k / 8], k % 2);
  };
  const int g = int(threadIdx.x % 32) / 4, t = int(threadIdx.x % 4);
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i / 2) * 8, col = 2 * t + i % 2;
    double acc = 0;
    for (int k = 0; k < 16; ++k) acc += A(row, k) * B(k, col);
    c[i] = float(double(c[i]) + acc);
  }
}

// ex2.approx.ftz.f32: 2^x; subnormal inputs and results flushed to +0
// (2^-inf = 0, 2^+inf = inf). The hardware's approximation error (~2 ulp) is
// not modelled.
inline float fast_exp2(float x) {
  if (std::fpclassify(x) == FP_SUBNORMAL) x = 0.f;
  const float y = std::exp2(x);
  return std::fpclassify(y) == FP_SUBNORMAL ? 0.f : y;
}

// __floats2bfloat162_rn: two floats to bf16x2, round to nearest even, `lo` in
// the low half.
inline uint32_t pack_bf16(float lo, float hi) {
  return uint32_t(adgt::float_to_bf16(lo)) | (uint32_t(adgt::float_to_bf16(hi)) << 16);
}

}  // namespace
}  // namespace adgt::cuda

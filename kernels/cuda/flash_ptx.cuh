// Inline-PTX wrappers of the flash attention kernels
// (flash_attention_kernels.cuh): shared-memory addresses, cp.async with zero
// fill, ldmatrix (.trans), mma.sync m16n8k16 bf16 -> fp32, ex2.approx and the
// bf16x2 pack. Only these touch the hardware-specific instructions, so a host
// build can swap them for emulated versions with the same names and
// signatures (tests/tools/cuda_sim/, ADGT_CUDA_SIM) and run the real kernel
// source on the CPU. CUDA translation units only.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define ADGT_FLASH_NO_MMA 1  // mma.sync bf16, ldmatrix, cp.async need sm_80
#endif

// In an unnamed namespace like the kernels: one translation unit
// (flash_attention.cu) includes them.
namespace adgt::cuda {
namespace {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; zero-filled when !valid (src unread).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
#ifndef ADGT_FLASH_NO_MMA
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
#endif
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
#ifndef ADGT_FLASH_NO_MMA
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifndef ADGT_FLASH_NO_MMA
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifndef ADGT_FLASH_NO_MMA
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
#ifndef ADGT_FLASH_NO_MMA
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#else
  r[0] = r[1] = r[2] = r[3] = 0;
#endif
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
#ifndef ADGT_FLASH_NO_MMA
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#else
  r[0] = r[1] = r[2] = r[3] = 0;
#endif
}

// c(16x8, fp32) += a(16x16, bf16, row) * b(16x8, bf16, col).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
#ifndef ADGT_FLASH_NO_MMA
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// 2^x (ex2.approx, flushes subnormal results to 0; 2^-inf = 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats -> bf16x2 (round to nearest even); `lo` in the low half, i.e.
// the element with the smaller column index.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

}  // namespace
}  // namespace adgt::cuda

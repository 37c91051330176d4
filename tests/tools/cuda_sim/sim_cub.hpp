// Host stand-ins for the CUB calls of the kernel headers (CUB is a library,
// outside the emulation, like cuBLAS): what kernels/cuda/embedding_kernels.cuh
// uses of cub::DeviceRadixSort and cub::BlockScan, with CUB's contracts.
// Include after sim_cuda.hpp and before the kernel header (which includes
// the real CUB only under nvcc).
//
// DeviceRadixSort::SortPairs: the two-call protocol (a null temp pointer only
// sets the size; the second call needs at least that many bytes), and a
// stable least-significant-digit radix sort on key bits [begin_bit, end_bit)
// only, as CUB's: keys that differ only outside those bits keep their input
// order. The temporaries really are used (as the sort's second buffer), and
// overlap between the buffers, which CUB does not allow, aborts.
//
// BlockScan<T, BLOCK_DIM_X>: ExclusiveSum (with and without the block
// aggregate). Every thread writes its input to TempStorage, __syncthreads,
// then reads what it needs; as in CUB, a caller that reuses TempStorage must
// __syncthreads first, and without that barrier the emulation's schedule
// (sim_runtime.hpp) lets a thread overwrite an input others still read.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "tests/tools/cuda_sim/sim_cuda.hpp"

namespace cub {

struct DeviceRadixSort {
  template <class K, class V, class NumItemsT>
  static cudaError_t SortPairs(void* d_temp_storage, size_t& temp_storage_bytes,
                               const K* d_keys_in, K* d_keys_out, const V* d_values_in,
                               V* d_values_out, NumItemsT num_items, int begin_bit = 0,
                               int end_bit = int(sizeof(K) * 8), cudaStream_t = nullptr) {
    static_assert(std::is_integral_v<K> && std::is_unsigned_v<K>, "SortPairs: unsigned keys");
    using adgt::cuda_sim::fail;
    const size_t n = num_items > 0 ? size_t(num_items) : 0;
    // A second buffer of keys and of values, as CUB's onesweep/LSD sorts need.
    const size_t kb = round_up(n * sizeof(K)), need = kb + round_up(n * sizeof(V)) + 256;
    if (!d_temp_storage) {
      temp_storage_bytes = need;
      return cudaSuccess;
    }
    if (temp_storage_bytes < need) fail("cub::DeviceRadixSort::SortPairs: temp storage too small");
    if (begin_bit < 0 || end_bit > int(sizeof(K) * 8) || begin_bit > end_bit)
      fail("cub::DeviceRadixSort::SortPairs: bit range");
    if (!n) return cudaSuccess;
    const Span ko{d_keys_out, n * sizeof(K)}, vo{d_values_out, n * sizeof(V)};
    const Span ki{d_keys_in, n * sizeof(K)}, vi{d_values_in, n * sizeof(V)};
    const Span tmp{d_temp_storage, temp_storage_bytes};
    for (const Span& out : {ko, vo})
      for (const Span& other : {ki, vi, tmp})
        if (overlap(out, other)) fail("cub::DeviceRadixSort::SortPairs: buffers overlap");
    if (overlap(ko, vo) || overlap(ki, tmp) || overlap(vi, tmp))
      fail("cub::DeviceRadixSort::SortPairs: buffers overlap");
    std::memset(d_temp_storage, 0xa5, temp_storage_bytes);  // scribbled over, as CUB does
    K* tk = static_cast<K*>(d_temp_storage);
    V* tv = reinterpret_cast<V*>(static_cast<unsigned char*>(d_temp_storage) + kb);
    // Ping-pong between the output and the temporaries, 8 bits a pass.
    K *src_k = d_keys_out, *dst_k = tk;
    V *src_v = d_values_out, *dst_v = tv;
    std::memcpy(src_k, d_keys_in, n * sizeof(K));
    std::memcpy(src_v, d_values_in, n * sizeof(V));
    for (int bit = begin_bit; bit < end_bit; bit += 8) {
      const int w = end_bit - bit < 8 ? end_bit - bit : 8;
      const K mask = K((1u << w) - 1);
      size_t start[257] = {};
      for (size_t i = 0; i < n; ++i) ++start[((src_k[i] >> bit) & mask) + 1];
      for (int d = 0; d < 256; ++d) start[d + 1] += start[d];
      for (size_t i = 0; i < n; ++i) {
        const size_t at = start[(src_k[i] >> bit) & mask]++;
        dst_k[at] = src_k[i];
        dst_v[at] = src_v[i];
      }
      std::swap(src_k, dst_k);
      std::swap(src_v, dst_v);
    }
    if (src_k != d_keys_out) {
      std::memcpy(d_keys_out, src_k, n * sizeof(K));
      std::memcpy(d_values_out, src_v, n * sizeof(V));
    }
    return cudaSuccess;
  }

 private:
  struct Span {
    const void* p;
    size_t n;
  };
  static bool overlap(const Span& a, const Span& b) {
    const auto *x = static_cast<const unsigned char*>(a.p), *y = static_cast<const unsigned char*>(b.p);
    return a.n && b.n && x < y + b.n && y < x + a.n;
  }
  static size_t round_up(size_t b) { return (b + 255) & ~size_t(255); }
};

template <class T, int BLOCK_DIM_X>
class BlockScan {
 public:
  struct TempStorage {
    T v[BLOCK_DIM_X];
  };
  explicit BlockScan(TempStorage& s) : s_(s) {
    if (blockDim.x != unsigned(BLOCK_DIM_X)) adgt::cuda_sim::fail("cub::BlockScan: block size");
  }
  // out = the sum of the inputs of the threads before this one (0 for thread 0).
  void ExclusiveSum(T in, T& out) {
    T total;
    ExclusiveSum(in, out, total);
  }
  // ... and total = the sum of all the block's inputs, in every thread.
  void ExclusiveSum(T in, T& out, T& total) {
    const unsigned me = threadIdx.x;
    s_.v[me] = in;
    __syncthreads();
    T run = T(0);
    for (unsigned i = 0; i < unsigned(BLOCK_DIM_X); ++i) {
      if (i == me) out = run;
      run += s_.v[i];
    }
    total = run;
  }

 private:
  TempStorage& s_;
};

}  // namespace cub

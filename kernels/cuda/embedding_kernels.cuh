// CUDA token embedding (vocab-parallel) kernels and the ops that launch them.
// Semantics: kernels/cpu/embedding.cpp.
//
// Deterministic embedding backward, on the device, no host synchronisation:
//  1. keys[i] = tokens[i] - vocab_start for tokens in this shard, Vl for the
//     others; rows[i] = i;
//  2. a stable radix sort of (key, row) by key (cub::DeviceRadixSort, only the
//     ceil(log2(Vl+1)) key bits): per key, its rows stay in ascending order;
//  3. the start of every run of equal keys, compacted in order by a
//     reduce-then-scan over tiles (three small kernels with cub::BlockScan;
//     CUB 3.0's device-wide scan and select kernels spill registers on sm_90,
//     which the build refuses; the run count stays on the device);
//  4. one block per run (grid: the bound min(N, Vl); blocks past the device's
//     count, and the run of key Vl, exit) adds its gradient rows in ascending
//     row order to dtable's row, each thread owning columns.
// No atomics; the CPU backend's summation order (ascending rows per vocabulary
// row, onto the existing value): bitwise reproducible, and equal to the
// previous host path. Temporaries: the kScratchIndex scratch.
//
// ADGT_EMBEDDING_BWD=host (embedding.cu) selects that previous path, kept for
// comparison: the token ids are read back, the host builds the per-row lists
// (embedding_host_lists: a counting sort, O(N + V)) and uploads them (one
// device-to-host copy and a synchronisation per call); the same accumulation
// kernels run on them (embedding_backward_lists).
//
// embedding.cu (the CUDA backend's methods) and the host emulation's test
// (tests/kernel_sim/embedding_sim_test.cpp) include this header; the
// emulation's CUB stand-ins are tests/tools/cuda_sim/sim_cub.hpp.
#pragma once
#ifndef ADGT_CUDA_SIM
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#endif

#include <algorithm>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"

namespace adgt::cuda {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void embedding_fwd_kernel(T* __restrict__ out, const T* __restrict__ table,
                                     const int32_t* __restrict__ tok, int64_t V, int64_t C,
                                     int64_t vocab_start) {
  const int64_t i = blockIdx.x;
  const int64_t t = int64_t(tok[i]) - vocab_start;
  T* o = out + i * C;
  if (t >= 0 && t < V) {
    const T* src = table + t * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = src[c];
  } else {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = T(0);
  }
}

// Where block b's gradient rows come from: segment(b, ...) gives its
// vocabulary row and its token rows idx[k0..k1) (ascending), or false when the
// block has nothing to do (uniform over the block).
//
// The host path's lists: csr = [row ids (R) | offsets (R+1) | token rows].
struct HostLists {
  const int32_t* csr;
  int64_t R;
  __device__ __forceinline__ bool segment(int64_t b, int64_t& row, int32_t& k0, int32_t& k1,
                                          const int32_t*& idx) const {
    row = csr[b];
    k0 = csr[R + b];
    k1 = csr[R + b + 1];
    idx = csr + 2 * R + 1;
    return true;
  }
};

// The device path's sorted pairs: run b starts at starts[b] (*runs runs in
// all); its key is keys[starts[b]], its rows rows[starts[b] .. next start or N).
// The run of key V (tokens of other shards), always the last, is skipped.
struct SortedRuns {
  const uint32_t* keys;    // sorted keys (N)
  const int32_t* rows;     // token rows in key order, ascending within a key
  const int32_t* starts;   // first position of each run
  const int32_t* runs;     // the number of runs (written on the device)
  int32_t N;
  uint32_t V;
  __device__ __forceinline__ bool segment(int64_t b, int64_t& row, int32_t& k0, int32_t& k1,
                                          const int32_t*& idx) const {
    const int64_t n = *runs;
    if (b >= n) return false;
    k0 = starts[b];
    const uint32_t key = keys[k0];
    if (key >= V) return false;
    k1 = b + 1 < n ? starts[b + 1] : N;
    row = int64_t(key);
    idx = rows;
    return true;
  }
};

// keys[i] = tokens[i] - vocab_start in this shard, else V; rows[i] = i.
__global__ void __launch_bounds__(256)
    embedding_keys_kernel(uint32_t* __restrict__ keys, int32_t* __restrict__ rows,
                          const int32_t* __restrict__ tok, int64_t N, int64_t V,
                          int64_t vocab_start) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N; i += stride) {
    const int64_t t = int64_t(tok[i]) - vocab_start;
    keys[i] = t >= 0 && t < V ? uint32_t(t) : uint32_t(V);
    rows[i] = int32_t(i);
  }
}

// Position i of the sorted keys starts a run of equal keys.
__device__ __forceinline__ bool run_start(const uint32_t* __restrict__ keys, int64_t i) {
  return i == 0 || keys[i] != keys[i - 1];
}

// The run starts, compacted in ascending order (reduce, then scan): tiles of
// kTile positions, each thread kScanItems consecutive ones (a blocked
// arrangement, so the block's exclusive scan follows position order).
constexpr int kScanThreads = 256, kScanItems = 8, kTile = kScanThreads * kScanItems;

// Bit j set: position base + j (< N) starts a run.
__device__ __forceinline__ unsigned start_mask(const uint32_t* __restrict__ keys, int64_t N,
                                               int64_t base) {
  unsigned m = 0;
#pragma unroll
  for (int j = 0; j < kScanItems; ++j)
    if (base + j < N && run_start(keys, base + j)) m |= 1u << j;
  return m;
}

// 1. cnt[tile] = the number of run starts in the tile.
__global__ void __launch_bounds__(kScanThreads)
    embedding_tile_counts_kernel(int32_t* __restrict__ cnt, const uint32_t* __restrict__ keys,
                                 int64_t N) {
  __shared__ int32_t red[32];
  const int64_t base = int64_t(blockIdx.x) * kTile + int64_t(threadIdx.x) * kScanItems;
  const int32_t s = block_sum(int32_t(__popc(start_mask(keys, N, base))), red);
  if (threadIdx.x == 0) cnt[blockIdx.x] = s;
}

// 2. One block: cnt[tile] = the runs before the tile (exclusive scan, in
// place); cnt[tiles] = the number of runs.
constexpr int kOffsetThreads = 1024;
__global__ void __launch_bounds__(kOffsetThreads)
    embedding_tile_offsets_kernel(int32_t* __restrict__ cnt, int64_t tiles) {
  using Scan = cub::BlockScan<int32_t, kOffsetThreads>;
  __shared__ typename Scan::TempStorage tmp;
  int32_t carry = 0;
  for (int64_t b0 = 0; b0 < tiles; b0 += kOffsetThreads) {
    const int64_t b = b0 + threadIdx.x;
    const int32_t c = b < tiles ? cnt[b] : 0;
    int32_t off, total;
    Scan(tmp).ExclusiveSum(c, off, total);
    if (b < tiles) cnt[b] = carry + off;
    carry += total;
    __syncthreads();  // tmp is reused
  }
  if (threadIdx.x == 0) cnt[tiles] = carry;
}

// 3. starts[run] = its first position, in ascending order.
__global__ void __launch_bounds__(kScanThreads)
    embedding_run_starts_kernel(int32_t* __restrict__ starts, const uint32_t* __restrict__ keys,
                                const int32_t* __restrict__ tile_off, int64_t N) {
  using Scan = cub::BlockScan<int32_t, kScanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const int64_t base = int64_t(blockIdx.x) * kTile + int64_t(threadIdx.x) * kScanItems;
  unsigned m = start_mask(keys, N, base);
  int32_t off;
  Scan(tmp).ExclusiveSum(int32_t(__popc(m)), off);
  off += tile_off[blockIdx.x];
  while (m) {
    starts[off++] = int32_t(base + (__ffs(m) - 1));
    m &= m - 1;
  }
}

// Block b: dtable row += its gradient rows in ascending order (f32/f64).
template <class T, class Seg>
__global__ void __launch_bounds__(256)
    embedding_bwd_kernel(T* __restrict__ dtable, const T* __restrict__ dout, Seg seg, int64_t C) {
  int64_t row;
  int32_t k0, k1;
  const int32_t* idx;
  if (!seg.segment(blockIdx.x, row, k0, k1, idx)) return;
  T* d = dtable + row * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    T acc = d[c];
#pragma unroll 4
    for (int32_t k = k0; k < k1; ++k) acc += dout[int64_t(idx[k]) * C + c];
    d[c] = acc;
  }
}

// bf16 forward: a row copy in words of Wd (uint4 = 8 bf16 when rows are
// 16-byte aligned, else single bf16); Cw words per row.
template <class Wd>
__global__ void __launch_bounds__(256)
    embedding_copy_kernel(Wd* __restrict__ out, const Wd* __restrict__ table,
                          const int32_t* __restrict__ tok, int64_t V, int64_t Cw,
                          int64_t vocab_start) {
  const int64_t i = blockIdx.x;
  const int64_t t = int64_t(tok[i]) - vocab_start;
  Wd* o = out + i * Cw;
  if (t >= 0 && t < V) {
    const Wd* src = table + t * Cw;
    for (int64_t c = threadIdx.x; c < Cw; c += blockDim.x) o[c] = src[c];
  } else {
    for (int64_t c = threadIdx.x; c < Cw; c += blockDim.x) o[c] = Wd{};
  }
}

// bf16 backward: block b's f32 dtable row += its bf16 gradient rows in
// ascending order, W columns per thread step (W = 8 needs C % 8 == 0 and
// aligned tensors: one 16-byte load of dout).
template <int W, class Seg>
__global__ void __launch_bounds__(256)
    embedding_bwd_bf16_kernel(float* __restrict__ dtable, const bf16_bits* __restrict__ dout,
                              Seg seg, int64_t C) {
  int64_t row;
  int32_t k0, k1;
  const int32_t* idx;
  if (!seg.segment(blockIdx.x, row, k0, k1, idx)) return;
  float* d = dtable + row * C;
  for (int64_t c = threadIdx.x * int64_t(W); c < C; c += int64_t(blockDim.x) * W) {
    float acc[W], g[W];
    ldv<W>(d + c, acc);
#pragma unroll 2
    for (int32_t k = k0; k < k1; ++k) {
      ldv<W>(dout + int64_t(idx[k]) * C + c, g);
#pragma unroll
      for (int j = 0; j < W; ++j) acc[j] += g[j];
    }
    stv<W>(d + c, acc);
  }
}

// ---- the ops ----

void embedding_forward(const OpCtx& c, Tensor out, const Tensor& table, const Tensor& tokens,
                       int64_t vocab_start) {
  const int64_t N = tokens.numel(), V = table.dim(0), C = table.dim(1);
  ADGT_CHECK(tokens.dtype == DType::I32 && out.numel() == N * C && out.dtype == table.dtype &&
                 table.ndim == 2,
             "embedding_forward: tokens" << tokens.shape_str() << " out" << out.shape_str()
                                         << " table" << table.shape_str());
  if (!N || !C) return;
  const char* op = "embedding_forward";
  if (table.dtype == DType::BF16) {
    if (C % 8 == 0 && aligned16(out.data) && aligned16(table.data))
      launch(op, embedding_copy_kernel<uint4>, rows_grid(N, op), kThreads, 0, c.stream,
             out.ptr<uint4>(), table.ptr<uint4>(), tokens.ptr<int32_t>(), V, C / 8, vocab_start);
    else
      launch(op, embedding_copy_kernel<bf16_bits>, rows_grid(N, op), kThreads, 0, c.stream,
             out.ptr<bf16_bits>(), table.ptr<bf16_bits>(), tokens.ptr<int32_t>(), V, C,
             vocab_start);
    return;
  }
  dispatch(table.dtype, op, [&](auto z) {
    using T = decltype(z);
    launch(op, embedding_fwd_kernel<T>, rows_grid(N, op), kThreads, 0, c.stream, out.ptr<T>(),
           table.ptr<T>(), tokens.ptr<int32_t>(), V, C, vocab_start);
  });
}

// embedding_backward's shape and dtype checks; false when there is nothing
// to add (no tokens, no columns or no rows).
bool embedding_backward_check(const Tensor& dtable, const Tensor& dout, const Tensor& tokens) {
  const int64_t N = tokens.numel(), V = dtable.dim(0), C = dtable.dim(1);
  // bf16: dout bf16, dtable f32 (the mixed-precision contract); else one dtype.
  const bool lowp = dout.dtype == DType::BF16;
  ADGT_CHECK(dout.numel() == N * C && tokens.dtype == DType::I32 &&
                 (lowp ? dtable.dtype == DType::F32 : dout.dtype == dtable.dtype),
             "embedding_backward: dout" << dout.shape_str() << " " << dtype_name(dout.dtype)
                                        << ", dtable" << dtable.shape_str() << " "
                                        << dtype_name(dtable.dtype) << " (bf16 dout takes an f32 dtable)"
                                        << ", tokens" << tokens.shape_str());
  ADGT_CHECK(N <= INT_MAX && V <= INT_MAX, "embedding_backward: sizes exceed int32 indices");
  return N && C && V;
}

// Launches the accumulation, one block per segment of `seg`, `blocks` blocks.
template <class Seg>
void embedding_accumulate(const OpCtx& c, Tensor dtable, const Tensor& dout, Seg seg,
                          int64_t blocks) {
  const char* op = "embedding_backward";
  const int64_t C = dtable.dim(1);
  if (dout.dtype == DType::BF16) {
    if (C % 8 == 0 && aligned16(dtable.data) && aligned16(dout.data))
      launch(op, embedding_bwd_bf16_kernel<8, Seg>, rows_grid(blocks, op), kThreads, 0, c.stream,
             dtable.ptr<float>(), dout.ptr<bf16_bits>(), seg, C);
    else
      launch(op, embedding_bwd_bf16_kernel<1, Seg>, rows_grid(blocks, op), kThreads, 0, c.stream,
             dtable.ptr<float>(), dout.ptr<bf16_bits>(), seg, C);
    return;
  }
  dispatch(dtable.dtype, op, [&](auto z) {
    using T = decltype(z);
    launch(op, embedding_bwd_kernel<T, Seg>, rows_grid(blocks, op), kThreads, 0, c.stream,
           dtable.ptr<T>(), dout.ptr<T>(), seg, C);
  });
}

// The host path's lists from the token ids `tok` (host memory): the rows
// named, in ascending vocabulary order, and per row its token rows in
// ascending order, laid out as HostLists reads them; R = the rows named.
// Empty (R = 0) when no token is in this shard.
std::vector<int32_t> embedding_host_lists(const int32_t* tok, int64_t N, int64_t V,
                                          int64_t vocab_start, int64_t& R) {
  std::vector<int32_t> count(static_cast<size_t>(V), 0);
  int64_t hits = 0;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t t = int64_t(tok[size_t(i)]) - vocab_start;
    if (t >= 0 && t < V) ++count[size_t(t)], ++hits;
  }
  R = 0;
  if (!hits) return {};
  std::vector<int32_t> rows, off(1, 0);
  for (int64_t t = 0; t < V; ++t)
    if (count[size_t(t)]) {
      rows.push_back(int32_t(t));
      off.push_back(off.back() + count[size_t(t)]);
    }
  R = int64_t(rows.size());
  std::vector<int32_t> csr(size_t(2 * R + 1 + hits));
  std::copy(rows.begin(), rows.end(), csr.begin());
  std::copy(off.begin(), off.end(), csr.begin() + R);
  std::vector<int32_t> cursor(static_cast<size_t>(V), -1);  // next slot per vocabulary row
  for (int64_t b = 0; b < R; ++b) cursor[size_t(rows[size_t(b)])] = off[size_t(b)];
  int32_t* idx = csr.data() + 2 * R + 1;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t t = int64_t(tok[size_t(i)]) - vocab_start;
    if (t >= 0 && t < V) idx[cursor[size_t(t)]++] = int32_t(i);
  }
  return csr;
}

// The host path's accumulation: `csr` (R rows, on the device) from
// embedding_host_lists. The caller has run embedding_backward_check.
void embedding_backward_lists(const OpCtx& c, Tensor dtable, const Tensor& dout,
                              const int32_t* csr, int64_t R) {
  if (R) embedding_accumulate(c, dtable, dout, HostLists{csr, R}, R);
}

// The device path: sort (key, row) pairs by key on the device, then one
// block per run of equal keys.
void embedding_backward(const OpCtx& c, Tensor dtable, const Tensor& dout, const Tensor& tokens,
                        int64_t vocab_start) {
  if (!embedding_backward_check(dtable, dout, tokens)) return;
  const int64_t N = tokens.numel(), V = dtable.dim(0);
  const char* op = "embedding_backward";
  // Key bits: the fewest that hold V (the key of other shards' tokens), so a
  // 32000-row shard sorts on 15 bits.
  int bits = 0;
  while ((uint64_t(1) << bits) <= uint64_t(V)) ++bits;
  const int n = int(N);
  // CUB's temporary size: with a null pointer this call only computes it.
  size_t sort_bytes = 0;
  ADGT_CUDA_OP(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const uint32_t*>(nullptr),
                                               static_cast<uint32_t*>(nullptr),
                                               static_cast<const int32_t*>(nullptr),
                                               static_cast<int32_t*>(nullptr), n, 0, bits, c.stream),
               op);
  // Scratch, each piece 256-byte aligned: keys in (then the run starts), keys
  // out, rows in (the identity), rows out (N int32 each), the tile counts /
  // offsets and the run count (tiles + 1), the sort's temporaries.
  const int64_t tiles = (N + kTile - 1) / kTile;
  auto up = [](size_t b) { return (b + 255) & ~size_t(255); };
  const size_t n4 = up(size_t(N) * 4), t4 = up(size_t(tiles + 1) * 4);
  char* base = static_cast<char*>(
      c.scratch(CudaBackend::kScratchIndex, 4 * n4 + t4 + up(sort_bytes)));
  auto* keys_in = reinterpret_cast<uint32_t*>(base);
  auto* starts = reinterpret_cast<int32_t*>(base);
  auto* keys_out = reinterpret_cast<uint32_t*>(base + n4);
  auto* rows_in = reinterpret_cast<int32_t*>(base + 2 * n4);
  auto* rows_out = reinterpret_cast<int32_t*>(base + 3 * n4);
  auto* cnt = reinterpret_cast<int32_t*>(base + 4 * n4);
  void* temp = base + 4 * n4 + t4;

  launch(op, embedding_keys_kernel, grid_for(N, kThreads), kThreads, 0, c.stream, keys_in,
         rows_in, tokens.ptr<int32_t>(), N, V, vocab_start);
  size_t bytes = sort_bytes;
  ADGT_CUDA_OP(cub::DeviceRadixSort::SortPairs(temp, bytes, static_cast<const uint32_t*>(keys_in),
                                               keys_out, static_cast<const int32_t*>(rows_in),
                                               rows_out, n, 0, bits, c.stream),
               op);
  launch(op, embedding_tile_counts_kernel, rows_grid(tiles, op), kScanThreads, 0, c.stream, cnt,
         keys_out, N);
  launch(op, embedding_tile_offsets_kernel, 1, kOffsetThreads, 0, c.stream, cnt, tiles);
  launch(op, embedding_run_starts_kernel, rows_grid(tiles, op), kScanThreads, 0, c.stream, starts,
         keys_out, cnt, N);
  // At most min(N, V) runs of keys in this shard; the rest exit on the device.
  embedding_accumulate(c, dtable, dout,
                       SortedRuns{keys_out, rows_out, starts, cnt + tiles, int32_t(N), uint32_t(V)},
                       std::min(N, V));
}

}  // namespace
}  // namespace adgt::cuda

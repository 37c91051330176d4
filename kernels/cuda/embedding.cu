// CUDA token embedding (vocab-parallel) and the other indexed-row ops: the
// mixture-of-experts combine and its backward. Semantics: kernels/cpu/embedding.cpp.
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
// ADGT_EMBEDDING_BWD=host selects that previous path, kept for comparison:
// the token ids are read back, the host builds the per-row lists (a counting
// sort, O(N + V)) and uploads them (one device-to-host copy and a
// synchronisation per call); the same accumulation kernels run on them.
#include <cub/device/device_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"

namespace adgt {
using namespace cuda;

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

// Storage S, math A: bf16 rows are combined in fp32 (each output rounded
// once, backend.hpp's mixed-precision rules), f32/f64 in their own type.
template <class S> struct CombineMath { using A = S; };
template <> struct CombineMath<bf16_bits> { using A = float; };
__device__ __forceinline__ float load_a(bf16_bits v) { return bf(v); }
__device__ __forceinline__ float load_a(float v) { return v; }
__device__ __forceinline__ double load_a(double v) { return v; }
__device__ __forceinline__ void store_a(bf16_bits* p, float v) { *p = to_bf(v); }
__device__ __forceinline__ void store_a(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_a(double* p, double v) { *p = v; }

// out[t] (=|+=) sum_j w[t,j] y[pos[t,j]] over pos >= 0, j ascending.
template <class S>
__global__ void combine_kernel(S* __restrict__ out, const S* __restrict__ y,
                               const int32_t* __restrict__ pos, const S* __restrict__ w, int64_t k,
                               int64_t C, bool accumulate) {
  using A = typename CombineMath<S>::A;
  const int64_t t = blockIdx.x;
  S* o = out + t * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    A acc = accumulate ? load_a(o[c]) : A(0);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = pos[t * k + j];
      if (r < 0) continue;
      const A wt = w ? load_a(w[t * k + j]) : A(1);
      acc += wt * load_a(y[r * C + c]);
    }
    store_a(o + c, acc);
  }
}

// One block per token row t: dw[t,j] = <dout[t], y[pos]> (in A: fp32 for bf16
// rows), dy[pos] = w dout[t].
template <class S>
__global__ void combine_bwd_kernel(S* __restrict__ dy, typename CombineMath<S>::A* __restrict__ dw,
                                   const S* __restrict__ dout, const S* __restrict__ y,
                                   const int32_t* __restrict__ pos, const S* __restrict__ w,
                                   int64_t k, int64_t C) {
  using A = typename CombineMath<S>::A;
  __shared__ A red[32];
  const int64_t t = blockIdx.x;
  const S* g = dout + t * C;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t r = pos[t * k + j];  // uniform over the block
    if (r < 0) {
      if (dw && threadIdx.x == 0) dw[t * k + j] = A(0);
      continue;
    }
    if (dw) {
      const S* yr = y + r * C;
      A s = 0;
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += load_a(g[c]) * load_a(yr[c]);
      s = block_sum(s, red);
      if (threadIdx.x == 0) dw[t * k + j] = s;
    }
    if (dy) {
      const A wt = w ? load_a(w[t * k + j]) : A(1);
      S* dr = dy + r * C;
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) store_a(dr + c, wt * load_a(g[c]));
    }
  }
}

}  // namespace

void CudaBackend::embedding_forward(Tensor out, const Tensor& table, const Tensor& tokens,
                                    int64_t vocab_start) {
  const int64_t N = tokens.numel(), V = table.dim(0), C = table.dim(1);
  ADGT_CHECK(tokens.dtype == DType::I32 && out.numel() == N * C && out.dtype == table.dtype &&
                 table.ndim == 2,
             "embedding_forward: tokens" << tokens.shape_str() << " out" << out.shape_str()
                                         << " table" << table.shape_str());
  if (!N || !C) return;
  if (table.dtype == DType::BF16) {
    const char* op = "embedding_forward";
    if (C % 8 == 0 && aligned16(out.data) && aligned16(table.data))
      embedding_copy_kernel<uint4><<<rows_grid(N, op), kThreads, 0, stream_>>>(
          out.ptr<uint4>(), table.ptr<uint4>(), tokens.ptr<int32_t>(), V, C / 8, vocab_start);
    else
      embedding_copy_kernel<bf16_bits><<<rows_grid(N, op), kThreads, 0, stream_>>>(
          out.ptr<bf16_bits>(), table.ptr<bf16_bits>(), tokens.ptr<int32_t>(), V, C, vocab_start);
    ADGT_LAUNCH_CHECK(op);
    return;
  }
  dispatch(table.dtype, "embedding_forward", [&](auto z) {
    using T = decltype(z);
    embedding_fwd_kernel<T><<<rows_grid(N, "embedding_forward"), kThreads, 0, stream_>>>(
        out.ptr<T>(), table.ptr<T>(), tokens.ptr<int32_t>(), V, C, vocab_start);
  });
  ADGT_LAUNCH_CHECK("embedding_forward");
}

void CudaBackend::embedding_backward(Tensor dtable, const Tensor& dout, const Tensor& tokens,
                                     int64_t vocab_start) {
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
  if (!N || !C || !V) return;
  const char* op = "embedding_backward";
  // Launches the accumulation, one block per segment of `seg`, `blocks` blocks.
  auto accumulate = [&](auto seg, int64_t blocks) {
    using Seg = decltype(seg);
    if (lowp) {
      if (C % 8 == 0 && aligned16(dtable.data) && aligned16(dout.data))
        embedding_bwd_bf16_kernel<8, Seg><<<rows_grid(blocks, op), kThreads, 0, stream_>>>(
            dtable.ptr<float>(), dout.ptr<bf16_bits>(), seg, C);
      else
        embedding_bwd_bf16_kernel<1, Seg><<<rows_grid(blocks, op), kThreads, 0, stream_>>>(
            dtable.ptr<float>(), dout.ptr<bf16_bits>(), seg, C);
    } else {
      dispatch(dtable.dtype, op, [&](auto z) {
        using T = decltype(z);
        embedding_bwd_kernel<T, Seg><<<rows_grid(blocks, op), kThreads, 0, stream_>>>(
            dtable.ptr<T>(), dout.ptr<T>(), seg, C);
      });
    }
    ADGT_LAUNCH_CHECK(op);
  };

  const char* mode = std::getenv("ADGT_EMBEDDING_BWD");
  if (mode && std::string(mode) == "host") {
    // The previous path: a host counting sort. Rows named, in ascending
    // vocabulary order; per row its token rows in ascending order.
    std::vector<int32_t> tok(static_cast<size_t>(N));
    to_host(tok.data(), tokens.data, size_t(N) * 4);
    std::vector<int32_t> count(static_cast<size_t>(V), 0);
    int64_t hits = 0;
    for (int64_t i = 0; i < N; ++i) {
      const int64_t t = int64_t(tok[size_t(i)]) - vocab_start;
      if (t >= 0 && t < V) ++count[size_t(t)], ++hits;
    }
    if (!hits) return;
    std::vector<int32_t> rows, off(1, 0);
    for (int64_t t = 0; t < V; ++t)
      if (count[size_t(t)]) {
        rows.push_back(int32_t(t));
        off.push_back(off.back() + count[size_t(t)]);
      }
    const int64_t R = int64_t(rows.size());
    std::vector<int32_t> csr(size_t(2 * R + 1 + hits));
    std::copy(rows.begin(), rows.end(), csr.begin());
    std::copy(off.begin(), off.end(), csr.begin() + R);
    {
      std::vector<int32_t> cursor(static_cast<size_t>(V), -1);  // next slot per vocabulary row
      for (int64_t b = 0; b < R; ++b) cursor[size_t(rows[size_t(b)])] = off[size_t(b)];
      int32_t* idx = csr.data() + 2 * R + 1;
      for (int64_t i = 0; i < N; ++i) {
        const int64_t t = int64_t(tok[size_t(i)]) - vocab_start;
        if (t >= 0 && t < V) idx[cursor[size_t(t)]++] = int32_t(i);
      }
    }
    auto* dev = static_cast<int32_t*>(scratch(kScratchIndex, csr.size() * 4));
    to_device(dev, csr.data(), csr.size() * 4);
    accumulate(HostLists{dev, R}, R);
    return;
  }

  // The device path: sort (key, row) pairs by key on the device, then one
  // block per run of equal keys. Key bits: the fewest that hold V (the key of
  // other shards' tokens), so a 32000-row shard sorts on 15 bits.
  int bits = 0;
  while ((uint64_t(1) << bits) <= uint64_t(V)) ++bits;
  const int n = int(N);
  // CUB's temporary size: with a null pointer this call only computes it.
  size_t sort_bytes = 0;
  ADGT_CUDA_OP(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const uint32_t*>(nullptr),
                                               static_cast<uint32_t*>(nullptr),
                                               static_cast<const int32_t*>(nullptr),
                                               static_cast<int32_t*>(nullptr), n, 0, bits, stream_),
               op);
  // Scratch, each piece 256-byte aligned: keys in (then the run starts), keys
  // out, rows in (the identity), rows out (N int32 each), the tile counts /
  // offsets and the run count (tiles + 1), the sort's temporaries.
  const int64_t tiles = (N + kTile - 1) / kTile;
  auto up = [](size_t b) { return (b + 255) & ~size_t(255); };
  const size_t n4 = up(size_t(N) * 4), t4 = up(size_t(tiles + 1) * 4);
  char* base = static_cast<char*>(scratch(kScratchIndex, 4 * n4 + t4 + up(sort_bytes)));
  auto* keys_in = reinterpret_cast<uint32_t*>(base);
  auto* starts = reinterpret_cast<int32_t*>(base);
  auto* keys_out = reinterpret_cast<uint32_t*>(base + n4);
  auto* rows_in = reinterpret_cast<int32_t*>(base + 2 * n4);
  auto* rows_out = reinterpret_cast<int32_t*>(base + 3 * n4);
  auto* cnt = reinterpret_cast<int32_t*>(base + 4 * n4);
  void* temp = base + 4 * n4 + t4;

  embedding_keys_kernel<<<grid_for(N, kThreads), kThreads, 0, stream_>>>(
      keys_in, rows_in, tokens.ptr<int32_t>(), N, V, vocab_start);
  ADGT_LAUNCH_CHECK(op);
  size_t bytes = sort_bytes;
  ADGT_CUDA_OP(cub::DeviceRadixSort::SortPairs(temp, bytes, static_cast<const uint32_t*>(keys_in),
                                               keys_out, static_cast<const int32_t*>(rows_in),
                                               rows_out, n, 0, bits, stream_),
               op);
  embedding_tile_counts_kernel<<<rows_grid(tiles, op), kScanThreads, 0, stream_>>>(cnt, keys_out, N);
  ADGT_LAUNCH_CHECK(op);
  embedding_tile_offsets_kernel<<<1, kOffsetThreads, 0, stream_>>>(cnt, tiles);
  ADGT_LAUNCH_CHECK(op);
  embedding_run_starts_kernel<<<rows_grid(tiles, op), kScanThreads, 0, stream_>>>(
      starts, keys_out, cnt, N);
  ADGT_LAUNCH_CHECK(op);
  // At most min(N, V) runs of keys in this shard; the rest exit on the device.
  accumulate(SortedRuns{keys_out, rows_out, starts, cnt + tiles, int32_t(N), uint32_t(V)},
             std::min(N, V));
}

namespace {
// Shapes as the CPU backend checks them; pos is read back to check its range
// (the CPU backend's check; an out-of-range row would read outside y).
void check_combine(CudaBackend& be, const Tensor& rows_nc, const Tensor& y, const Tensor& pos,
                   const Tensor& w, const char* op) {
  const int64_t N = pos.ndim == 2 ? pos.dim(0) : -1, C = y.ndim == 2 ? y.dim(1) : -1;
  ADGT_CHECK(pos.dtype == DType::I32 && pos.ndim == 2 && y.ndim == 2 &&
                 rows_nc.numel() == N * C && rows_nc.dtype == y.dtype,
             op << ": pos" << pos.shape_str() << " (int32 (N,k)), y" << y.shape_str()
                << " (M,C), rows" << rows_nc.shape_str() << " (N,C)");
  ADGT_CHECK(!w.data || (w.numel() == pos.numel() && w.dtype == y.dtype),
             op << ": weights" << w.shape_str() << " must match pos" << pos.shape_str() << " in "
                << dtype_name(y.dtype));
  std::vector<int32_t> p(static_cast<size_t>(pos.numel()));
  be.to_host(p.data(), pos.data, p.size() * 4);
  for (size_t i = 0; i < p.size(); ++i)
    ADGT_CHECK(p[i] < y.dim(0), op << ": pos[" << i << "] = " << p[i] << " outside y"
                                   << y.shape_str());
}
}  // namespace

void CudaBackend::combine_rows(Tensor out, const Tensor& y, const Tensor& pos, const Tensor& w,
                               bool accumulate) {
  check_combine(*this, out, y, pos, w, "combine_rows");
  const int64_t N = pos.dim(0), k = pos.dim(1), C = y.dim(1);
  if (!N || !C) return;
  auto launch = [&](auto z) {
    using S = decltype(z);
    combine_kernel<S><<<rows_grid(N, "combine_rows"), kThreads, 0, stream_>>>(
        out.ptr<S>(), y.ptr<S>(), pos.ptr<int32_t>(), w.data ? w.ptr<S>() : nullptr, k, C,
        accumulate);
  };
  if (y.dtype == DType::BF16)
    launch(bf16_bits{});
  else
    dispatch(y.dtype, "combine_rows", launch);
  ADGT_LAUNCH_CHECK("combine_rows");
}

void CudaBackend::combine_rows_backward(Tensor dy, Tensor dw, const Tensor& dout, const Tensor& y,
                                        const Tensor& pos, const Tensor& w) {
  check_combine(*this, dout, y, pos, w, "combine_rows_backward");
  ADGT_CHECK(!dy.data || (dy.numel() == y.numel() && dy.dtype == y.dtype),
             "combine_rows_backward: dy" << dy.shape_str() << " must match y" << y.shape_str());
  const DType dwt = y.dtype == DType::BF16 ? DType::F32 : y.dtype;  // fp32 with bf16 rows
  ADGT_CHECK(!dw.data || (dw.numel() == pos.numel() && dw.dtype == dwt),
             "combine_rows_backward: dw" << dw.shape_str() << " " << dtype_name(dw.dtype)
                                         << " must match pos" << pos.shape_str() << " in "
                                         << dtype_name(dwt) << " (f32 with bf16 rows)");
  const int64_t N = pos.dim(0), k = pos.dim(1), C = y.dim(1);
  if (!N || (!dy.data && !dw.data)) return;
  auto launch = [&](auto z) {
    using S = decltype(z);
    using A = typename CombineMath<S>::A;
    combine_bwd_kernel<S><<<rows_grid(N, "combine_rows_backward"), kThreads, 0, stream_>>>(
        dy.data ? dy.ptr<S>() : nullptr, dw.data ? dw.ptr<A>() : nullptr, dout.ptr<S>(),
        y.ptr<S>(), pos.ptr<int32_t>(), w.data ? w.ptr<S>() : nullptr, k, C);
  };
  if (y.dtype == DType::BF16)
    launch(bf16_bits{});
  else
    dispatch(y.dtype, "combine_rows_backward", launch);
  ADGT_LAUNCH_CHECK("combine_rows_backward");
}

}  // namespace adgt

// FlashAttention-2-style causal grouped-query attention in bf16 on the tensor
// cores (mma.sync m16n8k16 bf16 -> fp32), head_dim 64 and 128.
// q, out (B,T,H,hd); k, v (B,T,KV,hd); head h reads kv head h / (H/KV).
//
// Tiles: 64 query rows x 64 keys per step, 4 warps of 16 query (or key) rows
// each; K/V (or Q/dO) tiles are staged in shared memory with cp.async, double
// buffered (the next tile loads while this one is used), rows padded by 16
// bytes so ldmatrix is conflict-free; rows past T are zero-filled. Fragments
// come from ldmatrix (.trans for operands stored k-major, e.g. V in P V).
//
// Forward, one CTA per (query block, head, batch), heaviest (last) query
// block first: S = Q K^T over key blocks up to the diagonal (only the
// diagonal block is masked), online softmax in fp32 registers on
// log2(e)-prescaled scores with ex2, O accumulated in fp32, normalised at the
// end, written bf16 through shared memory (16-byte stores); lse = natural-log
// log-sum-exp of the scaled scores, fp32 (the exact kernel's convention).
//
// Backward, deterministic (no atomics; every output summed in a fixed order):
//   D = rowsum(dO * O), fp32, one warp per row;
//   dK/dV: one CTA per (key block, kv head, batch); each warp owns 16 keys and
//     loops over the group's heads and the query blocks at or after the
//     diagonal: S^T = K Q^T, P^T = exp(S^T - lse), dV += P^T dO,
//     dP^T = V dO^T, dS^T = P^T (dP^T - D), dK += dS^T Q; dK scaled at the end
//     (P^T here is the bf16-rounded P of the dV product, where the dQ kernel
//     uses fp32 P: one more rounding in dK, see flash_sim_test's bound);
//   dQ: one CTA per (query block, head, batch) over key blocks up to the
//     diagonal: S, P, dP = dO V^T, dS, dQ += dS K; scaled at the end.
//
// Document masking (FlashParams::doc, AttentionShape::doc_start: each token's
// document start, non-decreasing, <= its position): row i attends keys
// [doc_i, i]. The forward and dQ kernels start their key loops at the block
// holding the document start of the query block's first row (the smallest)
// and mask keys before each row's start to -inf (P = 0) in the blocks that
// have such keys; a row with every key of a block masked keeps its running
// max (or, with none yet, the 0 offset of the causal case), so no NaN. The
// dK/dV kernel stops at the first query block whose first row's document
// starts after the key block's last key (every later one does too) and
// masks P^T where the block holds rows of later documents. doc == nullptr:
// the causal kernels exactly (the same loops; only null-pointer branches).
//
// Ring attention's blocks (block_params; Backend::attention_block_*): Tq
// query rows (T) against Tk keys, every key visible (FULL: the forward and dQ
// over every key tile, the dK/dV kernel over every query tile, no diagonal
// mask; keys past Tk in the last tile masked to -inf in the forward,
// zero-filled rows adding 0 elsewhere) or the causal diagonal block (Tq ==
// Tk: the kernels above). Packed documents: doc holds each query row's
// document start in the sequence's positions and key 0 sits at doc_off
// (AttentionBlock::q_doc_start, k_pos), so the starts become key indices by
// subtracting doc_off; a row, or a whole query tile, may see no key of a
// block (out 0, lse -inf; the loops run no step), and a key tile may be seen
// by no query tile (dK/dV 0). The backward takes the rows' final out (D) and
// lse from the merge of every block; with acc_dq the dQ kernel adds its
// result to dq's bf16 values, rounding the sum once.
//
// This header holds the device code only (helpers and __global__ templates);
// flash_attention.cu has the host launchers and is the one CUDA translation
// unit that includes it. The inline-PTX wrappers live in flash_ptx.cuh. With
// ADGT_CUDA_SIM defined, flash_ptx.cuh is not included: the includer has
// defined emulated versions of those wrappers (and of the CUDA built-ins the
// kernels use) and runs this very source on the host
// (tests/tools/flash_sim_test.cpp, ctest flash_attention_emulated).
#pragma once
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>

#ifndef ADGT_CUDA_SIM
#include "kernels/cuda/flash_ptx.cuh"
#endif

namespace adgt::cuda {
namespace {

constexpr int kBlock = 64;    // query rows and keys per tile
constexpr int kThreads = 128;  // 4 warps x 16 rows
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int HD>
struct Tile {
  static constexpr int kLd = HD + 8;            // shared row stride in bf16 (+16 bytes)
  static constexpr int kElems = kBlock * kLd;  // one 64 x HD tile
  static constexpr int kBytes = kElems * 2;
};

struct FlashParams {
  int T, H, group;     // T: query rows per sequence; group = H / KV
  int Tk = 0;          // keys per sequence (the kernels' FULL blocks; causal: T)
  bool acc_dq = false; // dQ added to dq's values (a ring block's accumulation), else written
  int doc_off = 0;     // with doc: the position of key 0 in doc's positions (a ring block's k_pos)
  int64_t ldq, ldk;    // row strides in elements: H*hd (q, out, dout, dq), KV*hd (k, v, dk, dv)
  float scale;         // 1/sqrt(hd)
  float scale_log2;    // scale * log2(e)
  const int32_t* doc = nullptr;  // (B*T) each token's document start; nullptr: causal
};

// Kernel parameters of a (T, H, KV, hd) shape.
inline FlashParams flash_params(int64_t T, int64_t H, int64_t KV, int64_t hd) {
  FlashParams p;
  p.T = int(T);
  p.Tk = int(T);
  p.H = int(H);
  p.group = int(H / KV);
  p.ldq = H * hd;
  p.ldk = KV * hd;
  p.scale = 1.f / std::sqrt(float(hd));  // as the exact fp32 kernel
  p.scale_log2 = p.scale * kLog2e;
  return p;
}

// A ring-attention block (Backend::attention_block_*, without documents):
// Tq query rows against Tk keys — the kernels' FULL instances (every key
// visible) or, Tq == Tk, the causal ones (the diagonal block); dq accumulated
// when acc_dq.
inline FlashParams block_params(int64_t Tq, int64_t Tk, int64_t H, int64_t KV, int64_t hd,
                                bool acc_dq) {
  FlashParams p = flash_params(Tq, H, KV, hd);
  p.Tk = int(Tk);
  p.acc_dq = acc_dq;
  return p;
}

// Dynamic shared memory of each kernel (bytes).
template <int HD>
constexpr size_t fwd_smem() {
  return size_t(5) * Tile<HD>::kBytes;
}
template <int HD>
constexpr size_t dkdv_smem() {
  return size_t(6) * Tile<HD>::kBytes + 4 * kBlock * sizeof(float);
}
template <int HD>
constexpr size_t dq_smem() {
  return size_t(6) * Tile<HD>::kBytes + 2 * kBlock * sizeof(float);
}

// bf16 halves of a bf16x2 word (low half: the smaller column index).
__device__ __forceinline__ float bf_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

// ---- tiles --------------------------------------------------------------------

// Rows [r0, r0+64) of a (rows, HD) bf16 matrix with row stride ld (elements)
// into a shared tile; rows >= T are zero-filled. All 128 threads call it.
template <int HD>
__device__ __forceinline__ void load_tile(uint16_t* sdst, const uint16_t* g, int64_t ld, int r0,
                                          int T, int tid) {
  constexpr int kChunks = HD / 8;  // 16-byte chunks per row
  static_assert(kBlock * kChunks % kThreads == 0, "whole chunks per thread");
#pragma unroll
  for (int i = 0; i < kBlock * kChunks / kThreads; ++i) {
    const int c = tid + i * kThreads;
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool ok = r0 + r < T;
    const uint16_t* src = ok ? g + int64_t(r0 + r) * ld + col : g;
    cp_async16(smem_u32(sdst + r * Tile<HD>::kLd + col), src, ok);
  }
}

// 64 entries [r0, r0+64) of two fp32 rows (lse, D) into shared; 0 past T.
__device__ __forceinline__ void load_stats(float* sl, float* sd, const float* gl,
                                           const float* gd, int r0, int T, int tid) {
  const int i = tid & (kBlock - 1);
  const bool ok = r0 + i < T;
  if (tid < kBlock)
    cp_async4(smem_u32(sl + i), ok ? gl + r0 + i : gl, ok);
  else
    cp_async4(smem_u32(sd + i), ok ? gd + r0 + i : gd, ok);
}

// ---- warp-level GEMM pieces (each warp: 16 rows) -------------------------------
// Accumulator layout (m16n8 C fragment), lane = 4*g + t: acc[nt][0..1] is row g,
// columns nt*8 + 2t + {0,1}; acc[nt][2..3] is row g+8, the same columns.

// acc(16 x 64) += A(16 x HD) B^T, A as register fragments (af[kt] covers
// columns kt*16..+16), B = 64 rows x HD in shared (row-major, "n x k").
template <int HD>
__device__ __forceinline__ void gemm_rT(float (&acc)[8][4], const uint32_t (&af)[HD / 16][4],
                                        const uint16_t* sB, int lane) {
  constexpr int LD = Tile<HD>::kLd;
  // x4: matrices (rows 0-7, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 0-7), (rows 8-15, k 8-15)
  // = b0, b1 of n-tile 2np and b0, b1 of n-tile 2np+1.
  const uint32_t bbase = smem_u32(sB + ((lane & 7) + ((lane >> 4) << 3)) * LD + ((lane >> 3) & 1) * 8);
#pragma unroll
  for (int kt = 0; kt < HD / 16; ++kt) {
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      ldsm_x4(b, bbase + uint32_t((np * 16 * LD + kt * 16) * 2));
      mma_bf16(acc[2 * np], af[kt], b[0], b[1]);
      mma_bf16(acc[2 * np + 1], af[kt], b[2], b[3]);
    }
  }
}

// The same with A = the warp's 16 rows x HD in shared (sA points at its row
// 0), for 16*NP columns (B = 16*NP rows from sB).
template <int HD, int NP = 4>
__device__ __forceinline__ void gemm_sT(float (&acc)[2 * NP][4], const uint16_t* sA,
                                        const uint16_t* sB, int lane) {
  constexpr int LD = Tile<HD>::kLd;
  // x4: (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15) = a0..a3.
  const uint32_t abase = smem_u32(sA + (lane & 15) * LD + ((lane >> 4) << 3));
  const uint32_t bbase = smem_u32(sB + ((lane & 7) + ((lane >> 4) << 3)) * LD + ((lane >> 3) & 1) * 8);
#pragma unroll 1  // fewer loads in flight: no spills in the dK/dV kernel at hd 128
  for (int kt = 0; kt < HD / 16; ++kt) {
    uint32_t a[4];
    ldsm_x4(a, abase + uint32_t(kt * 16 * 2));
#pragma unroll
    for (int np = 0; np < NP; ++np) {
      uint32_t b[4];
      ldsm_x4(b, bbase + uint32_t((np * 16 * LD + kt * 16) * 2));
      mma_bf16(acc[2 * np], a, b[0], b[1]);
      mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// acc(16 x HD) += P(16 x 64) Y, P as A fragments (pa[kt] covers columns
// kt*16..+16), Y = 64 rows x HD in shared (row-major, "k x n": ldmatrix.trans).
template <int HD>
__device__ __forceinline__ void gemm_py(float (&acc)[HD / 8][4], const uint32_t (&pa)[4][4],
                                        const uint16_t* sY, int lane) {
  constexpr int LD = Tile<HD>::kLd;
  // x4.trans: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15)
  // = b0, b1 of n-tile 2dp and b0, b1 of n-tile 2dp+1.
  const uint32_t base = smem_u32(sY + ((lane & 7) + (((lane >> 3) & 1) << 3)) * LD + ((lane >> 4) << 3));
#pragma unroll
  for (int kt = 0; kt < 4; ++kt) {
#pragma unroll
    for (int dp = 0; dp < HD / 16; ++dp) {
      uint32_t b[4];
      ldsm_x4_t(b, base + uint32_t((kt * 16 * LD + dp * 16) * 2));
      mma_bf16(acc[2 * dp], pa[kt], b[0], b[1]);
      mma_bf16(acc[2 * dp + 1], pa[kt], b[2], b[3]);
    }
  }
}

// C fragments (16 x 64 fp32) -> A fragments (16 x 64 bf16, four k-slices of 16).
__device__ __forceinline__ void to_afrag(uint32_t (&a)[4][4], const float (&s)[8][4]) {
#pragma unroll
  for (int kt = 0; kt < 4; ++kt) {
    a[kt][0] = pack_bf16(s[2 * kt][0], s[2 * kt][1]);          // row g,   k 2t..
    a[kt][1] = pack_bf16(s[2 * kt][2], s[2 * kt][3]);          // row g+8, k 2t..
    a[kt][2] = pack_bf16(s[2 * kt + 1][0], s[2 * kt + 1][1]);  // row g,   k 8+2t..
    a[kt][3] = pack_bf16(s[2 * kt + 1][2], s[2 * kt + 1][3]);  // row g+8, k 8+2t..
  }
}

template <int N, int M>
__device__ __forceinline__ void zero(float (&a)[N][M]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < M; ++j) a[i][j] = 0.f;
}

// The warp's 16 x HD accumulator, rows g scaled by mul0 and g+8 by mul1, to
// bf16 rows [row0, row0+16) of a global matrix (row stride ld), rows >= T
// skipped; staged in the warp's own 16 rows of shared memory `sw` for
// 16-byte stores.
// With add, each element is the row's value in gdst plus the accumulator's,
// rounded once (rows >= T not read).
template <int HD>
__device__ __forceinline__ void store_rows(uint16_t* sw, const float (&acc)[HD / 8][4], float mul0,
                                           float mul1, uint16_t* gdst, int64_t ld, int row0,
                                           int T, int lane, bool add = false) {
  constexpr int LD = Tile<HD>::kLd;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < HD / 8; ++nt) {
    float a0 = acc[nt][0] * mul0, a1 = acc[nt][1] * mul0;
    float a2 = acc[nt][2] * mul1, a3 = acc[nt][3] * mul1;
    if (add) {
      const int col = nt * 8 + 2 * t;
      if (row0 + g < T) {
        const uint32_t o = *reinterpret_cast<const uint32_t*>(gdst + int64_t(row0 + g) * ld + col);
        a0 += bf_lo(o);
        a1 += bf_hi(o);
      }
      if (row0 + g + 8 < T) {
        const uint32_t o = *reinterpret_cast<const uint32_t*>(gdst + int64_t(row0 + g + 8) * ld + col);
        a2 += bf_lo(o);
        a3 += bf_hi(o);
      }
    }
    *reinterpret_cast<uint32_t*>(sw + g * LD + nt * 8 + 2 * t) = pack_bf16(a0, a1);
    *reinterpret_cast<uint32_t*>(sw + (g + 8) * LD + nt * 8 + 2 * t) = pack_bf16(a2, a3);
  }
  __syncwarp();
  constexpr int kChunks = HD / 8;
#pragma unroll
  for (int i = 0; i < 16 * kChunks / 32; ++i) {
    const int c = lane + i * 32;
    const int r = c / kChunks, col = (c % kChunks) * 8;
    if (row0 + r < T)
      *reinterpret_cast<uint4*>(gdst + int64_t(row0 + r) * ld + col) =
          *reinterpret_cast<const uint4*>(sw + r * LD + col);
  }
}

// ---- document masking ------------------------------------------------------------

// Sequence b's document starts (nullptr without a mask).
__device__ __forceinline__ const int32_t* doc_of(const FlashParams& p, int b) {
  return p.doc ? p.doc + int64_t(b) * p.T : nullptr;
}

// The document start of row r; past T the last row's (the starts stay
// non-decreasing; those rows are never stored).
__device__ __forceinline__ int doc_row(const int32_t* ds, int r, int T) {
  return ds[r < T ? r : T - 1];
}

// The first key block query block qb needs: the one holding its first row's
// document start (the smallest of its rows'; off: the position of key 0, a
// ring block's); 0 without a mask or when it starts before key 0.
__device__ __forceinline__ int first_key_block(const int32_t* ds, int qb, int off) {
  if (!ds) return 0;
  const int d = ds[qb * kBlock] - off;
  return d > 0 ? d / kBlock : 0;
}

// How many query blocks from qb0 on attend key block kb's keys (Tk keys, key
// 0 at position off): up to the last whose first row's document starts at or
// before kb's last key (the starts are non-decreasing, so no later block
// does; a binary search); nblk - qb0 without a mask. Causal (qb0 == kb):
// block kb always (its row k0 attends key k0); a full block: maybe none.
__device__ __forceinline__ int query_blocks_of(const int32_t* ds, int qb0, int kb, int nblk, int Tk,
                                               int off, bool causal) {
  if (!ds) return nblk - qb0;
  const int klast = (kb + 1) * kBlock < Tk ? (kb + 1) * kBlock - 1 : Tk - 1;
  int lo = causal ? 1 : 0, hi = nblk - qb0;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (ds[(qb0 + mid - 1) * kBlock] - off <= klast)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// ---- kernels ------------------------------------------------------------------

// The forward's masks on the warp's S (16 rows x the 64 keys from key0) to
// -inf: with diag (the diagonal block) keys after the row (row_lo: row g,
// +8 for c2, c3), with docm (document masking) keys before the row's
// document start dlo[0] (row g) or dlo[1] (row g+8), and keys at or past
// kend (a block's ragged last key tile; the causal diagonal masks them
// already).
__device__ __forceinline__ void fwd_mask(float (&s)[8][4], int key0, bool diag, bool docm,
                                         int row_lo, const int (&dlo)[2], int t4, int kend) {
  if (key0 + kBlock > kend) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (key0 + nt * 8 + 2 * t4 + (c & 1) >= kend) s[nt][c] = -INFINITY;
  }
  if (diag) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int key = key0 + nt * 8 + 2 * t4 + (c & 1);
        if (key > row_lo + (c >> 1) * 8) s[nt][c] = -INFINITY;
      }
  }
  if (docm) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (key0 + nt * 8 + 2 * t4 + (c & 1) < dlo[c >> 1]) s[nt][c] = -INFINITY;
  }
}

// FULL: a ring block whose every key is visible (Tk keys, block_params);
// else causal over T (the whole attention, or the ring's diagonal block).
template <int HD, bool FULL = false>
__global__ void __launch_bounds__(kThreads, 2)
    flash_fwd_kernel(uint16_t* __restrict__ out, float* __restrict__ lse,
                     const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                     const uint16_t* __restrict__ v, FlashParams p) {
#ifdef ADGT_FLASH_NO_MMA
  __trap();
#else
  using Tl = Tile<HD>;
  constexpr int LD = Tl::kLd;
  ADGT_DYNAMIC_SMEM(smem_raw);
  uint16_t* sQ = reinterpret_cast<uint16_t*>(smem_raw);  // (64, LD)
  uint16_t* sK = sQ + Tl::kElems;                         // 2 x (64, LD)
  uint16_t* sV = sK + 2 * Tl::kElems;                     // 2 x (64, LD)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int nblk = (p.T + kBlock - 1) / kBlock;
  const int qb = nblk - 1 - int(blockIdx.x);  // heaviest block first
  const int h = blockIdx.y, b = blockIdx.z, kh = h / p.group;
  const int q0 = qb * kBlock;
  const int64_t qoff = int64_t(b) * p.T * p.ldq + int64_t(h) * HD;
  const int Tk = FULL ? p.Tk : p.T;
  const int64_t koff = int64_t(b) * Tk * p.ldk + int64_t(kh) * HD;
  const int32_t* ds = doc_of(p, b);
  // Key blocks kb0..nkb-1 (from the document start's block): causal, up to
  // the diagonal qb; a full block, all of Tk. A ring block's rows may see
  // none (kb0 >= nkb: out 0, lse -inf).
  const int kb0 = first_key_block(ds, qb, p.doc_off);
  const int nkb = FULL ? (Tk + kBlock - 1) / kBlock : qb + 1;

  load_tile<HD>(sQ, q + qoff, p.ldq, q0, p.T, tid);
  load_tile<HD>(sK, k + koff, p.ldk, kb0 * kBlock, Tk, tid);
  load_tile<HD>(sV, v + koff, p.ldk, kb0 * kBlock, Tk, tid);
  cp_async_commit();

  uint32_t qf[HD / 16][4];
  float o[HD / 8][4];
  zero(o);
  float m[2] = {-INFINITY, -INFINITY};  // running max of the log2-domain scores, rows g, g+8
  float l[2] = {0.f, 0.f};              // this thread's part of the running sum
  const int row_lo = q0 + warp * 16 + g;
  // Document starts of rows g and g+8 as key indices (document masking only).
  const int dlo[2] = {ds ? doc_row(ds, row_lo, p.T) - p.doc_off : 0,
                      ds ? doc_row(ds, row_lo + 8, p.T) - p.doc_off : 0};
  for (int n = kb0; n < nkb; ++n) {  // causal: qb has the diagonal mask
    if (n + 1 < nkb) {
      const int nb = (n + 1 - kb0) & 1;
      load_tile<HD>(sK + nb * Tl::kElems, k + koff, p.ldk, (n + 1) * kBlock, Tk, tid);
      load_tile<HD>(sV + nb * Tl::kElems, v + koff, p.ldk, (n + 1) * kBlock, Tk, tid);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (n == kb0) {
#pragma unroll
      for (int kt = 0; kt < HD / 16; ++kt)
        ldsm_x4(qf[kt], smem_u32(sQ + (warp * 16 + (lane & 15)) * LD + kt * 16 + ((lane >> 4) << 3)));
    }
    const uint16_t* cK = sK + ((n - kb0) & 1) * Tl::kElems;
    const uint16_t* cV = sV + ((n - kb0) & 1) * Tl::kElems;

    float s[8][4];
    zero(s);
    gemm_rT<HD>(s, qf, cK, lane);
    // (Causal: no key past T reaches a stored row unmasked; INT_MAX drops the check.)
    fwd_mask(s, n * kBlock, !FULL && n == qb, ds && n * kBlock < dlo[1], row_lo, dlo, t4,
             FULL ? Tk : INT_MAX);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
    }
    float mb[2], corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float mn = fmaxf(m[r], mx[r] * p.scale_log2);
      mb[r] = mn == -INFINITY ? 0.f : mn;  // nothing unmasked yet: p = 0, no NaN
      corr[r] = fast_exp2(m[r] - mb[r]);
      m[r] = mn;
    }
    float rs[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      s[nt][0] = fast_exp2(fmaf(s[nt][0], p.scale_log2, -mb[0]));
      s[nt][1] = fast_exp2(fmaf(s[nt][1], p.scale_log2, -mb[0]));
      s[nt][2] = fast_exp2(fmaf(s[nt][2], p.scale_log2, -mb[1]));
      s[nt][3] = fast_exp2(fmaf(s[nt][3], p.scale_log2, -mb[1]));
      rs[0] += s[nt][0] + s[nt][1];
      rs[1] += s[nt][2] + s[nt][3];
    }
    l[0] = l[0] * corr[0] + rs[0];
    l[1] = l[1] * corr[1] + rs[1];
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt) {
      o[nt][0] *= corr[0];
      o[nt][1] *= corr[0];
      o[nt][2] *= corr[1];
      o[nt][3] *= corr[1];
    }
    uint32_t pa[4][4];
    to_afrag(pa, s);
    gemm_py<HD>(o, pa, cV, lane);
    __syncthreads();  // the buffers of this step are refilled next step
  }
  if (kb0 >= nkb) {  // no key of the block visible to this tile: its loads land first
    cp_async_wait<0>();
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  // A row that saw no key (a ring block's, l = 0): out 0 and lse -inf.
  store_rows<HD>(sQ + warp * 16 * LD, o, l[0] > 0.f ? 1.f / l[0] : 0.f, l[1] > 0.f ? 1.f / l[1] : 0.f,
                 out + qoff, p.ldq, q0 + warp * 16, p.T, lane);
  if (t4 == 0) {
    float* L = lse + (int64_t(b) * p.H + h) * p.T;
    if (row_lo < p.T) L[row_lo] = (m[0] + log2f(l[0])) * kLn2;
    if (row_lo + 8 < p.T) L[row_lo + 8] = (m[1] + log2f(l[1])) * kLn2;
  }
#endif
}

// D[(b*H + h)*T + i] = sum_d dout[b,i,h,d] * out[b,i,h,d] (fp32), one warp per row.
__global__ void flash_bwd_dsum_kernel(float* __restrict__ D, const uint16_t* __restrict__ dout,
                                      const uint16_t* __restrict__ out, int64_t rows, int T,
                                      int H, int hd) {
  const int lane = threadIdx.x & 31;
  const int64_t w0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t nw = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t r = w0; r < rows; r += nw) {  // r = (b*T + i)*H + h
    const uint32_t* a = reinterpret_cast<const uint32_t*>(dout + r * hd);
    const uint32_t* c = reinterpret_cast<const uint32_t*>(out + r * hd);
    float acc = 0.f;
    for (int j = lane; j < hd / 2; j += 32) {
      const uint32_t x = a[j], y = c[j];
      acc = fmaf(bf_lo(x), bf_lo(y), acc);
      acc = fmaf(bf_hi(x), bf_hi(y), acc);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) {
      const int64_t bt = r / H, hh = r % H, bb = bt / T, i = bt % T;
      D[(bb * H + hh) * T + i] = acc;
    }
  }
}

// The dK/dV kernel's P^T (the warp's 16 keys from key_lo x the 64 queries of
// the block at q0) as A fragments: S^T = K Q^T, P^T = exp(S^T - lse), zero
// where masked: with need_mask a query past T or (causal, not a full block)
// before the key, with docm (document masking) a key before the query's
// document start.
template <int HD, bool FULL>
__device__ __forceinline__ void dkdv_pt(uint32_t (&pa)[4][4], const uint16_t* wK,
                                        const uint16_t* cQ, const float* cL, const FlashParams& p,
                                        const int32_t* ds, int q0, int key_lo, bool need_mask,
                                        bool docm, int lane) {
  const int t4 = lane & 3;
  float s[8][4];  // S^T: rows = the warp's 16 keys, columns = 64 queries
  zero(s);
  gemm_sT<HD>(s, wK, cQ, lane);
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    const int qc = nt * 8 + 2 * t4;  // query column of c0 (c1: +1)
    const float l0 = cL[qc] * kLog2e, l1 = cL[qc + 1] * kLog2e;
    s[nt][0] = fast_exp2(fmaf(s[nt][0], p.scale_log2, -l0));
    s[nt][1] = fast_exp2(fmaf(s[nt][1], p.scale_log2, -l1));
    s[nt][2] = fast_exp2(fmaf(s[nt][2], p.scale_log2, -l0));
    s[nt][3] = fast_exp2(fmaf(s[nt][3], p.scale_log2, -l1));
    if (need_mask) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int qi = q0 + qc + (c & 1), kj = key_lo + (c >> 1) * 8;
        if ((!FULL && qi < kj) || qi >= p.T) s[nt][c] = 0.f;
      }
    }
    if (docm) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int qi = q0 + qc + (c & 1), kj = key_lo + (c >> 1) * 8;
        if (qi < p.T && kj < ds[qi] - p.doc_off) s[nt][c] = 0.f;
      }
    }
  }
  to_afrag(pa, s);
}

template <int HD, bool FULL = false>
__global__ void __launch_bounds__(kThreads, 1)
    flash_bwd_dkdv_kernel(uint16_t* __restrict__ dk, uint16_t* __restrict__ dv,
                          const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                          const uint16_t* __restrict__ v, const uint16_t* __restrict__ dout,
                          const float* __restrict__ lse, const float* __restrict__ Dsum,
                          FlashParams p) {
#ifdef ADGT_FLASH_NO_MMA
  __trap();
#else
  using Tl = Tile<HD>;
  constexpr int LD = Tl::kLd;
  ADGT_DYNAMIC_SMEM(smem_raw);
  uint16_t* sK = reinterpret_cast<uint16_t*>(smem_raw);  // (64, LD)
  uint16_t* sV = sK + Tl::kElems;                         // (64, LD)
  uint16_t* sQ = sV + Tl::kElems;                         // 2 x (64, LD)
  uint16_t* sdO = sQ + 2 * Tl::kElems;                    // 2 x (64, LD)
  float* sL = reinterpret_cast<float*>(sdO + 2 * Tl::kElems);  // 2 x 64: lse
  float* sD = sL + 2 * kBlock;                                   // 2 x 64: D
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int nblk = (p.T + kBlock - 1) / kBlock;
  const int kb = blockIdx.x, kh = blockIdx.y, b = blockIdx.z;
  const int k0 = kb * kBlock;
  const int32_t* ds = doc_of(p, b);
  // Query blocks qb0..qb0+nq-1 see these keys: causal, from the diagonal on;
  // a full block, every one.
  const int Tk = FULL ? p.Tk : p.T;
  const int qb0 = FULL ? 0 : kb;
  const int nq = query_blocks_of(ds, qb0, kb, nblk, Tk, p.doc_off, !FULL);
  const int iters = p.group * nq;    // (head of the group, query block), head-major
  const int64_t koff = int64_t(b) * Tk * p.ldk + int64_t(kh) * HD;

  load_tile<HD>(sK, k + koff, p.ldk, k0, Tk, tid);
  load_tile<HD>(sV, v + koff, p.ldk, k0, Tk, tid);
  // step `it` -> buffer `buf`
  auto issue = [&](int it, int buf) {
    const int hh = kh * p.group + it / nq, qs = (qb0 + it % nq) * kBlock;
    const int64_t qoff = int64_t(b) * p.T * p.ldq + int64_t(hh) * HD;
    const int64_t loff = (int64_t(b) * p.H + hh) * p.T;
    load_tile<HD>(sQ + buf * Tl::kElems, q + qoff, p.ldq, qs, p.T, tid);
    load_tile<HD>(sdO + buf * Tl::kElems, dout + qoff, p.ldq, qs, p.T, tid);
    load_stats(sL + buf * kBlock, sD + buf * kBlock, lse + loff, Dsum + loff, qs, p.T, tid);
  };
  if (iters > 0) issue(0, 0);  // (a ring block's keys no query of this tile sees: none)
  cp_async_commit();

  float dka[HD / 8][4], dva[HD / 8][4];
  zero(dka);
  zero(dva);
  const int key_lo = k0 + warp * 16 + g;  // key of accumulator rows g (c0, c1); +8 for c2, c3
  const uint16_t* wK = sK + warp * 16 * LD;
  const uint16_t* wV = sV + warp * 16 * LD;
  for (int it = 0; it < iters; ++it) {
    const int buf = it & 1;
    if (it + 1 < iters) {
      issue(it + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int q0 = (qb0 + it % nq) * kBlock;
    const uint16_t* cQ = sQ + buf * Tl::kElems;
    const uint16_t* cdO = sdO + buf * Tl::kElems;
    const float* cL = sL + buf * kBlock;
    const float* cD = sD + buf * kBlock;
    const bool need_mask = (!FULL && q0 == k0) || q0 + kBlock > p.T;

    uint32_t pa[4][4];  // P^T, then dS^T, as A fragments (rows = keys, k = queries)
    // Document masking: rows of a later document in this query block (the
    // last row's start is past the key block's first key).
    const bool docm = ds && doc_row(ds, q0 + kBlock - 1, p.T) - p.doc_off > k0;
    dkdv_pt<HD, FULL>(pa, wK, cQ, cL, p, ds, q0, key_lo, need_mask, docm, lane);
    gemm_py<HD>(dva, pa, cdO, lane);  // dV += P^T dO
    // dP^T = V dO^T and dS^T = P^T (dP^T - D), in two halves of 32 queries
    // (fewer live registers); half hf rewrites pa[2hf], pa[2hf+1] in place.
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float dp[4][4];
      zero(dp);
      gemm_sT<HD, 2>(dp, wV, cdO + hf * 32 * LD, lane);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int nt = hf * 4 + j;        // n-tile of the 64 query columns
        const int qc = nt * 8 + 2 * t4;
        const float d0 = cD[qc], d1 = cD[qc + 1];
        const uint32_t plo = pa[nt >> 1][(nt & 1) * 2];      // row g:   columns qc, qc+1
        const uint32_t phi = pa[nt >> 1][(nt & 1) * 2 + 1];  // row g+8
        dp[j][0] = bf_lo(plo) * (dp[j][0] - d0);
        dp[j][1] = bf_hi(plo) * (dp[j][1] - d1);
        dp[j][2] = bf_lo(phi) * (dp[j][2] - d0);
        dp[j][3] = bf_hi(phi) * (dp[j][3] - d1);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int kt = hf * 2 + j;
        pa[kt][0] = pack_bf16(dp[2 * j][0], dp[2 * j][1]);
        pa[kt][1] = pack_bf16(dp[2 * j][2], dp[2 * j][3]);
        pa[kt][2] = pack_bf16(dp[2 * j + 1][0], dp[2 * j + 1][1]);
        pa[kt][3] = pack_bf16(dp[2 * j + 1][2], dp[2 * j + 1][3]);
      }
    }
    gemm_py<HD>(dka, pa, cQ, lane);  // dK += dS^T Q
    __syncthreads();
  }
  if (iters == 0) {  // the K/V loads land before the tiles are reused
    cp_async_wait<0>();
    __syncthreads();
  }
  const int64_t ooff = koff;
  store_rows<HD>(sK + warp * 16 * LD, dka, p.scale, p.scale, dk + ooff, p.ldk, k0 + warp * 16,
                 Tk, lane);
  store_rows<HD>(sV + warp * 16 * LD, dva, 1.f, 1.f, dv + ooff, p.ldk, k0 + warp * 16, Tk, lane);
#endif
}

template <int HD, bool FULL = false>
__global__ void __launch_bounds__(kThreads, 2)
    flash_bwd_dq_kernel(uint16_t* __restrict__ dq, const uint16_t* __restrict__ q,
                        const uint16_t* __restrict__ k, const uint16_t* __restrict__ v,
                        const uint16_t* __restrict__ dout, const float* __restrict__ lse,
                        const float* __restrict__ Dsum, FlashParams p) {
#ifdef ADGT_FLASH_NO_MMA
  __trap();
#else
  using Tl = Tile<HD>;
  constexpr int LD = Tl::kLd;
  ADGT_DYNAMIC_SMEM(smem_raw);
  uint16_t* sQ = reinterpret_cast<uint16_t*>(smem_raw);  // (64, LD)
  uint16_t* sdO = sQ + Tl::kElems;                        // (64, LD)
  uint16_t* sK = sdO + Tl::kElems;                        // 2 x (64, LD)
  uint16_t* sV = sK + 2 * Tl::kElems;                     // 2 x (64, LD)
  float* sL = reinterpret_cast<float*>(sV + 2 * Tl::kElems);  // 64: lse
  float* sD = sL + kBlock;                                      // 64: D
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int nblk = (p.T + kBlock - 1) / kBlock;
  const int qb = nblk - 1 - int(blockIdx.x);  // heaviest block first
  const int h = blockIdx.y, b = blockIdx.z, kh = h / p.group;
  const int q0 = qb * kBlock;
  const int64_t qoff = int64_t(b) * p.T * p.ldq + int64_t(h) * HD;
  const int Tk = FULL ? p.Tk : p.T;
  const int64_t koff = int64_t(b) * Tk * p.ldk + int64_t(kh) * HD;
  const int64_t loff = (int64_t(b) * p.H + h) * p.T;
  const int32_t* ds = doc_of(p, b);
  // Key blocks kb0..nkb-1, as the forward.
  const int kb0 = first_key_block(ds, qb, p.doc_off);
  const int nkb = FULL ? (Tk + kBlock - 1) / kBlock : qb + 1;

  load_tile<HD>(sQ, q + qoff, p.ldq, q0, p.T, tid);
  load_tile<HD>(sdO, dout + qoff, p.ldq, q0, p.T, tid);
  load_stats(sL, sD, lse + loff, Dsum + loff, q0, p.T, tid);
  load_tile<HD>(sK, k + koff, p.ldk, kb0 * kBlock, Tk, tid);
  load_tile<HD>(sV, v + koff, p.ldk, kb0 * kBlock, Tk, tid);
  cp_async_commit();

  float dqa[HD / 8][4];
  zero(dqa);
  float lr[2] = {0.f, 0.f}, dr[2] = {0.f, 0.f};  // lse (log2 units) and D of rows g, g+8
  const int rl = warp * 16 + g;                   // local row of c0, c1; +8 for c2, c3
  const uint16_t* wQ = sQ + warp * 16 * LD;
  const uint16_t* wdO = sdO + warp * 16 * LD;
  // Document starts of rows rl and rl+8 (document masking only).
  const int dlo[2] = {ds ? doc_row(ds, q0 + rl, p.T) - p.doc_off : 0,
                      ds ? doc_row(ds, q0 + rl + 8, p.T) - p.doc_off : 0};
  for (int n = kb0; n < nkb; ++n) {
    if (n + 1 < nkb) {
      const int nb = (n + 1 - kb0) & 1;
      load_tile<HD>(sK + nb * Tl::kElems, k + koff, p.ldk, (n + 1) * kBlock, Tk, tid);
      load_tile<HD>(sV + nb * Tl::kElems, v + koff, p.ldk, (n + 1) * kBlock, Tk, tid);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (n == kb0) {
      lr[0] = sL[rl] * kLog2e;
      lr[1] = sL[rl + 8] * kLog2e;
      dr[0] = sD[rl];
      dr[1] = sD[rl + 8];
    }
    const uint16_t* cK = sK + ((n - kb0) & 1) * Tl::kElems;
    const uint16_t* cV = sV + ((n - kb0) & 1) * Tl::kElems;
    float s[8][4], dp[8][4];
    zero(s);
    zero(dp);
    gemm_sT<HD>(s, wQ, cK, lane);    // S = Q K^T
    gemm_sT<HD>(dp, wdO, cV, lane);  // dP = dO V^T
    // (Keys past Tk in a full block's ragged last tile: K and V rows of 0, so
    // dS = -P D and dQ += dS K adds 0.)
    const bool diag = !FULL && n == qb;
    const bool docm = ds && n * kBlock < dlo[1];  // keys before a row's document start
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float pr = fast_exp2(fmaf(s[nt][c], p.scale_log2, -lr[c >> 1]));
        const int key = n * kBlock + nt * 8 + 2 * t4 + (c & 1);
        if (diag && key > q0 + rl + (c >> 1) * 8) pr = 0.f;
        if (docm && key < dlo[c >> 1]) pr = 0.f;
        s[nt][c] = pr * (dp[nt][c] - dr[c >> 1]);  // dS
      }
    uint32_t pa[4][4];
    to_afrag(pa, s);
    gemm_py<HD>(dqa, pa, cK, lane);  // dQ += dS K
    __syncthreads();
  }
  if (kb0 >= nkb) {  // no key visible (a ring block's): the loads land first; dQ += 0
    cp_async_wait<0>();
    __syncthreads();
  }
  store_rows<HD>(sQ + warp * 16 * LD, dqa, p.scale, p.scale, dq + qoff, p.ldq, q0 + warp * 16,
                 p.T, lane, p.acc_dq);
#endif
}

}  // namespace
}  // namespace adgt::cuda

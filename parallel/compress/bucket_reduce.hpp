// The compressed reduction of one gradient bucket over its data-parallel
// group (docs/compression.md). Synchronous: it returns with the bucket
// reduced. Every rank of the group ends with the same bits.
//
// Quantized levels (Bf16, Int8, Int4), the reduce-scatter shape, so the
// quantization error does not grow with the number of ranks D:
//   1. v = g + residual (error feedback); the bucket is cut into D chunks
//      (ZeRO-1: exactly its dp chunks), each encoded (chunk_codec.hpp);
//      residual = v - decode(encode(v)).
//   2. all_to_allv of the encoded chunks: rank d receives chunk d of every rank.
//   3. The owner decodes the D pieces and sums them in fp32 in rank order.
//   ReduceScatter (ZeRO-1): the owner keeps that fp32 sum in g[its chunk]; done.
//   AllReduce:
//   4. w = sum + owner_residual, encoded once more; owner_residual =
//      w - decode(encode(w)) (a second error feedback, on the owner).
//   5. all_to_allv sending that encoding to every rank (an all-gather), and
//      every rank (the owner too) decodes every chunk into g.
// Each value is quantized twice whatever D is: once by its sender, once by
// its owner; a ring of re-quantizing hops would quantize it D times.
//
// PowerSGD: powersgd.hpp's step on every compressible 2-D tensor of the
// bucket; the other elements ride, fp32, in the all-reduce of the P factors.
// Both all-reduces are the transport's fp32 ring (deterministic). A ZeRO-1
// bucket is all-reduced whole (every rank then holds its chunk).
//
// Batches (reduce_buckets): several buckets of one level on one group go
// through one collective per stage — quantized: one all_to_allv of every
// bucket's chunks and one all-gather of every owner's encoding; PowerSGD: one
// all-reduce of every bucket's P and one of every Q — instead of one or two
// per bucket. Transport only: each bucket's arithmetic, and so its result and
// its error feedback, is bit for bit what reduce_bucket gives it alone (the
// quantized stages concatenate the buckets' encodings; the batched all-reduce
// lays each buffer's ring chunks side by side so the transport's ring,
// parallel/comm/ring.hpp, adds every element in the order it would alone).
#pragma once
#include <cstdint>
#include <vector>

#include "core/comm.hpp"
#include "core/model/param_table.hpp"
#include "parallel/compress/level.hpp"

namespace adgt::compress {

// What a bucket keeps between steps (host memory, fp32).
struct BucketCodecState {
  std::vector<float> residual;        // (n) sender-side error feedback; 0 at exact elements; empty: none yet
  std::vector<float> owner_residual;  // (own chunk) the owner's error feedback (AllReduce, quantized)
  std::vector<float> q;               // PowerSGD: each matrix's Q (k x r), in table order; empty: none yet
  bool empty() const { return residual.empty() && owner_residual.empty() && q.empty(); }
};

// One bucket: g[0, n) is the flat range [begin, begin + n) of the buffer
// that `table` describes.
struct BucketView {
  float* g = nullptr;
  int64_t begin = 0, n = 0;
  bool reduce_scatter = false;  // ZeRO-1: rank d needs only chunk d = [d*n/D, (d+1)*n/D)
};

// Chunk d of a bucket of n elements over D ranks, [first, second) relative
// to its start: n/D each for a reduce-scatter (n % D == 0), else ceil(n/D)
// each, the last ones shorter or empty.
std::pair<int64_t, int64_t> chunk_range(int64_t n, int D, int d, bool reduce_scatter);

// Reduces the bucket over `comm` at level l (not None); collective over comm.
// PowerSGD runs at rank s.powersgd_rank.
void reduce_bucket(Comm& comm, Level l, const BucketView& b, const std::vector<ParamSpec>& table,
                   const Settings& s, BucketCodecState& st);

// One bucket of a batch: its view, its state and (PowerSGD) its rank (0:
// Settings::powersgd_rank).
struct BatchItem {
  BucketView view;
  BucketCodecState* state = nullptr;
  int powersgd_rank = 0;
};
// Reduces every bucket of `items` over `comm` at level l (not None) with one
// collective per stage (above); every rank of the group passes the same
// buckets in the same order. Each bucket ends bit for bit as reduce_bucket
// would leave it.
void reduce_buckets(Comm& comm, Level l, const std::vector<BatchItem>& items,
                    const std::vector<ParamSpec>& table, const Settings& s);

// All-reduces (sum) every fp32 buffer of `bufs` with one all_reduce of
// `comm`: buffer j's ring chunks (ring.hpp, ceil(n_j/p) each, zero-padded) are
// laid side by side in chunk order, so a ring all-reduce of the whole adds
// each element along the same ranks, in the same order, as one of buffer j
// alone. A single non-empty buffer is all-reduced as it is.
void all_reduce_batched(Comm& comm, const std::vector<std::vector<float>*>& bufs);

// The bytes one rank sends to reduce the bucket uncompressed with the
// transport's fp32 ring: 2(D-1)/D x 4n for an all-reduce, (D-1)/D x 4n for a
// reduce-scatter (for the step line's "saved").
int64_t fp32_ring_bytes(int64_t n, int D, bool reduce_scatter);

}  // namespace adgt::compress

// Embedding kernels (kernels/cuda/embedding_kernels.cuh) in the CUDA
// emulation against the CPU backend, with CUB's sort and block scan as host
// stand-ins (tests/tools/cuda_sim/sim_cub.hpp). See sim_check.hpp.
//
// Forward: f32, f64 and bf16 (16-byte row copies when C % 8 == 0 and aligned,
// else scalar), rows wider than a block, tokens of other shards (zero rows).
// Backward, the device path (keys, radix sort, tile counts, tile offsets, run
// starts, one block per run) and the host-list path, f32, f64 and bf16 dout
// (W = 8 and W = 1): repeated tokens, tokens outside the shard, several scan
// tiles, more than one 1024-tile chunk of the offsets scan, a shard no token
// falls in. The kernels add each vocabulary row's gradient rows in ascending
// row order onto the existing value, the CPU backend's order: the results
// must equal the CPU's bitwise.
#include "tests/kernel_sim/sim_check.hpp"
#include "tests/tools/cuda_sim/sim_cub.hpp"
// (CUB's stand-ins before the kernel header)
#include "kernels/cuda/embedding_kernels.cuh"

namespace {
using namespace adgt;
using namespace adgt::sim_check;

// Token ids in [lo, hi), N of them.
Tensor tokens(Mem& m, std::mt19937& rng, int64_t N, int64_t lo, int64_t hi) {
  Tensor t = m.make(DType::I32, {N});
  std::uniform_int_distribution<int64_t> u(lo, hi - 1);
  for (int64_t i = 0; i < N; ++i) t.ptr<int32_t>()[i] = int32_t(u(rng));
  return t;
}

struct Case {
  int64_t N, V, C;
  int64_t vs;       // vocab_start
  int64_t lo, hi;   // token ids drawn from [lo, hi)
  int mis;          // elements off 16-byte alignment (out / dout)
};

std::string name(const char* op, DType dt, const Case& s) {
  return std::string(op) + " " + dtname(dt) + " N=" + std::to_string(s.N) + " V=" +
         std::to_string(s.V) + " C=" + std::to_string(s.C) + " vocab_start=" +
         std::to_string(s.vs) + (s.mis ? " misaligned" : "");
}

void forward(DType dt, const Case& s) {
  const std::string what = name("embedding_forward", dt, s);
  std::mt19937 rng(unsigned(s.N * 31 + s.C));
  Mem m;
  Ctx ctx;
  Tensor table = m.make(dt, {s.V, s.C}), tok = tokens(m, rng, s.N, s.lo, s.hi);
  fill(table, rng);
  Tensor outc = m.make(dt, {s.N, s.C});
  cpu().embedding_forward(outc, table, tok, s.vs);
  Tensor outs[2];
  int k = 0;
  run_both([&] {
    outs[k] = m.make(dt, {s.N, s.C}, s.mis);  // NaN bytes: every element must be written
    cuda::embedding_forward(ctx.get(), outs[k], table, tok, s.vs);
    ++k;
  });
  m.guards_ok(what);
  ++checks;
  if (!same_bits(outs[0], outc)) fail(what + ": rows differ from the CPU's copy");
  if (!same_bits(outs[0], outs[1])) fail(what + ": the two warp orders differ");
}

// lists: the host-list path (embedding_host_lists + embedding_backward_lists)
// instead of the device sort.
void backward(DType dt, const Case& s, bool lists) {
  const std::string what = name(lists ? "embedding_backward (host lists)" : "embedding_backward",
                                dt, s);
  std::mt19937 rng(unsigned(s.N * 17 + s.V + s.C));
  Mem m;
  Ctx ctx;
  const DType tdt = dt == DType::BF16 ? DType::F32 : dt;  // dtable
  Tensor dout = m.make(dt, {s.N, s.C}, s.mis), tok = tokens(m, rng, s.N, s.lo, s.hi);
  Tensor d0 = m.make(tdt, {s.V, s.C});
  fill(dout, rng), fill(d0, rng);
  Tensor dc = m.make(tdt, {s.V, s.C});
  copy(dc, d0);
  cpu().embedding_backward(dc, dout, tok, s.vs);

  Tensor csr;
  int64_t R = 0;
  if (lists) {
    const std::vector<int32_t> h =
        cuda::embedding_host_lists(tok.ptr<int32_t>(), s.N, s.V, s.vs, R);
    csr = m.make(DType::I32, {int64_t(h.size())});
    if (!h.empty()) std::memcpy(csr.data, h.data(), h.size() * 4);
  }
  Tensor ds[2];
  int k = 0;
  run_both([&] {
    ds[k] = m.make(tdt, {s.V, s.C}, s.mis);
    copy(ds[k], d0);
    if (lists)
      cuda::embedding_backward_lists(ctx.get(), ds[k], dout, csr.ptr<int32_t>(), R);
    else
      cuda::embedding_backward(ctx.get(), ds[k], dout, tok, s.vs);
    ++k;
  });
  m.guards_ok(what);
  close(what + " dtable", ds[0], dc, 0, 0);  // the CPU's summation order: exact
  if (!same_bits(ds[0], ds[1])) fail(what + ": the two warp orders differ");
}

}  // namespace

int main() {
  // kTile = 2048 positions per scan tile; the offsets scan takes 1024 tiles
  // at a time.
  const Case small{37, 50, 300, 0, 0, 50, 0};           // rows wider than 256 threads
  const Case shard{40, 10, 5, 7, -3, 25, 0};            // tokens below and above the shard
  const Case tiles{5000, 300, 3, 100, 0, 450, 0};       // 3 tiles, runs across tile edges
  const Case full{4500, 64, 2, 0, 0, 64, 0};            // every token in the shard: last run real
  const Case sparse{3000, 7000, 2, 0, 0, 7000, 0};      // N < V: grid of N blocks
  const Case none{300, 20, 4, 1000, 0, 1000, 0};        // no token in the shard
  const Case pow2{3000, 256, 2, 0, -40, 300, 0};        // V = 2^8: the key V takes a 9th bit
  for (DType dt : {DType::F32, DType::F64}) {
    for (const Case& s : {small, shard}) forward(dt, s);
    for (const Case& s : {small, shard, tiles, full, sparse, none, pow2}) {
      backward(dt, s, false);
      backward(dt, s, true);
    }
  }
  // bf16: 16-byte paths (C % 8 == 0, aligned), scalar ones (C % 8 != 0, or
  // misaligned out / dout), and rows wider than 256 x 8.
  const Case vec{33, 40, 64, 5, 0, 50, 0}, odd{33, 40, 36, 5, 0, 50, 0},
      mis{33, 40, 64, 5, 0, 50, 3}, wide{9, 12, 2056, 0, -2, 14, 0},
      wide1{9, 12, 300, 0, -2, 14, 1}, tiles8{5000, 300, 8, 100, 0, 450, 0};
  for (const Case& s : {vec, odd, mis, wide, wide1}) forward(DType::BF16, s);
  for (const Case& s : {vec, odd, mis, wide, wide1, tiles8, full, none}) {
    backward(DType::BF16, s, false);
    backward(DType::BF16, s, true);
  }
  // More than 1024 scan tiles: the offsets kernel's second chunk (its carry
  // and the reuse of its scan storage). Every token in the shard, so that
  // runs start in the last tiles too (the other shards' key sorts last);
  // C = 1 keeps it short.
  backward(DType::F32, Case{1024 * 2048 + 6000, 1500, 1, 500, 500, 2000, 0}, false);
  return finish("embedding");
}

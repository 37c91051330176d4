#include "parallel/compress/bucket_reduce.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/check.hpp"
#include "parallel/compress/chunk_codec.hpp"
#include "parallel/compress/powersgd.hpp"
#include "parallel/comm/ring.hpp"

namespace adgt::compress {

std::pair<int64_t, int64_t> chunk_range(int64_t n, int D, int d, bool reduce_scatter) {
  const int64_t c = reduce_scatter ? n / D : (n + D - 1) / D;
  return {std::min(n, d * c), std::min(n, (d + 1) * c)};
}

int64_t fp32_ring_bytes(int64_t n, int D, bool reduce_scatter) {
  if (D <= 1) return 0;
  const int64_t one = (D - 1) * ((n + D - 1) / D) * 4;
  return reduce_scatter ? one : 2 * one;
}

namespace {

Tensor words_tensor(std::vector<int32_t>& v, int64_t n) {
  if (v.size() < size_t(std::max<int64_t>(n, 1))) v.resize(size_t(std::max<int64_t>(n, 1)));
  return Tensor(v.data(), DType::I32, {n});
}

// One bucket of a quantized batch: its chunks' layouts and encodings.
struct QuantItem {
  BucketView b;
  BucketCodecState* st = nullptr;
  std::vector<std::pair<int64_t, int64_t>> cr;  // (D) chunk ranges
  std::vector<ChunkLayout> lay;                 // (D)
  std::vector<int64_t> words, sd;               // (D) encoded words per chunk, offsets in `send`
  std::vector<int32_t> send;                    // every chunk's encoding
  std::vector<float> acc;                       // the owner's fp32 sum of its chunk
  std::vector<int32_t> mine_enc;                // the owner's second encoding
};

void reduce_quantized(Comm& comm, Level l, const std::vector<BatchItem>& items,
                      const std::vector<ParamSpec>& table, const Settings& s) {
  const int D = comm.size(), me = comm.rank();
  std::vector<QuantItem> q(items.size());
  // 1. Per bucket: error feedback and the encoding of every chunk.
  for (size_t k = 0; k < items.size(); ++k) {
    QuantItem& x = q[k];
    x.b = items[k].view;
    x.st = items[k].state;
    const BucketView& b = x.b;
    if (b.reduce_scatter)
      ADGT_CHECK(b.n % D == 0, "compressed reduce-scatter: bucket of " << b.n << " elements over "
                                                                       << D << " ranks");
    x.cr.resize(size_t(D));
    x.lay.resize(size_t(D));
    x.words.resize(size_t(D));
    x.sd.resize(size_t(D));
    int64_t total = 0;
    for (int d = 0; d < D; ++d) {
      x.cr[size_t(d)] = chunk_range(b.n, D, d, b.reduce_scatter);
      x.lay[size_t(d)] = chunk_layout(table, b.begin + x.cr[size_t(d)].first,
                                      b.begin + x.cr[size_t(d)].second, s.min_elems);
      x.words[size_t(d)] = chunk_words(l, x.lay[size_t(d)]);
      x.sd[size_t(d)] = total;
      total += x.words[size_t(d)];
    }
    BucketCodecState& st = *x.st;
    if (int64_t(st.residual.size()) != b.n) st.residual.assign(size_t(b.n), 0.0f);
    for (int64_t i = 0; i < b.n; ++i) b.g[i] += st.residual[size_t(i)];
    x.send.resize(size_t(std::max<int64_t>(total, 1)));
    for (int d = 0; d < D; ++d)
      encode_chunk(l, x.lay[size_t(d)], b.g + x.cr[size_t(d)].first,
                   reinterpret_cast<uint8_t*>(x.send.data() + x.sd[size_t(d)]),
                   st.residual.data() + x.cr[size_t(d)].first);
  }
  // 2. One all_to_allv: chunk d of every bucket (in batch order) to rank d.
  // Every rank's chunk d has the same layout, so rank d receives the same
  // words from every rank.
  std::vector<int64_t> sc(size_t(D), 0), sdd(size_t(D), 0), rc(size_t(D), 0), rd(size_t(D), 0);
  int64_t mine = 0;  // words this rank owns over the batch, from each rank
  for (const QuantItem& x : q) mine += x.words[size_t(me)];
  for (int d = 0; d < D; ++d)
    for (const QuantItem& x : q) sc[size_t(d)] += x.words[size_t(d)];
  int64_t total = 0;
  for (int d = 0; d < D; ++d) {
    sdd[size_t(d)] = total;
    total += sc[size_t(d)];
    rc[size_t(d)] = mine;
    rd[size_t(d)] = d * mine;
  }
  std::vector<int32_t> send, recv;
  Tensor ts = words_tensor(send, total);
  for (int d = 0; d < D; ++d) {
    int64_t at = sdd[size_t(d)];
    for (const QuantItem& x : q) {
      std::copy_n(x.send.data() + x.sd[size_t(d)], x.words[size_t(d)], send.data() + at);
      at += x.words[size_t(d)];
    }
  }
  Tensor tr = words_tensor(recv, mine * D);
  comm.all_to_allv(tr, rc, rd, ts, sc, sdd);
  // 3. Per bucket: the owner's fp32 sum, in rank order; 4. (all-reduce
  // buckets) its second encoding, with its own error feedback.
  int64_t at = 0, gather = 0;  // at: the bucket's words in each rank's piece of recv
  for (QuantItem& x : q) {
    const auto [lo, hi] = x.cr[size_t(me)];
    const ChunkLayout& ml = x.lay[size_t(me)];
    const int64_t w = x.words[size_t(me)];
    x.acc.assign(size_t(hi - lo), 0.0f);
    for (int d = 0; d < D; ++d)
      decode_chunk(l, ml, reinterpret_cast<const uint8_t*>(recv.data() + d * mine + at), x.acc.data(), true);
    at += w;
    if (x.b.reduce_scatter) {
      std::copy(x.acc.begin(), x.acc.end(), x.b.g + lo);
      continue;
    }
    BucketCodecState& st = *x.st;
    if (int64_t(st.owner_residual.size()) != hi - lo) st.owner_residual.assign(size_t(hi - lo), 0.0f);
    for (size_t i = 0; i < x.acc.size(); ++i) x.acc[i] += st.owner_residual[i];
    x.mine_enc.resize(size_t(std::max<int64_t>(w, 1)));
    encode_chunk(l, ml, x.acc.data(), reinterpret_cast<uint8_t*>(x.mine_enc.data()), st.owner_residual.data());
    gather += w;
  }
  bool any_ar = false;
  for (const QuantItem& x : q) any_ar |= !x.b.reduce_scatter;
  if (!any_ar) return;
  // 5. One all-gather (an all_to_allv sending the same words to every rank):
  // every all-reduce bucket's owner encoding; rank d's piece holds its chunk d
  // of every such bucket, in batch order.
  std::vector<int32_t> mine_all;
  Tensor tm = words_tensor(mine_all, gather);
  at = 0;
  for (const QuantItem& x : q)
    if (!x.b.reduce_scatter) {
      std::copy_n(x.mine_enc.data(), x.words[size_t(me)], mine_all.data() + at);
      at += x.words[size_t(me)];
    }
  std::vector<int64_t> gc(size_t(D), gather), gd(size_t(D), 0), grc(size_t(D), 0), grd(size_t(D), 0);
  int64_t all_n = 0;
  for (int d = 0; d < D; ++d) {
    for (const QuantItem& x : q)
      if (!x.b.reduce_scatter) grc[size_t(d)] += x.words[size_t(d)];
    grd[size_t(d)] = all_n;
    all_n += grc[size_t(d)];
  }
  std::vector<int32_t> all;
  Tensor ta = words_tensor(all, all_n);
  comm.all_to_allv(ta, grc, grd, tm, gc, gd);
  std::vector<int64_t> pos = grd;  // per source rank: the next bucket's words
  for (const QuantItem& x : q) {
    if (x.b.reduce_scatter) continue;
    for (int d = 0; d < D; ++d) {
      decode_chunk(l, x.lay[size_t(d)], reinterpret_cast<const uint8_t*>(all.data() + pos[size_t(d)]),
                   x.b.g + x.cr[size_t(d)].first, false);
      pos[size_t(d)] += x.words[size_t(d)];
    }
  }
}

struct Matrix {
  const ParamSpec* p;
  int64_t at, m, k;  // at: offset in the bucket
  int r;
};

// One bucket of a PowerSGD batch.
struct PsgdItem {
  BucketView b;
  BucketCodecState* st = nullptr;
  std::vector<Matrix> mats;
  std::vector<std::pair<int64_t, int64_t>> exact;
  int64_t np = 0, nq = 0;
  std::vector<float> pbuf, qbuf;  // (np + exact) P factors then the exact elements; (nq) Q'
};

void reduce_powersgd(Comm& comm, const std::vector<BatchItem>& items, const std::vector<ParamSpec>& table,
                     const Settings& s) {
  std::vector<PsgdItem> q(items.size());
  for (size_t j = 0; j < items.size(); ++j) {
    PsgdItem& it = q[j];
    it.b = items[j].view;
    it.st = items[j].state;
    const BucketView& b = it.b;
    BucketCodecState& st = *it.st;
    const int rank = items[j].powersgd_rank > 0 ? items[j].powersgd_rank : s.powersgd_rank;
    // The compressible 2-D tensors lying wholly in the bucket; everything else goes exact.
    int64_t at = 0;
    for (const ParamSpec& p : table) {
      if (!compressible(p, s.min_elems) || p.offset < b.begin || p.offset + p.numel > b.begin + b.n) continue;
      const int64_t m = p.shape[0], k = p.shape[1];
      const int r = int(std::min<int64_t>({int64_t(rank), m, k}));
      it.mats.push_back({&p, p.offset - b.begin, m, k, r});
    }
    std::sort(it.mats.begin(), it.mats.end(), [](const Matrix& x, const Matrix& y) { return x.at < y.at; });
    int64_t ne = 0;
    for (const Matrix& x : it.mats) {
      if (x.at > at) it.exact.push_back({at, x.at});
      at = x.at + x.m * x.k;
      it.np += x.m * x.r;
      it.nq += x.k * x.r;
    }
    if (at < b.n) it.exact.push_back({at, b.n});
    for (const auto& [x, y] : it.exact) ne += y - x;
    if (int64_t(st.residual.size()) != b.n) st.residual.assign(size_t(b.n), 0.0f);
    if (int64_t(st.q.size()) != it.nq) {
      st.q.assign(size_t(it.nq), 0.0f);
      int64_t qo = 0;
      for (const Matrix& x : it.mats) {
        init_q(st.q.data() + qo, x.k, x.r, s.seed, x.p->name);
        qo += x.k * x.r;
      }
    }
    // P = (G + residual) Q for every matrix, then the exact elements.
    it.pbuf.assign(size_t(it.np + ne), 0.0f);
    int64_t po = 0, qo = 0;
    for (const Matrix& x : it.mats) {
      float* M = b.g + x.at;
      for (int64_t i = 0; i < x.m * x.k; ++i) M[i] += st.residual[size_t(x.at + i)];
      mat_mq(M, x.m, x.k, st.q.data() + qo, x.r, it.pbuf.data() + po);
      po += x.m * x.r;
      qo += x.k * x.r;
    }
    for (const auto& [x, y] : it.exact) {
      std::copy(b.g + x, b.g + y, it.pbuf.begin() + po);
      po += y - x;
    }
  }
  // One all-reduce of every bucket's P and exact elements.
  std::vector<std::vector<float>*> bufs;
  for (PsgdItem& it : q) bufs.push_back(&it.pbuf);
  all_reduce_batched(comm, bufs);
  // Q' = Mᵀ P and this rank's residual M - P Q'ᵀ.
  for (PsgdItem& it : q) {
    const BucketView& b = it.b;
    int64_t po = it.np;
    for (const auto& [x, y] : it.exact) {
      std::copy(it.pbuf.begin() + po, it.pbuf.begin() + po + (y - x), b.g + x);
      po += y - x;
    }
    it.qbuf.assign(size_t(it.nq), 0.0f);
    int64_t qo = 0;
    po = 0;
    for (const Matrix& x : it.mats) {
      float* P = it.pbuf.data() + po;
      orthonormalize(P, x.m, x.r);
      float* M = b.g + x.at;
      float* R = it.st->residual.data() + x.at;
      mat_mtp(M, x.m, x.k, P, x.r, it.qbuf.data() + qo);
      std::copy(M, M + x.m * x.k, R);
      mat_pqt(P, it.qbuf.data() + qo, x.m, x.k, x.r, R, true);
      for (int64_t i = 0; i < x.m * x.k; ++i)
        if (!std::isfinite(R[i])) R[i] = 0.0f;
      po += x.m * x.r;
      qo += x.k * x.r;
    }
  }
  // One all-reduce of every bucket's Q'.
  bufs.clear();
  for (PsgdItem& it : q) bufs.push_back(&it.qbuf);
  all_reduce_batched(comm, bufs);
  for (PsgdItem& it : q) {
    int64_t po = 0, qo = 0;
    bool finite = true;
    for (const Matrix& x : it.mats) {
      mat_pqt(it.pbuf.data() + po, it.qbuf.data() + qo, x.m, x.k, x.r, it.b.g + x.at, false);
      po += x.m * x.r;
      qo += x.k * x.r;
    }
    for (float v : it.qbuf) finite &= std::isfinite(v);
    // Warm start from the reduced Q; a non-finite one (a skipped step) starts afresh.
    if (finite)
      it.st->q = std::move(it.qbuf);
    else
      it.st->q.clear();
  }
}

}  // namespace

void all_reduce_batched(Comm& comm, const std::vector<std::vector<float>*>& bufs) {
  std::vector<std::vector<float>*> live;
  for (std::vector<float>* b : bufs)
    if (b && !b->empty()) live.push_back(b);
  if (live.empty()) return;
  if (live.size() == 1) {
    comm.all_reduce(Tensor(live[0]->data(), DType::F32, {int64_t(live[0]->size())}));
    return;
  }
  const int p = comm.size();
  std::vector<RingChunks> ch;
  std::vector<int64_t> off;  // buffer j's place inside each combined chunk
  int64_t C = 0;
  for (std::vector<float>* b : live) {
    ch.push_back(ring_chunks(int64_t(b->size()), p));
    off.push_back(C);
    C += ch.back().max_count();
  }
  // p chunks of C elements each: ring_chunks(p * C, p) cuts it exactly there.
  std::vector<float> all(size_t(p * C), 0.0f);
  for (size_t j = 0; j < live.size(); ++j)
    for (int c = 0; c < p; ++c)
      std::copy_n(live[j]->data() + ch[j].offset[size_t(c)], ch[j].count[size_t(c)],
                  all.data() + c * C + off[j]);
  comm.all_reduce(Tensor(all.data(), DType::F32, {p * C}));
  for (size_t j = 0; j < live.size(); ++j)
    for (int c = 0; c < p; ++c)
      std::copy_n(all.data() + c * C + off[j], ch[j].count[size_t(c)],
                  live[j]->data() + ch[j].offset[size_t(c)]);
}

void reduce_buckets(Comm& comm, Level l, const std::vector<BatchItem>& items,
                    const std::vector<ParamSpec>& table, const Settings& s) {
  ADGT_CHECK(l != Level::None, "compress::reduce_buckets: level off is the reducer's own path");
  if (comm.size() == 1 || items.empty()) return;  // a group of one: the sum is the gradient itself
  for (const BatchItem& it : items)
    ADGT_CHECK(it.state != nullptr, "compress::reduce_buckets: a bucket without state");
  if (l == Level::PowerSgd)
    reduce_powersgd(comm, items, table, s);
  else
    reduce_quantized(comm, l, items, table, s);
}

void reduce_bucket(Comm& comm, Level l, const BucketView& b, const std::vector<ParamSpec>& table,
                   const Settings& s, BucketCodecState& st) {
  reduce_buckets(comm, l, {BatchItem{b, &st, s.powersgd_rank}}, table, s);
}

}  // namespace adgt::compress

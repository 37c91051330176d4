// Document masking (train.document_mask) and per-document positions
// (model.rope_reset_per_document), in f64 against runs of each document on
// its own:
//  - the attention op with AttentionShape::doc_start equals plain causal
//    attention on each document's rows alone (forward and backward), with
//    documents across the CPU kernel's 64-row query blocks, grouped-query heads
//    and sequences of a batch cut differently;
//  - the model on packed sequences (documents ending in EOS) with both on
//    equals the sum of runs of each document alone at positions 0.., padded
//    with ignored targets: the same loss and gradients (1e-12), on the CPU
//    backend and on the emulated device;
//  - with neither on, the model's numbers are bitwise those of a model that
//    was never told about documents.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/model/model.hpp"
#include "core/rng.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/emulated/emulated_backend.hpp"

using namespace adgt;

namespace {

std::vector<double> random_vec(Rng& r, size_t n) {
  std::vector<double> v(n);
  for (double& x : v) x = 2 * r.uniform() - 1;
  return v;
}

// Rows [a, a + L) of sequence b of x (B, T, heads, hd) as a (1, L, heads, hd) array.
std::vector<double> rows_of(const std::vector<double>& x, int64_t T, int64_t heads, int64_t hd,
                            int64_t b, int64_t a, int64_t L) {
  const int64_t w = heads * hd;
  return std::vector<double>(x.begin() + (b * T + a) * w, x.begin() + (b * T + a + L) * w);
}

struct AttnOut {
  std::vector<double> out, dq, dk, dv;
};

AttnOut run_attention(const AttentionShape& s, std::vector<double> q, std::vector<double> k,
                      std::vector<double> v, std::vector<double> dout) {
  CpuBackend be;
  const int64_t nq = s.B * s.T * s.n_heads * s.head_dim, nk = s.B * s.T * s.n_kv_heads * s.head_dim;
  AttnOut o{std::vector<double>(size_t(nq)), std::vector<double>(size_t(nq)),
            std::vector<double>(size_t(nk)), std::vector<double>(size_t(nk))};
  std::vector<double> saved(size_t(be.attention_saved_elems(s)));
  auto t = [](std::vector<double>& x) { return Tensor(x.data(), DType::F64, {int64_t(x.size())}); };
  be.attention_forward(t(o.out), t(saved), t(q), t(k), t(v), s);
  be.attention_backward(t(o.dq), t(o.dk), t(o.dv), t(dout), t(q), t(k), t(v), t(o.out), t(saved), s);
  return o;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

}  // namespace

TEST_CASE("document-masked attention equals causal attention on each document alone",
          "[documents]") {
  const int64_t B = 2, T = 150, H = 4, KV = 2, hd = 8;
  // Document starts per sequence: boundaries inside and on the 64-row blocks,
  // a one-token document, a document spanning two blocks.
  const std::vector<std::vector<int64_t>> starts = {{0, 5, 6, 64, 100, 149}, {0, 63, 128}};
  std::vector<int32_t> doc_start(size_t(B * T));
  for (int64_t b = 0; b < B; ++b)
    for (size_t d = 0; d < starts[size_t(b)].size(); ++d) {
      const int64_t a = starts[size_t(b)][d];
      const int64_t e = d + 1 < starts[size_t(b)].size() ? starts[size_t(b)][d + 1] : T;
      for (int64_t t = a; t < e; ++t) doc_start[size_t(b * T + t)] = int32_t(a);
    }
  Rng r(3);
  const auto q = random_vec(r, size_t(B * T * H * hd)), k = random_vec(r, size_t(B * T * KV * hd)),
             v = random_vec(r, size_t(B * T * KV * hd)), dout = random_vec(r, size_t(B * T * H * hd));
  AttentionShape s{B, T, H, KV, hd};
  s.doc_start = doc_start.data();
  const AttnOut packed = run_attention(s, q, k, v, dout);
  const AttnOut plain = run_attention(AttentionShape{B, T, H, KV, hd}, q, k, v, dout);
  CHECK(max_abs_diff(packed.out, plain.out) > 1e-3);  // the mask changes the numbers
  for (int64_t b = 0; b < B; ++b)
    for (size_t d = 0; d < starts[size_t(b)].size(); ++d) {
      const int64_t a = starts[size_t(b)][d];
      const int64_t L = (d + 1 < starts[size_t(b)].size() ? starts[size_t(b)][d + 1] : T) - a;
      INFO("sequence " << b << " document at " << a << " of " << L << " tokens");
      const AttnOut one = run_attention(AttentionShape{1, L, H, KV, hd}, rows_of(q, T, H, hd, b, a, L),
                                        rows_of(k, T, KV, hd, b, a, L), rows_of(v, T, KV, hd, b, a, L),
                                        rows_of(dout, T, H, hd, b, a, L));
      CHECK(max_abs_diff(rows_of(packed.out, T, H, hd, b, a, L), one.out) < 1e-12);
      CHECK(max_abs_diff(rows_of(packed.dq, T, H, hd, b, a, L), one.dq) < 1e-12);
      CHECK(max_abs_diff(rows_of(packed.dk, T, KV, hd, b, a, L), one.dk) < 1e-12);
      CHECK(max_abs_diff(rows_of(packed.dv, T, KV, hd, b, a, L), one.dv) < 1e-12);
    }
}

namespace {

constexpr int32_t kEos = 0;

ModelConfig small() {
  ModelConfig m;
  m.vocab_size = 17;
  m.d_model = 16;
  m.n_layers = 2;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.ffn_hidden = 24;
  m.seq_len = 20;
  m.init_std = 0.3;
  m.rope_theta = 100;  // short wavelengths: positions matter at this length
  return m;
}

struct Pass {
  double loss = 0;
  std::vector<double> grads;
};

// forward + backward of (B, T) tokens; docs: set_documents(kEos, mask, reset).
Pass run_model(Backend& be, const std::vector<int32_t>& in, const std::vector<int32_t>& tg,
               int64_t B, bool mask, bool reset, double grad_scale = 1.0, Pass* acc = nullptr,
               bool tell = true) {
  const ModelConfig m = small();
  Model model(m, be, DType::F64, B, m.seq_len, {}, nullptr, {}, {}, true);
  if (tell) model.set_documents(kEos, mask, reset);
  model.init_weights(5);
  model.zero_grads();
  Pass p;
  p.loss = model.forward(in.data(), tg.data(), grad_scale);
  model.backward();
  p.grads = model.grads_to_host_f64();
  if (acc) {
    acc->loss += p.loss * grad_scale;
    if (acc->grads.empty()) acc->grads.assign(p.grads.size(), 0.0);
    for (size_t i = 0; i < p.grads.size(); ++i) acc->grads[i] += p.grads[i];
  }
  return p;
}

void packed_equals_documents_alone(Backend& be) {
  const int64_t B = 2, T = small().seq_len;
  // Sequence 0: documents of 4, 1 (a lone EOS), 7 tokens, then one cut off by
  // the window; sequence 1: one long document, then one of 3.
  const std::vector<std::vector<int64_t>> lengths = {{4, 1, 7, 8}, {17, 3}};
  Rng r(21);
  std::vector<int32_t> in(size_t(B * T)), tg(size_t(B * T));
  for (int64_t b = 0; b < B; ++b) {
    int64_t t = 0;
    for (int64_t L : lengths[size_t(b)])
      for (int64_t j = 0; j < L; ++j, ++t) {
        const bool last = j + 1 == L && t + 1 < T;  // every document but the cut one ends in EOS
        in[size_t(b * T + t)] = last ? kEos : int32_t(1 + r.next() % 16);
      }
  }
  for (size_t i = 0; i < tg.size(); ++i) tg[i] = i % 7 == 3 ? -1 : int32_t(r.next() % 17);
  int64_t n = 0;
  for (int32_t x : tg) n += x >= 0;
  const Pass packed = run_model(be, in, tg, B, true, true);
  // Each document alone at positions 0..L-1 of a sequence of its own, padded
  // with ignored targets; grad_scale n_d / n makes its gradients its share of
  // the packed mean.
  Pass alone;
  for (int64_t b = 0; b < B; ++b) {
    int64_t a = 0;
    for (int64_t L : lengths[size_t(b)]) {
      std::vector<int32_t> din(size_t(T), 1), dtg(size_t(T), -1);
      int64_t nd = 0;
      for (int64_t j = 0; j < L; ++j) {
        din[size_t(j)] = in[size_t(b * T + a + j)];
        dtg[size_t(j)] = tg[size_t(b * T + a + j)];
        nd += dtg[size_t(j)] >= 0;
      }
      a += L;
      if (nd) run_model(be, din, dtg, 1, false, false, double(nd) / double(n), &alone);
    }
  }
  CHECK(std::abs(packed.loss - alone.loss) < 1e-12 * std::abs(alone.loss));
  double ref = 0;
  for (double g : alone.grads) ref = std::max(ref, std::abs(g));
  CHECK(max_abs_diff(packed.grads, alone.grads) < 1e-12 * ref);
  // Masking alone gives the same numbers up to rounding: rotary attention
  // scores depend only on the distance between query and key, which the
  // reset does not change inside a document. The reset alone (documents
  // still see each other) and neither give other numbers.
  CHECK(std::abs(run_model(be, in, tg, B, true, false).loss - alone.loss) < 1e-12 * alone.loss);
  CHECK(std::abs(run_model(be, in, tg, B, false, true).loss - alone.loss) > 1e-6);
  CHECK(std::abs(run_model(be, in, tg, B, false, false).loss - alone.loss) > 1e-6);
  // Off: bitwise a model never told about documents.
  const Pass off = run_model(be, in, tg, B, false, false);
  const Pass never = run_model(be, in, tg, B, false, false, 1.0, nullptr, false);
  CHECK(std::memcmp(&off.loss, &never.loss, sizeof(double)) == 0);
  CHECK(off.grads == never.grads);
}

}  // namespace

TEST_CASE("packed documents with masking and position reset equal each document alone (cpu)",
          "[documents]") {
  CpuBackend be;
  packed_equals_documents_alone(be);
}

TEST_CASE("packed documents with masking and position reset equal each document alone "
          "(emulated device)",
          "[documents]") {
  EmulatedBackend be(size_t(1) << 30);
  packed_equals_documents_alone(be);
}

TEST_CASE("document masking needs an end-of-document token inside the vocabulary", "[documents]") {
  CpuBackend be;
  const ModelConfig m = small();
  Model model(m, be, DType::F64, 1, m.seq_len, {}, nullptr, {}, {}, true);
  CHECK_THROWS_WITH(model.set_documents(-1, true, false),
                    Catch::Contains("end-of-document token id") && Catch::Contains("data.eos_id"));
  CHECK_THROWS_WITH(model.set_documents(17, false, true), Catch::Contains("[0, 17)"));
  CHECK_NOTHROW(model.set_documents(-1, false, false));
}

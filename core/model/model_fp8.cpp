// The model's FP8 linear layers (train.dtype: fp8): which GEMMs, and their
// delayed-scaling state by global layer (core/model/fp8_linear.hpp).
#include <algorithm>

#include "core/model/model.hpp"
#include "kernels/check.hpp"

namespace adgt {

namespace {
// Roles of a layer's linears in the history table.
enum Role { kQ = 0, kK, kV, kO, kGate, kUp, kDown, kRoles };
// The last role a site of `role` stands for: a fused site (qkv, gate/up) its three or two.
int last_role(int role, bool fused) {
  return !fused ? role : role == kQ ? kV : role == kGate ? kUp : role;
}
}  // namespace

// Every expert of the layer has its sites on every rank (the ones it holds
// use theirs, owned or replicated), keyed -1 - ((layer * E + e) * 3 + proj).
// Expert weights are split over tp (F / tp rows of w1, w3; columns of w2).
void Model::add_expert_sites(int64_t layer, MoeLayer& m) {
  const int64_t E = cfg_.n_experts, C = cfg_.d_model, F = cfg_.expert_ffn() / tp_->size();
  std::vector<int> sites(size_t(3 * E), -1);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t key = -1 - (layer * E + e) * 3;
    if (fused_) {
      sites[size_t(e * 3)] = fp8_->add_site(key, 2 * F, C, false);
    } else {
      sites[size_t(e * 3)] = fp8_->add_site(key, F, C, false);
      sites[size_t(e * 3 + 1)] = fp8_->add_site(key - 1, F, C, false);
    }
    sites[size_t(e * 3 + 2)] = fp8_->add_site(key - 2, C, F, false);
  }
  m.set_fp8(fp8_.get(), std::move(sites));
}

void Model::enable_fp8(const Fp8Options& o, Comm* cp) {
  if (!o.on) return;
  ADGT_CHECK(dtype_ == DType::BF16 && mdt_ == DType::F32,
             "Model: FP8 GEMMs run inside bf16 mixed precision (train.dtype: fp8), not "
                 << dtype_name(dtype_));
  fp8_ = std::make_unique<Fp8Linears>(be_, o, tp_, cp);
  fp8_site_.assign(table_.size(), -1);
  auto add = [&](int64_t layer, int role, size_t wi, size_t wl) {
    const Tensor w = weights(wi, wl);
    fp8_site_[wi] = fp8_->add_site(layer * 8 + role, w.dim(0), w.dim(1));
  };
  for (const Chunk& ch : chunks_)
    for (int64_t l = 0; l < ch.n_layers; ++l) {
      const LayerIdx& w = layer_idx_[ch.first_local + size_t(l)];
      const int64_t g = ch.first_layer + l;
      if (fused_) {
        add(g, kQ, w.q, w.v);
      } else {
        add(g, kQ, w.q, w.q);
        add(g, kK, w.k, w.k);
        add(g, kV, w.v, w.v);
      }
      add(g, kO, w.o, w.o);
      if (w.moe >= 0) {
        add_expert_sites(g, *moe_[size_t(w.moe)]);
        continue;
      }
      if (fused_) {
        add(g, kGate, w.gate, w.up);
      } else {
        add(g, kGate, w.gate, w.gate);
        add(g, kUp, w.up, w.up);
      }
      add(g, kDown, w.down, w.down);
    }
  // parallel.fp8_allgather: the sequence-parallel gathers of ln1 (into q/k/v)
  // and of a dense layer's ln2 (into gate/up) move FP8 codes, at the scale
  // of the GEMM that reads them (q's, or the fused qkv's; gate's or gate/up's).
  fp8_gather_sites_.assign(table_.size(), {});
  auto gathered = [&](size_t norm, std::initializer_list<size_t> readers) {
    for (size_t r : readers)
      if (fp8_site_[r] >= 0) {
        fp8_gather_sites_[norm].push_back(fp8_site_[r]);
        fp8_->set_gathered(fp8_site_[r]);
      }
  };
  if (o.allgather && sp_)
    for (const Chunk& ch : chunks_)
      for (int64_t l = 0; l < ch.n_layers; ++l) {
        const LayerIdx& w = layer_idx_[ch.first_local + size_t(l)];
        gathered(w.in_norm, {w.q, w.k, w.v});               // fused: the qkv site is q's
        if (w.moe < 0) gathered(w.post_norm, {w.gate, w.up});  // a router reads MoE's ln2
      }
}

void Model::gather_norm(Tensor full, size_t norm_w) {
  if (fp8_ && norm_w < fp8_gather_sites_.size() && !fp8_gather_sites_[norm_w].empty())
    fp8_->gather(fp8_gather_sites_[norm_w], full, ln_local_, *tp_);
  else
    gather_rows(full, ln_local_);
}

void Model::mm_fwd(Tensor y, const Tensor& x, size_t wi, size_t wl) {
  const int site = fp8_ ? fp8_site_[wi] : -1;
  if (site >= 0)
    fp8_->forward(site, y, x, weights(wi, wl));
  else
    be_.linear_forward(y, x, weights(wi, wl));
}

void Model::mm_bwd(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, size_t wi, size_t wl,
                   bool accumulate_dx) {
  const int site = fp8_ ? fp8_site_[wi] : -1;
  if (site >= 0)
    fp8_->backward(site, dx, dw, dy, x, weights(wi, wl), accumulate_dx);
  else
    be_.linear_backward(dx, dw, dy, x, weights(wi, wl), accumulate_dx);
}

// The table: (n_layers, 7 roles, 2, H) for the dense linears, then, in a
// model with experts, (n_layers, n_experts, 3 (w1, w3, w2), 2, H).
// A site's rows in it (a fused site stands for two or three roles).
std::vector<size_t> Model::fp8_table_rows(int site) const {
  const int64_t key = fp8_->key(site);
  std::vector<size_t> rows;
  if (key >= 0) {
    const int64_t layer = key / 8;
    const int role = int(key % 8);
    for (int r = role; r <= last_role(role, fused_); ++r) rows.push_back(size_t(layer) * kRoles + size_t(r));
    return rows;
  }
  const int64_t i = -1 - key;  // (layer * E + e) * 3 + proj
  const size_t dense = size_t(cfg_.n_layers) * kRoles;
  rows.push_back(dense + size_t(i));
  if (fused_ && i % 3 == 0) rows.push_back(dense + size_t(i) + 1);  // w13: w1 and w3
  return rows;
}

size_t Model::fp8_table_size() const {
  const size_t H = size_t(fp8_->options().history);
  return (size_t(cfg_.n_layers) * kRoles + size_t(cfg_.n_layers * cfg_.n_experts) * 3) * 2 * H;
}

std::vector<double> Model::fp8_history_table() const {
  if (!fp8_) return {};
  const size_t row = 2 * size_t(fp8_->options().history);
  std::vector<double> t(fp8_table_size(), 0.0);
  const std::vector<double> h = fp8_->history();
  for (int s = 0; s < fp8_->sites(); ++s)
    for (size_t r : fp8_table_rows(s))
      std::copy(h.begin() + std::ptrdiff_t(size_t(s) * row),
                h.begin() + std::ptrdiff_t(size_t(s + 1) * row), t.begin() + std::ptrdiff_t(r * row));
  return t;
}

void Model::set_fp8_history_table(const std::vector<double>& t, int64_t steps) {
  if (!fp8_) return;
  const size_t H = size_t(fp8_->options().history), row = 2 * H;
  ADGT_CHECK(t.size() == fp8_table_size(),
             "Model: an FP8 history table of " << t.size() << " values, expected (n_layers x 7 + "
                                               << "n_layers x n_experts x 3) x 2 x " << H);
  std::vector<double> h(size_t(fp8_->sites()) * row, 0.0);
  for (int s = 0; s < fp8_->sites(); ++s)
    for (size_t r : fp8_table_rows(s))
      for (size_t k = 0; k < row; ++k)
        h[size_t(s) * row + k] = std::max(h[size_t(s) * row + k], t[r * row + k]);
  fp8_->set_history(h, steps);
}

}  // namespace adgt

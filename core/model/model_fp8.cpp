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
      if (w.moe >= 0) continue;  // the experts stay bf16
      if (fused_) {
        add(g, kGate, w.gate, w.up);
      } else {
        add(g, kGate, w.gate, w.gate);
        add(g, kUp, w.up, w.up);
      }
      add(g, kDown, w.down, w.down);
    }
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

std::vector<double> Model::fp8_history_table() const {
  if (!fp8_) return {};
  const size_t H = size_t(fp8_->options().history), row = 2 * H;
  std::vector<double> t(size_t(cfg_.n_layers) * kRoles * row, 0.0);
  const std::vector<double> h = fp8_->history();
  for (int s = 0; s < fp8_->sites(); ++s) {
    const int64_t key = fp8_->key(s), layer = key / 8;
    const int role = int(key % 8);
    const int last = last_role(role, fused_);
    for (int r = role; r <= last; ++r)
      std::copy(h.begin() + std::ptrdiff_t(size_t(s) * row),
                h.begin() + std::ptrdiff_t(size_t(s + 1) * row),
                t.begin() + std::ptrdiff_t((size_t(layer) * kRoles + size_t(r)) * row));
  }
  return t;
}

void Model::set_fp8_history_table(const std::vector<double>& t, int64_t steps) {
  if (!fp8_) return;
  const size_t H = size_t(fp8_->options().history), row = 2 * H;
  ADGT_CHECK(t.size() == size_t(cfg_.n_layers) * kRoles * row,
             "Model: an FP8 history table of " << t.size() << " values, expected n_layers x 7 x 2 x "
                                               << H);
  std::vector<double> h(size_t(fp8_->sites()) * row, 0.0);
  for (int s = 0; s < fp8_->sites(); ++s) {
    const int64_t key = fp8_->key(s), layer = key / 8;
    const int role = int(key % 8);
    const int last = last_role(role, fused_);
    for (int r = role; r <= last; ++r)
      for (size_t k = 0; k < row; ++k)
        h[size_t(s) * row + k] =
            std::max(h[size_t(s) * row + k], t[(size_t(layer) * kRoles + size_t(r)) * row + k]);
  }
  fp8_->set_history(h, steps);
}

}  // namespace adgt

#include "core/model/fp8_linear.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/check.hpp"

namespace adgt {

namespace {
constexpr int kW = 0, kX = 1, kDy = 2;
}  // namespace

Fp8Options fp8_options(const TrainConfig& t) {
  Fp8Options o;
  o.on = t.dtype == "fp8";
  o.grad_kind = t.fp8_format == "e4m3" ? Fp8Kind::E4M3 : Fp8Kind::E5M2;
  o.delayed = t.fp8_recipe == "delayed";
  o.history = int(std::max<int64_t>(1, t.fp8_amax_history));
  o.margin = int(t.fp8_margin);
  return o;
}

void Fp8Linears::gather(const std::vector<int>& sites, Tensor full, const Tensor& local,
                        Comm& group) {
  const int64_t rows = local.dim(0), cols = local.numel() / std::max<int64_t>(1, rows);
  const int site = sites.at(0);
  activation_scale(site, kX, local);
  if (o_.delayed)
    for (int s : sites) be_.fp8_amax(scalar(step_amax_, s, kX), local, true);
  const Tensor sc = scalar(scale_, site, kX);
  Tensor q = scratch(gq_, rows, cols, DType::E4M3);
  be_.fp8_quantize(q, Tensor(nullptr, DType::E4M3, {cols, rows}), local, sc);
  Tensor qf = scratch(gqf_, full.dim(0), cols, DType::E4M3);
  group.all_gather(qf, q);
  be_.fp8_dequantize(full, qf, sc);
}

Fp8Linears::Fp8Linears(Backend& be, const Fp8Options& o, Comm* tp, Comm* cp)
    : be_(be),
      o_(o),
      tp_(tp && tp->size() > 1 ? tp : nullptr),
      cp_(cp && cp->size() > 1 ? cp : nullptr),
      row_multiple_(std::max<int64_t>(1, be.fp8_row_multiple())) {}

int Fp8Linears::add_site(int64_t key, int64_t O, int64_t I, bool split_tokens) {
  ADGT_CHECK(!amax_.data(), "Fp8Linears: sites are added before the first GEMM");
  Site s;
  s.key = key;
  s.O = O;
  s.I = I;
  s.split_tokens = split_tokens;
  sites_.push_back(std::move(s));
  hist_.assign(sites_.size() * 2 * size_t(o_.history), 0.0f);
  return int(sites_.size()) - 1;
}

Tensor Fp8Linears::scalar(const Buffer& b, int site, int which) const {
  return Tensor(static_cast<float*>(b.data()) + size_t(which) * sites_.size() + size_t(site),
                DType::F32, {1});
}

Tensor Fp8Linears::scratch(Buffer& b, int64_t rows, int64_t cols, DType dt) {
  const size_t bytes = size_t(rows * cols) * dtype_size(dt);
  if (b.bytes() < bytes) b = Buffer(be_, bytes);
  return Tensor(b.data(), dt, {rows, cols});
}

void Fp8Linears::make_slots() {
  if (amax_.data()) return;
  const size_t n = 3 * sites_.size() * 4;
  amax_ = Buffer(be_, n);
  scale_ = Buffer(be_, n);
  step_amax_ = Buffer(be_, n);
  be_.zero(Tensor(step_amax_.data(), DType::F32, {int64_t(3 * sites_.size())}));
}

void Fp8Linears::current_scale(int site, int which, const Tensor& x, bool tokens) {
  make_slots();
  Tensor a = scalar(amax_, site, which);
  be_.fp8_amax(a, x, false);
  if (tp_) tp_->all_reduce(a, ReduceOp::Max);
  if (cp_ && tokens && sites_[size_t(site)].split_tokens) cp_->all_reduce(a, ReduceOp::Max);
  be_.fp8_scale(scalar(scale_, site, which), a, which == kDy ? o_.grad_kind : Fp8Kind::E4M3,
                o_.margin);
}

void Fp8Linears::activation_scale(int site, int which, const Tensor& x) {
  // (A pass before any begin_step since the history was set, an evaluation
  // right after a resume: the scales from the history first.)
  if (o_.delayed && filled_ > 0 && !uploaded_) begin_step();
  if (!o_.delayed || !have_history(site, which)) current_scale(site, which, x, true);
}

Fp8Operand Fp8Linears::quantize(int site, int which, const Tensor& x, Buffer& q, Buffer& qt) {
  const int64_t rows = x.dim(0), cols = x.numel() / rows;
  activation_scale(site, which, x);
  if (o_.delayed && !(which == kX && sites_[size_t(site)].gathered))
    be_.fp8_amax(scalar(step_amax_, site, which), x, true);
  const DType dt = which == kDy && o_.grad_kind == Fp8Kind::E5M2 ? DType::E5M2 : DType::E4M3;
  Fp8Operand r;
  r.q = scratch(q, rows, cols, dt);
  if (be_.fp8_needs_transpose()) r.qt = scratch(qt, cols, rows, dt);
  r.scale = scalar(scale_, site, which);
  be_.fp8_quantize(r.q, r.qt, x, r.scale);
  return r;
}

Fp8Operand Fp8Linears::weight(int site, const Tensor& w) {
  Site& s = sites_[size_t(site)];
  ADGT_CHECK(w.dim(0) == s.O && w.numel() == s.O * s.I,
             "Fp8Linears: site " << s.key << " was registered for (" << s.O << "," << s.I
                                 << ") weights, got " << w.shape_str());
  Fp8Operand r;
  const bool t = be_.fp8_needs_transpose();
  if (!o_.cache_weights) {  // cast at every use into one scratch (ZeRO-3: sharded weights)
    current_scale(site, kW, w, false);
    r.scale = scalar(scale_, site, kW);
    r.q = scratch(wq_, s.O, s.I, DType::E4M3);
    r.qt = t ? scratch(wqt_, s.I, s.O, DType::E4M3) : Tensor(nullptr, DType::E4M3, {s.I, s.O});
    be_.fp8_quantize(r.q, r.qt, w, r.scale);
    return r;
  }
  if (!s.w_valid) {
    current_scale(site, kW, w, false);
    if (!s.wq.data()) s.wq = Buffer(be_, size_t(s.O * s.I));
    if (t && !s.wqt.data()) s.wqt = Buffer(be_, size_t(s.O * s.I));
  }
  r.q = Tensor(s.wq.data(), DType::E4M3, {s.O, s.I});
  if (t) r.qt = Tensor(s.wqt.data(), DType::E4M3, {s.I, s.O});
  r.scale = scalar(scale_, site, kW);
  if (!s.w_valid) {
    be_.fp8_quantize(r.q, r.qt, w, r.scale);
    s.w_valid = true;
  }
  return r;
}

Tensor Fp8Linears::padded(Buffer& b, const Tensor& t, int64_t padded_rows) {
  const int64_t rows = t.dim(0), cols = t.numel() / std::max<int64_t>(1, rows);
  Tensor p = scratch(b, padded_rows, cols, t.dtype);
  if (rows) be_.copy(p.rows(0, rows), Tensor(t.data, t.dtype, {rows, cols}));
  be_.zero(p.rows(rows, padded_rows - rows));
  return p;
}

void Fp8Linears::forward(int site, Tensor y, const Tensor& x, const Tensor& w) {
  const int64_t rows = x.dim(0), pr = (rows + row_multiple_ - 1) / row_multiple_ * row_multiple_;
  if (pr == rows) return forward_rows(site, y, x, w);
  const Tensor xp = padded(xpad_, x, pr);
  Tensor yp = scratch(outpad_, pr, y.numel() / std::max<int64_t>(1, rows), y.dtype);
  forward_rows(site, yp, xp, w);
  if (rows) be_.copy(Tensor(y.data, y.dtype, {rows, yp.dim(1)}), yp.rows(0, rows));
}

void Fp8Linears::backward(int site, Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x,
                          const Tensor& w, bool accumulate_dx) {
  const int64_t rows = dy.dim(0), pr = (rows + row_multiple_ - 1) / row_multiple_ * row_multiple_;
  if (pr == rows) return backward_rows(site, dx, dw, dy, x, w, accumulate_dx);
  const int64_t cols = x.numel() / std::max<int64_t>(1, rows);
  const Tensor dyp = padded(dypad_, dy, pr);
  const Tensor xp = dw.data ? padded(xpad_, x, pr) : Tensor(nullptr, x.dtype, {pr, cols});
  Tensor dxp(nullptr, dx.dtype, {pr, cols});
  if (dx.data) dxp = accumulate_dx ? padded(outpad_, dx, pr) : scratch(outpad_, pr, cols, dx.dtype);
  backward_rows(site, dxp, dw, dyp, xp, w, accumulate_dx);
  if (dx.data && rows) be_.copy(Tensor(dx.data, dx.dtype, {rows, cols}), dxp.rows(0, rows));
}

void Fp8Linears::forward_rows(int site, Tensor y, const Tensor& x, const Tensor& w) {
  const Fp8Operand wq = weight(site, w);
  const Fp8Operand xq = quantize(site, kX, x, xq_, xqt_);
  be_.linear_forward_fp8(y, xq, wq);
}

void Fp8Linears::backward_rows(int site, Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x,
                               const Tensor& w, bool accumulate_dx) {
  const Fp8Operand wq = weight(site, w);
  const Fp8Operand dyq = quantize(site, kDy, dy, dyq_, dyqt_);
  // The input's codes again (the forward's scale: its amax is the same, or
  // the step's delayed scale).
  Fp8Operand xq;
  if (dw.data) {
    xq = quantize(site, kX, x, xq_, xqt_);
  } else {
    xq.q = Tensor(nullptr, DType::E4M3, {x.dim(0), x.numel() / x.dim(0)});
  }
  be_.linear_backward_fp8(dx, dw, dyq, xq, wq, accumulate_dx);
}

void Fp8Linears::invalidate_weights() {
  for (Site& s : sites_) s.w_valid = false;
}

bool Fp8Linears::have_history(int site, int which) const {
  return filled_ > 0 && hist_ok_.size() == 2 * sites_.size() &&
         hist_ok_[size_t(which - kX) * sites_.size() + size_t(site)];
}

void Fp8Linears::begin_step() {
  if (!o_.delayed || filled_ == 0 || sites_.empty()) return;
  const size_t S = sites_.size(), H = size_t(o_.history);
  const size_t n = size_t(std::min<int64_t>(filled_, o_.history));
  std::vector<float> sc(2 * S);
  hist_ok_.assign(2 * S, 0);
  for (size_t i = 0; i < S; ++i)
    for (int j = 0; j < 2; ++j) {
      const float* h = &hist_[(i * 2 + size_t(j)) * H];
      float m = 0;
      for (size_t k = 0; k < n; ++k) m = std::max(m, h[(size_t(head_) + H - 1 - k) % H]);
      hist_ok_[size_t(j) * S + i] = m > 0;
      const Fp8Kind kind = j == 1 ? o_.grad_kind : Fp8Kind::E4M3;
      sc[size_t(j) * S + i] = pow2f(fp8_scale_exponent(m, kind, o_.margin));
    }
  make_slots();
  be_.to_device(static_cast<float*>(scale_.data()) + S, sc.data(), sc.size() * 4);
  uploaded_ = true;
}

void Fp8Linears::end_step(const std::vector<Comm*>& groups) {
  if (!o_.delayed || sites_.empty() || !step_amax_.data()) return;
  const size_t S = sites_.size(), H = size_t(o_.history);
  Tensor t(static_cast<float*>(step_amax_.data()) + S, DType::F32, {int64_t(2 * S)});
  for (Comm* g : groups)
    if (g && g->size() > 1) g->all_reduce(t, ReduceOp::Max);
  std::vector<float> a(2 * S);
  be_.to_host(a.data(), t.data, a.size() * 4);
  be_.zero(t);
  for (float v : a)
    if (!std::isfinite(v)) return;  // a skipped step: the history stays
  for (size_t i = 0; i < S; ++i)
    for (size_t j = 0; j < 2; ++j) hist_[(i * 2 + j) * H + size_t(head_)] = a[j * S + i];
  head_ = (head_ + 1) % int64_t(H);
  ++filled_;
  uploaded_ = false;  // an evaluation before the next step scales from the new history
}

std::vector<double> Fp8Linears::history() const {
  const size_t S = sites_.size(), H = size_t(o_.history);
  std::vector<double> out(S * 2 * H, 0.0);
  const size_t n = size_t(std::min<int64_t>(filled_, o_.history));
  // Oldest first, the newest at index n - 1.
  for (size_t r = 0; r < S * 2; ++r)
    for (size_t k = 0; k < n; ++k)
      out[r * H + k] = hist_[r * H + (size_t(head_) + H - n + k) % H];
  return out;
}

void Fp8Linears::set_history(const std::vector<double>& h, int64_t steps) {
  const size_t S = sites_.size(), H = size_t(o_.history);
  ADGT_CHECK(h.size() == S * 2 * H && steps >= 0,
             "Fp8Linears: a history of " << h.size() << " values for " << S << " sites x 2 x "
                                         << H << " steps");
  const size_t n = size_t(std::min<int64_t>(steps, o_.history));
  std::fill(hist_.begin(), hist_.end(), 0.0f);
  for (size_t r = 0; r < S * 2; ++r)
    for (size_t k = 0; k < n; ++k) hist_[r * H + k] = float(h[r * H + k]);
  filled_ = int64_t(n);
  head_ = int64_t(n % H);
  uploaded_ = false;
}

}  // namespace adgt

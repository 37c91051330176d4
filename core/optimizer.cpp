#include "core/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "kernels/check.hpp"

namespace adgt {

double lr_at(const TrainConfig& t, int64_t s) {
  if (t.warmup_steps > 0 && s < t.warmup_steps)
    return t.lr * double(s + 1) / double(t.warmup_steps);
  const double span = double(std::max<int64_t>(1, t.steps - t.warmup_steps));
  const double p = std::min(1.0, double(s - t.warmup_steps) / span);
  return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1.0 + std::cos(M_PI * p));
}

std::string lr_schedule_change(const TrainConfig& saved, const TrainConfig& now, int64_t step) {
  const double was = lr_at(saved, step), is = lr_at(now, step);
  if (saved.steps == now.steps && saved.lr == now.lr && saved.min_lr == now.min_lr &&
      saved.warmup_steps == now.warmup_steps)
    return "";
  std::string keys;
  const auto key = [&](const char* name, const std::string& a, const std::string& b) {
    if (a != b) keys += std::string(keys.empty() ? "" : ", ") + "train." + name + "=" + b + " (the saved run's: " + a + ")";
  };
  const auto num = [](double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", x);
    return std::string(b);
  };
  key("steps", std::to_string(saved.steps), std::to_string(now.steps));
  key("lr", num(saved.lr), num(now.lr));
  key("min_lr", num(saved.min_lr), num(now.min_lr));
  key("warmup_steps", std::to_string(saved.warmup_steps), std::to_string(now.warmup_steps));
  char b[160];
  if (was == is)
    std::snprintf(b, sizeof b, "; step %lld keeps lr %.2e", (long long)(step + 1), is);
  else
    std::snprintf(b, sizeof b, "; step %lld gets lr %.2e instead of %.2e", (long long)(step + 1), is, was);
  return "resuming at step " + std::to_string(step) + " with " + keys +
         ": the learning-rate schedule (warm-up, cosine to min_lr) is recomputed over " +
         std::to_string(now.steps) + " steps" + b;
}

std::vector<Segment> segments_in(const std::vector<ParamSpec>& table, int64_t lo, int64_t hi) {
  std::vector<Segment> out;
  for (size_t i = 0; i < table.size(); ++i) {
    const int64_t b = std::max(lo, table[i].offset);
    const int64_t e = std::min(hi, table[i].offset + table[i].numel);
    if (b < e) out.push_back({i, b, e});
  }
  return out;
}

AdamW::AdamW(Backend& be, const std::vector<ParamSpec>& table, const TrainConfig& cfg,
             DType dtype, int64_t lo, int64_t hi)
    : be_(be), table_(table), cfg_(cfg), dtype_(dtype), lo_(lo),
      hi_(hi < 0 ? total_numel(table) : hi) {
  segs_ = segments_in(table_, lo_, hi_);
  m_ = Buffer(be, size_t(hi_ - lo_) * dtype_size(dtype));
  v_ = Buffer(be, size_t(hi_ - lo_) * dtype_size(dtype));
  be.zero(exp_avg());
  be.zero(exp_avg_sq());
}

Tensor AdamW::flat(const Buffer& b) const { return Tensor(b.data(), dtype_, {hi_ - lo_}); }

Tensor AdamW::at(Tensor f, int64_t begin, int64_t end, int64_t base) const {
  return Tensor(static_cast<char*>(f.data) + size_t(begin - base) * dtype_size(dtype_), dtype_,
                {end - begin});
}

void AdamW::step(Tensor params, Tensor grads, double lr, int64_t step, Tensor lowp,
                 double grad_scale) {
  ADGT_CHECK(params.numel() >= hi_ && grads.numel() >= hi_, "AdamW: flat buffer too small");
  AdamWHyper h;
  h.lr = lr;
  h.beta1 = cfg_.beta1;
  h.beta2 = cfg_.beta2;
  h.eps = cfg_.eps;
  h.step = step;
  h.grad_scale = grad_scale;
  for (const Segment& s : segs_) {
    h.weight_decay = decays(table_[s.param], cfg_) ? cfg_.weight_decay : 0.0;
    if (lowp.data) {
      Tensor lp(static_cast<char*>(lowp.data) + size_t(s.begin) * dtype_size(lowp.dtype),
                lowp.dtype, {s.end - s.begin});
      be_.adamw_cast(at(params, s.begin, s.end, 0), at(grads, s.begin, s.end, 0),
                     at(exp_avg(), s.begin, s.end, lo_), at(exp_avg_sq(), s.begin, s.end, lo_), lp,
                     h);
    } else {
      be_.adamw(at(params, s.begin, s.end, 0), at(grads, s.begin, s.end, 0),
                at(exp_avg(), s.begin, s.end, lo_), at(exp_avg_sq(), s.begin, s.end, lo_), h);
    }
  }
}

std::vector<float> AdamW::to_host(const Tensor& t) const {
  std::vector<float> out;
  to_host(t, out);
  return out;
}

void AdamW::to_host(const Tensor& t, std::vector<float>& out) const {
  out.resize(size_t(t.numel()));
  if (t.dtype == DType::F32) {
    be_.to_host(out.data(), t.data, out.size() * 4);
  } else {
    std::vector<double> d(out.size());
    be_.to_host(d.data(), t.data, d.size() * 8);
    for (size_t i = 0; i < d.size(); ++i) out[i] = float(d[i]);
  }
}

void AdamW::from_host(Tensor t, const std::vector<float>& src) {
  ADGT_CHECK(int64_t(src.size()) == t.numel(), "AdamW::from_host: size mismatch");
  if (t.dtype == DType::F32) {
    be_.to_device(t.data, src.data(), src.size() * 4);
  } else {
    std::vector<double> d(src.begin(), src.end());
    be_.to_device(t.data, d.data(), d.size() * 8);
  }
}

double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  return std::min(1.0, max_norm / (norm + 1e-6));
}

}  // namespace adgt

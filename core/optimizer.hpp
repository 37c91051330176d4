// AdamW (decoupled weight decay, PyTorch semantics), the learning-rate
// schedule (linear warm-up, cosine decay) and global-norm clipping.
#pragma once
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/model/param_table.hpp"
#include "kernels/backend.hpp"

namespace adgt {

// lr of 0-based step s: lr*(s+1)/warmup for s < warmup, then cosine from lr to
// min_lr over the remaining steps.
double lr_at(const TrainConfig& t, int64_t step);

// A resume at `step` (steps done) whose schedule keys (train.steps, lr,
// min_lr, warmup_steps) differ from the saved run's: one line saying how the
// learning rate of the next step changes ("" when it does not), e.g.
// "resuming at step 20 with train.steps=30 (the saved run's: 20): the
// learning-rate schedule is recomputed over 30 steps; step 21 gets lr 8.2e-04
// instead of 3.0e-04".
std::string lr_schedule_change(const TrainConfig& saved, const TrainConfig& now, int64_t step);

// A parameter's elements that fall inside a flat range [lo, hi).
struct Segment {
  size_t param;         // index in the table
  int64_t begin, end;   // flat offsets, lo <= begin < end <= hi
};
std::vector<Segment> segments_in(const std::vector<ParamSpec>& table, int64_t lo, int64_t hi);

class AdamW {
 public:
  // State for the flat range [lo, hi) of the parameter buffer (the whole buffer
  // by default; one data-parallel rank's chunk under ZeRO-1).
  AdamW(Backend& be, const std::vector<ParamSpec>& table, const TrainConfig& cfg, DType dtype,
        int64_t lo = 0, int64_t hi = -1);
  // One update of the parameters in range; `step` is the 1-based count of updates.
  // params are the (fp32) master weights; a non-empty `lowp` (mixed precision)
  // receives the updated weights in its dtype (bf16) in the same pass.
  // grad_scale: the clipping coefficient, applied as each gradient is read
  // (AdamWHyper::grad_scale; grads are left unscaled).
  void step(Tensor params, Tensor grads, double lr, int64_t step, Tensor lowp = {},
            double grad_scale = 1.0);
  int64_t lo() const { return lo_; }
  int64_t hi() const { return hi_; }
  Tensor exp_avg() const { return flat(m_); }     // (hi - lo)
  Tensor exp_avg_sq() const { return flat(v_); }  // (hi - lo)
  std::vector<float> to_host(const Tensor& t) const;
  void to_host(const Tensor& t, std::vector<float>& out) const;  // into out (resized, reused)
  void from_host(Tensor t, const std::vector<float>& src);

 private:
  Tensor flat(const Buffer& b) const;
  Tensor at(Tensor flat_full, int64_t begin, int64_t end, int64_t base) const;
  Backend& be_;
  std::vector<ParamSpec> table_;
  TrainConfig cfg_;
  DType dtype_;
  int64_t lo_, hi_;
  std::vector<Segment> segs_;
  Buffer m_, v_;
};

// The factor that brings a gradient of global norm `norm` to at most max_norm
// (PyTorch clip_grad_norm_: min(1, max_norm / (norm + 1e-6)); 1 when max_norm is 0).
// DataParallel::step applies it; DataParallel::grad_norm computes the norm.
double clip_coefficient(double norm, double max_norm);

}  // namespace adgt

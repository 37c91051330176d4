// FP8 linear layers (train.dtype: fp8; docs/fp8.md). The model's layer
// GEMMs (q/k/v or qkv, o, gate/up or gu, down) run on FP8 operands:
//   forward   y  = Q(x) Q(w)^T          x, w in E4M3
//   backward  dx = Q(dy) Q(w)           dy in E5M2 (hybrid) or E4M3
//             dw += Q(dy)^T Q(x)
// with fp32 accumulation and bf16 outputs (dw fp32), each Q a per-tensor
// power-of-two scale then a round-to-nearest-even, saturating cast
// (kernels/common/fp8.hpp). The head, the attention core, norms, SwiGLU,
// the loss and the router stay bf16/fp32. The MoE experts' GEMMs are sites
// too (MoeLayer::set_fp8), one per expert and projection.
//
// Scales. Weights: from their amax when cast, once per step (the cast codes
// are cached until the weights change: invalidate_weights), or at every use
// without the cache (Fp8Options::cache_weights, ZeRO-3). Activations (x)
// and output gradients (dy):
//   tensorwise  from this tensor's amax now (current scaling);
//   delayed     from the largest amax of the last `history` steps (TE's
//               delayed scaling); a site with no history yet scales from its
//               amax now. Each step's amax (the largest over the step's
//               micro-batches and over the ranks that share the layer) is
//               pushed at end_step.
// Every amax is the whole tensor's: a tensor split over the tp group (a
// weight shard, a row-parallel input, a column-parallel output gradient) or
// over the cp group (a sequence's tokens) takes the max over that group, so
// a layout computes the scales one process would. A micro-batch's amax is
// its own under data parallelism, as in one process's accumulation.
// An expert's site (split_tokens false) takes no max over cp: its rows are
// the ones routed to that expert on this rank, gathered from the ep group
// (its amax is the block's, as a grouped GEMM's per-expert scale; with
// power-of-two scales that casts every value in E4M3's normal range exactly
// as the micro-batches' own scales would, docs/fp8.md).
// Delayed scaling with an all-zero history for a site (an expert no token
// reached in the window) scales from the current amax, not from zero.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/comm.hpp"
#include "core/config.hpp"
#include "kernels/backend.hpp"

namespace adgt {

struct Fp8Options {
  bool on = false;
  bool allgather = false;             // parallel.fp8_allgather (Model: the SP gathers)
  // Weight codes cached from one cast a step (true), or cast at each use
  // into one scratch (false: ZeRO-3 freeing each unit's gathered weights
  // after use; the same codes, without a whole model of them kept).
  bool cache_weights = true;
  Fp8Kind grad_kind = Fp8Kind::E5M2;  // fp8_format hybrid; e4m3: E4M3
  bool delayed = false;               // fp8_recipe
  int history = 16;                   // fp8_amax_history
  int margin = 0;                     // fp8_margin
};
// From train.dtype and train.fp8_* (on only for dtype fp8).
Fp8Options fp8_options(const TrainConfig& t);

class Fp8Linears {
 public:
  // tp, cp: the groups a tensor may be split over (nullptr or one rank: none).
  Fp8Linears(Backend& be, const Fp8Options& o, Comm* tp, Comm* cp);
  Fp8Linears(const Fp8Linears&) = delete;
  Fp8Linears& operator=(const Fp8Linears&) = delete;

  // A linear layer of (O, I) weights; returns its site. `key`: a name the
  // checkpoint state uses (see Model: dense layer * 8 + role; an expert's
  // is negative). split_tokens: the site's activations are a sequence's
  // tokens split over cp (amax maxed over cp); false for experts.
  int add_site(int64_t key, int64_t O, int64_t I, bool split_tokens = true);
  int sites() const { return int(sites_.size()); }
  int64_t key(int site) const { return sites_[size_t(site)].key; }

  // Backend::linear_forward / linear_backward of the site on FP8 operands.
  // Rows that are not a multiple of the backend's fp8_row_multiple() (an
  // expert's) are padded with zero rows in scratch copies, which changes no
  // output row (a zero row's codes are zero, its amax adds nothing, its
  // products are zeros; dw's sum over rows only by the padded K's blocking).
  void forward(int site, Tensor y, const Tensor& x, const Tensor& w);
  void backward(int site, Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                bool accumulate_dx);
  // The multiple rows are padded to (default: the backend's; tests).
  void set_row_multiple(int64_t m) { row_multiple_ = m < 1 ? 1 : m; }

  // parallel.fp8_allgather: `full` (rows x cols, bf16) = the all-gather over
  // `group` (the tp group, sequence parallelism) of `local`'s FP8 codes at
  // the scale the site's forward takes for the gathered tensor (the local
  // amaxes maxed over tp and cp, or the history's), dequantized. So `full`
  // holds Q(x) where the plain gather holds x, and the site's GEMMs give
  // the same numbers from it: Q(x)'s own scale is the same power of two or
  // a larger one, at which Q(x) casts to itself.
  // `sites`: the GEMMs reading `full` (q, k, v or the fused qkv; gate, up
  // or the fused gate/up), the first's scale taken; under delayed scaling
  // their step amaxes come from `local` here (the amax of x, not of Q(x):
  // the same history as the plain gather's), marked by set_gathered.
  void gather(const std::vector<int>& sites, Tensor full, const Tensor& local, Comm& group);
  // The site's input is always gathered by gather(): its GEMMs' casts of it
  // do not add to the step's amax (delayed scaling).
  void set_gathered(int site) { sites_[size_t(site)].gathered = true; }

  // The weights changed (an update, a load): each site casts its weights
  // again at its next use.
  void invalidate_weights();
  // Delayed scaling: uploads this step's activation and gradient scales
  // from the histories (no-op otherwise).
  void begin_step();
  // Delayed scaling: the step's amax of every site, max over `groups` (the
  // ranks holding the same layers: tp, dp x cp), pushed into the histories
  // (a non-finite amax is not: that step is skipped). Collective over them.
  void end_step(const std::vector<Comm*>& groups);

  // The histories, oldest first: (sites, 2 (x, dy), history) and how many
  // steps are filled (at most history). For checkpoints.
  std::vector<double> history() const;
  int64_t history_steps() const { return filled_; }
  void set_history(const std::vector<double>& h, int64_t steps);

  const Fp8Options& options() const { return o_; }

 private:
  struct Site {
    int64_t key = 0, O = 0, I = 0;
    bool split_tokens = true;
    bool gathered = false;  // set_gathered
    Buffer wq, wqt;      // the cached weight codes (E4M3), and transposed
    bool w_valid = false;
  };
  void make_slots();  // the scalar buffers, at first use (after every add_site)
  // Slots in the scalar buffers: per site [w, x, dy].
  Tensor scalar(const Buffer& b, int site, int which) const;
  Tensor scratch(Buffer& b, int64_t rows, int64_t cols, DType dt);
  // amax of x into amax slot (site, which), max over tp (and cp when
  // `tokens`), then its scale into the scale slot.
  void current_scale(int site, int which, const Tensor& x, bool tokens);
  // The scale slot (site, which) for the activation or gradient x: the
  // recipe's (the delayed history's, else x's current amax).
  void activation_scale(int site, int which, const Tensor& x);
  // q (and qt) of x at the scale of (site, which); the activation recipes.
  Fp8Operand quantize(int site, int which, const Tensor& x, Buffer& q, Buffer& qt);
  Fp8Operand weight(int site, const Tensor& w);
  void forward_rows(int site, Tensor y, const Tensor& x, const Tensor& w);
  void backward_rows(int site, Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x,
                     const Tensor& w, bool accumulate_dx);
  // t (rows, cols) into b as (padded, cols): t's rows, then zero rows.
  Tensor padded(Buffer& b, const Tensor& t, int64_t padded_rows);
  bool have_history(int site, int which) const;

  Backend& be_;
  Fp8Options o_;
  Comm* tp_ = nullptr;
  Comm* cp_ = nullptr;
  std::vector<Site> sites_;
  Buffer amax_, scale_, step_amax_;  // F32 (3 x sites): now, scale, the step's (delayed)
  Buffer xq_, xqt_, dyq_, dyqt_;     // activation and gradient codes (grown)
  Buffer xpad_, dypad_, outpad_;     // row-padded copies (x, dy; y or dx)
  Buffer gq_, gqf_;                  // gather: the local and the gathered codes
  Buffer wq_, wqt_;                  // !cache_weights: the weight codes of the GEMM at hand
  int64_t row_multiple_ = 1;
  std::vector<float> hist_;          // (sites, 2, history) ring: slot (filled_ + i) % history
  std::vector<uint8_t> hist_ok_;     // (2, sites): the window's amax is > 0 (begin_step)
  int64_t filled_ = 0;               // steps pushed (capped at history for reads)
  int64_t head_ = 0;                 // next ring slot
  bool uploaded_ = false;            // the scales of the current history are on the device
};

}  // namespace adgt

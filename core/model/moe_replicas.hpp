// Expert replicas in spare slots (HERMP; docs/adaptation.md,
// "Expert replicas"): beyond the experts it owns (ExpertPlacement), an ep
// rank may hold copies of other ranks' experts, and every source rank splits
// its tokens of a replicated expert among the expert's holders by fixed
// shares.
//
// A copy is a shadow: the owner alone keeps the expert's weights, gradient
// and optimizer state (the parameter table, checkpoints, the gradient
// reduction and ZeRO see owners only). MoeLayer::sync_replicas copies the
// owners' weights into the shadows (once per step, after the update), and
// each backward sends the shadows' gradients back to the owners, which add
// them to their own before the expert-data-parallel reduction. So the model's
// numbers are the unreplicated run's: every row meets the same weights, and
// an expert's gradient is the same rows' sum, in another order.
//
// Split rule (every source rank, its own kept assignments of expert e in the
// send order, n of them): holder j of e (j = 0 is the owner) receives rows
// [round(c_j n), round(c_{j+1} n)), c_j the cumulative share of the holders
// before j (c_0 = 0, c_last = 1). Pure, so the receiver derives its counts
// from the senders' n alone.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/model/moe_placement.hpp"

namespace adgt {

class ExpertReplicas {
 public:
  ExpertReplicas() = default;  // none
  // holders[e]: the ep ranks that serve expert e, owner first; shares[e]: the
  // share of e's tokens each serves (sum 1, each >= 0). Throws a named error
  // when the owner is not placement's, a rank repeats or is outside the group,
  // a share is negative or the sum is not 1, or a rank would hold more than
  // `slots` experts (slots: owned plus shadows; 0 means no limit).
  ExpertReplicas(const ExpertPlacement& placement, std::vector<std::vector<int>> holders,
                 std::vector<std::vector<double>> shares, int slots);
  // Parses describe()'s text ("e:r=share,r=share;..." for replicated experts
  // only) against placement; throws naming the entry that is wrong.
  static ExpertReplicas parse(const ExpertPlacement& placement, const std::string& text, int slots);

  bool any() const { return !shadows_.empty() && any_; }
  int64_t n_experts() const { return int64_t(holders_.size()); }
  const std::vector<int>& holders(int64_t e) const { return holders_[size_t(e)]; }
  const std::vector<double>& shares(int64_t e) const { return shares_[size_t(e)]; }
  // Rank r's shadows: experts it holds but does not own, by (owner, expert id).
  const std::vector<int64_t>& shadows(int r) const { return shadows_[size_t(r)]; }
  // Rows [begin, end) of n that holder j of expert e serves (the split rule).
  void split(int64_t e, size_t j, int64_t n, int64_t& begin, int64_t& end) const;
  // "3:0=0.5,2=0.5;7:1=0.6,0=0.4" (replicated experts only; "" when none).
  std::string describe() const;

 private:
  bool any_ = false;
  std::vector<std::vector<int>> holders_;
  std::vector<std::vector<double>> shares_, cum_;
  std::vector<std::vector<int64_t>> shadows_;
};

}  // namespace adgt

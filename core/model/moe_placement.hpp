// Expert placement for expert parallelism: which rank of the ep group holds
// which expert, as a table owner[e] in [0, ep). Every rank holds the same
// number of experts, E / ep; a rank's local experts are its experts in
// ascending global id (the order of MoeParams' per-expert tensors).
//
// The default is contiguous blocks: rank r holds experts [r*E/ep, (r+1)*E/ep).
// Any other table with equal counts works (a planner may interleave experts or
// co-locate ones that are often chosen together).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace adgt {

class ExpertPlacement {
 public:
  // Contiguous blocks of E / ep experts. Throws when ep does not divide E.
  static ExpertPlacement contiguous(int64_t n_experts, int ep);
  // Validates `owner` (size E, values in [0, ep), E / ep experts per rank) and
  // throws a named error otherwise. An empty table means contiguous.
  ExpertPlacement(int64_t n_experts, int ep, std::vector<int> owner);

  int64_t n_experts() const { return int64_t(owner_.size()); }
  int ep() const { return ep_; }
  int64_t per_rank() const { return n_experts() / ep_; }
  int owner(int64_t e) const { return owner_[size_t(e)]; }
  const std::vector<int>& table() const { return owner_; }
  // Global ids of rank r's experts, ascending (size per_rank()).
  const std::vector<int64_t>& local_experts(int r) const { return local_[size_t(r)]; }
  // Index of expert e among its owner's local experts.
  int64_t local_index(int64_t e) const { return local_index_[size_t(e)]; }
  // "0 0 1 1" style, for messages and logs.
  std::string str() const;

 private:
  int ep_ = 1;
  std::vector<int> owner_;
  std::vector<std::vector<int64_t>> local_;
  std::vector<int64_t> local_index_;
};

}  // namespace adgt

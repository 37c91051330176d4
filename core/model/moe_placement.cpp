#include "core/model/moe_placement.hpp"

#include "kernels/check.hpp"

namespace adgt {

ExpertPlacement ExpertPlacement::contiguous(int64_t n_experts, int ep) {
  return ExpertPlacement(n_experts, ep, {});
}

ExpertPlacement::ExpertPlacement(int64_t n_experts, int ep, std::vector<int> owner) : ep_(ep) {
  ADGT_CHECK(n_experts >= 1, "moe: n_experts=" << n_experts << " must be at least 1");
  ADGT_CHECK(ep >= 1, "moe: expert-parallel size ep=" << ep << " must be at least 1");
  ADGT_CHECK(n_experts % ep == 0, "moe: ep=" << ep << " does not divide n_experts=" << n_experts
                                             << "; use an ep that divides it");
  const int64_t per = n_experts / ep;
  if (owner.empty()) {
    owner.resize(size_t(n_experts));
    for (int64_t e = 0; e < n_experts; ++e) owner[size_t(e)] = int(e / per);
  }
  ADGT_CHECK(int64_t(owner.size()) == n_experts,
             "moe: expert placement table has "
                 << owner.size() << " entries; it needs one per expert (" << n_experts << ")");
  owner_ = std::move(owner);
  local_.assign(size_t(ep), {});
  local_index_.assign(size_t(n_experts), 0);
  for (int64_t e = 0; e < n_experts; ++e) {
    const int r = owner_[size_t(e)];
    ADGT_CHECK(r >= 0 && r < ep, "moe: expert placement puts expert "
                                     << e << " on rank " << r << ", outside the ep group [0, " << ep
                                     << ")");
    local_index_[size_t(e)] = int64_t(local_[size_t(r)].size());
    local_[size_t(r)].push_back(e);
  }
  for (int r = 0; r < ep; ++r)
    ADGT_CHECK(int64_t(local_[size_t(r)].size()) == per,
               "moe: expert placement gives ep rank "
                   << r << " " << local_[size_t(r)].size()
                   << " experts; every rank needs n_experts/ep = " << per << " (table: " << str()
                   << ")");
}

std::string ExpertPlacement::str() const {
  std::string s;
  for (size_t e = 0; e < owner_.size(); ++e) s += (e ? " " : "") + std::to_string(owner_[e]);
  return s;
}

}  // namespace adgt

#include "core/model/moe_replicas.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "kernels/check.hpp"

namespace adgt {

ExpertReplicas::ExpertReplicas(const ExpertPlacement& placement,
                               std::vector<std::vector<int>> holders,
                               std::vector<std::vector<double>> shares, int slots) {
  const int64_t E = placement.n_experts();
  const int P = placement.ep();
  ADGT_CHECK(int64_t(holders.size()) == E && int64_t(shares.size()) == E,
             "moe replicas: " << holders.size() << " holder lists and " << shares.size()
                              << " share lists for " << E << " experts");
  std::vector<int64_t> held(size_t(P), placement.per_rank());
  shadows_.assign(size_t(P), {});
  for (int64_t e = 0; e < E; ++e) {
    auto& h = holders[size_t(e)];
    auto& s = shares[size_t(e)];
    ADGT_CHECK(!h.empty() && h.size() == s.size(),
               "moe replicas: expert " << e << " has " << h.size() << " holders and " << s.size()
                                       << " shares; it needs one share per holder, at least one");
    ADGT_CHECK(h[0] == placement.owner(e),
               "moe replicas: expert " << e << "'s first holder is ep rank " << h[0]
                                       << ", not its owner " << placement.owner(e));
    double sum = 0;
    for (size_t j = 0; j < h.size(); ++j) {
      ADGT_CHECK(h[j] >= 0 && h[j] < P, "moe replicas: expert " << e << " on ep rank " << h[j]
                                                                << ", outside [0, " << P << ")");
      ADGT_CHECK(std::count(h.begin(), h.end(), h[j]) == 1,
                 "moe replicas: expert " << e << " lists ep rank " << h[j] << " twice");
      ADGT_CHECK(std::isfinite(s[j]) && s[j] >= 0,
                 "moe replicas: expert " << e << "'s share on ep rank " << h[j] << " is " << s[j]
                                         << "; shares must be >= 0");
      sum += s[j];
      if (j > 0) ++held[size_t(h[j])];
    }
    ADGT_CHECK(std::abs(sum - 1) <= 1e-6, "moe replicas: expert " << e << "'s shares sum to "
                                                                  << sum << ", not 1");
    if (h.size() > 1) any_ = true;
  }
  for (int r = 0; r < P; ++r)
    ADGT_CHECK(slots <= 0 || held[size_t(r)] <= slots,
               "moe replicas: ep rank " << r << " would hold " << held[size_t(r)]
                                        << " experts, more than parallel.expert_slots=" << slots);
  holders_ = std::move(holders);
  shares_ = std::move(shares);
  cum_.resize(size_t(E));
  for (int64_t e = 0; e < E; ++e) {
    auto& c = cum_[size_t(e)];
    c.assign(1, 0.0);
    for (double x : shares_[size_t(e)]) c.push_back(c.back() + x);
    c.back() = 1.0;  // exact, so the last holder ends at n
  }
  // Shadows by (owner, expert id): each owner's sends are one block.
  for (int o = 0; o < P; ++o)
    for (int64_t e : placement.local_experts(o))
      for (size_t j = 1; j < holders_[size_t(e)].size(); ++j)
        shadows_[size_t(holders_[size_t(e)][j])].push_back(e);
}

void ExpertReplicas::split(int64_t e, size_t j, int64_t n, int64_t& begin, int64_t& end) const {
  if (holders_.empty()) {  // none: the owner serves every row
    begin = 0, end = j == 0 ? n : 0;
    return;
  }
  const auto& c = cum_[size_t(e)];
  begin = std::llround(c[j] * double(n));
  end = std::llround(c[j + 1] * double(n));
}

std::string ExpertReplicas::describe() const {
  std::string out;
  char b[64];
  for (size_t e = 0; e < holders_.size(); ++e) {
    if (holders_[e].size() < 2) continue;
    out += (out.empty() ? "" : ";") + std::to_string(e) + ":";
    for (size_t j = 0; j < holders_[e].size(); ++j) {
      std::snprintf(b, sizeof b, "%s%d=%.8g", j ? "," : "", holders_[e][j], shares_[e][j]);
      out += b;
    }
  }
  return out;
}

ExpertReplicas ExpertReplicas::parse(const ExpertPlacement& placement, const std::string& text,
                                     int slots) {
  const int64_t E = placement.n_experts();
  std::vector<std::vector<int>> h(static_cast<size_t>(E));
  std::vector<std::vector<double>> s(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) h[size_t(e)] = {placement.owner(e)}, s[size_t(e)] = {1.0};
  std::stringstream in(text);
  std::string entry;
  while (std::getline(in, entry, ';')) {
    auto bad = [&](const std::string& why) {
      ADGT_CHECK(false, "moe replicas: entry \"" << entry << "\" " << why
                                                 << " (expected e:rank=share,rank=share)");
    };
    const auto colon = entry.find(':');
    if (colon == std::string::npos) bad("has no ':'");
    size_t used = 0;
    int64_t e = -1;
    try {
      e = std::stoll(entry.substr(0, colon), &used);
    } catch (const std::exception&) {
      bad("does not start with an expert id");
    }
    if (used != colon || e < 0 || e >= E) bad("names no expert in [0, " + std::to_string(E) + ")");
    h[size_t(e)].clear(), s[size_t(e)].clear();
    std::stringstream hs(entry.substr(colon + 1));
    std::string pair;
    while (std::getline(hs, pair, ',')) {
      const auto eq = pair.find('=');
      if (eq == std::string::npos) bad("has a holder without '=share'");
      try {
        size_t u1 = 0, u2 = 0;
        const int r = std::stoi(pair.substr(0, eq), &u1);
        const double x = std::stod(pair.substr(eq + 1), &u2);
        if (u1 != eq || u2 != pair.size() - eq - 1) bad("has a malformed holder \"" + pair + "\"");
        h[size_t(e)].push_back(r), s[size_t(e)].push_back(x);
      } catch (const std::invalid_argument&) {
        bad("has a malformed holder \"" + pair + "\"");
      } catch (const std::out_of_range&) {
        bad("has a malformed holder \"" + pair + "\"");
      }
    }
  }
  return ExpertReplicas(placement, std::move(h), std::move(s), slots);
}

}  // namespace adgt

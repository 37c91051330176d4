// Packed documents in the attention tests: the (B*T) doc_start of
// AttentionShape from each sequence's document starts (positions in the
// sequence, the first 0): each token's document start.
#pragma once
#include <cstdint>
#include <vector>

namespace adgt::test {

template <class I>
std::vector<int32_t> doc_starts_of(const std::vector<std::vector<I>>& starts, int64_t T) {
  std::vector<int32_t> ds;
  for (const auto& st : starts)
    for (int64_t t = 0; t < T; ++t) {
      int64_t d = 0;
      for (I x : st)
        if (int64_t(x) <= t) d = int64_t(x);
      ds.push_back(int32_t(d));
    }
  return ds;
}

}  // namespace adgt::test

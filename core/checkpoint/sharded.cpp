// Format version 2: what the save (core/checkpoint/save.cpp) and the load
// (core/checkpoint/load.cpp) share through the public API: agreeing on one
// error across the ranks.
#include "core/checkpoint/sharded.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

namespace adgt {

std::string agree_error(Comm& world, const std::string& mine) {
  if (world.size() == 1) return mine;
  constexpr size_t kMax = 16384;
  const size_t len = std::min(mine.size(), kMax);
  int32_t longest[1] = {int32_t(len)};
  world.all_reduce(Tensor(longest, DType::I32, {1}), ReduceOp::Max);
  if (longest[0] == 0) return "";
  // Every rank takes part in the gather, also those that report their own message.
  const int64_t words = 1 + (longest[0] + 3) / 4;
  std::vector<int32_t> buf(size_t(words), 0), all(size_t(words) * size_t(world.size()));
  buf[0] = int32_t(len);
  std::memcpy(buf.data() + 1, mine.data(), len);
  world.all_gather(Tensor(all.data(), DType::I32, {int64_t(all.size())}), Tensor(buf.data(), DType::I32, {words}));
  if (!mine.empty()) return mine;
  for (int r = 0; r < world.size(); ++r) {
    const int32_t* rec = all.data() + size_t(r) * size_t(words);
    if (rec[0] > 0)
      return std::string(reinterpret_cast<const char*>(rec + 1), size_t(rec[0])) + " [reported by rank " +
             std::to_string(r) + "]";
  }
  return "another rank failed";  // not reached
}

}  // namespace adgt

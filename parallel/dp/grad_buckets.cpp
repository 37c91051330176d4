#include "parallel/dp/grad_buckets.hpp"

#include <algorithm>

#include "kernels/check.hpp"

namespace adgt {

namespace {

// Elements of the units of `chunk` (-1: any) inside [b, e).
int64_t covered(const std::vector<GradUnit>& units, int chunk, int64_t b, int64_t e) {
  int64_t n = 0;
  for (const GradUnit& u : units)
    if (chunk < 0 || u.chunk == chunk) n += std::max<int64_t>(0, std::min(e, u.end) - std::max(b, u.begin));
  return n;
}

// [b, e) cut where the table switches between expert and non-expert weights;
// each piece with whether it holds expert weights.
std::vector<std::pair<std::pair<int64_t, int64_t>, bool>> expert_runs(
    const std::vector<ParamSpec>& table, int64_t flat_size, int64_t b, int64_t e) {
  std::vector<std::pair<std::pair<int64_t, int64_t>, bool>> out;
  for (size_t i = 0; i < table.size(); ++i) {
    const int64_t pb = table[i].offset, pe = i + 1 < table.size() ? table[i + 1].offset : flat_size;
    const int64_t lo = std::max(b, pb), hi = std::min(e, pe);
    if (lo >= hi) continue;
    const bool ex = table[i].expert >= 0;
    if (!out.empty() && out.back().second == ex && out.back().first.second == lo)
      out.back().first.second = hi;
    else
      out.push_back({{lo, hi}, ex});
  }
  return out;
}

}  // namespace

std::vector<GradBucket> plan_grad_buckets(const BucketPlanInput& in) {
  std::vector<GradBucket> out;
  if (in.zero) {
    ADGT_CHECK(!in.expert_groups, "gradient buckets: ZeRO-1 with expert parallelism is not supported");
    if (in.reduce_dp)
      out.push_back({0, -1, 0, in.flat_size, covered(in.units, -1, 0, in.flat_size),
                     BucketOp::ReduceScatter, BucketGroup::DataParallel});
    return out;
  }
  // Contiguous units of one chunk, merged from the end of the buffer.
  std::vector<GradBucket> merged;
  bool open = false;
  GradBucket cur;
  auto close = [&] {
    if (open) merged.push_back(cur);
    open = false;
  };
  for (const GradUnit& u : in.units) {
    if (u.end <= u.begin) continue;
    if (open && u.chunk == cur.chunk && u.end == cur.begin) {
      cur.begin = u.begin;
    } else {
      close();
      cur = GradBucket{};
      cur.chunk = u.chunk;
      cur.begin = u.begin;
      cur.end = u.end;
      open = true;
    }
    if (cur.end - cur.begin >= in.bucket_elems) close();
  }
  close();
  for (const GradBucket& m : merged) {
    std::vector<std::pair<std::pair<int64_t, int64_t>, bool>> pieces;
    if (in.expert_groups)
      pieces = expert_runs(in.table, in.flat_size, m.begin, m.end);
    else
      pieces.push_back({{m.begin, m.end}, false});
    for (const auto& [r, expert] : pieces) {
      if (expert ? !in.reduce_edp : !in.reduce_dp) continue;
      GradBucket b = m;
      b.id = int(out.size());
      b.begin = r.first;
      b.end = r.second;
      b.need = covered(in.units, m.chunk, b.begin, b.end);
      b.group = expert ? BucketGroup::ExpertDataParallel : BucketGroup::DataParallel;
      out.push_back(b);
    }
  }
  return out;
}

}  // namespace adgt

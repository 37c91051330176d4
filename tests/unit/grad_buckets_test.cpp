// The data-parallel gradient buckets (parallel/dp/grad_buckets.hpp) and the
// schedule's ReduceGrads placement (pp::with_grad_reductions).
#include <catch2/catch.hpp>

#include <algorithm>
#include <utility>
#include <vector>

#include "core/model/model.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "parallel/dp/grad_buckets.hpp"
#include "parallel/pipeline/generators.hpp"
#include "parallel/pipeline/validate.hpp"

using namespace adgt;
using Catch::Matchers::Contains;

namespace {

ModelConfig small_model(int64_t experts = 0) {
  ModelConfig m;
  m.vocab_size = 64;
  m.d_model = 32;
  m.n_layers = 3;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.ffn_hidden = 48;
  m.seq_len = 8;
  m.n_experts = experts;
  return m;
}

// The ranges a real backward reports to its on_ready hook, in order.
std::vector<std::pair<int64_t, int64_t>> reported(Model& model) {
  std::vector<int32_t> in(16), tg(16);
  for (size_t i = 0; i < in.size(); ++i) in[i] = int32_t(i * 5 % 64), tg[i] = int32_t(i * 3 % 64);
  model.zero_grads();
  model.forward(in.data(), tg.data(), 1.0);
  std::vector<std::pair<int64_t, int64_t>> r;
  model.backward([&](int64_t b, int64_t e) { r.push_back({b, e}); }, true);
  return r;
}

// The rule the reducer replaced (kept here as the independent reference):
// merge ranges that arrive contiguous from the end of the buffer, flush a
// bucket once it holds at least `limit` elements or at a gap.
std::vector<std::pair<int64_t, int64_t>> merge_as_before(
    const std::vector<std::pair<int64_t, int64_t>>& ranges, int64_t limit) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t pb = -1, pe = -1;
  auto flush = [&] {
    if (pb >= 0) out.push_back({pb, pe});
    pb = pe = -1;
  };
  for (auto [b, e] : ranges) {
    if (pb >= 0 && e == pb) {
      pb = b;
    } else {
      flush();
      pb = b;
      pe = e;
    }
    if (pe - pb >= limit) flush();
  }
  flush();
  return out;
}

}  // namespace

TEST_CASE("grad buckets: the units are what the backward reports, and buckets merge them as before",
          "[dp]") {
  CpuBackend be;
  Model model(small_model(), be, DType::F32, 2, 8);
  model.init_weights(3);
  const auto rep = reported(model);
  const std::vector<GradUnit> units = model.grad_units();
  REQUIRE(units.size() == rep.size());
  for (size_t i = 0; i < units.size(); ++i) {
    CHECK(units[i].begin == rep[i].first);
    CHECK(units[i].end == rep[i].second);
  }
  for (int64_t limit : {int64_t(1), int64_t(1024), int64_t(5000), int64_t(1) << 30}) {
    BucketPlanInput in;
    in.units = units;
    in.table = model.table();
    in.flat_size = model.flat_size();
    in.bucket_elems = limit;
    const auto buckets = plan_grad_buckets(in);
    const auto want = merge_as_before(rep, limit);
    REQUIRE(buckets.size() == want.size());
    int64_t covered = 0;
    for (size_t i = 0; i < buckets.size(); ++i) {
      INFO("limit " << limit << " bucket " << i);
      CHECK(buckets[i].id == int(i));
      CHECK(buckets[i].begin == want[i].first);
      CHECK(buckets[i].end == want[i].second);
      CHECK(buckets[i].need == buckets[i].end - buckets[i].begin);
      CHECK(buckets[i].op == BucketOp::AllReduce);
      covered += buckets[i].need;
    }
    int64_t total = 0;
    for (const GradUnit& u : units) total += u.end - u.begin;
    CHECK(covered == total);
  }
}

TEST_CASE("grad buckets: ZeRO-1 is one reduce-scatter of the whole buffer; groups of one are left out",
          "[dp]") {
  CpuBackend be;
  Model model(small_model(), be, DType::F32, 2, 8);
  BucketPlanInput in;
  in.units = model.grad_units();
  in.table = model.table();
  in.flat_size = model.flat_size();
  in.zero = true;
  auto b = plan_grad_buckets(in);
  REQUIRE(b.size() == 1);
  CHECK(b[0].op == BucketOp::ReduceScatter);
  CHECK(b[0].begin == 0);
  CHECK(b[0].end == model.flat_size());
  CHECK(b[0].chunk == -1);
  in.reduce_dp = false;
  CHECK(plan_grad_buckets(in).empty());
  in.zero = false;
  CHECK(plan_grad_buckets(in).empty());
}

TEST_CASE("grad buckets: with expert parallelism expert weights reduce over edp, the rest over dp",
          "[dp]") {
  CpuBackend be;
  Model model(small_model(4), be, DType::F32, 2, 8);
  BucketPlanInput in;
  in.units = model.grad_units();
  in.table = model.table();
  in.flat_size = model.flat_size();
  in.bucket_elems = int64_t(1) << 30;  // one bucket before the cut at expert runs
  in.expert_groups = true;
  const auto b = plan_grad_buckets(in);
  REQUIRE(b.size() > 2);
  int64_t expert_elems = 0, plain_elems = 0;
  for (const ParamSpec& p : model.table())
    (p.expert >= 0 ? expert_elems : plain_elems) += (p.numel + 15) / 16 * 16;
  int64_t e = 0, d = 0;
  for (const GradBucket& x : b) {
    // Every parameter the bucket touches has the bucket's group.
    for (const ParamSpec& p : model.table())
      if (p.offset < x.end && p.offset + p.numel > x.begin)
        CHECK((p.expert >= 0) == (x.group == BucketGroup::ExpertDataParallel));
    (x.group == BucketGroup::ExpertDataParallel ? e : d) += x.need;
  }
  CHECK(e == expert_elems);
  CHECK(d == plain_elems);
  in.reduce_edp = false;  // ep == dp: every expert on one rank of its replicas
  for (const GradBucket& x : plan_grad_buckets(in)) CHECK(x.group == BucketGroup::DataParallel);
}

TEST_CASE("schedule: ReduceGrads right after each chunk's last weight gradient, validated", "[schedule][dp]") {
  for (const std::string name : {"gpipe", "1f1b", "zb-h1", "interleaved"}) {
    const int v = name == "interleaved" ? 2 : 1;
    const pp::Schedule s = pp::with_grad_reductions(pp::make_schedule(name, 4, 8, v));
    INFO(name);
    REQUIRE_NOTHROW(pp::validate(s));
    for (const auto& list : s.ranks) {
      for (int c = 0; c < v; ++c) {
        size_t last_w = 0, at = 0, n = 0;
        for (size_t i = 0; i < list.size(); ++i) {
          if ((list[i].op == pp::Op::Backward || list[i].op == pp::Op::BackwardWeight) && list[i].chunk == c)
            last_w = i;
          if (list[i].op == pp::Op::ReduceGrads && list[i].chunk == c) at = i, ++n;
        }
        CHECK(n == 1);
        CHECK(at == last_w + 1);
      }
    }
    // Idempotent: applying it again changes nothing.
    CHECK(pp::with_grad_reductions(s).ranks == s.ranks);
  }
}

TEST_CASE("schedule: a ReduceGrads before its chunk's last weight gradient or missing on a chunk is refused",
          "[schedule][dp]") {
  pp::Schedule s = pp::with_grad_reductions(pp::make_schedule("1f1b", 2, 2, 1));
  pp::Schedule early = s;
  auto& l = early.ranks[0];
  auto it = std::find_if(l.begin(), l.end(), [](const pp::Instr& x) { return x.op == pp::Op::ReduceGrads; });
  REQUIRE(it != l.end());
  const pp::Instr rg = *it;
  l.erase(it);
  l.insert(l.begin(), rg);
  CHECK_THROWS_WITH(pp::validate(early), Contains("rank 0 #0 ReduceGrads(chunk 0) comes before the weight gradient"));
  pp::Schedule inter = pp::with_grad_reductions(pp::make_schedule("interleaved", 2, 4, 2));
  auto& li = inter.ranks[1];
  li.erase(std::find_if(li.begin(), li.end(), [](const pp::Instr& x) { return x.op == pp::Op::ReduceGrads; }));
  CHECK_THROWS_WITH(pp::validate(inter), Contains("is missing: a schedule that reduces gradients does so once per chunk"));
}

// ZeRO-2/3's shards (parallel/dp/zero_shards.hpp) and the store that holds a
// model's weights and gradients by unit (parallel/dp/zero_store.hpp), in one
// process: the multi-rank numbers are tests/layouts/compare_zero.py's.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "core/model/init_weights.hpp"
#include "core/model/model.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "parallel/dp/zero_shards.hpp"
#include "parallel/dp/zero_store.hpp"

using namespace adgt;
using Catch::Matchers::Contains;

namespace {

ModelConfig zero_model(bool tied = false) {
  ModelConfig m;
  m.vocab_size = 64;
  m.d_model = 32;
  m.n_layers = 3;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.ffn_hidden = 48;
  m.seq_len = 8;
  m.tie_embeddings = tied;
  return m;
}

void batch(std::vector<int32_t>& in, std::vector<int32_t>& tg, int salt) {
  in.resize(16), tg.resize(16);
  for (size_t i = 0; i < in.size(); ++i)
    in[i] = int32_t((i * 5 + salt) % 64), tg[i] = int32_t((i * 3 + 2 * salt) % 64);
}

}  // namespace

TEST_CASE("ZeRO shards: every element of every unit is in exactly one rank's piece", "[dp][zero]") {
  CpuBackend be;
  for (bool tied : {false, true}) {
    Model model(zero_model(tied), be, DType::F32, 2, 8);
    const std::vector<GradUnit> units = model.grad_units();
    for (int P : {1, 3, 4, 7}) {
      std::vector<int> owner(size_t(model.flat_size()), -1);
      std::vector<int64_t> param_elems(model.table().size(), 0);
      for (int r = 0; r < P; ++r) {
        const ZeroShards z = plan_zero_shards(units, model.table(), P, r);
        REQUIRE(z.units.size() == units.size());
        int64_t off = 0;
        for (const ZeroUnit& u : z.units) {
          CHECK(u.offset == off);  // slots back to back, in flat order
          off += u.per_rank;
          CHECK(u.per_rank % 16 == 0);
          CHECK(u.per_rank * P >= u.end - u.begin);
          CHECK(u.hi - u.lo <= u.per_rank);
          for (int64_t k = u.lo; k < u.hi; ++k) {
            CHECK(owner[size_t(k)] == -1);
            owner[size_t(k)] = r;
          }
        }
        CHECK(z.shard_size == off);
        // The re-based table: each piece inside its slot, with the parameter's flags.
        for (const ParamSpec& q : z.table) {
          const auto it = std::find_if(model.table().begin(), model.table().end(),
                                       [&](const ParamSpec& p) { return p.name == q.name; });
          REQUIRE(it != model.table().end());
          CHECK(q.is_matrix == it->is_matrix);
          CHECK(q.shard_dim == it->shard_dim);
          param_elems[size_t(it - model.table().begin())] += q.numel;
        }
      }
      for (const GradUnit& u : units)
        for (int64_t k = u.begin; k < u.end; ++k) CHECK(owner[size_t(k)] >= 0);
      for (size_t i = 0; i < model.table().size(); ++i) CHECK(param_elems[i] == model.table()[i].numel);
    }
  }
}

TEST_CASE("ZeRO shards: unit_of finds the unit of a flat element", "[dp][zero]") {
  CpuBackend be;
  Model model(zero_model(), be, DType::F32, 2, 8);
  const ZeroShards z = plan_zero_shards(model.grad_units(), model.table(), 2, 1);
  for (size_t i = 0; i < z.units.size(); ++i) {
    CHECK(z.unit_of(z.units[i].begin) == int(i));
    CHECK(z.unit_of(z.units[i].end - 1) == int(i));
  }
  CHECK(z.unit_of(-1) == -1);
  CHECK(z.unit_of(model.flat_size() + 5) == -1);
}

TEST_CASE("ZeRO store (one rank): gradients and weights by unit give the flat model's",
          "[dp][zero]") {
  // One rank: the reduce-scatters copy, the gathers copy, so one
  // micro-batch through the store is the flat model's bit for bit, for both
  // levels, with prefetch 0-2, and tied embeddings (the head reads the
  // embedding's unit). Two micro-batches: the store adds each one's
  // gradient into the shard where the flat model's GEMMs accumulate into
  // the gradient (beta 1): the same sums up to rounding.
  for (int A : {1, 2})
  for (bool tied : {false, true})
    for (int level : {2, 3})
      for (int prefetch : {0, 1, 2}) {
        CpuBackend be;
        SelfComm group("dp");
        const ModelConfig m = zero_model(tied);
        Model ref(m, be, DType::F32, 2, 8);
        ref.init_weights(11);
        Model sharded(m, be, DType::F32, 2, 8);
        std::vector<float> init(size_t(sharded.flat_size()));
        draw_init_weights(sharded.table(), m.init_std, 11, init.data(), sharded.flat_size());
        ZeroOptions o;
        o.level = level;
        o.prefetch = prefetch;
        ZeroStore store(sharded, be, group, o, init.data());
        sharded.set_unit_storage(&store);
        store.publish();
        std::vector<int32_t> in, tg;
        ref.zero_grads();
        store.begin_step();
        double lr = 0, ls = 0;
        for (int a = 0; a < A; ++a) {
          batch(in, tg, a);
          lr += ref.forward(in.data(), tg.data(), 0.5);
          ref.backward({}, a + 1 == A);
          ls += sharded.forward(in.data(), tg.data(), 0.5);
          sharded.backward({}, true);
        }
        store.finish_grads();
        CHECK(lr == ls);
        // The shard's gradient is the whole gradient (one rank), slot by slot.
        std::vector<float> g;
        store.shard_to_flat_host(store.grad_shard(), g);
        const std::vector<double> want = ref.grads_to_host_f64();
        double most = 0, diff = 0;
        for (const ZeroUnit& u : store.shards().units)
          for (int64_t k = u.begin; k < u.end; ++k) {
            most = std::max(most, std::abs(want[size_t(k)]));
            diff = std::max(diff, std::abs(double(g[size_t(k)]) - want[size_t(k)]));
          }
        INFO("micro-batches " << A << ", level " << level << ", prefetch " << prefetch << ", tied " << tied);
        CHECK(most > 0);
        if (A == 1)
          CHECK(diff == 0.0);
        else
          CHECK(diff <= 1e-6 * most);
        // Nothing is left gathered or in flight beyond what the step keeps.
        CHECK(store.peak_working_bytes() > 0);
        if (level == 3) {
          CHECK_THROWS_WITH(sharded.params(), Contains("not kept under ZeRO-2/3"));
        }
        CHECK_THROWS_WITH(sharded.grads(), Contains("not kept under ZeRO-2/3"));
      }
}

TEST_CASE("ZeRO store: the gathered working set follows the prefetch depth", "[dp][zero]") {
  // A unit of a 3-layer model gathered ahead per prefetch step: the most
  // held at once grows with the depth and, without resharding after the
  // forward, reaches every unit.
  std::vector<int64_t> peaks;
  for (int prefetch : {0, 1, 3, -1}) {
    CpuBackend be;
    SelfComm group("dp");
    Model model(zero_model(), be, DType::F32, 2, 8);
    ZeroOptions o;
    o.level = 3;
    o.prefetch = prefetch < 0 ? 1 : prefetch;
    o.reshard_after_forward = prefetch >= 0;
    ZeroStore store(model, be, group, o, nullptr);
    model.set_unit_storage(&store);
    std::vector<int32_t> in, tg;
    batch(in, tg, 0);
    store.begin_step();
    model.forward(in.data(), tg.data(), 1.0);
    peaks.push_back(store.peak_working_bytes());
  }
  CHECK(peaks[0] == peaks[1]);  // the forward reads the next unit's norm: two units either way
  CHECK(peaks[2] > peaks[1]);
  CHECK(peaks[3] > peaks[2]);   // every unit kept
}

TEST_CASE("ZeRO shards: with expert parallelism an MoE unit's experts are a segment of their own",
          "[dp][zero]") {
  CpuBackend be;
  ModelConfig m = zero_model();
  m.n_experts = 4;
  m.moe_top_k = 2;
  Model model(m, be, DType::F32, 2, 8);
  const std::vector<GradUnit> units = model.grad_units();
  const int P = 4, E = 2;  // dp ranks, the experts' replicas
  std::vector<int> owner_dense(size_t(model.flat_size()), -1), owner_expert(size_t(model.flat_size()), -1);
  for (int r = 0; r < P; ++r) {
    const ZeroShards z = plan_zero_shards(units, model.table(), P, r, E, r % E);
    int expert_segments = 0;
    for (const ZeroUnit& u : z.units) {
      CHECK(u.ranks == (u.group ? E : P));
      expert_segments += u.group;
      for (const ParamSpec& p : model.table())
        if (p.offset >= u.begin && p.offset < u.end) CHECK((p.expert >= 0) == (u.group == 1));
      if (u.group == 1 && r >= E) continue;  // the other replicas hold the same pieces
      for (int64_t k = u.lo; k < u.hi; ++k) {
        auto& o = u.group ? owner_expert : owner_dense;
        CHECK(o[size_t(k)] == -1);
        o[size_t(k)] = r;
      }
    }
    CHECK(expert_segments == int(m.n_layers));  // every layer is an MoE layer here
    // Each grad unit's segments cover it, dense first.
    for (size_t g = 0; g < units.size(); ++g) {
      int64_t at = units[g].begin;
      for (int su : z.by_grad_unit[g]) {
        CHECK(z.units[size_t(su)].begin == at);
        at = z.units[size_t(su)].end;
      }
      CHECK(at == units[g].end);
    }
  }
  for (const GradUnit& u : units)
    for (int64_t k = u.begin; k < u.end; ++k) CHECK((owner_dense[size_t(k)] >= 0) != (owner_expert[size_t(k)] >= 0));
}

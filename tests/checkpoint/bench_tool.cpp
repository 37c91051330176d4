// adgt_checkpoint_bench: times save_checkpoint_sharded and
// load_checkpoint_sharded on a model state of a given size, without training
// (scripts/bench_checkpoint.sh drives it and compares with dd).
//
//   mpirun -np W adgt_checkpoint_bench save|load --root DIR [--tp T] [--dp D] [--zero]
//          [--layers L] [--d-model C] [--ffn F] [--vocab V]
//
// Values are a pure function of (tensor group, global element index), so a
// load in any layout checks what it read against what the save wrote. With
// --zero each rank holds only its ZeRO-1 chunk of the AdamW state (and writes
// that). Prints, on rank 0:
//   save: <bytes> bytes in <s> s = <GB/s> GB/s ...
//   load: <bytes> bytes in <s> s = <GB/s> GB/s (verified)
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/checkpoint/sharded.hpp"
#include "parallel/comm/mpi_env.hpp"
#include "parallel/mesh/process_groups.hpp"

using namespace adgt;

namespace {

float value(int g, int64_t tensor, int64_t global_index) {
  const uint64_t h = (uint64_t(g) * 0x9E3779B97F4A7C15ull) ^ (uint64_t(tensor) * 0xC2B2AE3D27D4EB4Full) ^
                     (uint64_t(global_index) * 0x165667B19E3779F9ull);
  return float(int64_t(h >> 40) - (int64_t(1) << 23)) * 1e-7f;
}

// Fills the local shard of every tensor (valid part) with value(); padding stays 0.
void fill(const std::vector<ParamSpec>& local, int tp_rank, int tp, int g, std::vector<float>& buf) {
  for (size_t i = 0; i < local.size(); ++i) {
    const ParamSpec& l = local[i];
    const Region r = shard_region(l, tp_rank, tp);
    const int64_t gcols = l.global_shape.size() > 1 ? l.global_shape[1] : 1;
    const int64_t lcols = l.shape.size() > 1 ? l.shape[1] : 1;
    for (int64_t a = 0; a < r.count[0]; ++a)
      for (int64_t b = 0; b < r.count[1]; ++b)
        buf[size_t(l.offset + a * lcols + b)] =
            value(g, int64_t(i), (r.start[0] + a) * gcols + r.start[1] + b);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    MpiEnv mpi(&argc, &argv);
    if (argc < 2) throw std::runtime_error("usage: adgt_checkpoint_bench save|load --root DIR [options]");
    const std::string mode = argv[1];
    std::string root;
    Layout dims;
    bool zero = false;
    ModelConfig m;
    m.vocab_size = 32000;
    m.d_model = 768;
    m.n_layers = 12;
    m.n_heads = 12;
    m.n_kv_heads = 12;
    m.ffn_hidden = 2048;
    for (int i = 2; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
        return argv[++i];
      };
      if (a == "--root") root = next();
      else if (a == "--tp") dims.tp = std::stoi(next());
      else if (a == "--dp") dims.dp = std::stoi(next());
      else if (a == "--zero") zero = true;
      else if (a == "--layers") m.n_layers = std::stoll(next());
      else if (a == "--d-model") m.d_model = std::stoll(next());
      else if (a == "--ffn") m.ffn_hidden = std::stoll(next());
      else if (a == "--vocab") m.vocab_size = std::stoll(next());
      else throw std::runtime_error("unknown option " + a);
    }
    if (root.empty() || (mode != "save" && mode != "load"))
      throw std::runtime_error("usage: adgt_checkpoint_bench save|load --root DIR [options]");
    ProcessGroups pg = make_process_groups(dims);
    ShardLayout lay;
    lay.tp = int(dims.tp);
    lay.tp_rank = pg.tp->rank();
    lay.dp = int(dims.dp);
    lay.dp_rank = pg.dp->rank();
    lay.description = "tp=" + std::to_string(dims.tp) + " dp=" + std::to_string(dims.dp) +
                      " zero=" + std::to_string(zero ? 1 : 0) + " (adgt_checkpoint_bench)";
    const std::vector<ParamSpec> local = build_param_table(m, lay.tp, lay.tp_rank);
    const int64_t n = total_numel(local);
    const int64_t params = param_count(build_param_table(m));
    const double bytes = 3.0 * 4.0 * double(params);  // valid elements of weights + 2 moments
    const bool lead = pg.world->rank() == 0;
    using clock = std::chrono::steady_clock;

    if (mode == "save") {
      CheckpointState st;
      st.step = 1;
      st.config_yaml = "# adgt_checkpoint_bench\n";
      st.specs = local;
      for (int g = 0; g < 3; ++g) {
        auto& buf = g == 0 ? st.params : g == 1 ? st.exp_avg : st.exp_avg_sq;
        buf.assign(size_t(n), 0.0f);
        fill(local, lay.tp_rank, lay.tp, g, buf);
      }
      // Under ZeRO each rank holds the AdamW state of its chunk only (the flat
      // buffer padded to a multiple of dp, as the trainer's is).
      if (zero) {
        const int64_t c = (n + dims.dp - 1) / dims.dp, lo = lay.dp_rank * c;
        for (auto* src : {&st.exp_avg, &st.exp_avg_sq}) {
          src->resize(size_t(c * dims.dp), 0.0f);
          *src = std::vector<float>(src->begin() + lo, src->begin() + lo + c);
        }
        lay.state_lo = lo;
        lay.state_hi = lo + c;
      }
      pg.world->barrier();
      const auto t0 = clock::now();
      const std::string dir = save_checkpoint_sharded(root, st, lay, *pg.world, 1);
      const double s = std::chrono::duration<double>(clock::now() - t0).count();
      if (lead)
        std::printf("save: %.0f bytes in %.3f s = %.3f GB/s (%ld parameters, %d ranks tp %d dp %d%s) -> %s\n",
                    bytes, s, bytes / s / 1e9, long(params), pg.world->size(), lay.tp, lay.dp,
                    zero ? " ZeRO-1" : "", dir.c_str());
    } else {
      pg.world->barrier();
      const auto t0 = clock::now();
      const CheckpointState st =
          load_checkpoint_sharded(root + "/step_1", local, lay, *pg.world);
      pg.world->barrier();
      const double s = std::chrono::duration<double>(clock::now() - t0).count();
      std::vector<float> want(static_cast<size_t>(n));
      int32_t bad[1] = {0};
      for (int g = 0; g < 3; ++g) {
        std::fill(want.begin(), want.end(), 0.0f);
        fill(local, lay.tp_rank, lay.tp, g, want);
        const auto& got = g == 0 ? st.params : g == 1 ? st.exp_avg : st.exp_avg_sq;
        if (got != want) bad[0] = 1;
      }
      pg.world->all_reduce(Tensor(bad, DType::I32, {1}), ReduceOp::Max);
      if (bad[0]) throw CollectiveError("load: the data read differ from what the save wrote");
      if (lead)
        std::printf("load: %.0f bytes in %.3f s = %.3f GB/s (%d ranks tp %d dp %d, verified)\n", bytes, s,
                    bytes / s / 1e9, pg.world->size(), lay.tp, lay.dp);
    }
    return 0;
  } catch (const std::exception& e) {
    fatal(e);
  }
}

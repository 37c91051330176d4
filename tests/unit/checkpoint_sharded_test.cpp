// Format version 2 in one process (a world of one): the round trip, reading
// any checkpoint (version 1 or 2) into tensor-parallel shards, ownership, and
// the errors for missing, truncated, corrupt rank files. Several ranks saving
// and loading together run under mpirun: tests/checkpoint_sharded.cmake.
#include <catch2/catch.hpp>

#include <hdf5.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>

#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/sharded.hpp"
#include "core/checkpoint/hdf5_util.hpp"
#include "core/model/shard_io.hpp"

using namespace adgt;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

fs::path fresh_root(const std::string& name) {
  const fs::path p = fs::path(ADGT_BINARY_DIR) / "test_tmp" / ("checkpoint_sharded_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

ModelConfig model(int64_t vocab = 63) {
  ModelConfig m;
  m.vocab_size = vocab;  // odd: tp=2 pads the vocabulary by one row
  m.d_model = 16;
  m.n_layers = 2;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.ffn_hidden = 40;
  m.seq_len = 8;
  return m;
}

// Whole tensors with distinct values everywhere (padding garbage that must not travel).
CheckpointState whole_state(const std::vector<ParamSpec>& specs, int64_t step) {
  CheckpointState st;
  st.step = step;
  st.samples_seen = step * 16;
  st.seed = 77;
  st.config_yaml = "model: {}\n";
  st.rng_state = {uint64_t(step)};
  st.specs = specs;
  const auto n = size_t(total_numel(specs));
  std::mt19937 rng(static_cast<uint32_t>(step));
  std::normal_distribution<float> nd;
  for (auto* v : {&st.params, &st.exp_avg, &st.exp_avg_sq}) {
    v->assign(n, 1234.5f);
    for (const ParamSpec& p : specs)
      for (int64_t i = 0; i < p.numel; ++i) (*v)[size_t(p.offset + i)] = nd(rng);
  }
  return st;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

uint64_t dataset_offset(const fs::path& file, const std::string& path) {
  h5::QuietErrors quiet;
  h5::Id f(ADGT_H5(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)), H5Fclose);
  h5::Id d(ADGT_H5(H5Dopen2(f, path.c_str(), H5P_DEFAULT)), H5Dclose);
  const haddr_t off = H5Dget_offset(d);
  REQUIRE(off != HADDR_UNDEF);
  return off;
}

void flip_bit(const fs::path& file, uint64_t at) {
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(std::streamoff(at));
  char c = 0;
  io.read(&c, 1);
  c ^= 0x04;
  io.seekp(std::streamoff(at));
  io.write(&c, 1);
}

bool is_virtual(const fs::path& file, const std::string& path) {
  h5::Id f(ADGT_H5(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)), H5Fclose);
  h5::Id d(ADGT_H5(H5Dopen2(f, path.c_str(), H5P_DEFAULT)), H5Dclose);
  h5::Id dcpl(ADGT_H5(H5Dget_create_plist(d)), H5Pclose);
  return H5Pget_layout(dcpl) == H5D_VIRTUAL;
}

ShardLayout tp_layout(int tp, int rank) {
  ShardLayout l;
  l.tp = tp;
  l.tp_rank = rank;
  return l;
}

void require_bits(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  REQUIRE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Every tp rank's shards read from `dir` equal the whole state cut by shard_io.
void require_shards_match(const std::string& dir, const CheckpointState& whole, int tp) {
  SelfComm world("world");
  const ModelConfig m = model();
  for (int r = 0; r < tp; ++r) {
    INFO("tp " << tp << " rank " << r);
    const auto local = build_param_table(m, tp, r);
    const CheckpointState st = load_checkpoint_sharded(dir, local, tp_layout(tp, r), world);
    REQUIRE(st.step == whole.step);
    const int64_t n = total_numel(local);
    require_bits(st.params, global_to_local(local, whole.specs, whole.params, n));
    require_bits(st.exp_avg, global_to_local(local, whole.specs, whole.exp_avg, n));
    require_bits(st.exp_avg_sq, global_to_local(local, whole.specs, whole.exp_avg_sq, n));
  }
}

}  // namespace

TEST_CASE("checkpoint v2 shard regions and piece writers", "[checkpoint]") {
  const auto t0 = build_param_table(model(), 2, 0), t1 = build_param_table(model(), 2, 1);
  // embed_tokens (63 rows, 32 per rank): rank 1 holds 31 valid rows.
  REQUIRE(shard_region(t0[0], 0, 2).count[0] == 32);
  REQUIRE(shard_region(t1[0], 1, 2).start[0] == 32);
  REQUIRE(shard_region(t1[0], 1, 2).count[0] == 31);
  REQUIRE(shard_region(t1[0], 1, 2) == shard_region(t0[0], 1, 2));  // any rank's spec gives every region
  const Region o = shard_region(t0[5], 1, 2);                       // o_proj: columns 8..16
  REQUIRE(o.start[1] == 8);
  REQUIRE(o.count[0] == 16);
  REQUIRE(shard_region(t0[1], 1, 2).numel() == 16);  // replicated norm: the whole tensor
  REQUIRE(Region(shard_region(t0[1], 0, 1)).contains(shard_region(t0[1], 1, 2)));

  for (int dp : {1, 2, 3, 4}) {
    const std::vector<int> w = piece_writers(t0, dp);
    REQUIRE(w == piece_writers(t1, dp));  // the same on every tp rank
    std::vector<int64_t> load(size_t(dp), 0);
    int64_t biggest = 0;
    for (size_t i = 0; i < t0.size(); ++i) {
      REQUIRE((w[i] >= 0 && w[i] < dp));
      load[size_t(w[i])] += t0[i].numel;
      biggest = std::max(biggest, t0[i].numel);
    }
    const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
    REQUIRE(*hi - *lo <= biggest);
    // Exactly one rank of the (tp, dp) grid writes each piece.
    for (size_t i = 0; i < t0.size(); ++i) {
      int writers = 0;
      for (int t = 0; t < 2; ++t)
        for (int d = 0; d < dp; ++d) {
          ShardLayout l{2, t, dp, d, ""};
          writers += writes_piece(t == 0 ? t0 : t1, w, i, l) ? 1 : 0;
        }
      REQUIRE(writers == (t0[i].shard_dim < 0 ? 1 : 2));
    }
  }
}

TEST_CASE("checkpoint v2 piece writers with expert parallelism", "[checkpoint]") {
  ModelConfig m = model();
  m.n_experts = 4;
  m.expert_ffn_hidden = 24;
  const std::vector<std::vector<int64_t>> placement = {{0, 2}, {1, 3}};  // ep=2, interleaved
  for (int dp : {2, 4, 6}) {
    const int ep = 2;
    INFO("dp " << dp);
    std::vector<std::vector<ParamSpec>> tables;  // [ep rank * 2 + tp rank]
    for (int e = 0; e < ep; ++e)
      for (int t = 0; t < 2; ++t) tables.push_back(build_param_table(m, 2, t, nullptr, &placement[size_t(e)]));
    std::vector<int64_t> load(size_t(dp), 0);
    int64_t biggest = 0;
    std::map<std::string, int> writers;  // name -> writing (tp, dp) ranks
    for (int e = 0; e < ep; ++e) {
      const auto& t0 = tables[size_t(2 * e)];
      const std::vector<int> w = piece_writers(t0, dp, ep, e);
      REQUIRE(w == piece_writers(tables[size_t(2 * e + 1)], dp, ep, e));  // the same on every tp rank
      for (size_t i = 0; i < t0.size(); ++i) {
        if (t0[i].expert >= 0) {
          REQUIRE(w[i] % ep == e);  // an expert is written by a dp rank of its own ep rank
        } else {                    // the same writer on every ep rank
          const auto& other = tables[size_t(2 * (1 - e))];
          const std::vector<int> wo = piece_writers(other, dp, ep, 1 - e);
          REQUIRE(wo[i] == w[i]);
        }
        if (t0[i].expert >= 0 || e == 0) load[size_t(w[i])] += t0[i].numel;
        biggest = std::max(biggest, t0[i].numel);
        for (int t = 0; t < 2; ++t)
          for (int d = e; d < dp; d += ep) {  // the ranks of ep rank e hold this table
            ShardLayout l{2, t, dp, d, ""};
            l.ep = ep;
            l.ep_rank = e;
            if (writes_piece(tables[size_t(2 * e + t)], w, i, l)) ++writers[t0[i].name];
          }
      }
    }
    const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
    REQUIRE(*hi - *lo <= 2 * biggest);
    // Exactly one writer per piece: every tensor of the model, tp shards twice.
    for (const ParamSpec& p : build_param_table(m, 2, 0)) {
      INFO(p.name);
      REQUIRE(writers[p.name] == (p.shard_dim < 0 ? 1 : 2));
    }
    REQUIRE(writers.size() == build_param_table(m).size());
  }
  REQUIRE_THAT(error_of([&] { piece_writers(build_param_table(m), 3, 2, 0); }), Contains("does not divide dp 3"));
}

TEST_CASE("checkpoint v2 round trip in one process is bitwise", "[checkpoint]") {
  const fs::path root = fresh_root("roundtrip");
  const auto specs = build_param_table(model());
  const CheckpointState st = whole_state(specs, 12);
  SelfComm world("world");
  ShardLayout lay;
  lay.description = "tp=1 dp=1 zero=0 sequence_parallel=0";
  const std::string dir = save_checkpoint_sharded(root.string(), st, lay, world, 2);
  REQUIRE(dir == (root / "step_12").string());
  for (const char* f : {"checkpoint.h5", "rank_0.h5", "COMPLETE"}) REQUIRE(fs::is_regular_file(fs::path(dir) / f));
  REQUIRE(std::distance(fs::directory_iterator(root), fs::directory_iterator()) == 1);  // no temporaries
  REQUIRE(is_virtual(fs::path(dir) / "checkpoint.h5", "model/model.layers.1.mlp.up_proj.weight"));
  REQUIRE(is_virtual(fs::path(dir) / "checkpoint.h5", "optim/exp_avg_sq/lm_head.weight"));
  std::ifstream marker(fs::path(dir) / "COMPLETE");
  const std::string text((std::istreambuf_iterator<char>(marker)), std::istreambuf_iterator<char>());
  REQUIRE_THAT(text, Contains("format_version=2"));
  REQUIRE_THAT(text, Contains("bytes.rank_0.h5=" + std::to_string(fs::file_size(fs::path(dir) / "rank_0.h5"))));

  const CheckpointState ld = load_checkpoint(dir, specs);
  REQUIRE(ld.step == 12);
  REQUIRE(ld.samples_seen == st.samples_seen);
  REQUIRE(ld.rng_state == st.rng_state);
  REQUIRE(ld.config_yaml == st.config_yaml);
  for (const ParamSpec& p : specs) {
    INFO(p.name);
    REQUIRE(std::memcmp(ld.params.data() + p.offset, st.params.data() + p.offset, size_t(p.numel) * 4) == 0);
    REQUIRE(std::memcmp(ld.exp_avg_sq.data() + p.offset, st.exp_avg_sq.data() + p.offset, size_t(p.numel) * 4) == 0);
  }
  // Into tensor-parallel shards (vocabulary padding rows come back zero).
  require_shards_match(dir, st, 2);
  require_shards_match(dir, st, 4);

  SECTION("keep prunes as in version 1") {
    save_checkpoint_sharded(root.string(), whole_state(specs, 13), lay, world, 2);
    save_checkpoint_sharded(root.string(), whole_state(specs, 14), lay, world, 2);
    const auto all = list_checkpoints(root.string());
    REQUIRE(all.size() == 2);
    REQUIRE(all.back().first == 14);
  }
}

TEST_CASE("checkpoint v1 files load into tensor-parallel shards", "[checkpoint]") {
  const fs::path root = fresh_root("v1_to_tp");
  const auto specs = build_param_table(model());
  const CheckpointState st = whole_state(specs, 5);
  const std::string dir = save_checkpoint(root.string(), st, 0);
  require_shards_match(dir, st, 2);
}

TEST_CASE("checkpoint v2 damaged rank files name the file and tensor", "[checkpoint]") {
  const fs::path root = fresh_root("damaged");
  const auto specs = build_param_table(model());
  SelfComm world("world");
  const std::string dir = save_checkpoint_sharded(root.string(), whole_state(specs, 3), ShardLayout{}, world, 0);
  const fs::path rank0 = fs::path(dir) / "rank_0.h5";
  const std::string index = "checkpoint " + dir + "/checkpoint.h5: ";

  SECTION("missing") {
    fs::remove(rank0);
    const std::string msg = error_of([&] { load_checkpoint(dir, specs); });
    REQUIRE_THAT(msg, Contains(index + "rank file " + rank0.string() + " is missing; it holds tensor "
                                       "model/model.embed_tokens.weight [0:63, 0:16]"));
  }
  SECTION("truncated") {
    fs::resize_file(rank0, fs::file_size(rank0) - 100);
    const std::string msg = error_of([&] { load_checkpoint(dir, specs); });
    REQUIRE_THAT(msg, Contains(index + "rank file " + rank0.string() + " is "));
    REQUIRE_THAT(msg, Contains("truncated"));
  }
  SECTION("bit flip, verified from the data read") {
    flip_bit(rank0, dataset_offset(rank0, "optim/exp_avg/model.layers.1.mlp.up_proj.weight") + 101);
    const std::string msg = error_of([&] { load_checkpoint(dir, specs); });
    REQUIRE_THAT(msg, Contains(index + "tensor optim/exp_avg/model.layers.1.mlp.up_proj.weight fails its "
                                       "checksum: piece [0:40, 0:16] in " + rank0.string()));
  }
  SECTION("bit flip, verified by the rank that reads the piece from its file") {
    // tp=2 shards are halves of the whole-tensor pieces: one of the two ranks
    // (chosen round robin) reads the piece itself.
    flip_bit(rank0, dataset_offset(rank0, "model/model.layers.0.self_attn.o_proj.weight") + 7);
    int failed = 0;
    for (int r = 0; r < 2; ++r) {
      const std::string msg = error_of([&] {
        load_checkpoint_sharded(dir, build_param_table(model(), 2, r), tp_layout(2, r), world);
      });
      if (msg == "(no exception)") continue;
      ++failed;
      REQUIRE_THAT(msg, Contains("tensor model/model.layers.0.self_attn.o_proj.weight fails its checksum: piece "
                                 "[0:16, 0:16] in " + rank0.string()));
    }
    REQUIRE(failed == 1);
  }
  SECTION("incompatible model") {
    ModelConfig m = model();
    m.ffn_hidden = 48;
    const std::string msg = error_of([&] { load_checkpoint(dir, build_param_table(m)); });
    REQUIRE_THAT(msg, Contains(index + "tensor model/model.layers.0.mlp.gate_proj.weight has shape (40,16), the "
                                       "model expects (48,16)"));
  }
  SECTION("not complete") {
    fs::remove(fs::path(dir) / "COMPLETE");
    REQUIRE_THAT(error_of([&] { load_checkpoint(dir, specs); }), Contains("no COMPLETE marker"));
  }
}

TEST_CASE("checkpoint v2 ZeRO chunk pieces round trip", "[checkpoint]") {
  // A group of one whose "chunk" is the whole buffer: the state is written as
  // flat (1-D) pieces mapped into the tensors by the index.
  const fs::path root = fresh_root("zero");
  const auto specs = build_param_table(model());
  const CheckpointState whole = whole_state(specs, 8);
  CheckpointState st = whole;
  ShardLayout lay;
  lay.state_lo = 0;
  lay.state_hi = total_numel(specs);
  SelfComm world("world");
  const std::string dir = save_checkpoint_sharded(root.string(), st, lay, world, 0);
  {
    h5::Id f(ADGT_H5(H5Fopen((fs::path(dir) / "rank_0.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)), H5Fclose);
    h5::Id d(ADGT_H5(H5Dopen2(f, "optim/exp_avg/model.layers.0.mlp.up_proj.weight", H5P_DEFAULT)), H5Dclose);
    h5::Id s(ADGT_H5(H5Dget_space(d)), H5Sclose);
    REQUIRE(H5Sget_simple_extent_ndims(s) == 1);
  }
  require_shards_match(dir, whole, 1);
  require_shards_match(dir, whole, 2);

  st.exp_avg.pop_back();
  REQUIRE_THAT(error_of([&] { save_checkpoint_sharded(root.string(), st, lay, world, 0); }),
               Contains("exp_avg has " + std::to_string(st.exp_avg.size()) + " floats, the ZeRO chunk has"));
}

namespace {

// build_param_table filtered by name, offsets recomputed (16-element aligned):
// what a pipeline stage holds.
std::vector<ParamSpec> stage_of(const std::vector<ParamSpec>& all,
                                const std::function<bool(const std::string&)>& keep) {
  std::vector<ParamSpec> t;
  int64_t off = 0;
  for (ParamSpec p : all) {
    if (!keep(p.name)) continue;
    p.offset = off;
    off += (p.numel + 15) / 16 * 16;
    t.push_back(p);
  }
  return t;
}

// What tp rank t's stage table `local` must hold: its tensors cut from the whole state.
std::vector<float> stage_values(const std::vector<ParamSpec>& local, int tp, int t, const CheckpointState& whole,
                                const std::vector<float>& gflat) {
  const auto full = build_param_table(model(), tp, t);
  const std::vector<float> all = global_to_local(full, whole.specs, gflat, total_numel(full));
  std::vector<float> out(size_t(total_numel(local)), 0.0f);
  for (const ParamSpec& p : local)
    for (const ParamSpec& q : full)
      if (q.name == p.name) std::copy_n(all.begin() + q.offset, p.numel, out.begin() + p.offset);
  return out;
}

// Stage 0 of two: the embedding and layer 0; stage 1: layer 1, model.norm, lm_head.
bool on_stage(const std::string& name, int stage) {
  const bool first = name == "model.embed_tokens.weight" || name.rfind("model.layers.0.", 0) == 0;
  return first == (stage == 0);
}

}  // namespace

TEST_CASE("checkpoint v2 pipeline stages load subsets of the tensors", "[checkpoint]") {
  // A world of one stands in for each rank of a pp=2 x tp=2 layout in turn.
  const fs::path root = fresh_root("pp_subsets");
  const auto specs = build_param_table(model());
  const CheckpointState whole = whole_state(specs, 4);
  SelfComm world("world");
  const std::string dir = save_checkpoint_sharded(root.string(), whole, ShardLayout{}, world, 0);
  for (int stage = 0; stage < 2; ++stage)
    for (int t = 0; t < 2; ++t) {
      INFO("pp rank " << stage << " tp rank " << t);
      const auto local =
          stage_of(build_param_table(model(), 2, t), [&](const std::string& n) { return on_stage(n, stage); });
      ShardLayout lay = tp_layout(2, t);
      lay.pp = 2;
      lay.pp_rank = stage;
      const CheckpointState st = load_checkpoint_sharded(dir, local, lay, world);
      const int64_t n = total_numel(local);
      REQUIRE(st.params.size() == size_t(n));
      require_bits(st.params, stage_values(local, 2, t, whole, whole.params));
      require_bits(st.exp_avg, stage_values(local, 2, t, whole, whole.exp_avg));
      require_bits(st.exp_avg_sq, stage_values(local, 2, t, whole, whole.exp_avg_sq));
    }

  SECTION("a tensor of the table that the checkpoint lacks is named") {
    ModelConfig m3 = model();
    m3.n_layers = 3;
    const auto local = stage_of(build_param_table(m3), [](const std::string& n) { return !on_stage(n, 0); });
    ShardLayout lay;
    lay.pp = 2;
    lay.pp_rank = 1;
    REQUIRE_THAT(error_of([&] { load_checkpoint_sharded(dir, local, lay, world); }),
                 Contains("checkpoint " + dir + "/checkpoint.h5: tensor model/model.layers.2.input_layernorm.weight "
                          "is missing (the model expects shape (16))"));
  }
  SECTION("with pp=1 a subset leaves tensors that no rank loads") {
    const auto local = stage_of(specs, [](const std::string& n) { return on_stage(n, 1); });
    REQUIRE_THAT(error_of([&] { load_checkpoint_sharded(dir, local, ShardLayout{}, world); }),
                 Contains("tensor model/model.embed_tokens.weight is in the checkpoint but not in the model"));
  }
}

TEST_CASE("checkpoint v2 pipeline layout checks and partial indexes", "[checkpoint]") {
  const fs::path root = fresh_root("pp_layout");
  const auto specs = build_param_table(model());
  SelfComm world("world");
  ShardLayout lay;
  lay.pp = 2;
  REQUIRE_THAT(error_of([&] { save_checkpoint_sharded(root.string(), whole_state(specs, 1), lay, world, 0); }),
               Contains("layout tp 1 x dp 1 x pp 2 (this rank tp 0, dp 0, pp 0) does not match the 1 ranks saving"));
  lay.pp = 1;
  lay.pp_rank = 1;
  REQUIRE_THAT(error_of([&] { load_checkpoint_sharded(root.string(), specs, lay, world); }),
               Contains("layout tp 1 x dp 1 x pp 1 (this rank tp 0, dp 0, pp 1) does not match the 1 ranks loading"));

  // Layers missing between the first and the last held: not the whole model.
  const auto stage1 = stage_of(specs, [](const std::string& n) { return on_stage(n, 1); });
  const CheckpointState st1 = whole_state(stage1, 2);
  REQUIRE_THAT(error_of([&] { save_checkpoint_sharded(root.string(), st1, ShardLayout{}, world, 0); }),
               Contains("no pipeline stage holds model.layers.0.* (the stages hold layers up to 1)"));

  // Stage 0 saved alone: the index lists exactly the tensors written.
  const auto stage0 = stage_of(specs, [](const std::string& n) { return on_stage(n, 0); });
  const CheckpointState st = whole_state(stage0, 2);
  const std::string dir = save_checkpoint_sharded(root.string(), st, ShardLayout{}, world, 0);
  {
    h5::Id f(ADGT_H5(H5Fopen((fs::path(dir) / "checkpoint.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)), H5Fclose);
    h5::Id g(ADGT_H5(H5Gopen2(f, "model", H5P_DEFAULT)), H5Gclose);
    H5G_info_t info;
    ADGT_H5(H5Gget_info(g, &info));
    REQUIRE(info.nlinks == stage0.size());
    h5::Id d(ADGT_H5(H5Dopen2(f, "meta/layout_dims", H5P_DEFAULT)), H5Dclose);
    int64_t dims[4] = {0, 0, 0, 0};  // tp, dp, pp, ep
    ADGT_H5(H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, dims));
    REQUIRE((dims[0] == 1 && dims[1] == 1 && dims[2] == 1 && dims[3] == 1));
  }
  const CheckpointState back = load_checkpoint(dir, stage0);
  for (const ParamSpec& p : stage0) {
    INFO(p.name);
    REQUIRE(std::memcmp(back.params.data() + p.offset, st.params.data() + p.offset, size_t(p.numel) * 4) == 0);
  }
  REQUIRE_THAT(error_of([&] { load_checkpoint(dir, specs); }),
               Contains("tensor model/model.layers.1.input_layernorm.weight is missing"));
}

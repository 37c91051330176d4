// Per-rank (format version 2) checkpoints of a mixture-of-experts model with
// expert parallelism, under mpirun with 4 ranks:
//
//   mpirun -np 4 adgt_ckpt_expert_test --dir DIR
//
// Every value of every tensor is a function of (group, global name, global
// index), as in tests/tools/ckpt_pipeline_test.cpp, so the shard any rank of
// any layout must hold is known exactly. Expert parallelism: ep divides dp,
// dp rank d is ep rank d % ep and holds only its ep rank's experts (contiguous
// blocks, or a placement table), so ranks of one stage hold different tables.
//
// Saves with dp=4 ep=2 (two replicas of each expert: one writes), dp=4 ep=4,
// tp=2 x dp=2 ep=2, pp=2 x dp=2 ep=2, dp=4 ep=2 with a non-contiguous
// placement, tp=2 x dp=2 without ep, and a model with mixed dense / MoE
// layers (moe_every 2) at pp=2 x dp=2 ep=2; loads each (and a version 1 file of whole tensors) into eight
// layouts (ep=1 with tp 1, 2, 4; ep=2 and ep=4 with either placement; pp=2)
// bit for bit; reads every whole tensor from checkpoint.h5 (HF order, every
// expert, meta/layout_dims); flips a byte in pieces in turn and checks that
// every rank fails naming it (each piece verified by a rank holding the
// expert); and checks the errors: an expert on two ep ranks, a missing expert,
// replicas of an ep rank with different experts, ep not passed (save and
// load), ZeRO-1 chunks with ep > 1, an ep that does not divide dp.
//
// The checkpoints stay under DIR/<name>/step_1 for tests/checkpoint/vds_check.py
// (h5py, against DIR/reference/step_1 or DIR/reference_mixed/step_1; see
// tests/checkpoint_expert.cmake). Prints "ckpt-expert: ok (...)" on rank 0.
#include <hdf5.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/sharded.hpp"
#include "core/checkpoint/hdf5_util.hpp"
#include "parallel/comm/mpi_comm.hpp"
#include "parallel/comm/mpi_env.hpp"
#include "tests/parallel/check.hpp"

using namespace adgt;
namespace fs = std::filesystem;

namespace {

constexpr const char* kGroups[3] = {"model", "optim/exp_avg", "optim/exp_avg_sq"};

// Every layer a MoE layer (moe_every 1), or (mixed) every second one of four.
ModelConfig model(bool mixed = false) {
  ModelConfig m;
  m.vocab_size = 256;
  m.d_model = 32;
  m.n_layers = mixed ? 4 : 2;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.ffn_hidden = 64;
  m.seq_len = 16;
  m.n_experts = 4;
  m.moe_top_k = 2;
  m.moe_every = mixed ? 2 : 1;
  m.expert_ffn_hidden = mixed ? 0 : 48;  // mixed: the experts are ffn_hidden wide
  return m;
}

// Element `idx` (C order in the global tensor) of tensor `name` in group g: an
// integer in [-2^19, 2^19), exact in fp32.
float value(int g, const std::string& name, int64_t idx) {
  uint32_t h = 2166136261u;
  for (char c : name) h = (h ^ uint8_t(c)) * 16777619u;
  uint32_t x = h ^ (uint32_t(g + 1) * 0x9E3779B1u);
  x += uint32_t(idx) * 2654435761u;
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  x ^= x >> 12;
  return float(int32_t(x >> 12) - (1 << 19));
}

// A layout of the 4 ranks: mesh order tp fastest, then dp, then pp; dp rank d
// is ep rank d % ep. `placement`: owner ep rank per expert (empty: contiguous).
struct Layout {
  std::string name;
  int tp = 1, dp = 1, pp = 1, ep = 1;
  std::vector<int> placement;
  bool mixed = false;  // the moe_every 2 model
};

ShardLayout shard_layout(const Layout& L, int rank) {
  ShardLayout s;
  s.tp = L.tp;
  s.dp = L.dp;
  s.pp = L.pp;
  s.ep = L.ep;
  // The rank order of core/layout.hpp, written out: these tests also hand the
  // save deliberately wrong layouts whose ranks coords_of() would refuse.
  s.tp_rank = rank % L.tp;
  s.dp_rank = rank / L.tp % L.dp;
  s.pp_rank = rank / (L.tp * L.dp);
  s.ep_rank = s.dp_rank % L.ep;
  s.description = "tp=" + std::to_string(L.tp) + " dp=" + std::to_string(L.dp) + " pp=" + std::to_string(L.pp) +
                  " ep=" + std::to_string(L.ep) + " zero=0";
  return s;
}

// Global ids of ep rank e's experts, ascending.
std::vector<int64_t> experts_of(const ModelConfig& m, const Layout& L, int e) {
  std::vector<int64_t> out;
  for (int64_t x = 0; x < m.n_experts; ++x) {
    const int owner = L.placement.empty() ? int(x / (m.n_experts / L.ep)) : L.placement[size_t(x)];
    if (owner == e) out.push_back(x);
  }
  return out;
}

using Filter = std::function<bool(const std::string&)>;

int64_t layer_of(const std::string& name) {
  const std::string pre = "model.layers.";
  if (name.rfind(pre, 0) != 0) return -1;
  return std::stoll(name.substr(pre.size()));
}

// build_param_table with these experts, filtered by name, offsets recomputed.
std::vector<ParamSpec> filtered_table(const ModelConfig& m, int tp, int tp_rank, const std::vector<int64_t>& experts,
                                      const Filter& keep) {
  std::vector<ParamSpec> t;
  int64_t off = 0;
  for (ParamSpec p : build_param_table(m, tp, tp_rank, nullptr, &experts)) {
    if (!keep(p.name)) continue;
    p.offset = off;
    off += (p.numel + 15) / 16 * 16;
    t.push_back(p);
  }
  return t;
}

// What pipeline rank `pp_rank` of L holds (contiguous layers).
Filter stage_filter(const ModelConfig& m, const Layout& L, int pp_rank) {
  const int64_t per = m.n_layers / L.pp;
  return [=](const std::string& name) {
    const int64_t l = layer_of(name);
    if (l >= 0) return l / per == pp_rank;
    if (name == "model.embed_tokens.weight") return pp_rank == 0;
    return pp_rank == L.pp - 1;
  };
}

std::vector<ParamSpec> rank_table(const ModelConfig& m, const Layout& L, int rank) {
  const ShardLayout s = shard_layout(L, rank);
  return filtered_table(m, s.tp, s.tp_rank, experts_of(m, L, s.ep_rank), stage_filter(m, L, s.pp_rank));
}

// The local flat buffer of group g: predicted values where the shard is valid, `pad` elsewhere.
std::vector<float> local_values(const std::vector<ParamSpec>& local, int tp, int tp_rank, int g, float pad) {
  std::vector<float> buf(size_t(total_numel(local)), pad);
  for (const ParamSpec& l : local) {
    const Region r = shard_region(l, tp_rank, tp);
    const int64_t lcols = l.shape.size() > 1 ? l.shape[1] : 1;
    const int64_t gcols = l.global_shape.size() > 1 ? l.global_shape[1] : 1;
    for (int64_t i = 0; i < (l.shape.empty() ? 1 : l.shape[0]); ++i)
      for (int64_t j = 0; j < lcols; ++j) {
        const bool valid = i < r.count[0] && j < r.count[1];
        buf[size_t(l.offset + i * lcols + j)] =
            valid ? value(g, l.name, (r.start[0] + i) * gcols + (r.start[1] + j)) : pad;
      }
  }
  return buf;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

struct Ctx {
  Comm* world;
  int rank = 0, size = 1;
  fs::path dir;
};

CheckpointState state_of(const std::vector<ParamSpec>& specs, const ShardLayout& s, int64_t step) {
  CheckpointState st;
  st.step = step;
  st.samples_seen = 1000 + step;
  st.seed = 99;
  st.config_yaml = "model: {n_experts: 4}\n";
  st.rng_state = {uint64_t(step), 7};
  st.specs = specs;
  // Padding holds garbage that must not travel.
  st.params = local_values(specs, s.tp, s.tp_rank, 0, 4242.0f);
  st.exp_avg = local_values(specs, s.tp, s.tp_rank, 1, 4343.0f);
  st.exp_avg_sq = local_values(specs, s.tp, s.tp_rank, 2, 4444.0f);
  return st;
}

// Saves step `step` with layout L (each rank's table from `table_of`, default
// its stage's tensors with its ep rank's experts; `edit` may change the ShardLayout).
std::string save_as(Ctx& c, const Layout& L, const fs::path& root, int64_t step,
                    const std::function<std::vector<ParamSpec>(int)>& table_of = nullptr,
                    const std::function<void(ShardLayout&, CheckpointState&)>& edit = nullptr) {
  ShardLayout s = shard_layout(L, c.rank);
  const ModelConfig m = model(L.mixed);
  CheckpointState st = state_of(table_of ? table_of(c.rank) : rank_table(m, L, c.rank), s, step);
  if (edit) edit(s, st);
  return save_checkpoint_sharded(root.string(), st, s, *c.world, 0);
}

// Loads `dir` into layout L and compares every buffer bit for bit with the prediction.
void load_and_compare(Ctx& c, const std::string& dir, const Layout& L, const std::string& what) {
  const ShardLayout s = shard_layout(L, c.rank);
  const std::vector<ParamSpec> local = rank_table(model(L.mixed), L, c.rank);
  CheckpointState st;
  const std::string err = error_of([&] { st = load_checkpoint_sharded(dir, local, s, *c.world); });
  PCHECK(err == "(no exception)", what << ": " << err);
  if (err != "(no exception)") return;
  PCHECK(st.step == 1 && st.samples_seen == 1001 && st.seed == 99, what << ": meta step " << st.step);
  const std::vector<float>* got[3] = {&st.params, &st.exp_avg, &st.exp_avg_sq};
  for (int g = 0; g < 3; ++g) {
    const std::vector<float> want = local_values(local, s.tp, s.tp_rank, g, 0.0f);
    PCHECK(got[g]->size() == want.size(), what << ": " << kGroups[g] << " has " << got[g]->size() << " floats");
    if (got[g]->size() != want.size()) continue;
    if (std::memcmp(got[g]->data(), want.data(), want.size() * 4) == 0) continue;
    for (const ParamSpec& l : local)
      for (int64_t k = 0; k < l.numel; ++k)
        if (std::memcmp(&(*got[g])[size_t(l.offset + k)], &want[size_t(l.offset + k)], 4) != 0) {
          PCHECK(false, what << ": " << kGroups[g] << "/" << l.name << " local element " << k << " is "
                             << (*got[g])[size_t(l.offset + k)] << ", want " << want[size_t(l.offset + k)]);
          goto next_group;
        }
    PCHECK(false, what << ": " << kGroups[g] << ": the padding between tensors is not zero");
  next_group:;
  }
}

herr_t collect(hid_t, const char* name, const H5L_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

// Rank 0: every tensor of checkpoint.h5 read whole equals the prediction; the
// groups list the whole model (every expert) in HF order.
void check_whole_tensors(Ctx& c, const std::string& dir, const ModelConfig& m, const std::string& what,
                         const std::vector<int64_t>& dims) {
  if (c.rank != 0) return;
  const std::vector<ParamSpec> whole = build_param_table(m);
  std::vector<std::string> order;
  for (const ParamSpec& p : whole) order.push_back(p.name);
  h5::QuietErrors quiet;
  h5::Id f(ADGT_H5(H5Fopen((fs::path(dir) / "checkpoint.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)), H5Fclose);
  for (int g = 0; g < 3; ++g) {
    h5::Id grp(ADGT_H5(H5Gopen2(f, kGroups[g], H5P_DEFAULT)), H5Gclose);
    std::vector<std::string> names;
    hsize_t idx = 0;
    ADGT_H5(H5Literate(grp, H5_INDEX_CRT_ORDER, H5_ITER_INC, &idx, collect, &names));
    PCHECK(names == order, what << ": " << kGroups[g] << " lists " << names.size() << " tensors, not the "
                                << order.size() << " of the model in HF order (first difference at "
                                << (std::mismatch(names.begin(), names.end(), order.begin(), order.end()).first -
                                    names.begin())
                                << ")");
    for (const ParamSpec& p : whole) {
      if (H5Lexists(grp, p.name.c_str(), H5P_DEFAULT) <= 0) continue;  // reported above
      h5::Id ds(ADGT_H5(H5Dopen2(grp, p.name.c_str(), H5P_DEFAULT)), H5Dclose);
      std::vector<float> buf(size_t(p.numel));
      ADGT_H5(H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()));
      int64_t bad = -1;
      for (int64_t k = 0; k < p.numel && bad < 0; ++k)
        if (buf[size_t(k)] != value(g, p.name, k)) bad = k;
      PCHECK(bad < 0, what << ": whole tensor " << kGroups[g] << "/" << p.name << " element " << bad << " is "
                           << buf[size_t(bad)] << ", want " << value(g, p.name, bad));
    }
  }
  if (!dims.empty()) {
    h5::Id ds(ADGT_H5(H5Dopen2(f, "meta/layout_dims", H5P_DEFAULT)), H5Dclose);
    std::vector<int64_t> got(4);
    ADGT_H5(H5Dread(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, got.data()));
    PCHECK(got == dims, what << ": meta/layout_dims is " << got[0] << "," << got[1] << "," << got[2] << ","
                             << got[3]);
  }
}

// Every (dataset, rank file) piece of `dir`, from meta/pieces.
std::vector<std::pair<std::string, int>> pieces_of(const std::string& dir) {
  h5::QuietErrors quiet;
  h5::Id f(ADGT_H5(H5Fopen((fs::path(dir) / "checkpoint.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)), H5Fclose);
  h5::Id t(ADGT_H5(H5Dopen2(f, "meta/pieces/tensor", H5P_DEFAULT)), H5Dclose);
  h5::Id r(ADGT_H5(H5Dopen2(f, "meta/pieces/rank", H5P_DEFAULT)), H5Dclose);
  h5::Id type(ADGT_H5(H5Dget_type(t)), H5Tclose);
  h5::Id space(ADGT_H5(H5Dget_space(t)), H5Sclose);
  const auto n = size_t(H5Sget_simple_extent_npoints(space));
  const size_t w = H5Tget_size(type);
  std::string text(n * w, '\0');
  std::vector<int32_t> ranks(n);
  ADGT_H5(H5Dread(t, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, text.data()));
  ADGT_H5(H5Dread(r, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, ranks.data()));
  std::vector<std::pair<std::string, int>> out;
  for (size_t k = 0; k < n; ++k) {
    std::string s(text.data() + k * w, w);
    s.resize(std::strlen(s.c_str()));
    out.emplace_back(s, ranks[k]);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void flip_byte(const fs::path& file, const std::string& path) {
  uint64_t at = 0, bytes = 0;
  {
    h5::QuietErrors quiet;
    h5::Id f(ADGT_H5(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)), H5Fclose);
    h5::Id d(ADGT_H5(H5Dopen2(f, path.c_str(), H5P_DEFAULT)), H5Dclose);
    at = H5Dget_offset(d);
    bytes = H5Dget_storage_size(d);
  }
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  const auto pos = std::streamoff(at + bytes / 2);
  io.seekg(pos);
  char ch = 0;
  io.read(&ch, 1);
  ch = char(ch ^ 0x10);
  io.seekp(pos);
  io.write(&ch, 1);
}

// Expert pieces of `dir` (every one of group `full`, every 3rd of the others)
// and every 5th other piece damaged in turn: loading into L fails on every
// rank, naming the piece, so some rank (one holding the expert) verified it.
void check_pieces_verified(Ctx& c, const std::string& dir, const Layout& L, const std::string& full,
                           const std::string& what) {
  const auto all = pieces_of(dir);
  std::vector<std::pair<std::string, int>> pieces;
  for (size_t k = 0; k < all.size(); ++k) {
    const bool expert = contains(all[k].first, ".experts.");
    if ((expert && (all[k].first.rfind(full + "/", 0) == 0 || k % 3 == 0)) || k % 5 == 0)
      pieces.push_back(all[k]);
  }
  const ShardLayout s = shard_layout(L, c.rank);
  const std::vector<ParamSpec> local = rank_table(model(L.mixed), L, c.rank);
  auto file_of = [&](int r) { return fs::path(dir) / ("rank_" + std::to_string(r) + ".h5"); };
  for (size_t k = 0; k < pieces.size(); ++k) {
    const auto& [path, r] = pieces[k];
    if (c.rank == 0) {
      if (k > 0) flip_byte(file_of(pieces[k - 1].second), pieces[k - 1].first);  // undo the last one
      flip_byte(file_of(r), path);
    }
    c.world->barrier();
    const std::string msg = error_of([&] { load_checkpoint_sharded(dir, local, s, *c.world); });
    PCHECK(contains(msg, "tensor " + path + " fails its checksum") && contains(msg, file_of(r).string()),
           what << ": a flipped byte in " << path << " of " << file_of(r).string() << " gives: " << msg);
  }
  if (c.rank == 0 && !pieces.empty()) flip_byte(file_of(pieces.back().second), pieces.back().first);
  c.world->barrier();
  PCHECK(pieces.size() > 30, what << ": only " << pieces.size() << " pieces");
  load_and_compare(c, dir, L, what + ", repaired");
}

void check_save_error(Ctx& c, const Layout& L, const fs::path& root,
                      const std::function<std::vector<ParamSpec>(int)>& t, const std::string& want,
                      const std::string& what,
                      const std::function<void(ShardLayout&, CheckpointState&)>& edit = nullptr) {
  const std::string msg = error_of([&] { save_as(c, L, root, 5, t, edit); });
  PCHECK(contains(msg, want), what << ": save gives: " << msg);
  c.world->barrier();
  if (c.rank == 0 && fs::exists(root)) {
    std::vector<std::string> left;
    for (const auto& e : fs::directory_iterator(root)) left.push_back(e.path().filename().string());
    PCHECK(left.empty(), what << ": the failed save left " << left.size() << " entries in " << root.string());
  }
}

int run(int argc, char** argv, Comm& world) {
  Ctx c{&world, world.rank(), world.size(), {}};
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--dir" && i + 1 < argc) c.dir = argv[++i];
  if (c.dir.empty() || c.size != 4) {
    if (c.rank == 0) std::fprintf(stderr, "usage: mpirun -np 4 %s --dir DIR\n", argv[0]);
    return 64;
  }
  ptest::tally().rank = c.rank;
  const auto t0 = std::chrono::steady_clock::now();
  if (c.rank == 0) {
    fs::remove_all(c.dir);
    fs::create_directories(c.dir);
  }
  world.barrier();

  const std::vector<int> scattered = {1, 0, 0, 1};  // ep rank 0: experts 1, 2; ep rank 1: experts 0, 3
  const Layout dp4_ep2{"dp4_ep2", 1, 4, 1, 2}, dp4_ep4{"dp4_ep4", 1, 4, 1, 4},
      tp2_dp2_ep2{"tp2_dp2_ep2", 2, 2, 1, 2}, pp2_dp2_ep2{"pp2_dp2_ep2", 1, 2, 2, 2},
      dp4_ep2_scattered{"dp4_ep2_scattered", 1, 4, 1, 2, scattered},
      mixed_pp2_dp2_ep2{"mixed_pp2_dp2_ep2", 1, 2, 2, 2, {}, true};
  const Layout tp2_dp2{"tp2_dp2", 2, 2, 1, 1};  // ep=1: every rank all experts, one writer per piece
  const std::vector<Layout> saves = {dp4_ep2, dp4_ep4, tp2_dp2_ep2, pp2_dp2_ep2, dp4_ep2_scattered, tp2_dp2};
  const std::vector<Layout> loads = {{"dp4", 1, 4, 1, 1},
                                     {"tp2_dp2", 2, 2, 1, 1},
                                     {"tp4", 4, 1, 1, 1},
                                     dp4_ep2,
                                     dp4_ep4,
                                     tp2_dp2_ep2,
                                     pp2_dp2_ep2,
                                     {"tp2_dp2_ep2_scattered", 2, 2, 1, 2, scattered}};
  const std::vector<Layout> mixed_loads = {{"mixed_dp4", 1, 4, 1, 1, {}, true},
                                           {"mixed_dp4_ep4", 1, 4, 1, 4, {}, true},
                                           {"mixed_tp2_dp2_ep2", 2, 2, 1, 2, {}, true},
                                           mixed_pp2_dp2_ep2};

  // The references: whole tensors (every expert) in one version 1 file.
  if (c.rank == 0)
    for (const auto& [mixed, name] : {std::pair{false, "reference"}, std::pair{true, "reference_mixed"}}) {
      const auto specs = build_param_table(model(mixed));
      save_checkpoint((c.dir / name).string(), state_of(specs, ShardLayout{}, 1), 0);
    }
  world.barrier();
  std::map<std::string, std::string> dirs, mixed_dirs;
  dirs["reference (v1)"] = (c.dir / "reference" / "step_1").string();
  mixed_dirs["reference_mixed (v1)"] = (c.dir / "reference_mixed" / "step_1").string();

  for (const Layout& L : saves) {
    std::string dir;
    const std::string err = error_of([&] { dir = save_as(c, L, c.dir / L.name, 1); });
    PCHECK(err == "(no exception)", "save " << L.name << ": " << err);
    if (err != "(no exception)") continue;
    check_whole_tensors(c, dir, model(), "save " + L.name, {L.tp, L.dp, L.pp, L.ep});
    dirs[L.name] = dir;
  }
  {
    std::string dir;
    const Layout& L = mixed_pp2_dp2_ep2;
    const std::string err = error_of([&] { dir = save_as(c, L, c.dir / L.name, 1); });
    PCHECK(err == "(no exception)", "save " << L.name << ": " << err);
    if (err == "(no exception)") {
      check_whole_tensors(c, dir, model(true), "save " + L.name, {L.tp, L.dp, L.pp, L.ep});
      mixed_dirs[L.name] = dir;
    }
  }
  // Each expert piece is written once: by one of its ep rank's dp replicas.
  if (c.rank == 0 && dirs.count("dp4_ep2")) {
    std::map<std::string, std::set<int>> writers;
    for (const auto& [path, r] : pieces_of(dirs["dp4_ep2"])) writers[path].insert(r);
    int expert_pieces = 0;
    for (const auto& [path, rs] : writers) {
      PCHECK(rs.size() == 1, "dp4_ep2: " << path << " is written by " << rs.size() << " ranks");
      const size_t at = path.find(".experts.");
      if (at == std::string::npos) continue;
      ++expert_pieces;
      const int x = std::stoi(path.substr(at + 9));
      PCHECK(*rs.begin() % 2 == x / 2, "dp4_ep2: " << path << " written by rank " << *rs.begin()
                                                   << ", which does not hold expert " << x);
    }
    PCHECK(expert_pieces == 3 * 2 * 4 * 3, "dp4_ep2: " << expert_pieces << " expert pieces");
  }

  // Every checkpoint into every layout.
  int loads_done = 0;
  for (const auto& [name, dir] : dirs)
    for (const Layout& L : loads) {
      load_and_compare(c, dir, L, "load " + name + " into " + L.name);
      ++loads_done;
    }
  for (const auto& [name, dir] : mixed_dirs)
    for (const Layout& L : mixed_loads) {
      load_and_compare(c, dir, L, "load " + name + " into " + L.name);
      ++loads_done;
    }

  // Every piece is verified by a rank that holds its expert: from the data it
  // read (dp4 ep4: each rank one expert) and from its file (tp4: the tp=2
  // pieces span two shards); the scattered placement into the contiguous one.
  const fs::path damaged = c.dir / "damaged";
  if (c.rank == 0) {
    fs::create_directories(damaged);
    fs::copy(dirs["tp2_dp2_ep2"], damaged / "tp2_dp2_ep2", fs::copy_options::recursive);
    fs::copy(dirs["dp4_ep2_scattered"], damaged / "dp4_ep2_scattered", fs::copy_options::recursive);
  }
  world.barrier();
  check_pieces_verified(c, (damaged / "tp2_dp2_ep2").string(), dp4_ep4, "model", "tp2_dp2_ep2 into dp4_ep4");
  check_pieces_verified(c, (damaged / "tp2_dp2_ep2").string(), loads[2], "optim/exp_avg", "tp2_dp2_ep2 into tp4");
  check_pieces_verified(c, (damaged / "dp4_ep2_scattered").string(), tp2_dp2_ep2, "optim/exp_avg_sq",
                        "dp4_ep2_scattered into tp2_dp2_ep2");

  // Errors, on every rank.
  const ModelConfig m = model();
  auto all = [](const std::string&) { return true; };
  {  // Expert 0 on both ep ranks (and so expert 2 on none).
    auto t = [&](int r) {
      const ShardLayout s = shard_layout(dp4_ep2, r);
      return filtered_table(m, 1, 0, s.ep_rank == 0 ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{0, 3}, all);
    };
    check_save_error(c, dp4_ep2, c.dir / "err_two_ep_ranks", t,
                     "tensor model.layers.0.block_sparse_moe.experts.0.w1.weight (expert 0) is held by ep ranks 0 "
                     "and 1 of pipeline stage 0",
                     "expert on two ep ranks");
  }
  {  // Expert 2 on no ep rank.
    auto t = [&](int r) {
      const ShardLayout s = shard_layout(dp4_ep2, r);
      return filtered_table(m, 1, 0, s.ep_rank == 0 ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{3}, all);
    };
    check_save_error(c, dp4_ep2, c.dir / "err_missing_expert", t,
                     "no ep rank holds expert 2 of model.layers.0 (model.layers.0.block_sparse_moe.gate.weight has "
                     "4 experts",
                     "missing expert");
  }
  {  // The two replicas of ep rank 0 hold different experts.
    auto t = [&](int r) {
      const ShardLayout s = shard_layout(dp4_ep2, r);
      if (s.dp_rank == 2) return filtered_table(m, 1, 0, {2, 3}, all);
      return rank_table(m, dp4_ep2, r);
    };
    check_save_error(c, dp4_ep2, c.dir / "err_replicas", t,
                     "rank 2 (tp 0, dp 2, pp 0, ep 0) holds other expert weights than rank 0 (tp 0, dp 0, pp 0, ep 0)",
                     "replicas with different experts");
  }
  {  // ep not passed: the dp ranks of a stage hold different experts.
    Layout no_ep = dp4_ep2;
    auto t = [&](int r) { return rank_table(m, dp4_ep2, r); };
    no_ep.ep = 1;
    check_save_error(c, no_ep, c.dir / "err_no_ep", t,
                     "holds other expert weights than rank 0 (tp 0, dp 0, pp 0), which is in the same pipeline "
                     "stage; with expert parallelism pass ShardLayout::ep",
                     "save without ep");
    // Loading likewise: some expert pieces would be verified by no rank.
    const ShardLayout s = shard_layout(no_ep, c.rank);
    const std::string msg =
        error_of([&] { load_checkpoint_sharded(dirs["dp4_ep2"], rank_table(m, dp4_ep2, c.rank), s, world); });
    PCHECK(contains(msg, "pieces of tensor") && contains(msg, "were verified: the ranks' parameter tables do not "
                                                              "match the layout they pass"),
           "load without ep: " << msg);
  }
  {  // ZeRO-1 chunks with ep > 1.
    auto edit = [](ShardLayout& s, CheckpointState& st) {
      const int64_t n = total_numel(st.specs);
      s.state_lo = n * s.dp_rank / s.dp;
      s.state_hi = n * (s.dp_rank + 1) / s.dp;
      for (auto* v : {&st.exp_avg, &st.exp_avg_sq})
        *v = std::vector<float>(v->begin() + s.state_lo, v->begin() + s.state_hi);
    };
    check_save_error(c, dp4_ep2, c.dir / "err_zero", nullptr, "ZeRO-1 state chunks with ep=2 are not supported",
                     "zero with ep", edit);
  }
  {  // ep that does not divide dp / a wrong ep rank.
    auto edit = [](ShardLayout& s, CheckpointState&) { s.ep = 3; s.ep_rank = s.dp_rank % 3; };
    check_save_error(c, dp4_ep2, c.dir / "err_ep3", nullptr, "ep must divide dp and ep_rank = dp_rank % ep",
                     "ep 3 of dp 4", edit);
    ShardLayout s = shard_layout(dp4_ep2, c.rank);
    s.ep_rank = 1 - s.ep_rank;
    const std::string msg =
        error_of([&] { load_checkpoint_sharded(dirs["dp4_ep2"], rank_table(m, dp4_ep2, c.rank), s, world); });
    PCHECK(contains(msg, "ep must divide dp and ep_rank = dp_rank % ep"), "wrong ep rank: " << msg);
  }

  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int32_t failed[1] = {int32_t(ptest::tally().failures)};
  world.all_reduce(Tensor(failed, DType::I32, {1}), ReduceOp::Sum);
  if (c.rank == 0) {
    if (failed[0] == 0)
      std::printf("ckpt-expert: ok (%ld checks on rank 0, %d loads, %.1f s)\n", ptest::tally().checks, loads_done,
                  secs);
    else
      std::fprintf(stderr, "ckpt-expert: %d checks failed\n", failed[0]);
  }
  return failed[0] == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    MpiEnv mpi(&argc, &argv);
    auto world = MpiComm::world();
    const int rc = run(argc, argv, *world);
    world.reset();
    return rc;
  } catch (const std::exception& e) {
    fatal(e);
  }
}

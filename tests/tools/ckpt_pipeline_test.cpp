// Per-rank (format version 2) checkpoints with pipeline parallelism, under
// mpirun with 4 ranks:
//
//   mpirun -np 4 adgt_ckpt_pipeline_test --dir DIR
//
// Every value of every tensor is a function of (group, global name, global
// index), so the shard any rank of any layout must hold is known exactly. The
// program saves with pipeline layouts (pp=2 x tp=2, pp=4, pp=2 x dp=2 with
// ZeRO-1 state chunks, an interleaved pp=2 x tp=2 whose ranks hold
// non-contiguous layers) and, for comparison, pp=1 (tp=2 x dp=2 ZeRO-1) and a
// version 1 file of whole tensors; it loads each into seven layouts of the 4
// ranks (pp=1 with tp 1/2/4, pp=2 with tp or dp, pp=4, interleaved) and
// compares bit for bit; reads whole tensors back from each checkpoint.h5 with
// the HDF5 C library (values, HF order, meta); flips a byte in every piece of
// a pp checkpoint in turn and checks that every rank fails naming it (each
// piece is verified by some rank); and checks the errors: a tensor on two
// stages, stages with different tables, a missing layer, a tensor of a rank's
// table missing from the checkpoint, a checkpoint tensor no rank loads.
//
// The checkpoints stay under DIR/<name>/step_<N> for the h5py check
// (tests/checkpoint/vds_check.py against DIR/reference/step_1, registered in
// tests/checkpoint_pipeline.cmake). Prints "ckpt-pipeline: ok (...)" on rank 0;
// exits non-zero when a check failed on any rank.
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

ModelConfig model() {
  ModelConfig m;
  m.vocab_size = 254;  // tp=4 pads it to 256: the last rank holds 62 valid rows
  m.d_model = 32;
  m.n_layers = 4;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.ffn_hidden = 64;
  m.seq_len = 16;
  return m;
}

// The value of element `idx` (C order in the global tensor) of tensor `name` in
// group g: an integer in [-2^19, 2^19), exact in fp32.
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

// A layout of the 4 ranks. Rank order (core/layout.hpp): tp fastest, then
// dp, then pp. With v > 1 virtual stages, chunk c of pipeline rank r is model
// stage c*pp + r (n_layers / (pp*v) layers each).
struct Layout {
  std::string name;
  int tp = 1, dp = 1, pp = 1, v = 1;
  bool zero = false;
};

ShardLayout shard_layout(const Layout& L, int rank) {
  ShardLayout s;
  s.tp = L.tp;
  s.dp = L.dp;
  s.pp = L.pp;
  // The rank order of core/layout.hpp, written out: these tests also hand the
  // save deliberately wrong layouts whose ranks coords_of() would refuse.
  s.tp_rank = rank % L.tp;
  s.dp_rank = rank / L.tp % L.dp;
  s.pp_rank = rank / (L.tp * L.dp);
  s.description = "tp=" + std::to_string(L.tp) + " dp=" + std::to_string(L.dp) + " pp=" + std::to_string(L.pp) +
                  " virtual_stages=" + std::to_string(L.v) + " zero=" + std::to_string(L.zero ? 1 : 0);
  return s;
}

// What a table keeps: name -> keep?
using Filter = std::function<bool(const std::string&)>;

// build_param_table filtered by name, offsets recomputed (16-element aligned).
std::vector<ParamSpec> filtered_table(const ModelConfig& m, int tp, int tp_rank, const Filter& keep) {
  std::vector<ParamSpec> t;
  int64_t off = 0;
  for (ParamSpec p : build_param_table(m, tp, tp_rank)) {
    if (!keep(p.name)) continue;
    p.offset = off;
    off += (p.numel + 15) / 16 * 16;
    t.push_back(p);
  }
  return t;
}

int64_t layer_of(const std::string& name) {
  const std::string pre = "model.layers.";
  if (name.rfind(pre, 0) != 0) return -1;
  return std::stoll(name.substr(pre.size()));
}

// What pipeline rank `pp_rank` of L holds.
Filter stage_filter(const ModelConfig& m, const Layout& L, int pp_rank) {
  const int64_t per = m.n_layers / (L.pp * L.v);
  return [=](const std::string& name) {
    const int64_t l = layer_of(name);
    if (l >= 0) return (l / per) % L.pp == pp_rank;
    if (name == "model.embed_tokens.weight") return pp_rank == 0;
    return pp_rank == L.pp - 1;  // model.norm, lm_head
  };
}

std::vector<ParamSpec> stage_table(const ModelConfig& m, const Layout& L, int rank) {
  const ShardLayout s = shard_layout(L, rank);
  return filtered_table(m, s.tp, s.tp_rank, stage_filter(m, L, s.pp_rank));
}

// The local flat buffer of group g for table `local` of tp rank (tp_rank of tp):
// predicted values where the shard is valid, `pad` elsewhere.
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
  ModelConfig m;
  fs::path dir;
};

// Saves step `step` with layout L, each rank's table filtered by `keep_of(rank)`
// (default: its stage's tensors). Returns the step directory.
std::string save_as(Ctx& c, const Layout& L, const fs::path& root, int64_t step,
                    const std::function<std::vector<ParamSpec>(int)>& table_of = nullptr) {
  const ShardLayout s0 = shard_layout(L, c.rank);
  ShardLayout s = s0;
  CheckpointState st;
  st.step = step;
  st.samples_seen = 1000 + step;
  st.seed = 99;
  st.config_yaml = "model: {vocab_size: 254}\n";
  st.rng_state = {uint64_t(step), 7};
  st.specs = table_of ? table_of(c.rank) : stage_table(c.m, L, c.rank);
  // Padding (vocabulary rows, between tensors) holds garbage that must not travel.
  st.params = local_values(st.specs, s.tp, s.tp_rank, 0, 4242.0f);
  st.exp_avg = local_values(st.specs, s.tp, s.tp_rank, 1, 4343.0f);
  st.exp_avg_sq = local_values(st.specs, s.tp, s.tp_rank, 2, 4444.0f);
  if (L.zero) {  // dp rank d holds elements [N*d/dp, N*(d+1)/dp) of its stage's flat buffer
    const int64_t n = total_numel(st.specs);
    s.state_lo = n * s.dp_rank / s.dp;
    s.state_hi = n * (s.dp_rank + 1) / s.dp;
    for (auto* v : {&st.exp_avg, &st.exp_avg_sq})
      *v = std::vector<float>(v->begin() + s.state_lo, v->begin() + s.state_hi);
  }
  return save_checkpoint_sharded(root.string(), st, s, *c.world, 0);
}

// Loads `dir` into layout L and compares every buffer bit for bit with the prediction.
void load_and_compare(Ctx& c, const std::string& dir, const Layout& L, const std::string& what) {
  const ShardLayout s = shard_layout(L, c.rank);
  const std::vector<ParamSpec> local = stage_table(c.m, L, c.rank);
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

// Rank 0: every tensor of checkpoint.h5 read whole (through the virtual
// datasets) equals the prediction; the groups list the whole model in HF order.
void check_whole_tensors(Ctx& c, const std::string& dir, const std::string& what, const std::vector<int64_t>& dims) {
  if (c.rank != 0) return;
  const std::vector<ParamSpec> whole = build_param_table(c.m);
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
                                << order.size() << " of the model in HF order");
    for (const ParamSpec& p : whole) {
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
    std::vector<int64_t> got(4);  // tp, dp, pp, ep
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
    if (out.empty() || out.back() != std::make_pair(s, int(ranks[k]))) out.emplace_back(s, ranks[k]);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Flips one byte in the middle of dataset `path` of `file`.
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

// Pieces of `dir` damaged in turn (all those of group `full`, every 4th of the
// others: a load per piece is slow with 4 ranks on few cores): loading into L
// fails on every rank, naming the piece's tensor and file, so some rank verified it.
void check_pieces_verified(Ctx& c, const std::string& dir, const Layout& L, const std::string& full,
                           const std::string& what) {
  const auto all = pieces_of(dir);
  std::vector<std::pair<std::string, int>> pieces;
  for (size_t k = 0; k < all.size(); ++k)
    if (all[k].first.rfind(full + "/", 0) == 0 || k % 4 == 0) pieces.push_back(all[k]);
  const ShardLayout s = shard_layout(L, c.rank);
  const std::vector<ParamSpec> local = stage_table(c.m, L, c.rank);
  auto file_of = [&](int r) { return fs::path(dir) / ("rank_" + std::to_string(r) + ".h5"); };
  for (size_t k = 0; k < pieces.size(); ++k) {
    const auto& [path, r] = pieces[k];
    if (c.rank == 0) {
      if (k > 0) flip_byte(file_of(pieces[k - 1].second), pieces[k - 1].first);  // undo the last one
      flip_byte(file_of(r), path);
    }
    // Once load_checkpoint_sharded returns on rank 0 every rank has stopped reading.
    c.world->barrier();
    const std::string msg = error_of([&] { load_checkpoint_sharded(dir, local, s, *c.world); });
    PCHECK(contains(msg, "tensor " + path + " fails its checksum") && contains(msg, file_of(r).string()),
           what << ": a flipped byte in " << path << " of " << file_of(r).string() << " gives: " << msg);
  }
  if (c.rank == 0 && !pieces.empty()) flip_byte(file_of(pieces.back().second), pieces.back().first);
  c.world->barrier();
  PCHECK(pieces.size() > 60, what << ": only " << pieces.size() << " pieces");
  load_and_compare(c, dir, L, what + ", repaired");
}

void check_save_error(Ctx& c, const Layout& L, const fs::path& root,
                      const std::function<std::vector<ParamSpec>(int)>& t, const std::string& want,
                      const std::string& what) {
  const std::string msg = error_of([&] { save_as(c, L, root, 5, t); });
  PCHECK(contains(msg, want), what << ": save gives: " << msg);
  c.world->barrier();
  if (c.rank == 0) {
    std::vector<std::string> left;
    for (const auto& e : fs::directory_iterator(root)) left.push_back(e.path().filename().string());
    PCHECK(left.empty(), what << ": the failed save left " << left.size() << " entries in " << root.string()
                              << " (first " << (left.empty() ? "" : left[0]) << ")");
  }
}

int run(int argc, char** argv, Comm& world) {
  Ctx c{&world, world.rank(), world.size(), model(), {}};
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

  const Layout pp2_tp2{"pp2_tp2", 2, 1, 2, 1, false}, pp4{"pp4", 1, 1, 4, 1, false},
      pp2_dp2_zero{"pp2_dp2_zero", 1, 2, 2, 1, true}, pp2_tp2_vs2{"pp2_tp2_interleaved", 2, 1, 2, 2, false},
      tp2_dp2_zero{"tp2_dp2_zero", 2, 2, 1, 1, true};
  const std::vector<Layout> saves = {pp2_tp2, pp4, pp2_dp2_zero, pp2_tp2_vs2, tp2_dp2_zero};
  const std::vector<Layout> loads = {{"tp1_dp4", 1, 4, 1, 1, false},
                                     {"tp2_dp2", 2, 2, 1, 1, false},
                                     {"tp4", 4, 1, 1, 1, false},
                                     {"pp4", 1, 1, 4, 1, false},
                                     {"pp2_tp2", 2, 1, 2, 1, false},
                                     {"pp2_dp2", 1, 2, 2, 1, false},
                                     {"pp2_tp2_interleaved", 2, 1, 2, 2, false}};

  // The reference: whole tensors in one version 1 file, written by rank 0 (and
  // one of a 6-layer model, for the errors).
  ModelConfig m6 = c.m;
  m6.n_layers = 6;
  if (c.rank == 0)
    for (const auto& [mc, name] : {std::pair{c.m, "reference"}, std::pair{m6, "reference6"}}) {
      CheckpointState st;
      st.step = 1;
      st.samples_seen = 1001;
      st.seed = 99;
      st.config_yaml = "model: {vocab_size: 254}\n";
      st.rng_state = {1, 7};
      st.specs = build_param_table(mc);
      st.params = local_values(st.specs, 1, 0, 0, 0.0f);
      st.exp_avg = local_values(st.specs, 1, 0, 1, 0.0f);
      st.exp_avg_sq = local_values(st.specs, 1, 0, 2, 0.0f);
      save_checkpoint((c.dir / name).string(), st, 0);
    }
  world.barrier();
  std::map<std::string, std::string> dirs;
  dirs["reference (v1)"] = (c.dir / "reference" / "step_1").string();

  // Saves with every layout; the index covers the whole model.
  for (const Layout& L : saves) {
    std::string dir;
    const std::string err = error_of([&] { dir = save_as(c, L, c.dir / L.name, 1); });
    PCHECK(err == "(no exception)", "save " << L.name << ": " << err);
    if (err != "(no exception)") continue;
    PCHECK(dir == (c.dir / L.name / "step_1").string(), "save " << L.name << " returned " << dir);
    if (c.rank == 0) {
      for (int r = 0; r < 4; ++r)
        PCHECK(fs::is_regular_file(fs::path(dir) / ("rank_" + std::to_string(r) + ".h5")),
               "save " << L.name << ": no rank_" << r << ".h5");
      std::ifstream in(fs::path(dir) / "COMPLETE");
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      PCHECK(contains(text, "rank_files=4"), "save " << L.name << ": COMPLETE is " << text);
    }
    check_whole_tensors(c, dir, "save " + L.name, {L.tp, L.dp, L.pp, 1});
    dirs[L.name] = dir;
  }
  check_whole_tensors(c, dirs["reference (v1)"], "reference", {});

  // Every checkpoint into every layout.
  int loads_done = 0;
  for (const auto& [name, dir] : dirs)
    for (const Layout& L : loads) {
      load_and_compare(c, dir, L, "load " + name + " into " + L.name);
      ++loads_done;
    }

  // Every piece is verified by some rank: from the data read (pp=4, tp=1: every
  // piece lies in one rank's shard) and from its file (tp=4: the tp=2 pieces span
  // two shards); a ZeRO checkpoint's 1-D chunk parts into interleaved stages.
  // (A piece is damaged in a copy of the checkpoint, then repaired.)
  const fs::path damaged = c.dir / "damaged";
  if (c.rank == 0) {
    fs::create_directories(damaged);
    fs::copy(dirs["pp2_tp2"], damaged / "pp2_tp2", fs::copy_options::recursive);
    fs::copy(dirs["pp2_dp2_zero"], damaged / "pp2_dp2_zero", fs::copy_options::recursive);
  }
  world.barrier();
  check_pieces_verified(c, (damaged / "pp2_tp2").string(), loads[3], "model", "pp2_tp2 into pp4");
  check_pieces_verified(c, (damaged / "pp2_tp2").string(), loads[2], "optim/exp_avg", "pp2_tp2 into tp4");
  check_pieces_verified(c, (damaged / "pp2_dp2_zero").string(), loads[6], "optim/exp_avg_sq",
                        "pp2_dp2_zero into interleaved");

  // Errors, on every rank.
  const ModelConfig m = c.m;
  {  // A tensor on two stages.
    auto t = [&](int r) {
      const ShardLayout s = shard_layout(pp2_tp2, r);
      return filtered_table(m, s.tp, s.tp_rank, [&](const std::string& n) {
        return stage_filter(m, pp2_tp2, s.pp_rank)(n) || n == "model.embed_tokens.weight";
      });
    };
    check_save_error(c, pp2_tp2, c.dir / "err_two_stages", t,
                     "tensor model.embed_tokens.weight is held by pipeline stages 0 and 1", "two stages");
  }
  {  // Ranks of one stage with different tables.
    auto t = [&](int r) {
      const ShardLayout s = shard_layout(pp2_tp2, r);
      return filtered_table(m, s.tp, s.tp_rank, [&](const std::string& n) {
        return stage_filter(m, pp2_tp2, s.pp_rank)(n) && !(r == 3 && n == "model.norm.weight");
      });
    };
    check_save_error(c, pp2_tp2, c.dir / "err_stage_tables", t,
                     "rank 3 (tp 1, dp 0, pp 1) holds other tensors (names, shapes or sharding) than rank 2",
                     "stage tables");
  }
  {  // No stage holds layer 2.
    auto t = [&](int r) {
      const ShardLayout s = shard_layout(pp2_tp2, r);
      return filtered_table(m, s.tp, s.tp_rank, [&](const std::string& n) {
        return stage_filter(m, pp2_tp2, s.pp_rank)(n) && layer_of(n) != 2;
      });
    };
    check_save_error(c, pp2_tp2, c.dir / "err_missing_layer", t, "no pipeline stage holds model.layers.2.*",
                     "missing layer");
  }
  {  // The layout does not match the world.
    Layout bad = pp2_tp2;
    bad.pp = 1;
    const std::string msg =
        error_of([&] { save_as(c, bad, c.dir / "err_layout", 5, [&](int r) { return stage_table(m, pp2_tp2, r); }); });
    PCHECK(contains(msg, "layout tp 2 x dp 1 x pp 1") && contains(msg, "does not match the 4 ranks saving"),
           "bad layout: " << msg);
  }
  {  // A tensor of a rank's table that the checkpoint lacks (a 6-layer model, pp=2: stage 1 holds layers 3..5).
    const Layout L = loads[4];
    const ShardLayout s = shard_layout(L, c.rank);
    const auto local = filtered_table(m6, s.tp, s.tp_rank, stage_filter(m6, L, s.pp_rank));
    const std::string msg = error_of([&] { load_checkpoint_sharded(dirs["pp4"], local, s, world); });
    const std::string want =
        "checkpoint " + dirs["pp4"] + "/checkpoint.h5: tensor model/model.layers.4.input_layernorm.weight is missing";
    PCHECK(contains(msg, want),
           "missing tensor: " << msg);
    if (s.pp_rank == 0) PCHECK(contains(msg, "[reported by rank 2]"), "missing tensor on stage 0: " << msg);
  }
  {  // A tensor of the checkpoint that no rank loads.
    const Layout L = loads[4];
    const ShardLayout s = shard_layout(L, c.rank);
    const auto local = filtered_table(m, s.tp, s.tp_rank, [&](const std::string& n) {
      return stage_filter(m, L, s.pp_rank)(n) && n != "model.norm.weight";
    });
    const std::string msg = error_of([&] { load_checkpoint_sharded(dirs["pp2_tp2"], local, s, world); });
    const std::string want =
        "tensor model/model.norm.weight is in the checkpoint but not in the model (no rank of the 4 loading holds it)";
    PCHECK(contains(msg, want),
           "unloaded tensor: " << msg);
  }
  {  // Stages that share a tensor may load it (each verifies its pieces).
    const Layout L = loads[4];
    const ShardLayout s = shard_layout(L, c.rank);
    const auto local = filtered_table(m, s.tp, s.tp_rank, [&](const std::string& n) {
      return stage_filter(m, L, s.pp_rank)(n) || n == "model.embed_tokens.weight";
    });
    CheckpointState st;
    const std::string msg = error_of([&] { st = load_checkpoint_sharded(dirs["pp4"], local, s, world); });
    PCHECK(msg == "(no exception)", "shared embedding: " << msg);
    if (msg == "(no exception)")
      PCHECK(st.params == local_values(local, s.tp, s.tp_rank, 0, 0.0f), "shared embedding: values differ");
  }
  {  // Ranks that load different checkpoints: rank 3's tensors are in both, but the lists differ.
    const Layout L = loads[4];
    const ShardLayout s = shard_layout(L, c.rank);
    const auto local = stage_table(m, L, c.rank);
    const std::string dir = c.rank == 3 ? (c.dir / "reference6" / "step_1").string() : dirs["pp4"];
    const std::string msg = error_of([&] { load_checkpoint_sharded(dir, local, s, world); });
    PCHECK(contains(msg, "the 4 ranks see different checkpoints (from 117 to 171 datasets"),
           "different checkpoints: " << msg);
  }

  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int32_t failed[1] = {int32_t(ptest::tally().failures)};
  world.all_reduce(Tensor(failed, DType::I32, {1}), ReduceOp::Sum);
  if (c.rank == 0) {
    if (failed[0] == 0)
      std::printf("ckpt-pipeline: ok (%ld checks on rank 0, %zu checkpoints x %zu layouts = %d loads, %.1f s)\n",
                  ptest::tally().checks, dirs.size(), loads.size(), loads_done, secs);
    else
      std::fprintf(stderr, "ckpt-pipeline: %d checks failed\n", failed[0]);
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

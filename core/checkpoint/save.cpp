// Format version 2, the save: every rank writes its pieces to rank_<R>.h5,
// rank 0 gathers the pieces' records, checks them against each other and the
// layout, writes the index of virtual datasets and commits the step directory
// (tmp dir, COMPLETE, rename, prune). Which rank writes which piece is
// core/checkpoint/geometry.hpp; the format and the protocol are described in
// docs/checkpoint-format.md; keep the two in step.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <set>
#include <thread>
#include <tuple>

#include "core/checkpoint/common.hpp"
#include "core/checkpoint/sharded.hpp"
#include "core/checkpoint/sharded_internal.hpp"
#include "core/checkpoint/checksum.hpp"
#include "core/checkpoint/hdf5_util.hpp"

namespace adgt {

using namespace ckpt;  // NOLINT: the helpers of the checkpoint module

namespace {

// Escapes '%' (H5Pset_virtual expands printf-style patterns in source names).
std::string vds_escape(const std::string& s) {
  std::string r;
  for (char c : s) r += c == '%' ? std::string("%%") : std::string(1, c);
  return r;
}

// ---------------------------------------------------------------- the rank files

// One record per block, gathered to rank 0 in the rank's report: (group, param, start0, start1,
// count0, count1, source offset, dataset length, flat, crc32).
constexpr size_t kRecordWords = 10;

// Writes rank_<R>.h5; returns the records of its pieces' blocks.
std::vector<int64_t> write_rank_file(const fs::path& path, const CheckpointState& st, const ShardLayout& lay,
                                     const std::vector<int>& writers) {
  const std::vector<WrittenPiece> pieces = written_pieces(st.specs, lay, writers);
  // Each piece's elements in order: in place in st's buffers when they are one
  // run, else gathered into a copy. A flat piece's buffer is the ZeRO chunk.
  const std::vector<float>* bufs[3] = {&st.params, &st.exp_avg, &st.exp_avg_sq};
  std::vector<std::vector<float>> copies(pieces.size());
  std::vector<const float*> data(pieces.size());
  std::vector<ByteRange> ranges;
  for (size_t k = 0; k < pieces.size(); ++k) {
    const WrittenPiece& p = pieces[k];
    const float* buf = bufs[p.group]->data();
    const int64_t shift = p.flat ? lay.state_lo : 0;
    if (p.runs.size() == 1) {
      data[k] = buf + (p.runs[0].first - shift);
    } else {
      for (const auto& [x, y] : p.runs) copies[k].insert(copies[k].end(), buf + (x - shift), buf + (y - shift));
      data[k] = copies[k].data();
    }
    ranges.push_back({data[k], size_t(p.numel) * sizeof(float)});
  }
  // The checksums are computed on other threads while the data are written.
  std::future<std::vector<uint32_t>> crc_future =
      std::async(std::launch::async, [&ranges] { return crc32_many(ranges); });

  h5::Id fapl = file_access();
  ADGT_H5(H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V18));
  ADGT_H5(H5Pset_alignment(fapl, 64 * 1024, 4096));
  h5::Id dcpl(ADGT_H5(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
  ADGT_H5(H5Pset_layout(dcpl, H5D_CONTIGUOUS));
  ADGT_H5(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
  h5::Id file(ADGT_H5(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl)), H5Fclose);
  std::vector<int64_t> rec;
  {
    h5::Id optim(ADGT_H5(H5Gcreate2(file, "optim", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Gclose);
    h5::Id groups[3] = {create_group(file, kTensorGroups[0]), create_group(file, kTensorGroups[1]),
                        create_group(file, kTensorGroups[2])};
    std::vector<h5::Id> datasets;
    for (size_t k = 0; k < pieces.size(); ++k) {
      const WrittenPiece& p = pieces[k];
      const std::vector<hsize_t> d = p.flat ? std::vector<hsize_t>{hsize_t(p.numel)} : dims_of(p.blocks[0].r);
      h5::Id space(ADGT_H5(H5Screate_simple(int(d.size()), d.data(), nullptr)), H5Sclose);
      datasets.emplace_back(ADGT_H5(H5Dcreate2(groups[p.group], st.specs[p.param].name.c_str(), H5T_IEEE_F32LE,
                                               space, H5P_DEFAULT, dcpl, H5P_DEFAULT)),
                            H5Dclose);
      ADGT_H5(H5Dwrite(datasets.back(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data[k]));
    }
    const std::vector<uint32_t> crcs = crc_future.get();
    for (size_t k = 0; k < pieces.size(); ++k) {
      const WrittenPiece& p = pieces[k];
      write_crc(datasets[k], crcs[k]);
      for (const Block& b : p.blocks)
        rec.insert(rec.end(), {int64_t(p.group), int64_t(p.param), b.r.start[0], b.r.start[1], b.r.count[0], b.r.count[1],
                               b.src_offset, p.numel, int64_t(p.flat), int64_t(crcs[k])});
    }
    write_state_entries(file, st.rank_state);  // this rank's own state (state/ of its file)
  }
  ADGT_H5(H5Fclose(file.release()));
  return rec;
}

// ---------------------------------------------------------------- the reports

// A tensor a rank describes in its report.
struct TensorRec {
  std::string name;
  std::vector<int64_t> global_shape;
  int64_t expert = -1;  // ParamSpec::expert
  bool router = false;  // ParamSpec::is_router
};

// What a rank tells rank 0 after writing its file: its place in the layout,
// the file's size, hashes of its table, the tensors it describes (the first
// rank of each ep rank of its pipeline stage, tp 0 and dp = the ep rank: its
// whole table, in order; the others: the tensors they wrote pieces of) and one
// record per block, whose word 1 indexes `tensors`.
struct RankReport {
  int tp = 1, tp_rank = 0, dp = 1, dp_rank = 0, pp = 1, pp_rank = 0, ep = 1, ep_rank = 0;
  int64_t file_bytes = 0;
  uint64_t table_hash = 0;   // the whole table: equal within a stage and ep rank
  uint64_t shared_hash = 0;  // the non-expert tensors: equal within a stage
  std::vector<TensorRec> tensors;
  std::vector<int64_t> blocks;  // kRecordWords each
};
constexpr size_t kReportHeader = 14;
constexpr size_t kTensorWords = 6;

// FNV-1a over the names, global shapes, shard dimensions and expert ids of a
// table's tensors (all of them, or the non-expert ones only): equal on every
// rank of a pipeline stage (the whole table: of a stage and ep rank).
uint64_t table_hash(const std::vector<ParamSpec>& specs, bool experts) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* p, size_t n) {
    for (size_t k = 0; k < n; ++k) h = (h ^ static_cast<const unsigned char*>(p)[k]) * 1099511628211ull;
  };
  for (const ParamSpec& l : specs) {
    if (!experts && l.expert >= 0) continue;
    mix(l.name.data(), l.name.size() + 1);  // with its NUL
    const auto nd = int64_t(l.global_shape.size());
    mix(&nd, sizeof nd);
    mix(l.global_shape.data(), l.global_shape.size() * sizeof(int64_t));
    mix(&l.shard_dim, sizeof l.shard_dim);
    mix(&l.expert, sizeof l.expert);
  }
  return h;
}

// Words: header (place, file size, hashes, tensor count, block words, name
// bytes), per tensor (nd, dim 0, dim 1, name length, expert, router), the
// block records, the names' bytes packed 8 to a word.
std::vector<int64_t> encode_report(const CheckpointState& st, const ShardLayout& lay, std::vector<int64_t> blocks,
                                   int64_t file_bytes) {
  std::vector<int64_t> entry_of(st.specs.size(), -1);
  std::vector<size_t> listed;
  if (stage_leader(lay))
    for (size_t i = 0; i < st.specs.size(); ++i) entry_of[i] = int64_t(listed.size()), listed.push_back(i);
  for (size_t k = 0; k + kRecordWords <= blocks.size(); k += kRecordWords) {
    const auto i = size_t(blocks[k + 1]);
    if (entry_of[i] < 0) entry_of[i] = int64_t(listed.size()), listed.push_back(i);
    blocks[k + 1] = entry_of[i];
  }
  std::string names;
  for (size_t i : listed) names += st.specs[i].name;
  std::vector<int64_t> w = {lay.tp,
                            lay.tp_rank,
                            lay.dp,
                            lay.dp_rank,
                            lay.pp,
                            lay.pp_rank,
                            lay.ep,
                            lay.ep_rank,
                            file_bytes,
                            int64_t(table_hash(st.specs, true)),
                            int64_t(table_hash(st.specs, false)),
                            int64_t(listed.size()),
                            int64_t(blocks.size()),
                            int64_t(names.size())};
  for (size_t i : listed) {
    const ParamSpec& l = st.specs[i];
    const std::vector<int64_t>& g = l.global_shape;
    w.insert(w.end(), {int64_t(g.size()), g.size() > 0 ? g[0] : 1, g.size() > 1 ? g[1] : 1, int64_t(l.name.size()),
                       l.expert, int64_t(l.is_router)});
  }
  w.insert(w.end(), blocks.begin(), blocks.end());
  const size_t at = w.size();
  w.resize(at + (names.size() + 7) / 8, 0);
  std::memcpy(w.data() + at, names.data(), names.size());
  return w;
}

RankReport decode_report(const int64_t* w, size_t len, int rank, const std::string& who) {
  auto bad = [&] {
    return CheckpointError(who + ": internal error: rank " + std::to_string(rank) + " sent a malformed piece report");
  };
  if (len < kReportHeader) throw bad();
  RankReport r;
  r.tp = int(w[0]), r.tp_rank = int(w[1]), r.dp = int(w[2]), r.dp_rank = int(w[3]), r.pp = int(w[4]),
  r.pp_rank = int(w[5]), r.ep = int(w[6]), r.ep_rank = int(w[7]);
  r.file_bytes = w[8];
  r.table_hash = uint64_t(w[9]);
  r.shared_hash = uint64_t(w[10]);
  const int64_t nt = w[11], nb = w[12], nc = w[13];
  const auto tw = int64_t(kTensorWords);
  if (nt < 0 || nb < 0 || nc < 0 || nb % int64_t(kRecordWords) != 0 ||
      len != kReportHeader + size_t(tw * nt + nb + (nc + 7) / 8))
    throw bad();
  const int64_t* t = w + kReportHeader;
  const char* chars = reinterpret_cast<const char*>(t + tw * nt + nb);
  int64_t used = 0;
  for (int64_t k = 0; k < nt; ++k, t += tw) {
    if (t[0] < 0 || t[0] > 2 || t[3] < 0 || used + t[3] > nc) throw bad();
    TensorRec rec{std::string(chars + used, size_t(t[3])), std::vector<int64_t>(t + 1, t + 1 + t[0]), t[4],
                  t[5] != 0};
    r.tensors.push_back(std::move(rec));
    used += t[3];
  }
  r.blocks.assign(t, t + nb);
  return r;
}

// Every rank's words, concatenated in rank order on rank 0 (`at[r]`: where rank
// r's start, at[W] the end); nothing elsewhere. Collective over `world`.
std::vector<int64_t> gather_to_root(Comm& world, std::vector<int64_t> mine, std::vector<size_t>& at) {
  const int W = world.size();
  std::vector<int32_t> lens(size_t(W), 0);
  int32_t my_len = int32_t(2 * mine.size());  // in 32-bit words
  world.all_gather(Tensor(lens.data(), DType::I32, {int64_t(W)}), Tensor(&my_len, DType::I32, {1}));
  std::vector<int64_t> rc(size_t(W), 0), rd(size_t(W), 0), sc(size_t(W), 0), sd(size_t(W), 0);
  sc[0] = my_len;
  at.assign(size_t(W) + 1, 0);
  int64_t total = 0;
  for (int r = 0; r < W; ++r) {
    at[size_t(r)] = size_t(total / 2);
    if (world.rank() == 0) rc[size_t(r)] = lens[size_t(r)], rd[size_t(r)] = total;
    total += lens[size_t(r)];
  }
  at[size_t(W)] = size_t(total / 2);
  std::vector<int64_t> all(world.rank() == 0 ? size_t(total / 2) : 1);
  world.all_to_allv(Tensor(all.data(), DType::I32, {int64_t(2 * all.size())}), rc, rd,
                    Tensor(mine.data(), DType::I32, {int64_t(2 * mine.size())}), sc, sd);
  return all;
}

struct IndexBlock {
  int64_t rank;
  Region r;
  int64_t src_offset, src_len;
  bool flat;
  uint32_t crc;
};

// A tensor of the index, with its place in the index's order.
struct IndexTensor {
  std::string name;
  std::vector<int64_t> global_shape;
  int stage = 0;
  int band = 0;        // 0: before the layers (embed_tokens), 1: a layer's, 2: after (norm, lm_head)
  int64_t layer = -1;  // N of model.layers.N.*
  size_t pos = 0;      // in its stage's (ep rank's) table
  // Expert weights: the expert id, the ep rank that holds it, and the position
  // of the layer's first expert tensor in that table (the experts of all ep
  // ranks go there, by id); anchor = pos for other tensors.
  int64_t expert = -1;
  int ep_rank = 0;
  size_t anchor = 0;
  bool router = false;
};

// N of "model.layers.N.<...>", else -1.
int64_t layer_of(const std::string& name) {
  static const std::string pre = "model.layers.";
  if (name.compare(0, pre.size(), pre) != 0) return -1;
  size_t k = pre.size();
  int64_t n = 0;
  if (k >= name.size() || !std::isdigit(static_cast<unsigned char>(name[k]))) return -1;
  for (; k < name.size() && std::isdigit(static_cast<unsigned char>(name[k])); ++k) n = n * 10 + (name[k] - '0');
  return k < name.size() && name[k] == '.' ? n : -1;
}

// "tp 1, dp 0, pp 2" (", ep 1" added with expert parallelism): a rank's place
// in the layout, for error messages.
std::string place_of(const RankReport& r, const ShardLayout& lay) {
  return "tp " + std::to_string(r.tp_rank) + ", dp " + std::to_string(r.dp_rank) + ", pp " +
         std::to_string(r.pp_rank) + (lay.ep > 1 ? ", ep " + std::to_string(r.ep_rank) : std::string());
}

// Which rank saves at each place of the layout.
struct Places {
  Layout L;
  std::vector<int> rank;  // by rank_of(L, place), -1 where none
  int at(int t, int d, int p) const { return rank[size_t(rank_of(L, RankCoords{t, d, p, 0, 0}))]; }
};

// Checks that every rank reports the same layout as rank 0, an ep rank that
// follows from its dp rank, and a place in the layout of its own.
Places places_of(const std::vector<RankReport>& reps, const ShardLayout& lay, const std::string& who) {
  const int W = int(reps.size());
  std::vector<int> at_coord(size_t(W), -1);
  for (int r = 0; r < W; ++r) {
    const RankReport& q = reps[size_t(r)];
    if (q.tp != lay.tp || q.dp != lay.dp || q.pp != lay.pp || q.ep != lay.ep)
      throw CheckpointError(who + ": rank " + std::to_string(r) + " saves with layout tp " + std::to_string(q.tp) +
                            " x dp " + std::to_string(q.dp) + " x pp " + std::to_string(q.pp) + " (ep " +
                            std::to_string(q.ep) + "), rank 0 with tp " + std::to_string(lay.tp) + " x dp " +
                            std::to_string(lay.dp) + " x pp " + std::to_string(lay.pp) + " (ep " +
                            std::to_string(lay.ep) + "); every rank must pass the same layout");
    const Layout ql{.tp = q.tp, .pp = q.pp, .dp = q.dp, .ep = q.ep};
    const bool inside = q.tp_rank >= 0 && q.tp_rank < q.tp && q.dp_rank >= 0 && q.dp_rank < q.dp &&
                        q.pp_rank >= 0 && q.pp_rank < q.pp;
    const bool ep_ok = q.ep >= 1 && q.dp % q.ep == 0;
    if (!ep_ok || (inside && q.ep_rank != coords_of(ql, rank_of(ql, RankCoords{q.tp_rank, q.dp_rank,
                                                                               q.pp_rank, 0, 0})).ep))
      throw CheckpointError(who + ": rank " + std::to_string(r) + " saves as ep rank " + std::to_string(q.ep_rank) +
                            " of ep " + std::to_string(q.ep) + " with dp rank " + std::to_string(q.dp_rank) +
                            " of dp " + std::to_string(q.dp) + "; ep must divide dp and ep_rank = dp_rank % ep");
    if (!inside) throw CheckpointError(who + ": rank " + std::to_string(r) + " has no place in the layout");
    const int c = rank_of(ql, RankCoords{q.tp_rank, q.dp_rank, q.pp_rank, 0, 0});
    if (at_coord[size_t(c)] >= 0)
      throw CheckpointError(who + ": ranks " + std::to_string(at_coord[size_t(c)]) + " and " + std::to_string(r) +
                            " both save as " + place_of(q, lay) + "; every rank needs its own place in the layout");
    at_coord[size_t(c)] = r;
  }
  return Places{Layout{.tp = lay.tp, .pp = lay.pp, .dp = lay.dp, .ep = lay.ep}, std::move(at_coord)};
}

// Every rank of a stage holds the stage's non-expert tensors, and the experts of its ep rank.
void check_stage_tables(const std::vector<RankReport>& reps, const ShardLayout& lay, const std::string& who,
                        const Places& places) {
  for (int r = 0; r < int(reps.size()); ++r) {
    const RankReport& q = reps[size_t(r)];
    const int lead = places.at(0, 0, q.pp_rank), ep_lead = places.at(0, q.ep_rank, q.pp_rank);
    if (q.shared_hash != reps[size_t(lead)].shared_hash)
      throw CheckpointError(who + ": rank " + std::to_string(r) + " (" + place_of(q, lay) +
                            ") holds other tensors (names, shapes or sharding) than rank " + std::to_string(lead) +
                            " (" + place_of(reps[size_t(lead)], lay) + "), which is in the same pipeline stage; "
                            "every rank of a stage must hold the same parameter table" +
                            (lay.ep > 1 ? " (but for its ep rank's experts)" : ""));
    if (q.table_hash != reps[size_t(ep_lead)].table_hash)
      throw CheckpointError(
          who + ": rank " + std::to_string(r) + " (" + place_of(q, lay) + ") holds other expert weights than rank " +
          std::to_string(ep_lead) + " (" + place_of(reps[size_t(ep_lead)], lay) +
          "), which is in the same pipeline stage" +
          (lay.ep > 1 ? " and ep rank; the dp ranks of one ep rank must hold the same experts"
                      : "; with expert parallelism pass ShardLayout::ep and ep_rank (ep ranks hold different "
                        "experts)"));
  }
}

// The tensors: the first rank of each ep rank of each stage (tp 0, dp = the ep
// rank) lists its whole table; the non-expert tensors are taken from ep rank
// 0's, the expert tensors from each. A name on two stages, or an expert on
// two ep ranks, is an error. Appended to `tensors` in HF order (what comes
// before the layers, the layers by number, what comes after; each stage's
// table order within).
void collect_tensors(const std::vector<RankReport>& reps, const ShardLayout& lay, const std::string& who,
                     const Places& places, std::vector<IndexTensor>& tensors) {
  std::map<std::string, size_t> first_seen;
  for (int p = 0; p < lay.pp; ++p)
    for (int e = 0; e < lay.ep; ++e) {
      const RankReport& q = reps[size_t(places.at(0, e, p))];
      size_t first_layer = q.tensors.size();
      for (size_t j = 0; j < q.tensors.size() && first_layer == q.tensors.size(); ++j)
        if (layer_of(q.tensors[j].name) >= 0) first_layer = j;
      std::map<int64_t, size_t> first_expert;  // layer -> position of its first expert tensor
      for (size_t j = 0; j < q.tensors.size(); ++j) {
        const TensorRec& rec = q.tensors[j];
        if (e > 0 && rec.expert < 0) continue;
        IndexTensor t{rec.name, rec.global_shape, p, 1, layer_of(rec.name), j, rec.expert, e, j, rec.router};
        if (t.layer < 0)
          t.band = first_layer < q.tensors.size() ? (j < first_layer ? 0 : 2) : (p == 0 ? 0 : 2);
        if (t.expert >= 0) t.anchor = first_expert.try_emplace(t.layer, j).first->second;
        auto [it, fresh] = first_seen.try_emplace(t.name, tensors.size());
        if (!fresh && tensors[it->second].stage == p)
          throw CheckpointError(who + ": tensor " + t.name + " (expert " + std::to_string(t.expert) +
                                ") is held by ep ranks " + std::to_string(tensors[it->second].ep_rank) + " and " +
                                std::to_string(e) + " of pipeline stage " + std::to_string(p) +
                                "; each expert must belong to exactly one ep rank (parallel.expert_placement)");
        if (!fresh)
          throw CheckpointError(who + ": tensor " + t.name + " is held by pipeline stages " +
                                std::to_string(tensors[it->second].stage) + " and " + std::to_string(p) +
                                "; each tensor must belong to exactly one stage when saving (a tensor shared "
                                "between stages must be saved by one of them only)");
        tensors.push_back(std::move(t));
      }
    }
  std::stable_sort(tensors.begin(), tensors.end(), [](const IndexTensor& a, const IndexTensor& b) {
    return std::tie(a.band, a.layer, a.stage, a.anchor, a.expert, a.pos) <
           std::tie(b.band, b.layer, b.stage, b.anchor, b.expert, b.pos);
  });
}

// The union over the stages: no layer may be missing between the first and the last.
void check_layers_held(const std::vector<IndexTensor>& tensors, const std::string& who) {
  std::set<int64_t> layers;
  for (const IndexTensor& t : tensors)
    if (t.layer >= 0) layers.insert(t.layer);
  for (int64_t l = 0; !layers.empty() && l <= *layers.rbegin(); ++l)
    if (!layers.count(l))
      throw CheckpointError(who + ": no pipeline stage holds model.layers." + std::to_string(l) +
                            ".* (the stages hold layers up to " + std::to_string(*layers.rbegin()) +
                            "); together the stages must hold the whole model");
}

// Every expert of every MoE layer, as many as its router has rows, each with
// as many tensors as the others (w1, w2, w3).
void check_experts_held(const std::vector<IndexTensor>& tensors, const ShardLayout& lay, const std::string& who) {
  std::map<int64_t, const IndexTensor*> router_of;               // layer -> its router
  std::map<int64_t, std::map<int64_t, int64_t>> experts_of;      // layer -> expert -> tensors
  for (const IndexTensor& t : tensors) {
    if (t.router) router_of[t.layer] = &t;
    if (t.expert >= 0) ++experts_of[t.layer][t.expert];
  }
  auto layer_name = [](int64_t l) { return "model.layers." + std::to_string(l); };
  for (const auto& [l, held] : experts_of)
    if (!router_of.count(l))
      throw CheckpointError(who + ": " + layer_name(l) + " holds expert weights (expert " +
                            std::to_string(held.begin()->first) + ") but no router (ParamSpec::is_router)");
  for (const auto& [l, router] : router_of) {
    const int64_t E = router->global_shape.empty() ? 0 : router->global_shape[0];
    const std::map<int64_t, int64_t>& held = experts_of[l];
    for (int64_t x = 0; x < E; ++x)
      if (!held.count(x))
        throw CheckpointError(who + ": no ep rank holds expert " + std::to_string(x) + " of " + layer_name(l) +
                              " (" + router->name + " has " + std::to_string(E) + " experts; stage " +
                              std::to_string(router->stage) + ", ep " + std::to_string(lay.ep) +
                              "); together the ep ranks of a stage must hold every expert");
    for (const auto& [x, count] : held) {
      if (x >= E)
        throw CheckpointError(who + ": " + layer_name(l) + " holds expert " + std::to_string(x) + ", but " +
                              router->name + " has " + std::to_string(E) + " experts");
      if (count != held.begin()->second)
        throw CheckpointError(who + ": expert " + std::to_string(x) + " of " + layer_name(l) + " has " +
                              std::to_string(count) + " tensors, expert " + std::to_string(held.begin()->first) +
                              " " + std::to_string(held.begin()->second) + "; every expert needs the same weights");
    }
  }
}

// Each rank's blocks are pieces of its stage's (and ep rank's) tensors:
// per[g * tensors.size() + t] gets the blocks of (group g, tensor t).
void collect_blocks(const std::vector<RankReport>& reps, const std::vector<IndexTensor>& tensors,
                    const std::string& who, std::vector<std::vector<IndexBlock>>& per) {
  std::map<std::string, size_t> tid;
  for (size_t t = 0; t < tensors.size(); ++t) tid[tensors[t].name] = t;
  const size_t n = tensors.size();
  per.assign(3 * n, {});
  for (int r = 0; r < int(reps.size()); ++r) {
    const RankReport& q = reps[size_t(r)];
    for (size_t k = 0; k < q.blocks.size(); k += kRecordWords) {
      const int64_t* b = q.blocks.data() + k;
      const auto it = b[1] >= 0 && b[1] < int64_t(q.tensors.size()) ? tid.find(q.tensors[size_t(b[1])].name)
                                                                    : tid.end();
      if (b[0] < 0 || b[0] > 2 || it == tid.end() || tensors[it->second].stage != q.pp_rank ||
          (tensors[it->second].expert >= 0 && tensors[it->second].ep_rank != q.ep_rank) ||
          tensors[it->second].global_shape != q.tensors[size_t(b[1])].global_shape)
        throw CheckpointError(who + ": internal error: rank " + std::to_string(r) + " reports a bad piece");
      const IndexTensor& t = tensors[it->second];
      IndexBlock ib{r, whole_region(t.global_shape, t.name), b[6], b[7], b[8] != 0, uint32_t(b[9])};
      ib.r.start = {b[2], b[3]};
      ib.r.count = {b[4], b[5]};
      per[size_t(b[0]) * n + it->second].push_back(ib);
    }
  }
}

// Rank 0: checks the reports against each other and the layout and turns them
// into the index's tensors (in HF order: what comes before the layers, the
// layers by number, what comes after; each stage's table order within) and the
// blocks of each (group, tensor): per[g * tensors.size() + t].
void assemble_index(const std::vector<RankReport>& reps, const ShardLayout& lay, const std::string& who,
                    std::vector<IndexTensor>& tensors, std::vector<std::vector<IndexBlock>>& per) {
  const Places places = places_of(reps, lay, who);
  check_stage_tables(reps, lay, who, places);
  collect_tensors(reps, lay, who, places, tensors);
  check_layers_held(tensors, who);
  check_experts_held(tensors, lay, who);
  collect_blocks(reps, tensors, who, per);
}

// Writes checkpoint.h5: virtual datasets over every rank's pieces, and meta/.
void write_index(const fs::path& path, const CheckpointState& st, const ShardLayout& lay,
                 const std::vector<IndexTensor>& tensors, const std::vector<std::vector<IndexBlock>>& per, int world,
                 const std::string& who) {
  const size_t n = tensors.size();
  h5::Id fapl = file_access();
  // Virtual datasets need the 1.10 object format (readers: HDF5 >= 1.10, h5py >= 2.9).
  ADGT_H5(H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V110));
  h5::Id file(ADGT_H5(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl)), H5Fclose);
  {
    h5::Id optim(ADGT_H5(H5Gcreate2(file, "optim", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Gclose);
    for (int g = 0; g < 3; ++g) {
      h5::Id grp = create_group(file, kTensorGroups[g]);
      for (size_t i = 0; i < n; ++i) {
        const IndexTensor& l = tensors[i];
        const Region whole = whole_region(l.global_shape, l.name);
        const std::string path_in_file = std::string(kTensorGroups[g]) + "/" + l.name;
        int64_t covered = 0;
        for (const IndexBlock& b : per[g * n + i]) {
          if (!whole.contains(b.r) || b.r.count[0] < 0 || b.r.count[1] < 0)
            throw CheckpointError(who + ": internal error: a piece of " + path_in_file + " at " + region_str(b.r) +
                                  " lies outside the tensor " + shape_str(l.global_shape));
          covered += b.r.numel();
        }
        if (covered != whole.numel())
          throw CheckpointError(who + ": internal error: the pieces of " + path_in_file + " cover " +
                                std::to_string(covered) + " of its " + std::to_string(whole.numel()) + " elements");
        if (whole.nd == 0) throw CheckpointError(who + ": " + path_in_file + " is a scalar; checkpoints hold arrays");
        const std::vector<hsize_t> gd = dims_of(whole);
        h5::Id vspace(ADGT_H5(H5Screate_simple(whole.nd, gd.data(), nullptr)), H5Sclose);
        h5::Id dcpl(ADGT_H5(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
        const float zero = 0.0f;
        ADGT_H5(H5Pset_fill_value(dcpl, H5T_NATIVE_FLOAT, &zero));
        for (const IndexBlock& b : per[g * n + i]) {
          const std::vector<hsize_t> start(b.r.start.begin(), b.r.start.begin() + whole.nd), count = dims_of(b.r);
          ADGT_H5(H5Sselect_hyperslab(vspace, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr));
          // The source: the whole dataset in the block's shape, or (a ZeRO chunk's part,
          // stored 1-D) its elements [src_offset, +numel), taken in C order.
          h5::Id src;
          if (b.flat) {
            const hsize_t len = hsize_t(b.src_len), at = hsize_t(b.src_offset), num = hsize_t(b.r.numel());
            src = h5::Id(ADGT_H5(H5Screate_simple(1, &len, nullptr)), H5Sclose);
            ADGT_H5(H5Sselect_hyperslab(src, H5S_SELECT_SET, &at, nullptr, &num, nullptr));
          } else {
            src = h5::Id(ADGT_H5(H5Screate_simple(whole.nd, count.data(), nullptr)), H5Sclose);
          }
          ADGT_H5(H5Pset_virtual(dcpl, vspace, rank_file_name(b.rank).c_str(), vds_escape(path_in_file).c_str(), src));
        }
        ADGT_H5(H5Sselect_all(vspace));
        h5::Id ds(ADGT_H5(H5Dcreate2(grp, l.name.c_str(), H5T_IEEE_F32LE, vspace, H5P_DEFAULT, dcpl, H5P_DEFAULT)),
                  H5Dclose);
      }
    }
    h5::Id meta = create_group(file, "meta");
    write_meta(meta, st, kFormatVersion);
    write_state(file, st);
    write_string(meta, "layout", lay.description);
    write_i64(meta, "world_size", world);
    const int64_t dims[4] = {lay.tp, lay.dp, lay.pp, lay.ep};
    write_array(meta, "layout_dims", H5T_STD_I64LE, H5T_NATIVE_INT64, dims, {4}, crc32(dims, sizeof dims),
                H5P_DEFAULT);

    // meta/pieces: one row per block, (group, table, rank, offset) order.
    std::vector<std::string> names;
    std::vector<int32_t> ranks;
    std::vector<int64_t> starts, counts, offsets;
    std::vector<uint32_t> crcs;
    size_t width = 1;
    for (int g = 0; g < 3; ++g)
      for (size_t i = 0; i < n; ++i)
        for (const IndexBlock& b : per[g * n + i]) {
          names.push_back(std::string(kTensorGroups[g]) + "/" + tensors[i].name);
          width = std::max(width, names.back().size());
          ranks.push_back(int32_t(b.rank));
          starts.insert(starts.end(), {b.r.start[0], b.r.start[1]});
          counts.insert(counts.end(), {b.r.count[0], b.r.count[1]});
          offsets.push_back(b.src_offset);
          crcs.push_back(b.crc);
        }
    const auto np = int64_t(names.size());
    h5::Id pg = create_group(meta, "pieces");
    std::string text(size_t(np) * width, '\0');
    for (size_t k = 0; k < names.size(); ++k) std::memcpy(text.data() + k * width, names[k].data(), names[k].size());
    h5::Id stype(ADGT_H5(H5Tcopy(H5T_C_S1)), H5Tclose);
    ADGT_H5(H5Tset_size(stype, width));
    ADGT_H5(H5Tset_strpad(stype, H5T_STR_NULLPAD));
    ADGT_H5(H5Tset_cset(stype, H5T_CSET_UTF8));
    write_array(pg, "tensor", stype, stype, text.data(), {np}, crc32(text.data(), text.size()), H5P_DEFAULT);
    write_array(pg, "rank", H5T_STD_I32LE, H5T_NATIVE_INT32, ranks.data(), {np},
                crc32(ranks.data(), ranks.size() * 4), H5P_DEFAULT);
    write_array(pg, "start", H5T_STD_I64LE, H5T_NATIVE_INT64, starts.data(), {np, 2},
                crc32(starts.data(), starts.size() * 8), H5P_DEFAULT);
    write_array(pg, "count", H5T_STD_I64LE, H5T_NATIVE_INT64, counts.data(), {np, 2},
                crc32(counts.data(), counts.size() * 8), H5P_DEFAULT);
    write_array(pg, "offset", H5T_STD_I64LE, H5T_NATIVE_INT64, offsets.data(), {np},
                crc32(offsets.data(), offsets.size() * 8), H5P_DEFAULT);
    write_array(pg, "crc32", H5T_STD_U32LE, H5T_NATIVE_UINT32, crcs.data(), {np},
                crc32(crcs.data(), crcs.size() * 4), H5P_DEFAULT);
  }
  ADGT_H5(H5Fclose(file.release()));
}

// ---------------------------------------------------------------- the phases

// Test hooks of the write phase (tests/checkpoint_async.cmake):
//   ADGT_TEST_CKPT_WRITE_FAIL=R:N   rank R's write of step N fails: a directory
//                                   is put where its rank file goes, so the
//                                   file's creation fails as on a real error;
//   ADGT_TEST_CKPT_WRITE_DELAY_S=S  every rank waits S seconds before writing
//                                   (a slow filesystem; kill tests aim inside).
void test_hooks(const fs::path& file, int rank, int64_t step) {
  if (const char* v = std::getenv("ADGT_TEST_CKPT_WRITE_DELAY_S"); v && *v)
    std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(v)));
  if (const char* v = std::getenv("ADGT_TEST_CKPT_WRITE_FAIL"); v && *v) {
    long r = -1, n = -1;
    if (std::sscanf(v, "%ld:%ld", &r, &n) == 2 && r == rank && n == step) {
      std::fprintf(stderr, "ADGT_TEST_CKPT_WRITE_FAIL: rank %d's write of step %ld will fail\n", rank, n);
      fs::create_directory(file);
    }
  }
}

}  // namespace

ShardedSave begin_sharded_save(const std::string& root, const CheckpointState& st, const ShardLayout& lay,
                               Comm& world, int64_t keep) {
  const int R = world.rank(), W = world.size();
  ShardedSave s;
  s.who = "save_checkpoint(" + root + ", step " + std::to_string(st.step) + ")";
  s.root = root;
  s.name = "step_" + std::to_string(st.step);
  s.step = st.step;
  s.keep = keep;
  s.rank = R;
  s.world_size = W;
  const std::string& who = s.who;
  const fs::path rootp(root);
  std::string err;
  std::error_code ec;
  fs::path tmp;

  // Checks everywhere; rank 0 makes the temporary directory and tells the others its name.
  guarded(err, who, [&] {
    if (root.empty()) throw CheckpointError(who + ": checkpoint.dir is empty; set it to a directory");
    if (st.step < 0) throw CheckpointError(who + ": step must be >= 0");
    if (keep < 0) throw CheckpointError(who + ": keep=" + std::to_string(keep) + " must be >= 0 (0 keeps all)");
    if (lay.tp < 1 || lay.dp < 1 || lay.pp < 1 || int64_t(lay.tp) * lay.dp * lay.pp != W || lay.tp_rank < 0 ||
        lay.tp_rank >= lay.tp || lay.dp_rank < 0 || lay.dp_rank >= lay.dp || lay.pp_rank < 0 || lay.pp_rank >= lay.pp)
      throw CheckpointError(who + ": layout tp " + std::to_string(lay.tp) + " x dp " + std::to_string(lay.dp) +
                            " x pp " + std::to_string(lay.pp) + " (this rank tp " + std::to_string(lay.tp_rank) +
                            ", dp " + std::to_string(lay.dp_rank) + ", pp " + std::to_string(lay.pp_rank) +
                            ") does not match the " + std::to_string(W) + " ranks saving");
    check_expert_layout(lay, who);
    if (lay.ep > 1 && lay.state_hi >= 0)
      throw CheckpointError(who + ": ZeRO-1 state chunks with ep=" + std::to_string(lay.ep) +
                            " are not supported (expert and non-expert state are sharded over different groups); "
                            "save with parallel.zero: 0");
    check_table(st.specs, who);
    const auto total = static_cast<size_t>(total_numel(st.specs));
    const std::pair<const char*, const std::vector<float>*> bufs[3] = {
        {"params", &st.params}, {"exp_avg", &st.exp_avg}, {"exp_avg_sq", &st.exp_avg_sq}};
    const bool zero = lay.state_hi >= 0;
    if (zero && (lay.state_lo < 0 || lay.state_lo > lay.state_hi))
      throw CheckpointError(who + ": the ZeRO chunk [" + std::to_string(lay.state_lo) + ", " +
                            std::to_string(lay.state_hi) + ") is not a range");
    for (const auto& [nm, b] : bufs) {
      const bool chunk = zero && b != &st.params;
      const size_t need = chunk ? size_t(lay.state_hi - lay.state_lo) : total;
      if (chunk ? b->size() != need : b->size() < need)
        throw CheckpointError(who + ": " + nm + " has " + std::to_string(b->size()) + " floats, " +
                              (chunk ? "the ZeRO chunk has " : "the parameter table needs total_numel(specs) = ") +
                              std::to_string(need));
    }
    s.writers = piece_writers(st.specs, lay.dp, lay.ep, lay.ep_rank);
    if (R == 0) {
      fs::create_directories(rootp, ec);
      if (ec) throw CheckpointError(who + ": cannot create " + root + ": " + ec.message());
      tmp = rootp / (".tmp_" + s.name + "_" + std::to_string(::getpid()));
      fs::remove_all(tmp);
      fs::create_directory(tmp);
      s.tmp_made = true;
    }
  });
  int32_t hdr[3] = {int32_t(::getpid()), int32_t(st.step & 0x7fffffff), int32_t(st.step >> 31)};
  world.broadcast(Tensor(hdr, DType::I32, {3}), 0);
  s.tmp = (rootp / (".tmp_" + s.name + "_" + std::to_string(hdr[0]))).string();
  guarded(err, who, [&] {
    if (hdr[1] != int32_t(st.step & 0x7fffffff) || hdr[2] != int32_t(st.step >> 31))
      throw CheckpointError(who + ": rank " + std::to_string(R) + " saves step " + std::to_string(st.step) +
                            " but rank 0 another step; every rank must save the same step");
  });
  if (std::string e = agree_error(world, err); !e.empty()) {
    discard_sharded_save(s);
    throw CheckpointError(e);
  }
  return s;
}

void write_sharded_rank_file(ShardedSave& s, const CheckpointState& st, const ShardLayout& lay) {
  s.error.clear();
  s.report.clear();
  guarded(s.error, s.who, [&] {
    std::error_code ec;
    const fs::path tmp(s.tmp);
    if (!fs::is_directory(tmp, ec))
      throw CheckpointError(s.who + ": rank " + std::to_string(s.rank) + " does not see " + tmp.string() +
                            ", which rank 0 created: checkpoint.dir must be on a filesystem that every rank shares");
    const fs::path file = tmp / rank_file_name(s.rank);
    test_hooks(file, s.rank, s.step);
    std::vector<int64_t> pieces;
    try {
      h5::QuietErrors quiet;
      pieces = write_rank_file(file, st, lay, s.writers);
    } catch (const h5::Error& e) {
      throw CheckpointError("writing checkpoint " + file.string() + ": " + e.what());
    }
    fsync_path(file, false);
    s.report = encode_report(st, lay, std::move(pieces), int64_t(fs::file_size(file)));
  });
}

std::string commit_sharded_save(ShardedSave& s, const CheckpointState& st, const ShardLayout& lay, Comm& world) {
  const int R = world.rank(), W = world.size();
  const std::string& who = s.who;
  const fs::path rootp(s.root), tmp(s.tmp);
  auto fail = [&](const std::string& msg) {
    discard_sharded_save(s);
    throw CheckpointError(msg);
  };
  // Every rank has finished its write (the caller's promise): agree on its outcome.
  if (std::string e = agree_error(world, s.error); !e.empty()) fail(e);
  // The reports (tensor names, blocks, checksums) go to rank 0 only.
  std::vector<size_t> at;
  const std::vector<int64_t> all = gather_to_root(world, std::move(s.report), at);
  s.report.clear();

  // Rank 0: the index, COMPLETE, the rename, pruning.
  std::string err;
  guarded(err, who, [&] {
    if (R != 0) return;
    std::vector<RankReport> reps;
    std::string sizes;
    for (int r = 0; r < W; ++r) {
      reps.push_back(decode_report(all.data() + at[size_t(r)], at[size_t(r) + 1] - at[size_t(r)], r, who));
      sizes += "bytes." + rank_file_name(r) + "=" + std::to_string(reps.back().file_bytes) + "\n";
    }
    std::vector<IndexTensor> tensors;
    std::vector<std::vector<IndexBlock>> per;
    assemble_index(reps, lay, who, tensors, per);
    const fs::path index = tmp / kH5Name;
    try {
      h5::QuietErrors quiet;
      write_index(index, st, lay, tensors, per, W, who);
    } catch (const h5::Error& e) {
      throw CheckpointError("writing checkpoint " + index.string() + ": " + e.what());
    }
    fsync_path(index, false);
    write_file_synced(tmp / kMarkerName, "adgt checkpoint\nformat_version=" + std::to_string(kFormatVersion) +
                                             "\nstep=" + std::to_string(s.step) + "\nfile=" + kH5Name +
                                             "\nbytes=" + std::to_string(fs::file_size(index)) +
                                             "\nrank_files=" + std::to_string(W) + "\n" + sizes);
    fsync_path(tmp, true);
    install(tmp, rootp / s.name);
    s.tmp_made = false;  // installed: no longer ours to remove
    fsync_path(rootp, true);
    prune(rootp, s.keep, s.step);
  });
  if (std::string e = agree_error(world, err); !e.empty()) fail(e);
  return (rootp / s.name).string();
}

void discard_sharded_save(ShardedSave& s) noexcept {
  if (s.rank != 0 || !s.tmp_made) return;
  std::error_code ec;
  fs::remove_all(fs::path(s.tmp), ec);
  s.tmp_made = false;
}

std::string save_checkpoint_sharded(const std::string& root, const CheckpointState& st, const ShardLayout& lay,
                                    Comm& world, int64_t keep) {
  // The three phases in a row; core/checkpoint/async_save.hpp runs the write on a thread.
  ShardedSave s = begin_sharded_save(root, st, lay, world, keep);
  write_sharded_rank_file(s, st, lay);
  return commit_sharded_save(s, st, lay, world);
}

}  // namespace adgt

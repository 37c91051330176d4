// Format version 2: per-rank files under an index of virtual datasets. The
// layout, the ownership rule and the commit protocol are described in
// docs/checkpoint-format.md; keep the two in step.
#include "core/checkpoint_sharded.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include "core/checkpoint_common.hpp"
#include "core/checksum.hpp"
#include "core/hdf5_util.hpp"

namespace adgt {

using namespace ckpt;  // NOLINT: the helpers of the checkpoint module

namespace {

constexpr int64_t kFormatVersion = 2;

std::string rank_file_name(int64_t r) { return "rank_" + std::to_string(r) + ".h5"; }

std::string region_str(const Region& r) {
  std::string s = "[";
  for (int d = 0; d < r.nd; ++d)
    s += (d ? ", " : "") + std::to_string(r.start[size_t(d)]) + ":" +
         std::to_string(r.start[size_t(d)] + r.count[size_t(d)]);
  return s + "]";
}

Region whole_region(const std::vector<int64_t>& g, const std::string& name) {
  if (g.size() > 2)
    throw CheckpointError("checkpoint: parameter " + name + " has " + std::to_string(g.size()) +
                          " dimensions; checkpoints hold tensors of at most 2");
  Region r;
  r.nd = int(g.size());
  for (size_t d = 0; d < g.size(); ++d) r.count[d] = g[d];
  return r;
}

std::vector<hsize_t> dims_of(const Region& r) {
  std::vector<hsize_t> v;
  for (int d = 0; d < r.nd; ++d) v.push_back(hsize_t(r.count[size_t(d)]));
  return v;
}

// The piece's elements as byte ranges of a buffer holding region `outer` (C order).
void piece_ranges(const float* base, const Region& outer, const Region& piece, std::vector<ByteRange>& out) {
  const int64_t cols = outer.count[1];
  const int64_t r0 = piece.start[0] - outer.start[0], c0 = piece.start[1] - outer.start[1];
  if (piece.count[1] == cols) {  // whole rows: one contiguous block
    out.push_back({base + r0 * cols, size_t(piece.numel()) * sizeof(float)});
    return;
  }
  for (int64_t r = 0; r < piece.count[0]; ++r)
    out.push_back({base + (r0 + r) * cols + c0, size_t(piece.count[1]) * sizeof(float)});
}

// v = n zeros, in a fresh allocation.
void zeroed(std::vector<float>& v, size_t n) {
  std::vector<float>().swap(v);
  v.assign(n, 0.0f);
}

// Escapes '%' (H5Pset_virtual expands printf-style patterns in source names).
std::string vds_escape(const std::string& s) {
  std::string r;
  for (char c : s) r += c == '%' ? std::string("%%") : std::string(1, c);
  return r;
}

// Runs f unless an error is already recorded; records the first error's message.
void guarded(std::string& err, const std::string& who, const std::function<void()>& f) {
  if (!err.empty()) return;
  try {
    f();
  } catch (const CheckpointError& e) {
    err = e.what();
  } catch (const std::exception& e) {
    err = who + ": " + e.what();
  }
}

// ---------------------------------------------------------------- saving

// A block of a global tensor and where its elements (C order) start in the
// dataset holding them.
struct Block {
  Region r;
  int64_t src_offset = 0;
};

struct OwnPiece {
  int g;
  size_t i;
  std::vector<Block> blocks;  // in source order
  bool flat = false;          // stored 1-D (a ZeRO chunk's part); else in the block's shape
  int64_t numel = 0;
  const float* data = nullptr;  // the piece's elements in order (into st's buffer, or `copy`)
  std::vector<float> copy;      // when the elements are not contiguous there
};

// The valid elements of the local flat range [a, b) of shard l (rows < vr,
// columns < vc of its (rows, cols) C-order layout) as at most three blocks of
// the global tensor (partial first row, whole rows, partial last row), and the
// local flat runs holding them, in order.
void chunk_blocks(const ParamSpec& l, const Region& mine, int64_t a, int64_t b, OwnPiece& p,
                  std::vector<std::pair<int64_t, int64_t>>& runs) {
  const int64_t cols = l.shape.size() > 1 ? l.shape[1] : 1;
  const int64_t vr = mine.count[0], vc = mine.count[1];
  auto add = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    r1 = std::min(r1, vr);
    c1 = std::min(c1, vc);
    if (r0 >= r1 || c0 >= c1) return;
    Block bl;
    bl.r.nd = mine.nd;
    bl.r.start = {mine.start[0] + r0, mine.start[1] + c0};
    bl.r.count = {r1 - r0, c1 - c0};
    bl.src_offset = p.numel;
    p.numel += bl.r.numel();
    p.blocks.push_back(bl);
    for (int64_t r = r0; r < r1; ++r) {
      if (!runs.empty() && runs.back().second == r * cols + c0)
        runs.back().second = r * cols + c1;
      else
        runs.emplace_back(r * cols + c0, r * cols + c1);
    }
  };
  int64_t ra = a / cols;
  const int64_t ca = a % cols, rb = b / cols, cb = b % cols;
  if (ra == rb) {
    add(ra, ra + 1, ca, cb);
    return;
  }
  if (ca > 0) {
    add(ra, ra + 1, ca, cols);
    ++ra;
  }
  add(ra, rb, 0, cols);
  if (cb > 0) add(rb, rb + 1, 0, cb);
}

// This rank's pieces of the three groups, in (group, table) order.
std::vector<OwnPiece> own_pieces(const CheckpointState& st, const ShardLayout& lay, const std::vector<int>& writers) {
  const std::vector<float>* bufs[3] = {&st.params, &st.exp_avg, &st.exp_avg_sq};
  const bool zero = lay.state_hi >= 0;
  std::vector<OwnPiece> out;
  for (int g = 0; g < 3; ++g)
    for (size_t i = 0; i < st.specs.size(); ++i) {
      const ParamSpec& l = st.specs[i];
      const Region mine = shard_region(l, lay.tp_rank, lay.tp);
      OwnPiece p{g, i, {}, false, 0, nullptr, {}};
      if (g > 0 && zero) {  // the part of this shard in this rank's chunk
        if ((l.shard_dim < 0 || lay.tp <= 1) && lay.tp_rank != 0) continue;
        const int64_t a = std::max(l.offset, lay.state_lo), b = std::min(l.offset + l.numel, lay.state_hi);
        if (a >= b) continue;
        std::vector<std::pair<int64_t, int64_t>> runs;
        chunk_blocks(l, mine, a - l.offset, b - l.offset, p, runs);
        if (p.blocks.empty()) continue;  // vocabulary padding only
        p.flat = true;
        const float* chunk = bufs[g]->data();
        const int64_t at = l.offset - lay.state_lo;  // element 0 of the shard, in chunk coordinates
        if (runs.size() == 1) {
          p.data = chunk + (at + runs[0].first);
        } else {
          for (const auto& [x, y] : runs) p.copy.insert(p.copy.end(), chunk + (at + x), chunk + (at + y));
        }
      } else {  // the whole (valid) shard
        if (!writes_piece(st.specs, writers, i, lay)) continue;
        p.blocks.push_back({mine, 0});
        p.numel = mine.numel();
        p.data = bufs[g]->data() + l.offset;
        if (l.shard_dim == 1 && mine.count[1] != l.shape[1]) {
          const int64_t rows = mine.count[0], lc = l.shape[1], vc = mine.count[1];
          for (int64_t r = 0; r < rows; ++r) p.copy.insert(p.copy.end(), p.data + r * lc, p.data + r * lc + vc);
        }
      }
      out.push_back(std::move(p));
    }
  for (OwnPiece& p : out)
    if (!p.copy.empty()) p.data = p.copy.data();
  return out;
}

// One record per block, gathered to rank 0 in the rank's report: (group, param, start0, start1,
// count0, count1, source offset, dataset length, flat, crc32).
constexpr size_t kRecordWords = 10;

// Writes rank_<R>.h5; returns the records of its pieces' blocks.
std::vector<int64_t> write_rank_file(const fs::path& path, const CheckpointState& st, const ShardLayout& lay,
                                     const std::vector<int>& writers) {
  std::vector<OwnPiece> pieces = own_pieces(st, lay, writers);
  std::vector<ByteRange> ranges;
  for (const OwnPiece& p : pieces) ranges.push_back({p.data, size_t(p.numel) * sizeof(float)});
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
    for (const OwnPiece& p : pieces) {
      const std::vector<hsize_t> d = p.flat ? std::vector<hsize_t>{hsize_t(p.numel)} : dims_of(p.blocks[0].r);
      h5::Id space(ADGT_H5(H5Screate_simple(int(d.size()), d.data(), nullptr)), H5Sclose);
      datasets.emplace_back(ADGT_H5(H5Dcreate2(groups[p.g], st.specs[p.i].name.c_str(), H5T_IEEE_F32LE, space,
                                               H5P_DEFAULT, dcpl, H5P_DEFAULT)),
                            H5Dclose);
      ADGT_H5(H5Dwrite(datasets.back(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, p.data));
    }
    const std::vector<uint32_t> crcs = crc_future.get();
    for (size_t k = 0; k < pieces.size(); ++k) {
      const OwnPiece& p = pieces[k];
      write_crc(datasets[k], crcs[k]);
      for (const Block& b : p.blocks)
        rec.insert(rec.end(), {int64_t(p.g), int64_t(p.i), b.r.start[0], b.r.start[1], b.r.count[0], b.r.count[1],
                               b.src_offset, p.numel, int64_t(p.flat), int64_t(crcs[k])});
    }
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

// Lists its whole table: tp rank 0, the first dp rank of its ep rank.
bool stage_leader(const ShardLayout& lay) { return lay.tp_rank == 0 && lay.dp_rank < lay.ep; }

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

// Rank 0: checks the reports against each other and the layout and turns them
// into the index's tensors (in HF order: what comes before the layers, the
// layers by number, what comes after; each stage's table order within) and the
// blocks of each (group, tensor): per[g * tensors.size() + t].
void assemble_index(const std::vector<RankReport>& reps, const ShardLayout& lay, const std::string& who,
                    std::vector<IndexTensor>& tensors, std::vector<std::vector<IndexBlock>>& per) {
  const int W = int(reps.size());
  auto place = [&lay](const RankReport& r) {
    return "tp " + std::to_string(r.tp_rank) + ", dp " + std::to_string(r.dp_rank) + ", pp " +
           std::to_string(r.pp_rank) + (lay.ep > 1 ? ", ep " + std::to_string(r.ep_rank) : std::string());
  };
  std::vector<int> at_coord(size_t(W), -1);
  for (int r = 0; r < W; ++r) {
    const RankReport& q = reps[size_t(r)];
    if (q.tp != lay.tp || q.dp != lay.dp || q.pp != lay.pp || q.ep != lay.ep)
      throw CheckpointError(who + ": rank " + std::to_string(r) + " saves with layout tp " + std::to_string(q.tp) +
                            " x dp " + std::to_string(q.dp) + " x pp " + std::to_string(q.pp) + " (ep " +
                            std::to_string(q.ep) + "), rank 0 with tp " + std::to_string(lay.tp) + " x dp " +
                            std::to_string(lay.dp) + " x pp " + std::to_string(lay.pp) + " (ep " +
                            std::to_string(lay.ep) + "); every rank must pass the same layout");
    if (q.ep < 1 || q.dp % q.ep != 0 || q.ep_rank != q.dp_rank % q.ep)
      throw CheckpointError(who + ": rank " + std::to_string(r) + " saves as ep rank " + std::to_string(q.ep_rank) +
                            " of ep " + std::to_string(q.ep) + " with dp rank " + std::to_string(q.dp_rank) +
                            " of dp " + std::to_string(q.dp) + "; ep must divide dp and ep_rank = dp_rank % ep");
    const int64_t c = q.tp_rank + int64_t(q.tp) * (q.dp_rank + int64_t(q.dp) * q.pp_rank);
    if (c < 0 || c >= W) throw CheckpointError(who + ": rank " + std::to_string(r) + " has no place in the layout");
    if (at_coord[size_t(c)] >= 0)
      throw CheckpointError(who + ": ranks " + std::to_string(at_coord[size_t(c)]) + " and " + std::to_string(r) +
                            " both save as " + place(q) + "; every rank needs its own place in the layout");
    at_coord[size_t(c)] = r;
  }
  auto rank_at = [&](int t, int d, int p) { return at_coord[size_t(t + lay.tp * (d + lay.dp * p))]; };

  // Every rank of a stage holds the stage's non-expert tensors, and the experts of its ep rank.
  for (int r = 0; r < W; ++r) {
    const RankReport& q = reps[size_t(r)];
    const int lead = rank_at(0, 0, q.pp_rank), ep_lead = rank_at(0, q.ep_rank, q.pp_rank);
    if (q.shared_hash != reps[size_t(lead)].shared_hash)
      throw CheckpointError(who + ": rank " + std::to_string(r) + " (" + place(q) +
                            ") holds other tensors (names, shapes or sharding) than rank " + std::to_string(lead) +
                            " (" + place(reps[size_t(lead)]) + "), which is in the same pipeline stage; every "
                            "rank of a stage must hold the same parameter table" +
                            (lay.ep > 1 ? " (but for its ep rank's experts)" : ""));
    if (q.table_hash != reps[size_t(ep_lead)].table_hash)
      throw CheckpointError(
          who + ": rank " + std::to_string(r) + " (" + place(q) + ") holds other expert weights than rank " +
          std::to_string(ep_lead) + " (" + place(reps[size_t(ep_lead)]) + "), which is in the same pipeline stage" +
          (lay.ep > 1 ? " and ep rank; the dp ranks of one ep rank must hold the same experts"
                      : "; with expert parallelism pass ShardLayout::ep and ep_rank (ep ranks hold different "
                        "experts)"));
  }

  // The tensors: the first rank of each ep rank of each stage (tp 0, dp = the ep
  // rank) lists its whole table; the non-expert tensors are taken from ep rank
  // 0's, the expert tensors from each. A name on two stages, or an expert on
  // two ep ranks, is an error.
  std::map<std::string, size_t> first_seen;
  for (int p = 0; p < lay.pp; ++p)
    for (int e = 0; e < lay.ep; ++e) {
      const RankReport& q = reps[size_t(rank_at(0, e, p))];
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
  std::map<std::string, size_t> tid;
  for (size_t t = 0; t < tensors.size(); ++t) tid[tensors[t].name] = t;
  // The union over the stages: no layer may be missing between the first and the last.
  std::set<int64_t> layers;
  for (const IndexTensor& t : tensors)
    if (t.layer >= 0) layers.insert(t.layer);
  for (int64_t l = 0; !layers.empty() && l <= *layers.rbegin(); ++l)
    if (!layers.count(l))
      throw CheckpointError(who + ": no pipeline stage holds model.layers." + std::to_string(l) +
                            ".* (the stages hold layers up to " + std::to_string(*layers.rbegin()) +
                            "); together the stages must hold the whole model");
  // Every expert of every MoE layer, as many as its router has rows, each with
  // as many tensors as the others (w1, w2, w3).
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

  // Each rank's blocks are pieces of its stage's (and ep rank's) tensors.
  const size_t n = tensors.size();
  per.assign(3 * n, {});
  for (int r = 0; r < W; ++r) {
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

// ---------------------------------------------------------------- loading

struct SrcPiece {
  int g;
  size_t i;                   // index in the loading rank's table
  std::string path;           // dataset path, e.g. "model/<name>"
  fs::path file;              // rank file (v2) or checkpoint.h5 itself (v1)
  std::vector<Block> blocks;  // in source order
  int64_t numel = 0;
  uint32_t crc = 0;
  bool inside(const Region& outer) const {
    return std::all_of(blocks.begin(), blocks.end(), [&](const Block& b) { return outer.contains(b.r); });
  }
};

// "[0:128, 0:64]", or "[5:6, 60:64] + 2 more blocks" for a ZeRO chunk's part.
std::string piece_str(const SrcPiece& p) {
  return region_str(p.blocks.front().r) +
         (p.blocks.size() > 1 ? " + " + std::to_string(p.blocks.size() - 1) + " more blocks" : "");
}

// Reads meta/pieces of a version 2 index: the pieces of the tensors in `index`
// (this rank's), and the number of pieces of every dataset path (all tensors).
std::vector<SrcPiece> read_piece_table(hid_t f, const fs::path& dir, const std::map<std::string, size_t>& index,
                                       const std::string& where, std::map<std::string, int32_t>& count_of) {
  auto read_all = [&](const char* name, hid_t mem_type, void* dst, int64_t want, int64_t per_row, size_t elem) {
    const std::string path = std::string("meta/pieces/") + name;
    h5::Id ds = open_dataset(f, path, where);
    h5::Id space(ADGT_H5(H5Dget_space(ds)), H5Sclose);
    if (ADGT_H5(H5Sget_simple_extent_npoints(space)) != want * per_row)
      throw CheckpointError(where + path + " does not have " + std::to_string(want) + " rows");
    if (want > 0) ADGT_H5(H5Dread(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst));
    verify_crc(ds, path, dst, size_t(want * per_row) * elem, where);
  };
  h5::Id tds = open_dataset(f, "meta/pieces/tensor", where);
  h5::Id ttype(ADGT_H5(H5Dget_type(tds)), H5Tclose);
  h5::Id tspace(ADGT_H5(H5Dget_space(tds)), H5Sclose);
  if (ADGT_H5(H5Tget_class(ttype)) != H5T_STRING || ADGT_H5(H5Tis_variable_str(ttype)) > 0)
    throw CheckpointError(where + "meta/pieces/tensor must hold fixed-length strings");
  const int64_t np = ADGT_H5(H5Sget_simple_extent_npoints(tspace));
  const size_t width = H5Tget_size(ttype);
  std::string text(size_t(np) * width, '\0');
  if (np > 0) ADGT_H5(H5Dread(tds, ttype, H5S_ALL, H5S_ALL, H5P_DEFAULT, text.data()));
  verify_crc(tds, "meta/pieces/tensor", text.data(), text.size(), where);
  std::vector<int32_t> ranks(static_cast<size_t>(np));
  std::vector<int64_t> starts(static_cast<size_t>(2 * np)), counts(static_cast<size_t>(2 * np));
  std::vector<int64_t> offsets(static_cast<size_t>(np));
  std::vector<uint32_t> crcs(static_cast<size_t>(np));
  read_all("rank", H5T_NATIVE_INT32, ranks.data(), np, 1, 4);
  read_all("start", H5T_NATIVE_INT64, starts.data(), np, 2, 8);
  read_all("count", H5T_NATIVE_INT64, counts.data(), np, 2, 8);
  read_all("offset", H5T_NATIVE_INT64, offsets.data(), np, 1, 8);
  read_all("crc32", H5T_NATIVE_UINT32, crcs.data(), np, 1, 4);
  // Rows are blocks; the blocks of one (tensor, rank) are one piece (one dataset).
  std::vector<SrcPiece> out;
  std::map<std::pair<std::string, int32_t>, size_t> piece_of;
  std::set<std::pair<std::string, int32_t>> seen;
  for (int64_t k = 0; k < np; ++k) {
    std::string path(text.data() + k * int64_t(width), width);
    path.resize(std::strlen(path.c_str()));
    if (seen.emplace(path, ranks[size_t(k)]).second) ++count_of[path];
    const size_t slash = path.rfind('/');
    const std::string gname = slash == std::string::npos ? "" : path.substr(0, slash);
    int g = -1;
    for (int q = 0; q < 3; ++q)
      if (gname == kTensorGroups[q]) g = q;
    const auto it = index.find(path.substr(slash + 1));
    if (g < 0 || it == index.end()) continue;  // not this rank's (one that no rank loads is reported later)
    const int32_t rank = ranks[size_t(k)];
    auto [at, fresh] = piece_of.try_emplace({path, rank}, out.size());
    if (fresh) out.push_back(SrcPiece{g, it->second, path, dir / rank_file_name(rank), {}, 0, crcs[size_t(k)]});
    SrcPiece& p = out[at->second];
    if (p.crc != crcs[size_t(k)])
      throw CheckpointError(where + "meta/pieces gives two checksums for " + path + " in " + rank_file_name(rank));
    Block b;
    b.r.nd = 2;
    for (size_t d = 0; d < 2; ++d) {
      b.r.start[d] = starts[size_t(2 * k) + d];
      b.r.count[d] = counts[size_t(2 * k) + d];
    }
    b.src_offset = offsets[size_t(k)];
    p.blocks.push_back(b);
    p.numel += b.r.numel();
  }
  for (SrcPiece& p : out)
    std::sort(p.blocks.begin(), p.blocks.end(),
              [](const Block& a, const Block& b) { return a.src_offset < b.src_offset; });
  return out;
}

// Opens group/<l.name>, checks type and global shape, reads region `mine` into
// dst (the local shard, C order, shape l.shape).
h5::Id read_shard(hid_t group, const std::string& gname, const ParamSpec& l, const Region& mine, float* dst,
                  const std::string& where) {
  const std::string full = gname + "/" + l.name;
  if (ADGT_H5(H5Lexists(group, l.name.c_str(), H5P_DEFAULT)) <= 0)
    throw CheckpointError(where + "tensor " + full + " is missing (the model expects shape " +
                          shape_str(l.global_shape) + ")" + model_hint());
  h5::Id ds(ADGT_H5(H5Dopen2(group, l.name.c_str(), H5P_DEFAULT)), H5Dclose);
  h5::Id type(ADGT_H5(H5Dget_type(ds)), H5Tclose);
  if (ADGT_H5(H5Tget_class(type)) != H5T_FLOAT || H5Tget_size(type) != 4)
    throw CheckpointError(where + "tensor " + full + " is not stored as 32-bit float (HDF5 type size " +
                          std::to_string(H5Tget_size(type)) + "); convert it to float32");
  h5::Id fspace(ADGT_H5(H5Dget_space(ds)), H5Sclose);
  const int nd = ADGT_H5(H5Sget_simple_extent_ndims(fspace));
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  if (nd > 0) ADGT_H5(H5Sget_simple_extent_dims(fspace, dims.data(), nullptr));
  const std::vector<int64_t> got(dims.begin(), dims.end());
  if (got != l.global_shape)
    throw CheckpointError(where + "tensor " + full + " has shape " + shape_str(got) + ", the model expects " +
                          shape_str(l.global_shape) + model_hint());
  if (mine.numel() == 0) return ds;
  if (nd == 0) {
    ADGT_H5(H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst));
    return ds;
  }
  const std::vector<hsize_t> start(mine.start.begin(), mine.start.begin() + nd), count = dims_of(mine);
  ADGT_H5(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr));
  const std::vector<hsize_t> ldims(l.shape.begin(), l.shape.end()), zero(size_t(nd), 0);
  h5::Id mspace(ADGT_H5(H5Screate_simple(nd, ldims.data(), nullptr)), H5Sclose);
  ADGT_H5(H5Sselect_hyperslab(mspace, H5S_SELECT_SET, zero.data(), nullptr, count.data(), nullptr));
  ADGT_H5(H5Dread(ds, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, dst));
  return ds;
}

// The tensors of the checkpoint (group/name, for the three groups in order,
// each by name) and which of them this rank loads: a tensor that no rank loads
// is an error, found once every rank has read its own.
struct FileTensors {
  std::string where;  // "checkpoint <file>: "
  std::vector<std::string> paths;
  std::vector<int32_t> loaded;    // 0 / 1 per path
  std::vector<int32_t> pieces;    // pieces of each path in the file
  std::vector<int32_t> verified;  // pieces of each path this rank verifies
};

CheckpointState read_shards(const std::string& step_dir, const std::vector<ParamSpec>& local, const ShardLayout& lay,
                            FileTensors& listed) {
  const fs::path arg(step_dir);
  std::error_code ec;
  fs::path dir, file;
  if (fs::is_regular_file(arg, ec) || arg.extension() == ".h5") {
    file = arg;
    dir = arg.has_parent_path() ? arg.parent_path() : fs::path(".");
  } else {
    dir = arg;
    file = arg / kH5Name;
  }
  const std::string where = "checkpoint " + file.string() + ": ";
  listed.where = where;
  const fs::path root = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  if (!fs::is_regular_file(file, ec)) throw CheckpointError(where + "file not found" + available_hint(root));
  if (!fs::is_regular_file(dir / kMarkerName, ec))
    throw CheckpointError(where + "no COMPLETE marker in " + dir.string() +
                          ": the save did not finish (the process stopped while writing it); resume from "
                          "another checkpoint" + available_hint(root));
  const auto marker = read_marker(dir / kMarkerName);
  const auto actual_bytes = fs::file_size(file, ec);
  if (auto it = marker.find("bytes"); it != marker.end() && it->second != std::to_string(actual_bytes))
    throw CheckpointError(where + "file is " + std::to_string(actual_bytes) + " bytes but COMPLETE records " +
                          it->second + ": it was truncated or modified after saving; resume from another checkpoint" +
                          available_hint(root));
  check_table(local, "load_checkpoint(" + file.string() + ")");

  CheckpointState st;
  st.specs = local;
  const auto total = static_cast<size_t>(total_numel(local));
  std::vector<float>* bufs[3] = {&st.params, &st.exp_avg, &st.exp_avg_sq};
  // The optimizer state's buffers are made while the weights are read.
  zeroed(st.params, total);
  std::future<void> state_buffers = std::async(std::launch::async, [&st, total] {
    zeroed(st.exp_avg, total);
    zeroed(st.exp_avg_sq, total);
  });
  const size_t n = local.size();
  std::vector<Region> mine(n);
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < n; ++i) {
    const ParamSpec& l = local[i];
    mine[i] = shard_region(l, lay.tp_rank, lay.tp);
    if (l.shard_dim >= 0 &&
        (mine[i].start[size_t(l.shard_dim)] != l.shard_start || mine[i].count[size_t(l.shard_dim)] != l.shard_valid))
      throw CheckpointError("load_checkpoint: parameter " + l.name + " of tp rank " + std::to_string(lay.tp_rank) +
                            " starts at " + std::to_string(l.shard_start) + " but tp=" + std::to_string(lay.tp) +
                            " equal shards put it at " + std::to_string(mine[i].start[size_t(l.shard_dim)]));
    index[l.name] = i;
  }

  h5::QuietErrors quiet;
  try {
    if (ADGT_H5(H5Fis_hdf5(file.c_str())) <= 0)
      throw CheckpointError(where + "not an HDF5 file (damaged or overwritten); resume from another checkpoint" +
                            available_hint(root));
    h5::Id fapl = file_access();
    h5::Id f(ADGT_H5(H5Fopen(file.c_str(), H5F_ACC_RDONLY, fapl)), H5Fclose);
    const int64_t version = read_i64(f, "meta/format_version", where);
    if (version != 1 && version != kFormatVersion)
      throw CheckpointError(where + "format version " + std::to_string(version) +
                            "; this build reads versions 1 and 2");
    st.step = read_i64(f, "meta/step", where);
    st.samples_seen = read_i64(f, "meta/samples_seen", where);
    st.seed = read_u64(f, "meta/seed", where);
    st.config_yaml = read_string(f, "meta/config_yaml", where);
    st.rng_state = read_u64_array(f, "meta/rng_state", where);
    if (auto it = marker.find("step"); it != marker.end() && it->second != std::to_string(st.step))
      throw CheckpointError(where + "meta/step is " + std::to_string(st.step) + " but COMPLETE says step " +
                            it->second + "; the file does not belong to this directory");

    // Pieces and their files (version 2): each must be there, at the size COMPLETE records,
    // before anything reads through the virtual datasets (HDF5 fills a missing source with zeros).
    std::vector<SrcPiece> pieces;
    std::vector<int64_t> covered(3 * n, 0);  // elements of each (group, tensor) in meta/pieces
    std::map<std::string, int32_t> pieces_in_file;  // dataset path -> its pieces (version 1: 1 each)
    if (version == kFormatVersion) {
      pieces = read_piece_table(f, dir, index, where, pieces_in_file);
      for (SrcPiece& p : pieces)
        for (Block& b : p.blocks) b.r.nd = int(local[p.i].global_shape.size());
      for (const SrcPiece& p : pieces) covered[size_t(p.g) * n + p.i] += p.numel;
      std::map<fs::path, std::pair<std::string, int>> held;  // file -> (first tensor, pieces)
      for (const SrcPiece& p : pieces) {
        auto& h = held[p.file];
        if (h.second++ == 0) h.first = p.path + " " + piece_str(p);
      }
      for (const auto& [path, h] : held) {
        const std::string also = h.second > 1 ? " and " + std::to_string(h.second - 1) + " more pieces" : "";
        if (!fs::is_regular_file(path, ec))
          throw CheckpointError(where + "rank file " + path.string() + " is missing; it holds tensor " + h.first +
                                also + ": the checkpoint is incomplete or was damaged after saving; resume from "
                                "another checkpoint" + available_hint(root));
        const auto bytes = fs::file_size(path, ec);
        if (auto it = marker.find("bytes." + path.filename().string());
            it != marker.end() && it->second != std::to_string(bytes))
          throw CheckpointError(where + "rank file " + path.string() + " is " + std::to_string(bytes) +
                                " bytes but COMPLETE records " + it->second + " (it holds tensor " + h.first + also +
                                "): it was truncated or modified after saving; resume from another checkpoint" +
                                available_hint(root));
      }
    }

    // Who verifies each piece (every piece once across the ranks of a stage
    // that hold its tensor): a rank whose shard contains it, from the data it
    // read (round robin among them); else a rank chosen round robin, reading
    // the piece from its file. The pieces of non-expert and of expert tensors
    // are numbered apart (`ordinal`), so that ranks of a stage number them
    // alike even when they hold different experts; an expert's pieces go to
    // the dp ranks of this ep rank (lay.ep_rank + lay.ep * j).
    std::vector<size_t> ordinal;
    size_t next_ordinal[2] = {0, 0};
    auto number = [&](size_t k) {
      ordinal.resize(std::max(ordinal.size(), k + 1));
      ordinal[k] = next_ordinal[local[pieces[k].i].expert >= 0 ? 1 : 0]++;
    };
    for (size_t k = 0; k < pieces.size(); ++k) number(k);
    enum class Check { kNone, kBuffer, kFile };
    auto check_of = [&](size_t k) {
      const SrcPiece& p = pieces[k];
      const bool expert = local[p.i].expert >= 0 && lay.ep > 1;
      const size_t holders = size_t(expert ? lay.dp / lay.ep : lay.dp);  // dp ranks holding the tensor
      const int me = expert ? lay.dp_rank / lay.ep : lay.dp_rank;         // this rank among them
      const size_t o = ordinal[k];
      std::vector<int> cand;  // tp ranks whose shard contains the piece
      for (int t = 0; t < lay.tp; ++t)
        if (p.inside(shard_region(local[p.i], t, lay.tp))) cand.push_back(t);
      if (!cand.empty()) {
        const size_t pick = o % (cand.size() * holders);
        return cand[pick / holders] == lay.tp_rank && int(pick % holders) == me ? Check::kBuffer : Check::kNone;
      }
      return int(o % size_t(lay.tp)) == lay.tp_rank && int(o / size_t(lay.tp) % holders) == me ? Check::kFile
                                                                                             : Check::kNone;
    };
    std::map<std::string, int32_t> verified;  // dataset path -> pieces this rank verifies
    // CRCs of pieces verified from the buffer run on a second thread while the
    // next tensors are read.
    std::vector<std::pair<size_t, std::future<uint32_t>>> pending;
    auto crc_from_buffer = [&](size_t k) {
      const SrcPiece& p = pieces[k];
      const ParamSpec& l = local[p.i];
      Region outer = mine[p.i];
      outer.count[1] = l.shape.size() > 1 ? l.shape[1] : 1;  // the local buffer's row length
      std::vector<ByteRange> ranges;
      for (const Block& b : p.blocks) piece_ranges(bufs[p.g]->data() + l.offset, outer, b.r, ranges);
      pending.emplace_back(k, std::async(std::launch::async, [ranges = std::move(ranges)] {
                             uint32_t c = 0;
                             for (const ByteRange& r : ranges) c = crc32_update(c, r.data, r.bytes);
                             return c;
                           }));
    };
    std::map<std::pair<int, size_t>, std::vector<size_t>> pieces_of;  // (group, param) -> pieces (version 2)
    for (size_t k = 0; k < pieces.size(); ++k) pieces_of[{pieces[k].g, pieces[k].i}].push_back(k);

    // Every tensor: this rank's hyperslab, read through the (virtual or real) dataset.
    std::set<std::string> names;
    for (const ParamSpec& l : local) names.insert(l.name);
    for (int g = 0; g < 3; ++g) {
      const std::string gname = kTensorGroups[g];
      if (ADGT_H5(H5Lexists(f, gname.substr(0, gname.find('/')).c_str(), H5P_DEFAULT)) <= 0 ||
          ADGT_H5(H5Lexists(f, gname.c_str(), H5P_DEFAULT)) <= 0)
        throw CheckpointError(where + "group " + gname + " is missing (see docs/checkpoint-format.md)");
      h5::Id grp(ADGT_H5(H5Gopen2(f, gname.c_str(), H5P_DEFAULT)), H5Gclose);
      if (g == 1) state_buffers.get();
      for (size_t i = 0; i < n; ++i) {
        h5::Id ds = read_shard(grp, gname, local[i], mine[i], bufs[g]->data() + local[i].offset, where);
        if (version == 1) {  // the whole tensor is the piece; its crc is the dataset's attribute
          const Region whole = whole_region(local[i].global_shape, local[i].name);
          SrcPiece p{g, i, gname + "/" + local[i].name, file, {{whole, 0}}, whole.numel(), 0};
          if (!read_crc(ds, &p.crc))
            throw CheckpointError(where + "tensor " + p.path + " has no crc32 attribute (see docs/checkpoint-format.md)");
          pieces.push_back(std::move(p));
          number(pieces.size() - 1);
          if (check_of(pieces.size() - 1) == Check::kBuffer) crc_from_buffer(pieces.size() - 1);
        } else {
          const int64_t want = whole_region(local[i].global_shape, local[i].name).numel();
          if (covered[size_t(g) * n + i] != want)
            throw CheckpointError(where + "meta/pieces covers " + std::to_string(covered[size_t(g) * n + i]) +
                                  " of the " + std::to_string(want) + " elements of tensor " + gname + "/" +
                                  local[i].name + "; the index is damaged");
          for (size_t k : pieces_of[{g, i}])
            if (check_of(k) == Check::kBuffer) crc_from_buffer(k);
        }
      }
      for (const std::string& nm : link_names(grp)) {
        listed.paths.push_back(gname + "/" + nm);
        listed.loaded.push_back(names.count(nm) ? 1 : 0);
        const auto it = pieces_in_file.find(listed.paths.back());
        listed.pieces.push_back(version == 1 ? 1 : it == pieces_in_file.end() ? 0 : it->second);
      }
    }
    for (size_t k = 0; k < pieces.size(); ++k)
      if (check_of(k) != Check::kNone) ++verified[pieces[k].path];
    for (const std::string& path : listed.paths) {
      const auto it = verified.find(path);
      listed.verified.push_back(it == verified.end() ? 0 : it->second);
    }

    std::vector<std::pair<size_t, uint32_t>> got;  // (piece, computed crc)
    for (auto& [k, fut] : pending) got.emplace_back(k, fut.get());
    std::map<fs::path, h5::Id> open_files;
    std::vector<float> read_back;
    for (size_t k = 0; k < pieces.size(); ++k) {
      if (check_of(k) != Check::kFile) continue;
      const SrcPiece& p = pieces[k];
      const std::string at = where + "tensor " + p.path + " " + piece_str(p) + " in " + p.file.string() + ": ";
      try {
        hid_t src = f;
        if (p.file != file) {
          auto it = open_files.find(p.file);
          if (it == open_files.end())
            it = open_files.emplace(p.file, h5::Id(ADGT_H5(H5Fopen(p.file.c_str(), H5F_ACC_RDONLY, fapl)), H5Fclose))
                     .first;
          src = it->second;
        }
        h5::Id ds = open_dataset(src, p.path, at);
        h5::Id space(ADGT_H5(H5Dget_space(ds)), H5Sclose);
        if (ADGT_H5(H5Sget_simple_extent_npoints(space)) != p.numel)
          throw CheckpointError(at + "the dataset's size differs from the piece table's");
        read_back.resize(size_t(p.numel));
        ADGT_H5(H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, read_back.data()));
      } catch (const h5::Error& e) {
        throw CheckpointError(at + "cannot read it: " + e.what() + "; resume from another checkpoint" +
                              available_hint(root));
      }
      got.emplace_back(k, crc32_many({{read_back.data(), read_back.size() * sizeof(float)}})[0]);
    }
    // Report the first failure in piece order.
    std::sort(got.begin(), got.end());
    for (const auto& [k, crc] : got) {
      const SrcPiece& p = pieces[k];
      if (crc == p.crc) continue;
      const std::string sums = "stored crc32 " + hex32(p.crc) + ", computed " + hex32(crc);
      if (version == 1)
        throw CheckpointError(where + "tensor " + p.path + " fails its checksum (" + sums +
                              "): the file is corrupt; resume from another checkpoint" + available_hint(root));
      throw CheckpointError(where + "tensor " + p.path + " fails its checksum: piece " + piece_str(p) + " in " +
                            p.file.string() + " (" + sums + ") is corrupt; resume from another checkpoint" +
                            available_hint(root));
    }
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError(where + e.what());
  }
  return st;
}

// ep divides dp and this rank's ep rank is its dp rank mod ep.
void check_expert_layout(const ShardLayout& lay, const std::string& who) {
  if (lay.ep < 1 || lay.dp % lay.ep != 0 || lay.ep_rank != lay.dp_rank % lay.ep)
    throw CheckpointError(who + ": expert parallelism ep " + std::to_string(lay.ep) + " (this rank ep " +
                          std::to_string(lay.ep_rank) + ", dp " + std::to_string(lay.dp_rank) + " of dp " +
                          std::to_string(lay.dp) + "): ep must divide dp and ep_rank = dp_rank % ep");
}

}  // namespace

// ---------------------------------------------------------------- public API

bool Region::contains(const Region& o) const {
  for (size_t d = 0; d < 2; ++d)
    if (o.start[d] < start[d] || o.start[d] + o.count[d] > start[d] + count[d]) return false;
  return true;
}

Region shard_region(const ParamSpec& l, int tp_rank, int tp) {
  Region r = whole_region(l.global_shape, l.name);
  if (l.shard_dim < 0 || tp <= 1) return r;
  const auto d = size_t(l.shard_dim);
  const int64_t ext = l.shape[d], s = int64_t(tp_rank) * ext;
  r.start[d] = s;
  r.count[d] = std::clamp<int64_t>(l.global_shape[d] - s, 0, ext);
  return r;
}

std::vector<int> piece_writers(const std::vector<ParamSpec>& local, int dp, int ep, int ep_rank) {
  std::vector<int> w(local.size(), 0);
  if (dp <= 1) return w;
  if (ep < 1 || dp % ep != 0 || ep_rank < 0 || ep_rank >= ep)
    throw CheckpointError("piece_writers: ep " + std::to_string(ep) + " (rank " + std::to_string(ep_rank) +
                          ") does not divide dp " + std::to_string(dp));
  std::vector<size_t> order(local.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return local[a].numel > local[b].numel; });
  std::vector<int64_t> load(size_t(dp), 0);
  // The non-expert tensors over every dp rank (the same on every ep rank), then
  // the expert weights over the dp ranks of this ep rank (ep_rank + ep * j).
  for (const bool experts : {false, true}) {
    const int stride = experts ? ep : 1, first = experts ? ep_rank : 0;
    for (size_t i : order) {
      if ((local[i].expert >= 0) != experts) continue;
      int best = first;
      for (int d = first; d < dp; d += stride)
        if (load[size_t(d)] < load[size_t(best)]) best = d;
      w[i] = best;
      load[size_t(best)] += std::max<int64_t>(local[i].numel, 1);
    }
  }
  return w;
}

bool writes_piece(const std::vector<ParamSpec>& local, const std::vector<int>& writers, size_t i,
                  const ShardLayout& lay) {
  const ParamSpec& l = local[i];
  if (writers[i] != lay.dp_rank) return false;
  if ((l.shard_dim < 0 || lay.tp <= 1) && lay.tp_rank != 0) return false;
  return shard_region(l, lay.tp_rank, lay.tp).numel() > 0;
}

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

std::string save_checkpoint_sharded(const std::string& root, const CheckpointState& st, const ShardLayout& lay,
                                    Comm& world, int64_t keep) {
  const int R = world.rank(), W = world.size();
  const std::string who = "save_checkpoint(" + root + ", step " + std::to_string(st.step) + ")";
  const fs::path rootp(root);
  const std::string name = "step_" + std::to_string(st.step);
  std::string err;
  bool tmp_made = false;
  fs::path tmp;
  std::vector<int> writers;
  std::error_code ec;

  // 1. Checks everywhere; rank 0 makes the temporary directory and tells the others its name.
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
    writers = piece_writers(st.specs, lay.dp, lay.ep, lay.ep_rank);
    if (R == 0) {
      fs::create_directories(rootp, ec);
      if (ec) throw CheckpointError(who + ": cannot create " + root + ": " + ec.message());
      tmp = rootp / (".tmp_" + name + "_" + std::to_string(::getpid()));
      fs::remove_all(tmp);
      fs::create_directory(tmp);
      tmp_made = true;
    }
  });
  int32_t hdr[3] = {int32_t(::getpid()), int32_t(st.step & 0x7fffffff), int32_t(st.step >> 31)};
  world.broadcast(Tensor(hdr, DType::I32, {3}), 0);
  tmp = rootp / (".tmp_" + name + "_" + std::to_string(hdr[0]));
  guarded(err, who, [&] {
    if (hdr[1] != int32_t(st.step & 0x7fffffff) || hdr[2] != int32_t(st.step >> 31))
      throw CheckpointError(who + ": rank " + std::to_string(R) + " saves step " + std::to_string(st.step) +
                            " but rank 0 another step; every rank must save the same step");
  });
  auto fail = [&](const std::string& msg) {
    if (R == 0 && tmp_made) fs::remove_all(tmp, ec);
    throw CheckpointError(msg);
  };
  if (std::string e = agree_error(world, err); !e.empty()) fail(e);

  // 2. Every rank writes, fsyncs and describes its file.
  std::vector<int64_t> report;
  guarded(err, who, [&] {
    if (!fs::is_directory(tmp, ec))
      throw CheckpointError(who + ": rank " + std::to_string(R) + " does not see " + tmp.string() +
                            ", which rank 0 created: checkpoint.dir must be on a filesystem that every rank shares");
    const fs::path file = tmp / rank_file_name(R);
    std::vector<int64_t> pieces;
    try {
      h5::QuietErrors quiet;
      pieces = write_rank_file(file, st, lay, writers);
    } catch (const h5::Error& e) {
      throw CheckpointError("writing checkpoint " + file.string() + ": " + e.what());
    }
    fsync_path(file, false);
    report = encode_report(st, lay, std::move(pieces), int64_t(fs::file_size(file)));
  });
  if (std::string e = agree_error(world, err); !e.empty()) fail(e);
  // 3. The reports (tensor names, blocks, checksums) go to rank 0 only.
  std::vector<size_t> at;
  const std::vector<int64_t> all = gather_to_root(world, std::move(report), at);

  // 4. Rank 0: the index, COMPLETE, the rename, pruning.
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
                                             "\nstep=" + std::to_string(st.step) + "\nfile=" + kH5Name +
                                             "\nbytes=" + std::to_string(fs::file_size(index)) +
                                             "\nrank_files=" + std::to_string(W) + "\n" + sizes);
    fsync_path(tmp, true);
    install(tmp, rootp / name);
    fsync_path(rootp, true);
    prune(rootp, keep, st.step);
  });
  if (std::string e = agree_error(world, err); !e.empty()) fail(e);
  return (rootp / name).string();
}

CheckpointState load_checkpoint_sharded(const std::string& step_dir, const std::vector<ParamSpec>& local,
                                        const ShardLayout& lay, Comm& world) {
  const int W = world.size();
  const std::string who = "load_checkpoint(" + step_dir + ")";
  std::string err;
  CheckpointState st;
  FileTensors listed;
  guarded(err, who, [&] {
    // A world of one may stand in for one rank of a bigger layout (tests, tools).
    if (lay.tp < 1 || lay.dp < 1 || lay.pp < 1 || (W > 1 && int64_t(lay.tp) * lay.dp * lay.pp != W) ||
        lay.tp_rank < 0 || lay.tp_rank >= lay.tp || lay.dp_rank < 0 || lay.dp_rank >= lay.dp || lay.pp_rank < 0 ||
        lay.pp_rank >= lay.pp)
      throw CheckpointError(who + ": layout tp " + std::to_string(lay.tp) + " x dp " + std::to_string(lay.dp) +
                            " x pp " + std::to_string(lay.pp) + " (this rank tp " + std::to_string(lay.tp_rank) +
                            ", dp " + std::to_string(lay.dp_rank) + ", pp " + std::to_string(lay.pp_rank) +
                            ") does not match the " + std::to_string(W) + " ranks loading");
    check_expert_layout(lay, who);
    st = read_shards(step_dir, local, lay, listed);
  });
  // Every tensor of the checkpoint must be loaded by some rank (each pipeline
  // stage loads its own), and every piece of a loaded tensor verified by some
  // rank. The calls below do not depend on the tables: first whether every
  // rank read the same list of tensors (count and hash; -1 after an error),
  // then, if so, how many ranks load each and how many of its pieces they verify.
  const bool whole_layout = int64_t(lay.tp) * lay.dp * lay.pp == W;
  if (!(W == 1 && (lay.pp > 1 || lay.ep > 1))) {
    uint32_t h = 2166136261u;
    for (const std::string& p : listed.paths)
      for (size_t k = 0; k <= p.size(); ++k) h = (h ^ uint8_t(k < p.size() ? p[k] : 0)) * 16777619u;
    const auto count = int32_t(listed.paths.size());
    const auto hash = int32_t(h & 0x3fffffff);
    const bool ok = err.empty();
    int32_t agree[4] = {ok ? count : -1, ok ? -count : 1, ok ? hash : -1, ok ? -hash : 1};  // max and -min of each
    world.all_reduce(Tensor(agree, DType::I32, {4}), ReduceOp::Max);
    if (agree[0] >= 0 && agree[0] == -agree[1] && agree[2] == -agree[3]) {
      std::vector<int32_t> sums(listed.loaded);  // ranks loading each path, then pieces verified of each
      sums.insert(sums.end(), listed.verified.begin(), listed.verified.end());
      if (count > 0) world.all_reduce(Tensor(sums.data(), DType::I32, {2 * int64_t(count)}), ReduceOp::Sum);
      for (size_t k = 0; k < listed.paths.size() && err.empty(); ++k)
        if (sums[k] == 0)
          err = listed.where + "tensor " + listed.paths[k] + " is in the checkpoint but not in the model" +
                (W > 1 ? " (no rank of the " + std::to_string(W) + " loading holds it)" : std::string()) +
                model_hint();
      for (size_t k = 0; k < listed.paths.size() && err.empty() && whole_layout; ++k)
        if (sums[size_t(count) + k] < listed.pieces[k])
          err = listed.where + "only " + std::to_string(sums[size_t(count) + k]) + " of the " +
                std::to_string(listed.pieces[k]) + " pieces of tensor " + listed.paths[k] +
                " were verified: the ranks' parameter tables do not match the layout they pass (tp " +
                std::to_string(lay.tp) + ", dp " + std::to_string(lay.dp) + ", pp " + std::to_string(lay.pp) +
                ", ep " + std::to_string(lay.ep) +
                "); with expert parallelism pass ShardLayout::ep and ep_rank (ranks of one stage may "
                "differ only in their ep rank's experts)";
    } else if (agree[1] <= 0 && err.empty()) {  // every rank read a list, but not the same one
      err = listed.where + "the " + std::to_string(W) + " ranks see different checkpoints (from " +
            std::to_string(-agree[1]) + " to " + std::to_string(agree[0]) +
            " datasets under model/ and optim/); every rank must load the same step directory, from a "
            "filesystem they all share";
    }
  }
  if (std::string e = agree_error(world, err); !e.empty()) throw CheckpointError(e);
  return st;
}

}  // namespace adgt

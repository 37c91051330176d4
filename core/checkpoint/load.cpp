// Format version 2 (and 1), the load: each rank reads the hyperslab of its own
// shard of each of its tensors through the index's virtual datasets, checks
// the rank files against COMPLETE and meta/pieces, and verifies every piece's
// crc32 once per pipeline stage. What a rank reads is
// core/checkpoint/geometry.hpp (needed_regions); the format is described in
// docs/checkpoint-format.md; keep the two in step.
#include <algorithm>
#include <cstring>
#include <future>
#include <map>
#include <set>

#include "core/checkpoint/common.hpp"
#include "core/checkpoint/sharded.hpp"
#include "core/checkpoint/sharded_internal.hpp"
#include "core/checkpoint/checksum.hpp"
#include "core/checkpoint/hdf5_util.hpp"

namespace adgt {

using namespace ckpt;  // NOLINT: the helpers of the checkpoint module

namespace {

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

// Where a checkpoint is: its index file, the step directory and the directory
// of steps (for available_hint).
struct CheckpointFiles {
  fs::path dir, file, root;
  std::string where;  // "checkpoint <file>: "
  std::map<std::string, std::string> marker;  // what COMPLETE records (check_complete)
};

// step_dir is a step directory or its index file.
CheckpointFiles checkpoint_files(const std::string& step_dir) {
  const fs::path arg(step_dir);
  std::error_code ec;
  CheckpointFiles cf;
  if (fs::is_regular_file(arg, ec) || arg.extension() == ".h5") {
    cf.file = arg;
    cf.dir = arg.has_parent_path() ? arg.parent_path() : fs::path(".");
  } else {
    cf.dir = arg;
    cf.file = arg / kH5Name;
  }
  cf.where = "checkpoint " + cf.file.string() + ": ";
  cf.root = cf.dir.has_parent_path() ? cf.dir.parent_path() : fs::path(".");
  return cf;
}

// The index file is there, the save finished (COMPLETE), and the file has the
// size COMPLETE records; cf.marker gets COMPLETE's records.
void check_complete(CheckpointFiles& cf) {
  std::error_code ec;
  const std::string& where = cf.where;
  if (!fs::is_regular_file(cf.file, ec)) throw CheckpointError(where + "file not found" + available_hint(cf.root));
  if (!fs::is_regular_file(cf.dir / kMarkerName, ec))
    throw CheckpointError(where + "no COMPLETE marker in " + cf.dir.string() +
                          ": the save did not finish (the process stopped while writing it); resume from "
                          "another checkpoint" + available_hint(cf.root));
  cf.marker = read_marker(cf.dir / kMarkerName);
  const auto actual_bytes = fs::file_size(cf.file, ec);
  if (auto it = cf.marker.find("bytes"); it != cf.marker.end() && it->second != std::to_string(actual_bytes))
    throw CheckpointError(where + "file is " + std::to_string(actual_bytes) + " bytes but COMPLETE records " +
                          it->second + ": it was truncated or modified after saving; resume from another checkpoint" +
                          available_hint(cf.root));
}

// How a rank verifies a piece: not at all (another rank does), from the data
// it read into its buffer, or by reading the piece from its file.
enum class Check { kNone, kBuffer, kFile };

// One rank's load of one checkpoint: reads meta/ into the state, this rank's
// hyperslab of each of its tensors into the state's buffers, and verifies the
// crc32 of the pieces that fall to it; fills `listed` with the checkpoint's
// tensors for the check across ranks (load_checkpoint_sharded).
class ShardReader {
 public:
  ShardReader(const CheckpointFiles& cf, const std::vector<ParamSpec>& local, const ShardLayout& lay,
              CheckpointState& st, FileTensors& listed)
      : cf_(cf), local_(local), lay_(lay), st_(st), listed_(listed), n_(local.size()),
        mine_(needed_regions(local, lay)) {
    for (size_t i = 0; i < n_; ++i) index_[local[i].name] = i;
  }

  // The whole load; state_buffers makes the optimizer state's buffers, which
  // the read of optim/ waits for.
  void run(std::future<void>& state_buffers) {
    const std::string& where = cf_.where;
    if (ADGT_H5(H5Fis_hdf5(cf_.file.c_str())) <= 0)
      throw CheckpointError(where + "not an HDF5 file (damaged or overwritten); resume from another checkpoint" +
                            available_hint(cf_.root));
    h5::Id fapl = file_access();
    h5::Id f(ADGT_H5(H5Fopen(cf_.file.c_str(), H5F_ACC_RDONLY, fapl)), H5Fclose);
    read_meta(f);
    covered_.assign(3 * n_, 0);
    if (version_ == kFormatVersion) read_pieces(f);
    for (size_t k = 0; k < pieces_.size(); ++k) number(k);
    for (size_t k = 0; k < pieces_.size(); ++k) pieces_of_[{pieces_[k].g, pieces_[k].i}].push_back(k);
    read_groups(f, state_buffers);
    count_verified();
    std::vector<std::pair<size_t, uint32_t>> got;  // (piece, computed crc)
    for (auto& [k, fut] : pending_) got.emplace_back(k, fut.get());
    verify_from_files(f, fapl, got);
    report_first_failure(got);
  }

 private:
  // meta/: the format version, the step and the state; the step must be the one COMPLETE records.
  void read_meta(hid_t f) {
    const std::string& where = cf_.where;
    version_ = read_i64(f, "meta/format_version", where);
    if (version_ != 1 && version_ != kFormatVersion)
      throw CheckpointError(where + "format version " + std::to_string(version_) +
                            "; this build reads versions 1 and 2");
    st_.step = read_i64(f, "meta/step", where);
    st_.samples_seen = read_i64(f, "meta/samples_seen", where);
    st_.seed = read_u64(f, "meta/seed", where);
    st_.config_yaml = read_string(f, "meta/config_yaml", where);
    st_.rng_state = read_u64_array(f, "meta/rng_state", where);
    st_.state = read_state(f, where);
    if (auto it = cf_.marker.find("step"); it != cf_.marker.end() && it->second != std::to_string(st_.step))
      throw CheckpointError(where + "meta/step is " + std::to_string(st_.step) + " but COMPLETE says step " +
                            it->second + "; the file does not belong to this directory");
  }

  // Version 2: the pieces of this rank's tensors and their files. Each file
  // must be there, at the size COMPLETE records, before anything reads
  // through the virtual datasets (HDF5 fills a missing source with zeros).
  void read_pieces(hid_t f) {
    std::error_code ec;
    const std::string& where = cf_.where;
    pieces_ = read_piece_table(f, cf_.dir, index_, where, pieces_in_file_);
    for (SrcPiece& p : pieces_)
      for (Block& b : p.blocks) b.r.nd = int(local_[p.i].global_shape.size());
    for (const SrcPiece& p : pieces_) covered_[size_t(p.g) * n_ + p.i] += p.numel;
    std::map<fs::path, std::pair<std::string, int>> held;  // file -> (first tensor, pieces)
    for (const SrcPiece& p : pieces_) {
      auto& h = held[p.file];
      if (h.second++ == 0) h.first = p.path + " " + piece_str(p);
    }
    for (const auto& [path, h] : held) {
      const std::string also = h.second > 1 ? " and " + std::to_string(h.second - 1) + " more pieces" : "";
      if (!fs::is_regular_file(path, ec))
        throw CheckpointError(where + "rank file " + path.string() + " is missing; it holds tensor " + h.first +
                              also + ": the checkpoint is incomplete or was damaged after saving; resume from "
                              "another checkpoint" + available_hint(cf_.root));
      const auto bytes = fs::file_size(path, ec);
      if (auto it = cf_.marker.find("bytes." + path.filename().string());
          it != cf_.marker.end() && it->second != std::to_string(bytes))
        throw CheckpointError(where + "rank file " + path.string() + " is " + std::to_string(bytes) +
                              " bytes but COMPLETE records " + it->second + " (it holds tensor " + h.first + also +
                              "): it was truncated or modified after saving; resume from another checkpoint" +
                              available_hint(cf_.root));
    }
  }

  // Who verifies each piece (every piece once across the ranks of a stage
  // that hold its tensor): a rank whose shard contains it, from the data it
  // read (round robin among them); else a rank chosen round robin, reading
  // the piece from its file. The pieces of non-expert and of expert tensors
  // are numbered apart (`ordinal`), so that ranks of a stage number them
  // alike even when they hold different experts; an expert's pieces go to
  // the dp ranks of this ep rank (lay.ep_rank + lay.ep * j).
  void number(size_t k) {
    ordinal_.resize(std::max(ordinal_.size(), k + 1));
    ordinal_[k] = next_ordinal_[local_[pieces_[k].i].expert >= 0 ? 1 : 0]++;
  }
  Check check_of(size_t k) const {
    const SrcPiece& p = pieces_[k];
    const bool expert = local_[p.i].expert >= 0 && lay_.ep > 1;
    const size_t holders = size_t(expert ? lay_.dp / lay_.ep : lay_.dp);  // dp ranks holding the tensor
    const int me = expert ? lay_.dp_rank / lay_.ep : lay_.dp_rank;         // this rank among them
    const size_t o = ordinal_[k];
    std::vector<int> cand;  // tp ranks whose shard contains the piece
    for (int t = 0; t < lay_.tp; ++t)
      if (p.inside(shard_region(local_[p.i], t, lay_.tp))) cand.push_back(t);
    if (!cand.empty()) {
      const size_t pick = o % (cand.size() * holders);
      return cand[pick / holders] == lay_.tp_rank && int(pick % holders) == me ? Check::kBuffer : Check::kNone;
    }
    return int(o % size_t(lay_.tp)) == lay_.tp_rank && int(o / size_t(lay_.tp) % holders) == me ? Check::kFile
                                                                                                : Check::kNone;
  }

  // The CRC of piece k from the buffer, on a second thread while the next
  // tensors are read.
  void crc_from_buffer(size_t k) {
    const SrcPiece& p = pieces_[k];
    const ParamSpec& l = local_[p.i];
    Region outer = mine_[p.i];
    outer.count[1] = l.shape.size() > 1 ? l.shape[1] : 1;  // the local buffer's row length
    std::vector<ByteRange> ranges;
    for (const Block& b : p.blocks) piece_ranges(buffer(p.g)->data() + l.offset, outer, b.r, ranges);
    pending_.emplace_back(k, std::async(std::launch::async, [ranges = std::move(ranges)] {
                            uint32_t c = 0;
                            for (const ByteRange& r : ranges) c = crc32_update(c, r.data, r.bytes);
                            return c;
                          }));
  }

  // The buffer of tensor group g: weights, first and second moments.
  std::vector<float>* buffer(int g) const {
    std::vector<float>* bufs[3] = {&st_.params, &st_.exp_avg, &st_.exp_avg_sq};
    return bufs[g];
  }

  // Every tensor: this rank's hyperslab, read through the (virtual or real)
  // dataset; and the names of the checkpoint's tensors, into listed_.
  void read_groups(hid_t f, std::future<void>& state_buffers) {
    std::set<std::string> names;
    for (const ParamSpec& l : local_) names.insert(l.name);
    for (int g = 0; g < 3; ++g) {
      const std::string gname = kTensorGroups[g];
      if (ADGT_H5(H5Lexists(f, gname.substr(0, gname.find('/')).c_str(), H5P_DEFAULT)) <= 0 ||
          ADGT_H5(H5Lexists(f, gname.c_str(), H5P_DEFAULT)) <= 0)
        throw CheckpointError(cf_.where + "group " + gname + " is missing (see docs/checkpoint-format.md)");
      h5::Id grp(ADGT_H5(H5Gopen2(f, gname.c_str(), H5P_DEFAULT)), H5Gclose);
      if (g == 1) state_buffers.get();
      for (size_t i = 0; i < n_; ++i) read_tensor(grp, g, gname, i);
      for (const std::string& nm : link_names(grp)) {
        listed_.paths.push_back(gname + "/" + nm);
        listed_.loaded.push_back(names.count(nm) ? 1 : 0);
        const auto it = pieces_in_file_.find(listed_.paths.back());
        listed_.pieces.push_back(version_ == 1 ? 1 : it == pieces_in_file_.end() ? 0 : it->second);
      }
    }
  }

  // Tensor i of group g: reads it and starts the CRCs of its pieces this rank
  // verifies from the buffer. Version 1: the whole tensor is the piece, its
  // crc the dataset's attribute; version 2: meta/pieces must cover it.
  void read_tensor(hid_t grp, int g, const std::string& gname, size_t i) {
    const std::string& where = cf_.where;
    const ParamSpec& l = local_[i];
    h5::Id ds = read_shard(grp, gname, l, mine_[i], buffer(g)->data() + l.offset, where);
    if (version_ == 1) {
      const Region whole = whole_region(l.global_shape, l.name);
      SrcPiece p{g, i, gname + "/" + l.name, cf_.file, {{whole, 0}}, whole.numel(), 0};
      if (!read_crc(ds, &p.crc))
        throw CheckpointError(where + "tensor " + p.path + " has no crc32 attribute (see docs/checkpoint-format.md)");
      pieces_.push_back(std::move(p));
      number(pieces_.size() - 1);
      if (check_of(pieces_.size() - 1) == Check::kBuffer) crc_from_buffer(pieces_.size() - 1);
    } else {
      const int64_t want = whole_region(l.global_shape, l.name).numel();
      if (covered_[size_t(g) * n_ + i] != want)
        throw CheckpointError(where + "meta/pieces covers " + std::to_string(covered_[size_t(g) * n_ + i]) +
                              " of the " + std::to_string(want) + " elements of tensor " + gname + "/" + l.name +
                              "; the index is damaged");
      for (size_t k : pieces_of_[{g, i}])
        if (check_of(k) == Check::kBuffer) crc_from_buffer(k);
    }
  }

  // The pieces of each listed tensor this rank verifies.
  void count_verified() {
    std::map<std::string, int32_t> verified;  // dataset path -> pieces this rank verifies
    for (size_t k = 0; k < pieces_.size(); ++k)
      if (check_of(k) != Check::kNone) ++verified[pieces_[k].path];
    for (const std::string& path : listed_.paths) {
      const auto it = verified.find(path);
      listed_.verified.push_back(it == verified.end() ? 0 : it->second);
    }
  }

  // The pieces this rank verifies from their files: each read whole and its
  // CRC appended to `got`.
  void verify_from_files(hid_t f, hid_t fapl, std::vector<std::pair<size_t, uint32_t>>& got) {
    std::map<fs::path, h5::Id> open_files;
    std::vector<float> read_back;
    for (size_t k = 0; k < pieces_.size(); ++k) {
      if (check_of(k) != Check::kFile) continue;
      const SrcPiece& p = pieces_[k];
      const std::string at = cf_.where + "tensor " + p.path + " " + piece_str(p) + " in " + p.file.string() + ": ";
      try {
        hid_t src = f;
        if (p.file != cf_.file) {
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
                              available_hint(cf_.root));
      }
      got.emplace_back(k, crc32_many({{read_back.data(), read_back.size() * sizeof(float)}})[0]);
    }
  }

  // Throws for the first piece, in piece order, whose computed CRC differs from the stored one.
  void report_first_failure(std::vector<std::pair<size_t, uint32_t>>& got) const {
    const std::string& where = cf_.where;
    std::sort(got.begin(), got.end());
    for (const auto& [k, crc] : got) {
      const SrcPiece& p = pieces_[k];
      if (crc == p.crc) continue;
      const std::string sums = "stored crc32 " + hex32(p.crc) + ", computed " + hex32(crc);
      if (version_ == 1)
        throw CheckpointError(where + "tensor " + p.path + " fails its checksum (" + sums +
                              "): the file is corrupt; resume from another checkpoint" + available_hint(cf_.root));
      throw CheckpointError(where + "tensor " + p.path + " fails its checksum: piece " + piece_str(p) + " in " +
                            p.file.string() + " (" + sums + ") is corrupt; resume from another checkpoint" +
                            available_hint(cf_.root));
    }
  }

  const CheckpointFiles& cf_;
  const std::vector<ParamSpec>& local_;
  const ShardLayout& lay_;
  CheckpointState& st_;
  FileTensors& listed_;
  const size_t n_;
  const std::vector<Region> mine_;      // what this rank reads of each tensor
  std::map<std::string, size_t> index_;  // name -> position in local_
  int64_t version_ = 0;
  std::vector<SrcPiece> pieces_;
  std::vector<int64_t> covered_;                  // elements of each (group, tensor) in meta/pieces
  std::map<std::string, int32_t> pieces_in_file_;  // dataset path -> its pieces (version 1: 1 each)
  std::map<std::pair<int, size_t>, std::vector<size_t>> pieces_of_;  // (group, param) -> pieces (version 2)
  std::vector<size_t> ordinal_;                   // per piece (number)
  size_t next_ordinal_[2] = {0, 0};               // non-expert, expert
  // CRCs of pieces verified from the buffer, computing on other threads.
  std::vector<std::pair<size_t, std::future<uint32_t>>> pending_;
};

CheckpointState read_shards(const std::string& step_dir, const std::vector<ParamSpec>& local, const ShardLayout& lay,
                            FileTensors& listed) {
  CheckpointFiles cf = checkpoint_files(step_dir);
  listed.where = cf.where;
  check_complete(cf);
  check_table(local, "load_checkpoint(" + cf.file.string() + ")");

  CheckpointState st;
  st.specs = local;
  const auto total = static_cast<size_t>(total_numel(local));
  // The optimizer state's buffers are made while the weights are read.
  zeroed(st.params, total);
  std::future<void> state_buffers = std::async(std::launch::async, [&st, total] {
    zeroed(st.exp_avg, total);
    zeroed(st.exp_avg_sq, total);
  });
  ShardReader reader(cf, local, lay, st, listed);

  h5::QuietErrors quiet;
  try {
    reader.run(state_buffers);
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError(cf.where + e.what());
  }
  return st;
}

}  // namespace

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

namespace adgt {

SavedLayout saved_layout(const std::string& step_dir) {
  std::filesystem::path file = step_dir;
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) file /= "checkpoint.h5";
  const std::string where = file.string() + ": ";
  try {
    h5::QuietErrors quiet;
    h5::Id f(ADGT_H5(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)), H5Fclose);
    if (ADGT_H5(H5Lexists(f, "meta/layout", H5P_DEFAULT)) <= 0) return {};
    return {read_string(f, "meta/layout", where), read_i64(f, "meta/world_size", where)};
  } catch (const h5::Error& e) {
    throw CheckpointError("reading " + file.string() + ": " + e.what());
  }
}

std::map<std::string, StateEntry> load_rank_state(const std::string& step_dir, int world_rank) {
  const std::filesystem::path file = std::filesystem::path(step_dir) / rank_file_name(world_rank);
  const std::string where = file.string() + ": ";
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return {};  // a checkpoint of fewer ranks, or version 1
  try {
    h5::QuietErrors quiet;
    h5::Id fapl = file_access();
    h5::Id f(ADGT_H5(H5Fopen(file.c_str(), H5F_ACC_RDONLY, fapl)), H5Fclose);
    return read_state(f, where);
  } catch (const h5::Error& e) {
    throw CheckpointError("reading " + file.string() + ": " + e.what());
  }
}

}  // namespace adgt

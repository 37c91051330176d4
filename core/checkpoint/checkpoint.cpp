// Checkpoint save (format version 1, one file of whole tensors) and the
// public entry points. The file layout and the save protocol are described in
// docs/checkpoint-format.md; keep the two in step. Version 2 (per-rank files,
// the trainer's format) is core/checkpoint/save.cpp and load.cpp; load_checkpoint reads both.
#include "core/checkpoint/checkpoint.hpp"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <filesystem>

#include "core/checkpoint/common.hpp"
#include "core/checkpoint/sharded.hpp"
#include "core/checkpoint/checksum.hpp"
#include "core/checkpoint/hdf5_util.hpp"

namespace adgt {

using namespace ckpt;  // NOLINT: the helpers of the checkpoint module
static_assert(std::endian::native == std::endian::little,
              "checkpoint checksums are defined over little-endian bytes; add byte swapping "
              "before building on a big-endian host");

namespace {

constexpr int64_t kFormatVersion = 1;

// "step_123" -> 123; -1 for anything else.
int64_t parse_step_name(const std::string& name) {
  constexpr std::string_view kPrefix = "step_";
  if (name.size() <= kPrefix.size() || name.compare(0, kPrefix.size(), kPrefix) != 0) return -1;
  const char* b = name.data() + kPrefix.size();
  const char* e = name.data() + name.size();
  if (*b == '0' && e - b > 1) return -1;  // the writer never pads: "step_007" is not ours
  int64_t v = -1;
  auto [p, ec] = std::from_chars(b, e, v);
  if (ec != std::errc() || p != e || v < 0) return -1;
  return v;
}

void write_h5(const fs::path& path, const CheckpointState& st) {
  const size_t n = st.specs.size();
  const std::vector<float>* bufs[3] = {&st.params, &st.exp_avg, &st.exp_avg_sq};
  // Checksums first, on all threads (HDF5 itself is called from this thread only).
  std::vector<ByteRange> ranges;
  ranges.reserve(3 * n);
  for (const auto* b : bufs)
    for (const ParamSpec& p : st.specs)
      ranges.push_back({b->data() + p.offset, static_cast<size_t>(p.numel) * sizeof(float)});
  const std::vector<uint32_t> crcs = crc32_many(ranges);

  h5::Id fapl = file_access();
  // Format objects readable by any HDF5 >= 1.8; align large datasets to 4 KiB.
  ADGT_H5(H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V18));
  ADGT_H5(H5Pset_alignment(fapl, 64 * 1024, 4096));
  h5::Id dcpl(ADGT_H5(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
  ADGT_H5(H5Pset_layout(dcpl, H5D_CONTIGUOUS));
  ADGT_H5(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));  // every byte is written anyway

  h5::Id file(ADGT_H5(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl)), H5Fclose);
  {
    h5::Id optim(ADGT_H5(H5Gcreate2(file, "optim", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Gclose);
    for (int g = 0; g < 3; ++g) {
      h5::Id grp = create_group(file, kTensorGroups[g]);
      for (size_t i = 0; i < n; ++i) {
        const ParamSpec& p = st.specs[i];
        write_array(grp, p.name.c_str(), H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, bufs[g]->data() + p.offset, p.shape,
                    crcs[g * n + i], dcpl);
      }
    }
    h5::Id meta = create_group(file, "meta");
    write_meta(meta, st, kFormatVersion);
    write_state(file, st);
  }
  ADGT_H5(H5Fclose(file.release()));
}

}  // namespace

// ---------------------------------------------------------------- public API

std::string save_checkpoint(const std::string& root, const CheckpointState& st, int64_t keep) {
  const std::string who = "save_checkpoint(" + root + ", step " + std::to_string(st.step) + ")";
  if (root.empty()) throw CheckpointError(who + ": checkpoint.dir is empty; set it to a directory");
  if (st.step < 0) throw CheckpointError(who + ": step must be >= 0");
  if (keep < 0) throw CheckpointError(who + ": keep=" + std::to_string(keep) + " must be >= 0 (0 keeps all)");
  check_table(st.specs, who);
  const auto total = static_cast<size_t>(total_numel(st.specs));
  const std::pair<const char*, const std::vector<float>*> bufs[3] = {
      {"params", &st.params}, {"exp_avg", &st.exp_avg}, {"exp_avg_sq", &st.exp_avg_sq}};
  for (const auto& [nm, b] : bufs)
    if (b->size() != total)
      throw CheckpointError(who + ": " + nm + " has " + std::to_string(b->size()) +
                            " floats, the parameter table needs total_numel(specs) = " + std::to_string(total));

  const fs::path rootp(root);
  std::error_code ec;
  fs::create_directories(rootp, ec);
  if (ec) throw CheckpointError(who + ": cannot create " + root + ": " + ec.message());
  const std::string name = "step_" + std::to_string(st.step);
  const fs::path final_dir = rootp / name;
  const fs::path tmp = rootp / (".tmp_" + name + "_" + std::to_string(::getpid()));
  const fs::path h5path = tmp / kH5Name;
  try {
    fs::remove_all(tmp);
    fs::create_directory(tmp);
    {
      h5::QuietErrors quiet;
      try {
        write_h5(h5path, st);
      } catch (const h5::Error& e) {
        throw CheckpointError("writing checkpoint " + h5path.string() + ": " + e.what());
      }
    }
    fsync_path(h5path, false);
    const auto bytes = fs::file_size(h5path);
    write_file_synced(tmp / kMarkerName, "adgt checkpoint\nformat_version=" + std::to_string(kFormatVersion) +
                                             "\nstep=" + std::to_string(st.step) + "\nfile=" + kH5Name +
                                             "\nbytes=" + std::to_string(bytes) + "\n");
    fsync_path(tmp, true);
    install(tmp, final_dir);
    fsync_path(rootp, true);
  } catch (const CheckpointError&) {
    fs::remove_all(tmp, ec);
    throw;
  } catch (const std::exception& e) {
    fs::remove_all(tmp, ec);
    throw CheckpointError(who + ": " + e.what());
  }
  prune(rootp, keep, st.step);
  return final_dir.string();
}

StateEntry StateEntry::of_ints(std::vector<int64_t> v, int64_t version) {
  return {Kind::Ints, version, std::move(v), {}, {}};
}
StateEntry StateEntry::of_reals(std::vector<double> v, int64_t version) {
  return {Kind::Reals, version, {}, std::move(v), {}};
}
StateEntry StateEntry::of_text(std::string t, int64_t version) {
  return {Kind::Text, version, {}, {}, std::move(t)};
}
StateEntry StateEntry::of_floats(std::vector<float> v, int64_t version) {
  return {Kind::Floats, version, {}, {}, {}, std::move(v)};
}

CheckpointState load_checkpoint(const std::string& step_dir, const std::vector<ParamSpec>& expected) {
  // Whole tensors are the shards of a layout of one rank.
  std::vector<ParamSpec> whole = expected;
  for (ParamSpec& p : whole) {
    p.global_shape = p.shape;
    p.shard_dim = -1;
    p.shard_start = 0;
    p.shard_valid = p.shape.empty() ? 0 : p.shape[0];
  }
  SelfComm self("world");
  CheckpointState st = load_checkpoint_sharded(step_dir, whole, ShardLayout{}, self);
  st.specs = expected;
  return st;
}

std::string resolve_resume(const std::string& arg, const std::string& root) {
  if (arg.empty()) return "";
  if (arg == "auto") {
    const auto all = list_checkpoints(root);
    return all.empty() ? "" : all.back().second;
  }
  std::error_code ec;
  if (!fs::exists(arg, ec))
    throw CheckpointError("resume: checkpoint path '" + arg + "' does not exist" + available_hint(root) +
                          "; pass a step directory, its checkpoint.h5, or 'auto' for the newest");
  return arg;
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t step = parse_step_name(it->path().filename().string());
    std::error_code ec2;
    if (step >= 0 && it->is_directory(ec2) && is_complete(it->path())) out.emplace_back(step, it->path().string());
  }
  if (ec) throw CheckpointError("listing checkpoints under " + root + ": " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace adgt

// Checkpoint save/load. The file layout and the save protocol are described in
// docs/checkpoint-format.md; keep the two in step.
#include "core/checkpoint.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "core/checksum.hpp"
#include "core/hdf5_util.hpp"

namespace adgt {

namespace fs = std::filesystem;
static_assert(std::endian::native == std::endian::little,
              "checkpoint checksums are defined over little-endian bytes; add byte swapping "
              "before building on a big-endian host");

namespace {

constexpr int64_t kFormatVersion = 1;
constexpr const char* kH5Name = "checkpoint.h5";
constexpr const char* kMarkerName = "COMPLETE";
constexpr const char* kCrcAttr = "crc32";
// Tensor groups, in the order they are written, read and verified.
constexpr const char* kTensorGroups[3] = {"model", "optim/exp_avg", "optim/exp_avg_sq"};

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + ")";
}

std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", v);
  return b;
}

std::string errno_text(int e) { return std::strerror(e); }

// ---------------------------------------------------------------- directories

bool is_complete(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / kMarkerName, ec) && fs::is_regular_file(dir / kH5Name, ec);
}

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

// " (complete checkpoints under R: step_1, step_2)" for error messages.
std::string available_hint(const fs::path& root) {
  std::vector<std::pair<int64_t, std::string>> all;
  try {
    all = list_checkpoints(root.string());
  } catch (const std::exception&) {
  }
  std::string r = " (complete checkpoints under " + root.string() + ": ";
  if (all.empty()) return r + "none)";
  for (size_t i = 0; i < all.size(); ++i)
    r += (i ? ", " : "") + fs::path(all[i].second).filename().string();
  return r + ")";
}

void fsync_path(const fs::path& p, bool is_dir) {
  const int fd = ::open(p.c_str(), is_dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw CheckpointError("cannot open " + p.string() + " to fsync it: " + errno_text(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some filesystems refuse fsync on a directory (EINVAL); the data itself is synced.
  if (rc != 0 && !(is_dir && (err == EINVAL || err == EROFS)))
    throw CheckpointError("fsync(" + p.string() + ") failed: " + errno_text(err));
}

void write_file_synced(const fs::path& p, const std::string& text) {
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw CheckpointError("cannot create " + p.string() + ": " + errno_text(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      throw CheckpointError("writing " + p.string() + " failed: " + errno_text(err));
    }
    done += static_cast<size_t>(n);
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  if (::close(fd) != 0 || rc != 0)
    throw CheckpointError("fsync/close of " + p.string() + " failed: " + errno_text(err));
}

std::map<std::string, std::string> read_marker(const fs::path& p) {
  std::map<std::string, std::string> kv;
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) kv[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return kv;
}

// Removes a checkpoint directory; the COMPLETE marker goes first so that a
// crash half-way leaves a directory that no longer counts as complete.
void remove_checkpoint_dir(const fs::path& dir) {
  std::error_code ec;
  fs::remove(dir / kMarkerName, ec);
  fs::remove_all(dir, ec);
  if (ec) std::cerr << "checkpoint: warning: could not remove " << dir.string() << ": " << ec.message() << "\n";
}

// Moves the finished temporary directory to its final name. An existing
// directory of that name is swapped out atomically (renameat2 RENAME_EXCHANGE)
// where the filesystem allows, else moved aside first; then it is deleted.
void install(const fs::path& tmp, const fs::path& dst) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(dst, ec))) {
    if (::rename(tmp.c_str(), dst.c_str()) == 0) return;
    if (errno != EEXIST && errno != ENOTEMPTY)
      throw CheckpointError("rename " + tmp.string() + " -> " + dst.string() + " failed: " + errno_text(errno));
  }
  std::cerr << "checkpoint: replacing the existing " << (is_complete(dst) ? "complete" : "incomplete")
            << " checkpoint " << dst.string() << "\n";
#ifdef RENAME_EXCHANGE
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dst.c_str(), RENAME_EXCHANGE) == 0) {
    remove_checkpoint_dir(tmp);  // now holds the old checkpoint
    return;
  }
#endif
  const fs::path aside = dst.parent_path() / (".old_" + dst.filename().string() + "_" + std::to_string(::getpid()));
  fs::remove_all(aside, ec);
  if (::rename(dst.c_str(), aside.c_str()) != 0)
    throw CheckpointError("cannot move the existing " + dst.string() + " aside to " + aside.string() + ": " +
                          errno_text(errno));
  if (::rename(tmp.c_str(), dst.c_str()) != 0) {
    const int err = errno;
    (void)::rename(aside.c_str(), dst.c_str());
    throw CheckpointError("rename " + tmp.string() + " -> " + dst.string() + " failed: " + errno_text(err));
  }
  remove_checkpoint_dir(aside);
}

// Keeps the checkpoint just written plus the newest keep-1 others.
void prune(const fs::path& root, int64_t keep, int64_t just_written) {
  if (keep <= 0) return;
  std::vector<std::pair<int64_t, std::string>> others;
  for (auto& c : list_checkpoints(root.string()))
    if (c.first != just_written) others.push_back(std::move(c));
  const int64_t excess = static_cast<int64_t>(others.size()) - (keep - 1);
  for (int64_t i = 0; i < excess; ++i) remove_checkpoint_dir(others[static_cast<size_t>(i)].second);
}

// ---------------------------------------------------------------- validation

// Names become HDF5 link names: no '/', not "." and unique.
void check_table(const std::vector<ParamSpec>& specs, const std::string& who) {
  const int64_t total = total_numel(specs);
  std::set<std::string> seen;
  for (const ParamSpec& p : specs) {
    if (p.name.empty() || p.name == "." || p.name.find('/') != std::string::npos)
      throw CheckpointError(who + ": parameter name '" + p.name +
                            "' cannot be an HDF5 dataset name (empty, '.' or contains '/')");
    if (!seen.insert(p.name).second) throw CheckpointError(who + ": parameter " + p.name + " appears twice in the table");
    int64_t n = 1;
    for (int64_t d : p.shape) {
      if (d < 0) throw CheckpointError(who + ": parameter " + p.name + " has negative shape " + shape_str(p.shape));
      n *= d;
    }
    if (n != p.numel)
      throw CheckpointError(who + ": parameter " + p.name + " has numel " + std::to_string(p.numel) +
                            " but shape " + shape_str(p.shape));
    if (p.offset < 0 || p.offset + p.numel > total)
      throw CheckpointError(who + ": parameter " + p.name + " at offset " + std::to_string(p.offset) +
                            " runs past the flat buffer (" + std::to_string(total) + " elements)");
  }
}

// ---------------------------------------------------------------- HDF5 writing

h5::Id create_group(hid_t loc, const char* name) {
  // Creation order is tracked so that h5py lists tensors in parameter-table order.
  h5::Id gcpl(ADGT_H5(H5Pcreate(H5P_GROUP_CREATE)), H5Pclose);
  ADGT_H5(H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED));
  return h5::Id(ADGT_H5(H5Gcreate2(loc, name, H5P_DEFAULT, gcpl, H5P_DEFAULT)), H5Gclose);
}

void write_crc(hid_t obj, uint32_t crc) {
  h5::Id space(ADGT_H5(H5Screate(H5S_SCALAR)), H5Sclose);
  h5::Id attr(ADGT_H5(H5Acreate2(obj, kCrcAttr, H5T_STD_U32LE, space, H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
  ADGT_H5(H5Awrite(attr, H5T_NATIVE_UINT32, &crc));
}

template <class T>
void write_scalar(hid_t loc, const char* name, hid_t file_type, hid_t mem_type, T v) {
  h5::Id space(ADGT_H5(H5Screate(H5S_SCALAR)), H5Sclose);
  h5::Id ds(ADGT_H5(H5Dcreate2(loc, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Dclose);
  ADGT_H5(H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v));
}

// Fixed-length UTF-8 string, NUL-padded (h5py: ds[()].decode()).
void write_string(hid_t loc, const char* name, const std::string& s) {
  h5::Id type(ADGT_H5(H5Tcopy(H5T_C_S1)), H5Tclose);
  ADGT_H5(H5Tset_size(type, std::max<size_t>(s.size(), 1)));
  ADGT_H5(H5Tset_strpad(type, H5T_STR_NULLPAD));
  ADGT_H5(H5Tset_cset(type, H5T_CSET_UTF8));
  h5::Id space(ADGT_H5(H5Screate(H5S_SCALAR)), H5Sclose);
  h5::Id ds(ADGT_H5(H5Dcreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Dclose);
  const std::string buf = s.empty() ? std::string(1, '\0') : s;
  ADGT_H5(H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()));
  write_crc(ds, crc32(s.data(), s.size()));
}

// A contiguous dataset of `shape` written with one H5Dwrite straight from `data`.
void write_array(hid_t loc, const char* name, hid_t file_type, hid_t mem_type, const void* data,
                 const std::vector<int64_t>& shape, uint32_t crc, hid_t dcpl) {
  const std::vector<hsize_t> dims(shape.begin(), shape.end());
  h5::Id space(dims.empty() ? ADGT_H5(H5Screate(H5S_SCALAR))
                            : ADGT_H5(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)),
               H5Sclose);
  h5::Id ds(ADGT_H5(H5Dcreate2(loc, name, file_type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT)), H5Dclose);
  const bool empty = std::any_of(dims.begin(), dims.end(), [](hsize_t d) { return d == 0; });
  if (!empty) ADGT_H5(H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
  write_crc(ds, crc);
}

// File access properties for both reading and writing.
h5::Id file_access() {
  h5::Id fapl(ADGT_H5(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
#if H5_VERSION_GE(1, 10, 7)
  // Lock, but carry on where the filesystem has no locks (some NFS / Lustre mounts).
  ADGT_H5(H5Pset_file_locking(fapl, true, true));
#endif
  return fapl;
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
    write_scalar(meta, "format_version", H5T_STD_I64LE, H5T_NATIVE_INT64, kFormatVersion);
    write_scalar(meta, "step", H5T_STD_I64LE, H5T_NATIVE_INT64, st.step);
    write_scalar(meta, "samples_seen", H5T_STD_I64LE, H5T_NATIVE_INT64, st.samples_seen);
    write_scalar(meta, "seed", H5T_STD_U64LE, H5T_NATIVE_UINT64, st.seed);
    write_string(meta, "config_yaml", st.config_yaml);
    write_array(meta, "rng_state", H5T_STD_U64LE, H5T_NATIVE_UINT64, st.rng_state.data(),
                {static_cast<int64_t>(st.rng_state.size())},
                crc32(st.rng_state.data(), st.rng_state.size() * sizeof(uint64_t)), H5P_DEFAULT);
  }
  ADGT_H5(H5Fclose(file.release()));
}

// ---------------------------------------------------------------- HDF5 reading

h5::Id open_dataset(hid_t loc, const std::string& path, const std::string& where) {
  // H5Lexists needs each parent to exist: check the path one component at a time.
  size_t pos = 0;
  while (true) {
    const size_t slash = path.find('/', pos);
    const std::string prefix = path.substr(0, slash);
    if (ADGT_H5(H5Lexists(loc, prefix.c_str(), H5P_DEFAULT)) <= 0)
      throw CheckpointError(where + prefix + " is missing; this is not an adgt checkpoint or it was written "
                                            "by an incompatible tool (see docs/checkpoint-format.md)");
    if (slash == std::string::npos) break;
    pos = slash + 1;
  }
  return h5::Id(ADGT_H5(H5Dopen2(loc, path.c_str(), H5P_DEFAULT)), H5Dclose);
}

template <class T>
T read_scalar(hid_t file, const std::string& path, hid_t mem_type, const std::string& where) {
  h5::Id ds = open_dataset(file, path, where);
  h5::Id space(ADGT_H5(H5Dget_space(ds)), H5Sclose);
  if (ADGT_H5(H5Sget_simple_extent_npoints(space)) != 1)
    throw CheckpointError(where + path + " must hold a single value");
  T v{};
  ADGT_H5(H5Dread(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v));
  return v;
}

bool read_crc(hid_t ds, uint32_t* crc) {
  if (ADGT_H5(H5Aexists(ds, kCrcAttr)) <= 0) return false;
  h5::Id attr(ADGT_H5(H5Aopen(ds, kCrcAttr, H5P_DEFAULT)), H5Aclose);
  ADGT_H5(H5Aread(attr, H5T_NATIVE_UINT32, crc));
  return true;
}

void verify_crc(hid_t ds, const std::string& path, const void* data, size_t bytes, const std::string& where) {
  uint32_t stored = 0;
  if (!read_crc(ds, &stored))
    throw CheckpointError(where + path + " has no crc32 attribute (see docs/checkpoint-format.md)");
  const uint32_t got = crc32(data, bytes);
  if (got != stored)
    throw CheckpointError(where + path + " fails its checksum (stored crc32 " + hex32(stored) + ", computed " +
                          hex32(got) + "): the file is corrupt; resume from another checkpoint");
}

// Reads a string written fixed-length (by adgt) or variable-length (h5py's default).
std::string read_string(hid_t file, const std::string& path, const std::string& where) {
  h5::Id ds = open_dataset(file, path, where);
  h5::Id ftype(ADGT_H5(H5Dget_type(ds)), H5Tclose);
  if (ADGT_H5(H5Tget_class(ftype)) != H5T_STRING) throw CheckpointError(where + path + " is not a string");
  h5::Id space(ADGT_H5(H5Dget_space(ds)), H5Sclose);
  if (ADGT_H5(H5Sget_simple_extent_npoints(space)) != 1)
    throw CheckpointError(where + path + " must hold a single string");
  std::string s;
  if (ADGT_H5(H5Tis_variable_str(ftype)) > 0) {
    h5::Id mtype(ADGT_H5(H5Tcopy(H5T_C_S1)), H5Tclose);
    ADGT_H5(H5Tset_size(mtype, H5T_VARIABLE));
    ADGT_H5(H5Tset_cset(mtype, H5Tget_cset(ftype)));
    char* p = nullptr;
    ADGT_H5(H5Dread(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, &p));
    if (p) s = p;
    ADGT_H5(H5Dvlen_reclaim(mtype, space, H5P_DEFAULT, &p));
  } else {
    const size_t size = H5Tget_size(ftype);
    s.assign(size, '\0');
    ADGT_H5(H5Dread(ds, ftype, H5S_ALL, H5S_ALL, H5P_DEFAULT, s.data()));
    s.resize(std::strlen(s.c_str()));  // NUL-padded / NUL-terminated
  }
  verify_crc(ds, path, s.data(), s.size(), where);
  return s;
}

std::vector<uint64_t> read_u64_array(hid_t file, const std::string& path, const std::string& where) {
  h5::Id ds = open_dataset(file, path, where);
  h5::Id space(ADGT_H5(H5Dget_space(ds)), H5Sclose);
  const hssize_t n = ADGT_H5(H5Sget_simple_extent_npoints(space));
  std::vector<uint64_t> v(static_cast<size_t>(n));
  if (n > 0) ADGT_H5(H5Dread(ds, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()));
  verify_crc(ds, path, v.data(), v.size() * sizeof(uint64_t), where);
  return v;
}

std::string model_hint() {
  return "; the checkpoint was written for a different model (its config is in meta/config_yaml)";
}

// Reads group/<p.name> into dst after checking type and shape; returns the stored crc.
uint32_t read_tensor(hid_t group, const std::string& gname, const ParamSpec& p, float* dst,
                     const std::string& where) {
  const std::string full = gname + "/" + p.name;
  if (ADGT_H5(H5Lexists(group, p.name.c_str(), H5P_DEFAULT)) <= 0)
    throw CheckpointError(where + "tensor " + full + " is missing (the model expects shape " + shape_str(p.shape) +
                          ")" + model_hint());
  h5::Id ds(ADGT_H5(H5Dopen2(group, p.name.c_str(), H5P_DEFAULT)), H5Dclose);
  h5::Id type(ADGT_H5(H5Dget_type(ds)), H5Tclose);
  if (ADGT_H5(H5Tget_class(type)) != H5T_FLOAT || H5Tget_size(type) != 4)
    throw CheckpointError(where + "tensor " + full + " is not stored as 32-bit float (HDF5 type size " +
                          std::to_string(H5Tget_size(type)) + "); convert it to float32");
  h5::Id space(ADGT_H5(H5Dget_space(ds)), H5Sclose);
  const int nd = ADGT_H5(H5Sget_simple_extent_ndims(space));
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  if (nd > 0) ADGT_H5(H5Sget_simple_extent_dims(space, dims.data(), nullptr));
  const std::vector<int64_t> got(dims.begin(), dims.end());
  if (got != p.shape)
    throw CheckpointError(where + "tensor " + full + " has shape " + shape_str(got) + ", the model expects " +
                          shape_str(p.shape) + model_hint());
  if (p.numel > 0) ADGT_H5(H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst));
  uint32_t crc = 0;
  if (!read_crc(ds, &crc))
    throw CheckpointError(where + "tensor " + full + " has no crc32 attribute (see docs/checkpoint-format.md)");
  return crc;
}

herr_t collect_name(hid_t, const char* name, const H5L_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

// Tensors present in the file that the model does not have are an error too:
// dropping them silently would hide a config mismatch (e.g. tie_embeddings).
void check_no_extras(hid_t group, const std::string& gname, const std::set<std::string>& expected,
                     const std::string& where) {
  std::vector<std::string> names;
  ADGT_H5(H5Literate(group, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, collect_name, &names));
  for (const std::string& nm : names)
    if (!expected.count(nm))
      throw CheckpointError(where + "tensor " + gname + "/" + nm + " is in the checkpoint but not in the model" +
                            model_hint());
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

CheckpointState load_checkpoint(const std::string& step_dir, const std::vector<ParamSpec>& expected) {
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
  const fs::path root = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  if (!fs::is_regular_file(file, ec))
    throw CheckpointError(where + "file not found" + available_hint(root));
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
  check_table(expected, "load_checkpoint(" + file.string() + ")");

  CheckpointState st;
  st.specs = expected;
  const auto total = static_cast<size_t>(total_numel(expected));
  st.params.assign(total, 0.0f);
  st.exp_avg.assign(total, 0.0f);
  st.exp_avg_sq.assign(total, 0.0f);
  std::vector<float>* bufs[3] = {&st.params, &st.exp_avg, &st.exp_avg_sq};
  const size_t n = expected.size();
  std::vector<uint32_t> stored(3 * n);
  try {
    h5::QuietErrors quiet;
    if (ADGT_H5(H5Fis_hdf5(file.c_str())) <= 0)
      throw CheckpointError(where + "not an HDF5 file (damaged or overwritten); resume from another checkpoint" +
                            available_hint(root));
    h5::Id fapl = file_access();
    h5::Id f(ADGT_H5(H5Fopen(file.c_str(), H5F_ACC_RDONLY, fapl)), H5Fclose);
    const auto version = read_scalar<int64_t>(f, "meta/format_version", H5T_NATIVE_INT64, where);
    if (version != kFormatVersion)
      throw CheckpointError(where + "format version " + std::to_string(version) + "; this build reads version " +
                            std::to_string(kFormatVersion));
    st.step = read_scalar<int64_t>(f, "meta/step", H5T_NATIVE_INT64, where);
    st.samples_seen = read_scalar<int64_t>(f, "meta/samples_seen", H5T_NATIVE_INT64, where);
    st.seed = read_scalar<uint64_t>(f, "meta/seed", H5T_NATIVE_UINT64, where);
    st.config_yaml = read_string(f, "meta/config_yaml", where);
    st.rng_state = read_u64_array(f, "meta/rng_state", where);
    if (auto it = marker.find("step"); it != marker.end() && it->second != std::to_string(st.step))
      throw CheckpointError(where + "meta/step is " + std::to_string(st.step) + " but COMPLETE says step " +
                            it->second + "; the file does not belong to this directory");

    std::set<std::string> names;
    for (const ParamSpec& p : expected) names.insert(p.name);
    for (int g = 0; g < 3; ++g) {
      const std::string gname = kTensorGroups[g];
      if (ADGT_H5(H5Lexists(f, gname.substr(0, gname.find('/')).c_str(), H5P_DEFAULT)) <= 0 ||
          ADGT_H5(H5Lexists(f, gname.c_str(), H5P_DEFAULT)) <= 0)
        throw CheckpointError(where + "group " + gname + " is missing (see docs/checkpoint-format.md)");
      h5::Id grp(ADGT_H5(H5Gopen2(f, gname.c_str(), H5P_DEFAULT)), H5Gclose);
      for (size_t i = 0; i < n; ++i)
        stored[g * n + i] = read_tensor(grp, gname, expected[i], bufs[g]->data() + expected[i].offset, where);
      check_no_extras(grp, gname, names, where);
    }
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError(where + e.what());
  }

  // Checksums over everything read, on all threads; report the first failure in table order.
  std::vector<ByteRange> ranges;
  ranges.reserve(3 * n);
  for (const auto* b : bufs)
    for (const ParamSpec& p : expected)
      ranges.push_back({b->data() + p.offset, static_cast<size_t>(p.numel) * sizeof(float)});
  const std::vector<uint32_t> got = crc32_many(ranges);
  for (size_t k = 0; k < got.size(); ++k)
    if (got[k] != stored[k])
      throw CheckpointError(where + "tensor " + kTensorGroups[k / n] + "/" + expected[k % n].name +
                            " fails its checksum (stored crc32 " + hex32(stored[k]) + ", computed " + hex32(got[k]) +
                            "): the file is corrupt; resume from another checkpoint" + available_hint(root));
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

// Shared checkpoint helpers; see core/checkpoint/common.hpp.
#include "core/checkpoint/common.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>

#include "core/checkpoint/checksum.hpp"

namespace adgt::ckpt {

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

namespace {
template <class T>
void write_scalar(hid_t loc, const char* name, hid_t file_type, hid_t mem_type, T v) {
  h5::Id space(ADGT_H5(H5Screate(H5S_SCALAR)), H5Sclose);
  h5::Id ds(ADGT_H5(H5Dcreate2(loc, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Dclose);
  ADGT_H5(H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v));
}
}  // namespace

void write_i64(hid_t loc, const char* name, int64_t v) {
  write_scalar(loc, name, H5T_STD_I64LE, H5T_NATIVE_INT64, v);
}
void write_u64(hid_t loc, const char* name, uint64_t v) {
  write_scalar(loc, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, v);
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


h5::Id open_dataset(hid_t loc, const std::string& path, const std::string& where) {
  // A damaged object header or B-tree fails inside HDF5 (most with "incorrect
  // metadata checksum"); the error then names the object being opened.
  try {
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
  } catch (const h5::Error& e) {
    throw CheckpointError(where + "cannot open " + path + " (the file's metadata is damaged): " + e.what() +
                          "; resume from another checkpoint");
  }
}

namespace {
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
}  // namespace

int64_t read_i64(hid_t file, const std::string& path, const std::string& where) {
  return read_scalar<int64_t>(file, path, H5T_NATIVE_INT64, where);
}
uint64_t read_u64(hid_t file, const std::string& path, const std::string& where) {
  return read_scalar<uint64_t>(file, path, H5T_NATIVE_UINT64, where);
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

namespace {
herr_t collect_name(hid_t, const char* name, const H5L_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> link_names(hid_t group) {
  std::vector<std::string> names;
  hsize_t idx = 0;
  ADGT_H5(H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, &idx, collect_name, &names));
  return names;
}

void write_meta(hid_t meta, const CheckpointState& st, int64_t format_version) {
  write_i64(meta, "format_version", format_version);
  write_i64(meta, "step", st.step);
  write_i64(meta, "samples_seen", st.samples_seen);
  write_u64(meta, "seed", st.seed);
  write_string(meta, "config_yaml", st.config_yaml);
  write_array(meta, "rng_state", H5T_STD_U64LE, H5T_NATIVE_UINT64, st.rng_state.data(),
              {static_cast<int64_t>(st.rng_state.size())},
              crc32(st.rng_state.data(), st.rng_state.size() * sizeof(uint64_t)), H5P_DEFAULT);
}

namespace {

void write_version(hid_t obj, int64_t v) {
  h5::Id space(ADGT_H5(H5Screate(H5S_SCALAR)), H5Sclose);
  h5::Id a(ADGT_H5(H5Acreate2(obj, "version", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
  ADGT_H5(H5Awrite(a, H5T_NATIVE_INT64, &v));
}

int64_t read_version(hid_t obj) {
  if (ADGT_H5(H5Aexists(obj, "version")) <= 0) return 1;
  h5::Id a(ADGT_H5(H5Aopen(obj, "version", H5P_DEFAULT)), H5Aclose);
  int64_t v = 1;
  ADGT_H5(H5Aread(a, H5T_NATIVE_INT64, &v));
  return v;
}

void read_state_group(hid_t g, const std::string& prefix, std::map<std::string, StateEntry>& out,
                      const std::string& where) {
  for (const std::string& name : link_names(g)) {
    const std::string full = prefix.empty() ? name : prefix + "/" + name;
    const std::string path = "state/" + full;
    h5::Id obj(ADGT_H5(H5Oopen(g, name.c_str(), H5P_DEFAULT)), H5Oclose);
    if (ADGT_H5(H5Iget_type(obj)) == H5I_GROUP) {
      read_state_group(obj, full, out, where);
      continue;
    }
    h5::Id ftype(ADGT_H5(H5Dget_type(obj)), H5Tclose);
    StateEntry e;
    e.version = read_version(obj);
    switch (ADGT_H5(H5Tget_class(ftype))) {
      case H5T_STRING:
        e.kind = StateEntry::Kind::Text;
        e.text = read_string(g, name, where + path + ": ");
        break;
      case H5T_INTEGER: {
        e.kind = StateEntry::Kind::Ints;
        h5::Id space(ADGT_H5(H5Dget_space(obj)), H5Sclose);
        e.ints.resize(size_t(ADGT_H5(H5Sget_simple_extent_npoints(space))));
        if (!e.ints.empty()) ADGT_H5(H5Dread(obj, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, e.ints.data()));
        verify_crc(obj, path, e.ints.data(), e.ints.size() * 8, where);
        break;
      }
      case H5T_FLOAT: {
        if (ADGT_H5(H5Tget_size(ftype)) == 4) {  // Kind::Floats
          e.kind = StateEntry::Kind::Floats;
          h5::Id space(ADGT_H5(H5Dget_space(obj)), H5Sclose);
          e.floats.resize(size_t(ADGT_H5(H5Sget_simple_extent_npoints(space))));
          if (!e.floats.empty())
            ADGT_H5(H5Dread(obj, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, e.floats.data()));
          verify_crc(obj, path, e.floats.data(), e.floats.size() * 4, where);
          break;
        }
        e.kind = StateEntry::Kind::Reals;
        h5::Id space(ADGT_H5(H5Dget_space(obj)), H5Sclose);
        e.reals.resize(size_t(ADGT_H5(H5Sget_simple_extent_npoints(space))));
        if (!e.reals.empty())
          ADGT_H5(H5Dread(obj, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, e.reals.data()));
        verify_crc(obj, path, e.reals.data(), e.reals.size() * 8, where);
        break;
      }
      default:
        throw CheckpointError(where + path + " is neither integers, reals nor text");
    }
    out[full] = std::move(e);
  }
}

}  // namespace

void write_state(hid_t file, const CheckpointState& st) { write_state_entries(file, st.state); }

void write_state_entries(hid_t file, const std::map<std::string, StateEntry>& entries) {
  if (entries.empty()) return;
  h5::Id root = create_group(file, "state");
  std::map<std::string, h5::Id> groups;  // "moe/bias" -> its group
  for (const auto& [name, e] : entries) {
    if (name.empty() || name.front() == '/' || name.back() == '/' || name.find("//") != std::string::npos)
      throw CheckpointError("checkpoint state entry '" + name + "': names are '/'-separated words");
    hid_t parent = root;
    size_t at = 0;
    for (size_t slash; (slash = name.find('/', at)) != std::string::npos; at = slash + 1) {
      const std::string dir = name.substr(0, slash);
      auto it = groups.find(dir);
      if (it == groups.end())
        it = groups.emplace(dir, create_group(parent, name.substr(at, slash - at).c_str())).first;
      parent = it->second;
    }
    const std::string leaf = name.substr(at);
    switch (e.kind) {
      case StateEntry::Kind::Text: write_string(parent, leaf.c_str(), e.text); break;
      case StateEntry::Kind::Ints:
        write_array(parent, leaf.c_str(), H5T_STD_I64LE, H5T_NATIVE_INT64, e.ints.data(),
                    {static_cast<int64_t>(e.ints.size())}, crc32(e.ints.data(), e.ints.size() * 8),
                    H5P_DEFAULT);
        break;
      case StateEntry::Kind::Reals:
        write_array(parent, leaf.c_str(), H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, e.reals.data(),
                    {static_cast<int64_t>(e.reals.size())}, crc32(e.reals.data(), e.reals.size() * 8),
                    H5P_DEFAULT);
        break;
      case StateEntry::Kind::Floats:
        write_array(parent, leaf.c_str(), H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, e.floats.data(),
                    {static_cast<int64_t>(e.floats.size())}, crc32(e.floats.data(), e.floats.size() * 4),
                    H5P_DEFAULT);
        break;
    }
    h5::Id ds(ADGT_H5(H5Dopen2(parent, leaf.c_str(), H5P_DEFAULT)), H5Dclose);
    write_version(ds, e.version);
  }
}

std::map<std::string, StateEntry> read_state(hid_t file, const std::string& where) {
  std::map<std::string, StateEntry> out;
  if (ADGT_H5(H5Lexists(file, "state", H5P_DEFAULT)) <= 0) return out;
  h5::Id g(ADGT_H5(H5Gopen2(file, "state", H5P_DEFAULT)), H5Gclose);
  read_state_group(g, "", out, where);
  return out;
}

}  // namespace adgt::ckpt

// Pieces shared by the checkpoint writers and the reader (core/checkpoint/checkpoint.cpp,
// save.cpp, load.cpp): directory handling and the commit protocol
// (fsync, COMPLETE marker, atomic install, pruning), HDF5 write/read helpers,
// and checks with their error messages. Internal to core; the public API is
// core/checkpoint/checkpoint.hpp and core/checkpoint/sharded.hpp.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/hdf5_util.hpp"

namespace adgt::ckpt {

namespace fs = std::filesystem;

constexpr const char* kH5Name = "checkpoint.h5";
constexpr const char* kMarkerName = "COMPLETE";
constexpr const char* kCrcAttr = "crc32";
// Tensor groups, in the order they are written, read and verified.
constexpr const char* kTensorGroups[3] = {"model", "optim/exp_avg", "optim/exp_avg_sq"};

std::string shape_str(const std::vector<int64_t>& s);
std::string hex32(uint32_t v);
std::string errno_text(int e);

// ---------------------------------------------------------------- directories

// step_<N> with COMPLETE and checkpoint.h5.
bool is_complete(const fs::path& dir);
// " (complete checkpoints under R: step_1, step_2)" for error messages.
std::string available_hint(const fs::path& root);
void fsync_path(const fs::path& p, bool is_dir);
// Creates (truncates) p, writes text, fsyncs and closes it.
void write_file_synced(const fs::path& p, const std::string& text);
// key=value lines of a COMPLETE marker.
std::map<std::string, std::string> read_marker(const fs::path& p);
// Removes a checkpoint directory, COMPLETE first (a crash half-way leaves an
// incomplete directory, never a damaged complete one).
void remove_checkpoint_dir(const fs::path& dir);
// Renames the finished temporary directory to dst; an existing dst is swapped
// out atomically (renameat2 RENAME_EXCHANGE) where possible, then deleted.
void install(const fs::path& tmp, const fs::path& dst);
// Keeps the checkpoint just written plus the newest keep-1 others (keep 0: all).
void prune(const fs::path& root, int64_t keep, int64_t just_written);

// Names become HDF5 link names (no '/', not ".", unique); shapes match numel;
// the flat layout fits in total_numel(specs).
void check_table(const std::vector<ParamSpec>& specs, const std::string& who);

// ---------------------------------------------------------------- HDF5 writing

// File access properties for reading and writing (file locking where available).
h5::Id file_access();
// A group that tracks link creation order (h5py lists in parameter-table order).
h5::Id create_group(hid_t loc, const char* name);
void write_crc(hid_t obj, uint32_t crc);
void write_i64(hid_t loc, const char* name, int64_t v);
void write_u64(hid_t loc, const char* name, uint64_t v);
// Fixed-length UTF-8 string, NUL-padded, with its crc32 attribute.
void write_string(hid_t loc, const char* name, const std::string& s);
// A contiguous dataset of `shape` written with one H5Dwrite straight from `data`.
void write_array(hid_t loc, const char* name, hid_t file_type, hid_t mem_type, const void* data,
                 const std::vector<int64_t>& shape, uint32_t crc, hid_t dcpl);
// meta/format_version, step, samples_seen, seed, config_yaml, rng_state.
void write_meta(hid_t meta, const CheckpointState& st, int64_t format_version);
// state/<name> for every named entry (groups for the name's '/' parts), each
// with its crc32 and a `version` attribute; nothing when there is none.
void write_state(hid_t file, const CheckpointState& st);
// The same for any map of entries (a rank file's CheckpointState::rank_state).
void write_state_entries(hid_t file, const std::map<std::string, StateEntry>& entries);

// ---------------------------------------------------------------- HDF5 reading

// Opens `path` below loc, naming the first missing component.
h5::Id open_dataset(hid_t loc, const std::string& path, const std::string& where);
int64_t read_i64(hid_t file, const std::string& path, const std::string& where);
uint64_t read_u64(hid_t file, const std::string& path, const std::string& where);
bool read_crc(hid_t ds, uint32_t* crc);
// Throws unless ds carries a crc32 attribute equal to the CRC-32 of data[0..bytes).
void verify_crc(hid_t ds, const std::string& path, const void* data, size_t bytes, const std::string& where);
// Reads a string written fixed-length (by adgt) or variable-length (h5py's default)
// and checks its crc32.
std::string read_string(hid_t file, const std::string& path, const std::string& where);
std::vector<uint64_t> read_u64_array(hid_t file, const std::string& path, const std::string& where);
// Every entry under state/ (none when the file has no state group: checkpoints
// written before named state), checksums verified.
std::map<std::string, StateEntry> read_state(hid_t file, const std::string& where);
std::string model_hint();
// The names of the links directly in `group`, in name order.
std::vector<std::string> link_names(hid_t group);

}  // namespace adgt::ckpt

// What the version 2 save (core/checkpoint/save.cpp) and load
// (core/checkpoint/load.cpp) share beyond core/checkpoint/common.hpp: the
// format version, rank file names, HDF5 extents of a region, and the error
// capture that precedes agree_error. Internal to core.
#pragma once
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "core/checkpoint/geometry.hpp"
#include "core/checkpoint/hdf5_util.hpp"

namespace adgt::ckpt {

constexpr int64_t kFormatVersion = 2;

inline std::string rank_file_name(int64_t r) { return "rank_" + std::to_string(r) + ".h5"; }

// The region's counts as HDF5 extents (nd of them).
inline std::vector<hsize_t> dims_of(const Region& r) {
  std::vector<hsize_t> v;
  for (int d = 0; d < r.nd; ++d) v.push_back(hsize_t(r.count[size_t(d)]));
  return v;
}

// Runs f unless an error is already recorded; records the first error's message.
inline void guarded(std::string& err, const std::string& who, const std::function<void()>& f) {
  if (!err.empty()) return;
  try {
    f();
  } catch (const CheckpointError& e) {
    err = e.what();
  } catch (const std::exception& e) {
    err = who + ": " + e.what();
  }
}

}  // namespace adgt::ckpt

// HDF5 C API helpers: ADGT_H5(call) checks every call (house style rule 2) and
// throws h5::Error naming the statement, rank, host, file, line and HDF5's own
// error stack; h5::Id closes a handle when it leaves scope.
#pragma once
#include <hdf5.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace adgt::h5 {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws Error for a failed call; reads (and clears) HDF5's error stack.
[[noreturn]] void fail(const char* call, const char* file, int line);

// HDF5 reports failure as a negative herr_t / hid_t / htri_t / hssize_t.
template <class T>
inline T checked(T r, const char* call, const char* file, int line) {
  if (r < 0) fail(call, file, line);
  return r;
}

// An owned hid_t and the H5*close that releases it (H5Fclose, H5Dclose, ...).
// Destruction ignores close errors; close a file explicitly with
// ADGT_H5(H5Fclose(f.release())) where a failed flush must be reported.
class Id {
 public:
  using Closer = herr_t (*)(hid_t);
  Id() = default;
  Id(hid_t id, Closer close) : id_(id), close_(close) {}
  Id(Id&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), close_(o.close_) {}
  Id& operator=(Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      close_ = o.close_;
    }
    return *this;
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  ~Id() { reset(); }
  operator hid_t() const { return id_; }  // NOLINT: passes straight into H5 calls
  hid_t get() const { return id_; }
  hid_t release() { return std::exchange(id_, H5I_INVALID_HID); }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer close_ = nullptr;
};

// Turns off HDF5's automatic printing of its error stack for this scope (the
// stack comes back inside h5::Error instead); restores the previous handler.
class QuietErrors {
 public:
  QuietErrors();
  ~QuietErrors();
  QuietErrors(const QuietErrors&) = delete;
  QuietErrors& operator=(const QuietErrors&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// "rank R on host H" for error messages (rank from the launcher's environment:
// OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK or SLURM_PROCID; "?" when unset).
std::string process_label();

}  // namespace adgt::h5

#define ADGT_H5(call) ::adgt::h5::checked((call), #call, __FILE__, __LINE__)

// A non-owning view of a contiguous, row-major tensor on some backend's device.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace adgt {

// E4M3 / E5M2: FP8 (kernels/common/fp8.hpp), one byte an element.
enum class DType : uint8_t { F32, F64, I32, BF16, E4M3, E5M2 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::I32: return 4;
    case DType::BF16: return 2;
    case DType::E4M3:
    case DType::E5M2: return 1;
  }
  return 0;
}
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::I32: return "i32";
    case DType::BF16: return "bf16";
    case DType::E4M3: return "e4m3";
    case DType::E5M2: return "e5m2";
  }
  return "?";
}

struct Tensor {
  static constexpr int kMaxDims = 4;
  void* data = nullptr;
  DType dtype = DType::F32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {0, 0, 0, 0};

  Tensor() = default;
  Tensor(void* d, DType t, std::initializer_list<int64_t> s) : data(d), dtype(t) {
    if (s.size() > kMaxDims) throw std::invalid_argument("Tensor: too many dims");
    for (int64_t v : s) shape[ndim++] = v;
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  size_t bytes() const { return size_t(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
  template <class T> T* ptr() const { return static_cast<T*>(data); }
  // Rows [r0, r0+n) of the leading dimension.
  Tensor rows(int64_t r0, int64_t n) const {
    Tensor t = *this;
    int64_t inner = ndim > 0 ? numel() / shape[0] : 1;
    t.data = static_cast<char*>(data) + size_t(r0 * inner) * dtype_size(dtype);
    t.shape[0] = n;
    return t;
  }
  std::string shape_str() const {
    std::string s = "(";
    for (int i = 0; i < ndim; ++i) s += (i ? "," : "") + std::to_string(shape[i]);
    return s + ")";
  }
};

}  // namespace adgt

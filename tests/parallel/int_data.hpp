// What the MPI collective tests share (collectives_test.cpp,
// site_comm_test.cpp): a host vector as a Tensor of its dtype, and
// integer-valued test data small enough that every sum is exact in fp32.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/tensor.hpp"

namespace adgt::ptest {

template <class T> DType dtype_of();
template <> inline DType dtype_of<float>() { return DType::F32; }
template <> inline DType dtype_of<double>() { return DType::F64; }
template <> inline DType dtype_of<int32_t>() { return DType::I32; }

template <class T> Tensor view(std::vector<T>& v) {
  return Tensor(v.data(), dtype_of<T>(), {int64_t(v.size())});
}

// Rank r's element i: integer-valued, exact in every sum of the tests.
inline int64_t val(int r, int64_t i) { return (i * 7 + r * 13) % 101 - 50 + r; }

}  // namespace adgt::ptest

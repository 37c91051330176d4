// The relative error of a result against its reference, ||got - want|| /
// ||want|| (Frobenius), as the CUDA tests compare device against CPU (the
// flash kernels' contract: tests/unit/cuda_attention_test.cpp). A non-finite
// entry of got is an infinite error.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

namespace adgt::test {

inline double rel_fro(const std::vector<double>& got, const std::vector<double>& want) {
  double d = 0, n = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    d += (got[i] - want[i]) * (got[i] - want[i]);
    n += want[i] * want[i];
  }
  return std::sqrt(d / std::max(n, 1e-300));
}

}  // namespace adgt::test

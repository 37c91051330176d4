// The CUDA backend's mixture-of-experts combine methods; the kernels and the
// ops that launch them are in combine_kernels.cuh. What stays here is
// host-only: the range check of pos, on a host copy.
#include <vector>

#include "kernels/cuda/combine_kernels.cuh"

namespace adgt {

namespace {
// Shapes as the CPU backend checks them, then pos read back to check its
// range (the CPU backend's check; an out-of-range row would read outside y).
void check_pos(CudaBackend& be, const Tensor& rows_nc, const Tensor& y, const Tensor& pos,
               const Tensor& w, const char* op) {
  cuda::check_combine(rows_nc, y, pos, w, op);
  std::vector<int32_t> p(static_cast<size_t>(pos.numel()));
  be.to_host(p.data(), pos.data, p.size() * 4);
  for (size_t i = 0; i < p.size(); ++i)
    ADGT_CHECK(p[i] < y.dim(0), op << ": pos[" << i << "] = " << p[i] << " outside y"
                                   << y.shape_str());
}
}  // namespace

void CudaBackend::combine_rows(Tensor out, const Tensor& y, const Tensor& pos, const Tensor& w,
                               bool accumulate) {
  check_pos(*this, out, y, pos, w, "combine_rows");
  cuda::combine_rows(cuda::op_ctx(*this), out, y, pos, w, accumulate);
}

void CudaBackend::combine_rows_backward(Tensor dy, Tensor dw, const Tensor& dout, const Tensor& y,
                                        const Tensor& pos, const Tensor& w) {
  check_pos(*this, dout, y, pos, w, "combine_rows_backward");
  cuda::combine_rows_backward(cuda::op_ctx(*this), dy, dw, dout, y, pos, w);
}

}  // namespace adgt

// The CUDA backend's embedding methods; the kernels and the ops that launch
// them are in embedding_kernels.cuh. What stays here is host-only: the
// ADGT_EMBEDDING_BWD=host path's token read-back and list upload.
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cuda/embedding_kernels.cuh"

namespace adgt {

void CudaBackend::embedding_forward(Tensor out, const Tensor& table, const Tensor& tokens,
                                    int64_t vocab_start) {
  cuda::embedding_forward(cuda::op_ctx(*this), out, table, tokens, vocab_start);
}

void CudaBackend::embedding_backward(Tensor dtable, const Tensor& dout, const Tensor& tokens,
                                     int64_t vocab_start) {
  const char* mode = std::getenv("ADGT_EMBEDDING_BWD");
  if (!mode || std::string(mode) != "host") {
    cuda::embedding_backward(cuda::op_ctx(*this), dtable, dout, tokens, vocab_start);
    return;
  }
  // The previous path: the token ids read back, the lists built on the host.
  if (!cuda::embedding_backward_check(dtable, dout, tokens)) return;
  const int64_t N = tokens.numel(), V = dtable.dim(0);
  std::vector<int32_t> tok(static_cast<size_t>(N));
  to_host(tok.data(), tokens.data, size_t(N) * 4);
  int64_t R = 0;
  const std::vector<int32_t> csr = cuda::embedding_host_lists(tok.data(), N, V, vocab_start, R);
  if (!R) return;
  auto* dev = static_cast<int32_t*>(scratch(kScratchIndex, csr.size() * 4));
  to_device(dev, csr.data(), csr.size() * 4);
  cuda::embedding_backward_lists(cuda::op_ctx(*this), dtable, dout, dev, R);
}

}  // namespace adgt

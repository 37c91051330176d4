#include "parallel/nccl_comm.hpp"

#include <chrono>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "kernels/check.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "parallel/device_comm.hpp"
#include "parallel/mpi_env.hpp"
#include "parallel/ring.hpp"

namespace adgt {

namespace {


ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::I32: return ncclInt32;
    case DType::BF16: return ncclBfloat16;
  }
  ADGT_CHECK(false, "NcclComm: unknown dtype");
}

const char* byte_ptr(const Tensor& t, int64_t elem_offset) {
  return static_cast<const char*>(t.data) + elem_offset * int64_t(dtype_size(t.dtype));
}
char* byte_ptr(Tensor& t, int64_t elem_offset) {
  return static_cast<char*>(t.data) + elem_offset * int64_t(dtype_size(t.dtype));
}

}  // namespace

void gpu_call_failed(const char* call, const char* error, const char* file, int line) {
  std::ostringstream os;
  os << "GPU call failed: " << call << ": " << error << " (" << rank_host() << ", " << file << ":"
     << line << ")";
  throw std::runtime_error(os.str());
}

NcclComm::NcclComm(const MpiComm& group, int device, cudaStream_t stream, bool blocking)
    : stream_(stream), blocking_(blocking), rank_(group.rank()), size_(group.size()),
      device_(device), name_(group.name()) {
  ncclUniqueId id{};
  if (rank_ == 0) ADGT_NCCL(ncclGetUniqueId(&id));
  ADGT_MPI(MPI_Bcast(&id, int(sizeof id), MPI_BYTE, 0, group.handle()));
  ADGT_CUDA(cudaSetDevice(device_));
  if (!stream_) {
    ADGT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    own_stream_ = true;
  }
  ADGT_CUDA(cudaMalloc(&barrier_buf_, sizeof(float)));
  ADGT_CUDA(cudaMemset(barrier_buf_, 0, sizeof(float)));
  ADGT_NCCL(ncclCommInitRank(&comm_, size_, id, rank_));
}

NcclComm::~NcclComm() {
  // No throwing here: errors at teardown are reported, not raised.
  if (comm_) {
    const ncclResult_t rc = ncclCommDestroy(comm_);
    if (rc != ncclSuccess)
      std::fprintf(stderr, "warning: ncclCommDestroy: %s (%s)\n", ncclGetErrorString(rc), rank_host().c_str());
  }
  if (barrier_buf_) cudaFree(barrier_buf_);
  if (own_stream_ && stream_) cudaStreamDestroy(stream_);
}

void NcclComm::finish() {
  if (blocking_) ADGT_CUDA(cudaStreamSynchronize(stream_));
}

void NcclComm::all_reduce(Tensor t, ReduceOp op) {
  Timed timed(stats_);
  ADGT_NCCL(ncclAllReduce(t.data, t.data, size_t(t.numel()), nccl_type(t.dtype),
                          op == ReduceOp::Sum ? ncclSum : ncclMax, comm_, stream_));
  finish();
  stats_.bytes += ring_all_reduce_sent(t.numel(), size_, rank_) * int64_t(dtype_size(t.dtype));
}

void NcclComm::reduce_scatter(Tensor out, const Tensor& in) {
  ADGT_CHECK(out.dtype == in.dtype && in.numel() == int64_t(size_) * out.numel(),
             "NcclComm(" << name_ << ")::reduce_scatter: in" << in.shape_str() << " must hold "
                         << size_ << " x out" << out.shape_str() << " of one dtype");
  Timed timed(stats_);
  ADGT_NCCL(ncclReduceScatter(in.data, out.data, size_t(out.numel()), nccl_type(in.dtype), ncclSum,
                              comm_, stream_));
  finish();
  stats_.bytes += ring_reduce_scatter_sent(in.numel(), size_, rank_) * int64_t(dtype_size(in.dtype));
}

void NcclComm::all_gather(Tensor out, const Tensor& in) {
  ADGT_CHECK(out.dtype == in.dtype && out.numel() == int64_t(size_) * in.numel(),
             "NcclComm(" << name_ << ")::all_gather: out" << out.shape_str() << " must hold "
                         << size_ << " x in" << in.shape_str() << " of one dtype");
  Timed timed(stats_);
  ADGT_NCCL(ncclAllGather(in.data, out.data, size_t(in.numel()), nccl_type(in.dtype), comm_, stream_));
  finish();
  stats_.bytes += ring_all_gather_sent(out.numel(), size_, rank_) * int64_t(dtype_size(in.dtype));
}

void NcclComm::broadcast(Tensor t, int root) {
  ADGT_CHECK(root >= 0 && root < size_,
             "NcclComm(" << name_ << ")::broadcast: root " << root << " outside 0.." << size_ - 1);
  Timed timed(stats_);
  ADGT_NCCL(ncclBroadcast(t.data, t.data, size_t(t.numel()), nccl_type(t.dtype), root, comm_, stream_));
  finish();
  stats_.bytes += chain_broadcast_sent(t.numel(), size_, rank_, root) * int64_t(dtype_size(t.dtype));
}

void NcclComm::send(const Tensor& t, int peer, int) {
  ADGT_CHECK(peer >= 0 && peer < size_ && peer != rank_,
             "NcclComm(" << name_ << ")::send: peer " << peer << " must be another rank of 0.." << size_ - 1);
  Timed timed(stats_);
  ADGT_NCCL(ncclSend(t.data, size_t(t.numel()), nccl_type(t.dtype), peer, comm_, stream_));
  finish();
  stats_.bytes += int64_t(t.bytes());
}

void NcclComm::recv(Tensor t, int peer, int) {
  ADGT_CHECK(peer >= 0 && peer < size_ && peer != rank_,
             "NcclComm(" << name_ << ")::recv: peer " << peer << " must be another rank of 0.." << size_ - 1);
  Timed timed(stats_);
  ADGT_NCCL(ncclRecv(t.data, size_t(t.numel()), nccl_type(t.dtype), peer, comm_, stream_));
  finish();
}

void NcclComm::all_to_all(Tensor out, const Tensor& in) {
  ADGT_CHECK(out.dtype == in.dtype && out.numel() == in.numel() && in.numel() % size_ == 0 &&
                 out.data != in.data,
             "NcclComm(" << name_ << ")::all_to_all: in" << in.shape_str() << " and out"
                         << out.shape_str() << " must be distinct, equal, of one dtype, and split into "
                         << size_ << " chunks");
  const int64_t n = in.numel() / size_;
  std::vector<int64_t> counts(size_, n), displs(size_);
  for (int j = 0; j < size_; ++j) displs[j] = j * n;
  all_to_allv(out, counts, displs, in, counts, displs);
}

void NcclComm::all_to_allv(Tensor out, const std::vector<int64_t>& recv_counts,
                           const std::vector<int64_t>& recv_displs, const Tensor& in,
                           const std::vector<int64_t>& send_counts,
                           const std::vector<int64_t>& send_displs) {
  const size_t p = size_t(size_);
  ADGT_CHECK(out.dtype == in.dtype && out.data != in.data && recv_counts.size() == p &&
                 recv_displs.size() == p && send_counts.size() == p && send_displs.size() == p,
             "NcclComm(" << name_ << ")::all_to_allv: distinct in/out of one dtype and " << p
                         << " counts and displacements each");
  for (size_t j = 0; j < p; ++j)
    ADGT_CHECK(send_counts[j] >= 0 && send_displs[j] >= 0 && send_displs[j] + send_counts[j] <= in.numel() &&
                   recv_counts[j] >= 0 && recv_displs[j] >= 0 &&
                   recv_displs[j] + recv_counts[j] <= out.numel(),
               "NcclComm(" << name_ << ")::all_to_allv: the ranges of rank " << j
                           << " fall outside in" << in.shape_str() << " or out" << out.shape_str());
  ADGT_CHECK(recv_counts[rank_] == send_counts[rank_],
             "NcclComm(" << name_ << ")::all_to_allv: rank " << rank_ << " sends itself "
                         << send_counts[rank_] << " elements but expects " << recv_counts[rank_]);
  Timed timed(stats_);
  const ncclDataType_t ty = nccl_type(in.dtype);
  const size_t es = dtype_size(in.dtype);
  int64_t sent = 0;
  ADGT_CUDA(cudaMemcpyAsync(byte_ptr(out, recv_displs[rank_]), byte_ptr(in, send_displs[rank_]),
                            size_t(send_counts[rank_]) * es, cudaMemcpyDeviceToDevice, stream_));
  ADGT_NCCL(ncclGroupStart());
  for (int j = 0; j < size_; ++j) {
    if (j == rank_) continue;
    if (send_counts[j] > 0)
      ADGT_NCCL(ncclSend(byte_ptr(in, send_displs[j]), size_t(send_counts[j]), ty, j, comm_, stream_));
    if (recv_counts[j] > 0)
      ADGT_NCCL(ncclRecv(byte_ptr(out, recv_displs[j]), size_t(recv_counts[j]), ty, j, comm_, stream_));
    sent += send_counts[j] * int64_t(es);
  }
  ADGT_NCCL(ncclGroupEnd());
  finish();
  stats_.bytes += sent;
}

void NcclComm::barrier() {
  Timed timed(stats_);
  ADGT_NCCL(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_, stream_));
  ADGT_CUDA(cudaStreamSynchronize(stream_));
}

}  // namespace adgt

namespace adgt {

std::unique_ptr<Comm> make_nccl_comm(Comm& group, Backend& be) {
  auto* mpi = dynamic_cast<MpiComm*>(&group);
  ADGT_CHECK(mpi, "make_nccl_comm: group '" << group.name() << "' is not an MpiComm");
  auto* cuda = dynamic_cast<CudaBackend*>(&be);
  ADGT_CHECK(cuda, "make_nccl_comm: the backend is " << be.name() << ", not CUDA");
  return std::make_unique<NcclComm>(*mpi, cuda->device(), reinterpret_cast<cudaStream_t>(cuda->stream()),
                                    /*blocking=*/true);
}

}  // namespace adgt

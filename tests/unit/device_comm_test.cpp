// DeviceComm (parallel/comm/device_comm.hpp): device tensors staged through host
// memory give the host transport's results bit for bit, asynchronous ones
// land on completion, host tensors pass through, a mix is refused.
#include <catch2/catch.hpp>
#include <vector>

#include "kernels/emulated/emulated_backend.hpp"
#include "parallel/comm/device_comm.hpp"

using namespace adgt;

namespace {
// A "group of two" whose collectives mark what they did (on host memory
// only), so a test sees both that the call reached the host transport and on
// which memory.
class RecordingComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string name() const override { return "rec"; }
  void all_reduce(Tensor t, ReduceOp) override {
    last = t.data;
    for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] *= 2;  // stands in for a sum
  }
  void reduce_scatter(Tensor out, const Tensor& in) override { inner.reduce_scatter(out, in); }
  void all_gather(Tensor out, const Tensor& in) override {  // both chunks = in
    last = out.data;
    for (int64_t i = 0; i < out.numel(); ++i) out.ptr<float>()[i] = in.ptr<float>()[i % in.numel()];
  }
  void broadcast(Tensor, int) override {}
  void send(const Tensor&, int, int) override {}
  void recv(Tensor, int, int) override {}
  void all_to_all(Tensor out, const Tensor& in) override { inner.all_to_all(out, in); }
  void all_to_allv(Tensor out, const std::vector<int64_t>& rc, const std::vector<int64_t>& rd,
                   const Tensor& in, const std::vector<int64_t>& sc,
                   const std::vector<int64_t>& sd) override {
    inner.all_to_allv(out, rc, rd, in, sc, sd);
  }
  void barrier() override {}
  const void* last = nullptr;
  SelfComm inner;
};
}  // namespace

TEST_CASE("DeviceComm: device tensors are staged, host tensors pass through") {
  EmulatedBackend be(size_t(1) << 30);
  RecordingComm host;
  DeviceComm dc(host, be);
  CHECK(dc.transport() == "mpi (host-staged)");
  std::vector<float> h = {1, 2, 3, 4};
  Buffer d(be, 16);
  be.to_device(d.data(), h.data(), 16);
  const Tensor td(d.data(), DType::F32, {4});
  dc.all_reduce(td);  // would fault if the host transport touched device memory
  CHECK(host.last != d.data());
  std::vector<float> back(4);
  be.to_host(back.data(), d.data(), 16);
  CHECK(back == std::vector<float>{2, 4, 6, 8});
  // A host tensor goes to the transport as it is.
  dc.all_reduce(Tensor(h.data(), DType::F32, {4}));
  CHECK(host.last == h.data());
  CHECK(h == std::vector<float>{2, 4, 6, 8});
  // Asynchronous: the copy back happens when the work completes.
  Work w = dc.start_all_reduce(td);
  w.wait();
  be.to_host(back.data(), d.data(), 16);
  CHECK(back == std::vector<float>{4, 8, 12, 16});
  // All-gather in place (ZeRO-1's: in is chunk 0 of out), staged.
  dc.all_gather(td, td.rows(0, 2));
  be.to_host(back.data(), d.data(), 16);
  CHECK(back == std::vector<float>{4, 8, 4, 8});
  // One device and one host tensor in one call is refused, naming it.
  CHECK_THROWS_WITH(dc.all_gather(td, Tensor(h.data(), DType::F32, {2})),
                    Catch::Contains("DeviceComm(rec)::all_gather"));
}

TEST_CASE("DeviceComm: a group of one moves nothing through the host") {
  EmulatedBackend be(size_t(1) << 30);
  SelfComm self("one");
  DeviceComm dc(self, be);
  std::vector<float> h = {1, 2, 3, 4}, back(4);
  Buffer a(be, 16), b(be, 16);
  be.to_device(a.data(), h.data(), 16);
  const int64_t reads = be.host_reads();
  dc.all_reduce(Tensor(a.data(), DType::F32, {4}));
  dc.all_gather(Tensor(b.data(), DType::F32, {4}), Tensor(a.data(), DType::F32, {4}));
  CHECK(be.host_reads() == reads);  // no staging copies
  be.to_host(back.data(), b.data(), 16);
  CHECK(back == h);
}

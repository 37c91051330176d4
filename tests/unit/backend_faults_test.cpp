// Backend failure paths that must work before any GPU does: a buffer freed
// after a failed op (also while an exception unwinds) never throws, and the
// failure is reported by the next checking call; the device choice names a
// CUDA error instead of treating it as "no GPU".
#include <catch2/catch.hpp>

#include <cstdlib>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "kernels/backend.hpp"
#include "kernels/cpu/cpu_backend.hpp"

using namespace adgt;
using Catch::Matchers::Contains;

static_assert(std::is_nothrow_destructible_v<Buffer>, "~Buffer must not throw");
static_assert(noexcept(std::declval<Buffer&>().reset()), "Buffer::reset must not throw");
static_assert(noexcept(std::declval<Backend&>().release(nullptr)), "Backend::release must not throw");

namespace {

// A CPU backend whose device has "faulted": every op after fail() throws, and
// release defers the failure as the CUDA backend does after a sticky error.
class FaultyBackend final : public CpuBackend {
 public:
  std::string name() const override { return "faulty"; }
  void release(void* p) noexcept override {
    if (failed_) defer_error("release: cudaStreamSynchronize", "cudaErrorIllegalAddress");
    CpuBackend::release(p);
    ++released_;
  }
  void to_device(void* d, const void* s, size_t n) override {
    throw_deferred_error();
    CpuBackend::to_device(d, s, n);
  }
  void to_host(void* d, const void* s, size_t n) override {
    throw_deferred_error();
    CpuBackend::to_host(d, s, n);
  }
  void zero(Tensor t) override {
    if (failed_) throw std::runtime_error("faulty: zero: cudaErrorIllegalAddress");
    CpuBackend::zero(t);
  }
  void fail() { failed_ = true; }
  int released() const { return released_; }

 private:
  bool failed_ = false;
  int released_ = 0;
};

}  // namespace

TEST_CASE("backend faults: buffers freed after a failed op never throw; the next check reports it",
          "[backend]") {
  FaultyBackend be;
  {
    Buffer keep(be, 64);
    be.fail();
    float x[4] = {1, 2, 3, 4};
    // An op fails; the buffers of the scope are freed while its exception unwinds.
    auto failing_scope = [&] {
      Buffer a(be, 256), b(be, 128);
      be.zero(Tensor(a.data(), DType::F32, {64}));
    };
    CHECK_THROWS_WITH(failing_scope(), Contains("faulty: zero: cudaErrorIllegalAddress"));
    CHECK(be.released() == 2);  // both freed, nothing terminated
    // The deferred failure comes out of the next checking call, naming the release, once.
    CHECK_THROWS_WITH(be.to_host(x, keep.data(), 16),
                      Contains("faulty: release: cudaStreamSynchronize: cudaErrorIllegalAddress (and 1 "
                               "later failures)"));
    CHECK_NOTHROW(be.synchronize());
  }
  CHECK(be.released() == 3);
  CHECK_THROWS_WITH(be.synchronize(), Contains("cudaErrorIllegalAddress"));
}

TEST_CASE("backend choice: a CUDA error is named, not mistaken for no GPU", "[backend]") {
  const DeviceQuery none{0, ""}, two{2, ""};
  const DeviceQuery old_driver{0, "cudaErrorInsufficientDriver (CUDA driver version is insufficient for CUDA runtime version)"};
  CHECK(choose_device("cpu", old_driver, true).device == "cpu");
  CHECK(choose_device("auto", two, true).device == "cuda");
  CHECK(choose_device("auto", none, true).device == "cpu");
  CHECK(choose_device("auto", none, true).warning.empty());
  CHECK(choose_device("auto", two, false).device == "cpu");
  const DeviceChoice a = choose_device("auto", old_driver, true);
  CHECK(a.device == "cpu");
  CHECK_THAT(a.warning, Contains("cudaErrorInsufficientDriver") && Contains("update the driver") &&
                            Contains("Training on the CPU"));
  CHECK(choose_device("cuda", two, true).device == "cuda");
  CHECK_THROWS_WITH(choose_device("cuda", old_driver, true),
                    Contains("train.device=cuda: the CUDA runtime could not list devices: "
                             "cudaErrorInsufficientDriver") && Contains("update the driver"));
  CHECK_THROWS_WITH(choose_device("cuda", DeviceQuery{0, "cudaErrorUnknown (unknown error)"}, true),
                    Contains("cudaErrorUnknown") && Contains("nvidia-smi"));
  CHECK_THROWS_WITH(choose_device("cuda", none, true), Contains("no CUDA device is visible"));
  CHECK_THROWS_WITH(choose_device("cuda", two, false), Contains("built without CUDA"));
  CHECK_THROWS_WITH(choose_device("tpu", two, true), Contains("unknown device 'tpu'"));
  // No driver at all (no libcuda.so.1, no /dev/nvidiactl): the runtime's error
  // means "no GPU here"; auto is silent, cuda says so.
  DeviceQuery no_driver = old_driver;
  no_driver.driver = false;
  CHECK(choose_device("auto", no_driver, true).device == "cpu");
  CHECK(choose_device("auto", no_driver, true).warning.empty());
  CHECK_THROWS_WITH(choose_device("cuda", no_driver, true),
                    Contains("no NVIDIA driver is installed") && Contains("train.device=cpu"));
}

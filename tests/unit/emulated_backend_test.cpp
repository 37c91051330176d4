// The emulated device (kernels/emulated/): its memory faults when host code
// touches it outside a backend call, its ops refuse host pointers, and its
// numbers are the CPU backend's bit for bit.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/emulated/emulated_backend.hpp"

using namespace adgt;
using Catch::Contains;

namespace {
// Runs f in a child process with stderr captured; returns (how it ended, stderr).
struct ChildEnd {
  bool killed_by_segv = false;
  int exit_code = -1;
  std::string err;
};
template <class F>
ChildEnd in_child(F f) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 2);
    // Default SIGSEGV behind the arena's handler (not the test framework's).
    signal(SIGSEGV, SIG_DFL);
    DeviceArena::install_fault_handler();
    f();
    _exit(0);
  }
  close(fds[1]);
  ChildEnd e;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) e.err.append(buf, size_t(n));
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  e.killed_by_segv = WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV;
  if (WIFEXITED(st)) e.exit_code = WEXITSTATUS(st);
  return e;
}

std::vector<float> random_floats(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> v(n);
  for (float& x : v) x = float(r.normal());
  return v;
}
}  // namespace

TEST_CASE("emulated device: host reads and writes of its memory fault, with a report") {
  // The arena's handler is installed in the child, after SIG_DFL, so it chains to the default.
  auto read_after_alloc = [] {
    EmulatedBackend be(size_t(1) << 30);
    float* p = static_cast<float*>(be.alloc(4096));
    volatile float x = p[3];  // the bug: host code reading device memory
    (void)x;
  };
  const ChildEnd r = in_child(read_after_alloc);
  CHECK(r.killed_by_segv);
  CHECK_THAT(r.err, Contains("host code read or wrote emulated device memory"));
  CHECK_THAT(r.err, Contains("byte 12 of a 4096-byte buffer"));

  const ChildEnd w = in_child([] {
    EmulatedBackend be(size_t(1) << 30);
    std::vector<float> h(256, 1.0f);
    float* p = static_cast<float*>(be.alloc(1024));
    be.to_device(p, h.data(), 1024);  // fine: through the backend
    p[0] = 2.0f;                      // the bug
  });
  CHECK(w.killed_by_segv);
  CHECK_THAT(w.err, Contains("byte 0 of a 1024-byte buffer"));

  // The same code on host memory runs to the end: the fault is the emulation's doing.
  const ChildEnd ok = in_child([] {
    CpuBackend be;
    float* p = static_cast<float*>(be.alloc(4096));
    volatile float x = p[3];
    (void)x;
    be.release(p);
  });
  CHECK_FALSE(ok.killed_by_segv);
  CHECK(ok.exit_code == 0);
}

TEST_CASE("emulated device: ops refuse host tensors; copies check their sides") {
  EmulatedBackend be(size_t(1) << 30);
  Buffer y(be, 4 * 8 * 4), w(be, 8 * 8 * 4);
  std::vector<float> host_x(4 * 8, 1.0f);
  const Tensor ty(y.data(), DType::F32, {4, 8}), tw(w.data(), DType::F32, {8, 8});
  const Tensor tx(host_x.data(), DType::F32, {4, 8});
  try {
    be.linear_forward(ty, tx, tw);
    FAIL("a host tensor was accepted");
  } catch (const std::exception& e) {
    CHECK_THAT(std::string(e.what()), Contains("linear_forward's x (4,8) f32"));
    CHECK_THAT(std::string(e.what()), Contains("is host memory"));
  }
  // A view running past the end of its buffer is caught too.
  const Tensor past(y.data(), DType::F32, {8, 8});
  CHECK_THROWS_WITH(be.zero(past), Contains("not inside one live device buffer"));
  std::vector<float> h(64);
  CHECK_THROWS_WITH(be.to_host(w.data(), y.data(), 16), Contains("to_host's destination"));
  CHECK_THROWS_WITH(be.to_device(h.data(), h.data(), 16), Contains("to_device's destination"));
  CHECK_THROWS_WITH(be.to_host(h.data(), h.data(), 16), Contains("to_host's source"));
  // Freeing a pointer that is not a live buffer is reported at the next sync.
  be.release(h.data());
  CHECK_THROWS_WITH(be.synchronize(), Contains("not a live emulated-device buffer"));
  CHECK(be.is_device_pointer(y.data()));
  CHECK_FALSE(be.is_device_pointer(h.data()));
  CHECK_FALSE(be.is_host());
}

TEST_CASE("emulated device: numbers are the CPU backend's, bit for bit") {
  EmulatedBackend em(size_t(1) << 30);
  CpuBackend cpu;
  const int64_t N = 6, I = 16, O = 12;
  const auto x = random_floats(N * I, 1), w = random_floats(O * I, 2), dy = random_floats(N * O, 3);
  auto run = [&](Backend& be) {
    Buffer bx(be, x.size() * 4), bw(be, w.size() * 4), by(be, N * O * 4), bdy(be, dy.size() * 4),
        bdx(be, x.size() * 4), bdw(be, w.size() * 4);
    be.to_device(bx.data(), x.data(), x.size() * 4);
    be.to_device(bw.data(), w.data(), w.size() * 4);
    be.to_device(bdy.data(), dy.data(), dy.size() * 4);
    const Tensor tx(bx.data(), DType::F32, {N, I}), tw(bw.data(), DType::F32, {O, I}),
        ty(by.data(), DType::F32, {N, O}), tdy(bdy.data(), DType::F32, {N, O}),
        tdx(bdx.data(), DType::F32, {N, I}), tdw(bdw.data(), DType::F32, {O, I});
    be.zero(tdw);
    be.linear_forward(ty, tx, tw);
    be.linear_backward(tdx, tdw, tdy, tx, tw, false);
    be.swiglu_forward(tdy, ty, ty);
    std::vector<float> out(size_t(N * O + N * I + O * I));
    be.to_host(out.data(), ty.data, ty.bytes());
    be.to_host(out.data() + N * O, tdx.data, tdx.bytes());
    be.to_host(out.data() + N * O + N * I, tdw.data, tdw.bytes());
    std::vector<float> h(size_t(N * O));
    be.to_host(h.data(), tdy.data, tdy.bytes());
    out.insert(out.end(), h.begin(), h.end());
    out.push_back(float(be.sum_squares(tx)));
    return out;
  };
  const auto a = run(em), b = run(cpu);
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

TEST_CASE("emulated device: the arena reuses and coalesces freed blocks") {
  DeviceArena a(size_t(64) << 20);
  void* p = a.alloc(1000);
  void* q = a.alloc(3000);
  void* r = a.alloc(10);
  CHECK(a.contains(p, 1000));
  CHECK_FALSE(a.contains(p, 1025));  // 1000 rounds to 1024
  a.release(p);
  a.release(q);
  CHECK_FALSE(a.contains(p));
  // The two freed neighbours make one block that takes a request of their sum.
  void* s = a.alloc(4000);
  CHECK(s == p);
  a.release(s);
  a.release(r);
  CHECK(a.used() == 0);
  CHECK(a.peak() >= 1024 + 3072 + 256);
  a.release(reinterpret_cast<void*>(0x1234));
  CHECK(a.bad_releases() == 1);
  CHECK_THROWS_WITH(a.alloc(size_t(65) << 20), Contains("out of memory"));
}

TEST_CASE("sum_squares_ranges: each range's sum_squares, bit for bit, without a host read") {
  const auto v = random_floats(70000, 9);  // ranges across the CPU's 16384-element chunks
  const std::vector<int64_t> bounds = {0, 5, 5, 40000, 40000, 40000, 123, 70000};
  CpuBackend cpu;
  EmulatedBackend em(size_t(1) << 30);
  std::vector<double> want;
  for (size_t i = 0; i < bounds.size(); i += 2)
    want.push_back(cpu.sum_squares(Tensor(const_cast<float*>(v.data()) + bounds[i], DType::F32,
                                          {bounds[i + 1] - bounds[i]})));
  std::vector<double> got_cpu(4);
  cpu.sum_squares_ranges(Tensor(got_cpu.data(), DType::F64, {4}),
                         Tensor(const_cast<float*>(v.data()), DType::F32, {70000}), bounds);
  CHECK(std::memcmp(got_cpu.data(), want.data(), 4 * sizeof(double)) == 0);
  Buffer x(em, v.size() * 4), out(em, 4 * sizeof(double));
  em.to_device(x.data(), v.data(), v.size() * 4);
  const int64_t reads = em.host_reads();
  em.sum_squares_ranges(Tensor(out.data(), DType::F64, {4}), Tensor(x.data(), DType::F32, {70000}),
                        bounds);
  CHECK(em.host_reads() == reads);  // nothing came back to the host yet
  std::vector<double> got(4);
  em.to_host(got.data(), out.data(), 4 * sizeof(double));
  CHECK(em.host_reads() == reads + 1);
  CHECK(std::memcmp(got.data(), want.data(), 4 * sizeof(double)) == 0);
}

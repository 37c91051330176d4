#include "parallel/switch/shared_sources.hpp"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace adgt {

namespace {
bool all_true(bool mine) {
  int v = mine ? 1 : 0, all = 0;
  MPI_Allreduce(&v, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}
}  // namespace

SharedSources::SharedSources(const RankState& src) {
  int world = 0, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  views_.assign(size_t(world), StateView{});
  const char* env = std::getenv("ADGT_SWITCH_SHARED");
  const std::string want = env ? env : "";
  // The same on every rank (mpirun passes the environment to all; a rank
  // that differs is outvoted by the all-reduces).
  if (!all_true(want != "0")) {
    why_ = "ADGT_SWITCH_SHARED=0";
    return;
  }
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, me, MPI_INFO_NULL, &node_);
  MPI_Comm_size(node_, &node_size_);
  world_of_.assign(size_t(node_size_), 0);
  MPI_Allgather(&me, 1, MPI_INT, world_of_.data(), 1, MPI_INT, node_);
  if (!all_true(want != "window"))
    why_ = "ADGT_SWITCH_SHARED=window";
  else if (try_cross_memory(src, me)) {
    mode_ = Mode::CrossMemory;
    return;
  }
  if (try_window(src)) mode_ = Mode::Window;
}

bool SharedSources::try_cross_memory(const RankState& src, int me) {
  // Every process's id, buffer addresses and sizes, and its first parameter's
  // bits: a test read of each peer must return them.
  int64_t mine[8] = {int64_t(getpid()),
                     int64_t(reinterpret_cast<intptr_t>(src.params.data())),
                     int64_t(reinterpret_cast<intptr_t>(src.exp_avg.data())),
                     int64_t(reinterpret_cast<intptr_t>(src.exp_avg_sq.data())),
                     int64_t(src.params.size()),
                     int64_t(src.exp_avg.size()),
                     int64_t(src.exp_avg_sq.size()),
                     0};
  if (!src.params.empty()) std::memcpy(&mine[7], src.params.data(), sizeof(float));
  std::vector<int64_t> all(size_t(8 * node_size_));
  MPI_Allgather(mine, 8, MPI_INT64_T, all.data(), 8, MPI_INT64_T, node_);
  bool ok = true;
  for (int r = 0; r < node_size_; ++r) {
    const int64_t* a = &all[size_t(8 * r)];
    StateView& v = views_[size_t(world_of_[size_t(r)])];
    v.present = true;
    v.pid = world_of_[size_t(r)] == me ? 0 : int(a[0]);
    for (int g = 0; g < 3; ++g) {
      v.buf[g] = reinterpret_cast<const float*>(intptr_t(a[1 + g]));
      v.size[g] = a[4 + g];
    }
    if (v.pid == 0 || v.size[0] == 0) continue;
    int64_t got = 0;
    iovec local{&got, sizeof(float)};
    iovec remote{const_cast<float*>(v.buf[0]), sizeof(float)};
    if (process_vm_readv(v.pid, &local, 1, &remote, 1, 0) != ssize_t(sizeof(float)) ||
        got != a[7]) {
      if (ok) why_ = "cross-memory reads refused (" + std::string(std::strerror(errno)) + ")";
      ok = false;
    }
  }
  // A test hook: this world rank's reads count as refused (the fallback's ctest).
  if (const char* t = std::getenv("ADGT_TEST_CROSS_MEMORY_REFUSED"); t && std::atoi(t) == me && ok) {
    why_ = "cross-memory reads refused (ADGT_TEST_CROSS_MEMORY_REFUSED)";
    ok = false;
  }
  if (all_true(ok)) return true;
  if (why_.empty()) why_ = "cross-memory reads refused on another process";
  views_.assign(views_.size(), StateView{});
  return false;
}

bool SharedSources::try_window(const RankState& src) {
  MPI_Comm_set_errhandler(node_, MPI_ERRORS_RETURN);
  const int64_t sizes[3] = {int64_t(src.params.size()), int64_t(src.exp_avg.size()),
                            int64_t(src.exp_avg_sq.size())};
  const int64_t total = sizes[0] + sizes[1] + sizes[2];
  MPI_Info info;
  MPI_Info_create(&info);
  MPI_Info_set(info, "alloc_shared_noncontig", "true");
  float* base = nullptr;
  const int rc =
      MPI_Win_allocate_shared(MPI_Aint(std::max<int64_t>(total, 1) * int64_t(sizeof(float))),
                              int(sizeof(float)), info, node_, &base, &win_);
  MPI_Info_free(&info);
  if (!all_true(rc == MPI_SUCCESS)) {
    // A process's window failed: it cannot be freed collectively, so the
    // others' segments are left to the end of the run (a rare path: the
    // node's shared memory is full).
    win_ = MPI_WIN_NULL;
    why_ += (why_.empty() ? "" : "; ") + std::string("no shared-memory window on every process");
    return false;
  }
  std::memcpy(base, src.params.data(), size_t(sizes[0]) * sizeof(float));
  std::memcpy(base + sizes[0], src.exp_avg.data(), size_t(sizes[1]) * sizeof(float));
  std::memcpy(base + sizes[0] + sizes[1], src.exp_avg_sq.data(), size_t(sizes[2]) * sizeof(float));
  // Every process's sizes, and the writes visible to the node before anyone reads.
  std::vector<int64_t> all(size_t(3 * node_size_));
  MPI_Allgather(sizes, 3, MPI_INT64_T, all.data(), 3, MPI_INT64_T, node_);
  MPI_Win_fence(0, win_);
  for (int r = 0; r < node_size_; ++r) {
    MPI_Aint bytes = 0;
    int unit = 0;
    float* at = nullptr;
    MPI_Win_shared_query(win_, r, &bytes, &unit, &at);
    StateView& v = views_[size_t(world_of_[size_t(r)])];
    v.present = true;
    int64_t off = 0;
    for (int g = 0; g < 3; ++g) {
      v.buf[g] = at + off;
      v.size[g] = all[size_t(3 * r + g)];
      off += v.size[g];
    }
    if (int64_t(bytes) < off * int64_t(sizeof(float)))
      throw std::logic_error("shared sources: process " + std::to_string(world_of_[size_t(r)]) +
                             "'s segment holds " + std::to_string(bytes) +
                             " bytes, fewer than its state");
  }
  return true;
}

std::string SharedSources::describe() const {
  const std::string n = std::to_string(node_size_) + " processes on this node";
  switch (mode_) {
    case Mode::CrossMemory:
      return "cross-memory reads (" + n + ")";
    case Mode::Window:
      return "shared-memory window (" + n + (why_.empty() ? "" : "; " + why_) + ")";
    case Mode::Messages:
      break;
  }
  return "messages (" + why_ + ")";
}

SharedSources::~SharedSources() {
  if (win_ != MPI_WIN_NULL) {
    MPI_Win_fence(0, win_);  // nobody frees a segment another process may still read
    MPI_Win_free(&win_);
  } else if (mode_ == Mode::CrossMemory) {
    MPI_Barrier(node_);  // nobody frees its host copy while another process reads it
  }
  if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
}

}  // namespace adgt

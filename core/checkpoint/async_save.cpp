// Asynchronous checkpoints: the sharded save's phases over step boundaries
// (core/checkpoint/async_save.hpp).
#include "core/checkpoint/async_save.hpp"

#include <chrono>
#include <utility>

#include "core/comm.hpp"

namespace adgt {

namespace {
using clock = std::chrono::steady_clock;
double since(clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); }
}  // namespace

AsyncCheckpointSaver::~AsyncCheckpointSaver() {
  if (preparer_.joinable()) preparer_.join();
  abandon();
}

std::optional<AsyncCheckpointSaver::Committed> AsyncCheckpointSaver::start(CheckpointState st,
                                                                           const ShardLayout& lay, Comm& world,
                                                                           const std::string& root, int64_t keep) {
  std::optional<Committed> previous = finish(world);  // at most one save in flight
  const auto t0 = clock::now();
  save_ = begin_sharded_save(root, st, lay, world, keep);  // throws on every rank alike
  st_ = std::move(st);
  lay_ = lay;
  times_ = Committed{};
  times_.step = st_.step;
  times_.begin_s = since(t0);
  written_.store(false);
  active_ = true;
  writer_ = std::thread([this] {
    // No communication here, and the only HDF5 calls of the process meanwhile.
    const auto tw = clock::now();
    write_sharded_rank_file(save_, st_, lay_);  // records its error, never throws
    times_.write_s = since(tw);
    written_.store(true, std::memory_order_release);
  });
  return previous;
}

std::optional<AsyncCheckpointSaver::Committed> AsyncCheckpointSaver::poll(Comm& world) {
  if (!active_) return std::nullopt;
  const auto t0 = clock::now();
  int32_t pending[1] = {written_.load(std::memory_order_acquire) ? 0 : 1};  // this rank still writing
  world.all_reduce(Tensor(pending, DType::I32, {1}), ReduceOp::Max);
  times_.poll_s += since(t0);
  ++times_.polls;
  if (pending[0]) return std::nullopt;
  return commit(world);
}

std::optional<AsyncCheckpointSaver::Committed> AsyncCheckpointSaver::finish(Comm& world) {
  if (!active_) return std::nullopt;
  return commit(world);
}

AsyncCheckpointSaver::Committed AsyncCheckpointSaver::commit(Comm& world) {
  auto t0 = clock::now();
  if (writer_.joinable()) writer_.join();  // before any HDF5 call on this thread
  active_ = false;
  Committed c = times_;
  c.wait_s = since(t0);
  t0 = clock::now();
  try {
    c.dir = commit_sharded_save(save_, st_, lay_, world);  // discards the directory on an error
  } catch (...) {
    st_ = CheckpointState{};
    throw;
  }
  // The written copy's buffers stay for the next save (take_buffers).
  spare_ = CheckpointState{};
  spare_.params = std::move(st_.params);
  spare_.exp_avg = std::move(st_.exp_avg);
  spare_.exp_avg_sq = std::move(st_.exp_avg_sq);
  st_ = CheckpointState{};
  c.commit_s = since(t0);
  return c;
}

void AsyncCheckpointSaver::prepare_buffers(size_t params, size_t moments) {
  if (preparer_.joinable()) preparer_.join();
  preparer_ = std::thread([this, params, moments] {
    // Each page written once: the kernel maps it now rather than in the save's copy.
    spare_.params.assign(params, 0.0f);
    spare_.exp_avg.assign(moments, 0.0f);
    spare_.exp_avg_sq.assign(moments, 0.0f);
  });
}

CheckpointState AsyncCheckpointSaver::take_buffers() {
  if (preparer_.joinable()) preparer_.join();
  if (active_) return {};
  CheckpointState s;
  s.params = std::move(spare_.params);
  s.exp_avg = std::move(spare_.exp_avg);
  s.exp_avg_sq = std::move(spare_.exp_avg_sq);
  spare_ = CheckpointState{};
  return s;
}

void AsyncCheckpointSaver::abandon() noexcept {
  if (writer_.joinable()) writer_.join();
  if (!active_) return;
  active_ = false;
  discard_sharded_save(save_);
  st_ = CheckpointState{};
}

}  // namespace adgt

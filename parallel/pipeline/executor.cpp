#include "parallel/pipeline/executor.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <atomic>
#include <chrono>
#include <thread>
#include <tuple>

#include <omp.h>
#include <time.h>

#include "core/trace.hpp"
#include "kernels/check.hpp"
#include "kernels/clock.hpp"
#include "parallel/pipeline/grouped.hpp"
#include "parallel/emulate/slowdown.hpp"
#include "parallel/comm/mpi_comm.hpp"

namespace adgt {

namespace {
constexpr int kAct = 0, kGrad = 1;
constexpr int kMaxTag = 32767;  // MPI guarantees MPI_TAG_UB >= 32767

// Large messages over MPI move only while the sender calls into MPI (no
// asynchronous progress on the CPU transports), so an activation sent before a
// long compute would reach its neighbour only after it. While this rank
// computes (and so makes no MPI call), a helper thread polls the pending sends.
// The main thread leaves a compute only once the helper is out of MPI.
class SendProgress {
 public:
  // comms[0]: the pipeline group; the others' started collectives move too.
  // poll_us: between polls while the rank computes.
  SendProgress(std::vector<Comm*> comms, int poll_us) : comms_(std::move(comms)), poll_us_(poll_us) {
    if (comms_[0]->size() > 1 && comms_[0]->progress_from_thread())
      thread_ = std::thread([this] { loop(); });
  }
  ~SendProgress() {
    stop_.store(true);
    allow_.store(true);  // wakes the loop, which sees stop_ first
    allow_.notify_one();
    if (thread_.joinable()) thread_.join();
  }
  void compute_begin() {
    allow_.store(true);
    allow_.notify_one();
  }
  void compute_end() {
    allow_.store(false);
    while (busy_.load()) std::this_thread::yield();
  }

 private:
  // Polls every poll_us while the rank computes and sleeps (no wake-ups)
  // between computes: with many ranks on few cores, a poll every 20 us on
  // every rank's helper whether or not it computed was hundreds of
  // thousands of wake-ups a second taking the cores from the ranks' compute.
  void loop() {
    for (;;) {
      allow_.wait(false);
      if (stop_.load()) return;
      busy_.store(true);
      if (allow_.load())  // re-checked after announcing busy
        for (Comm* c : comms_) c->progress();
      busy_.store(false);
      std::this_thread::sleep_for(std::chrono::microseconds(poll_us_));
    }
  }
  std::vector<Comm*> comms_;
  int poll_us_;
  std::atomic<bool> allow_{false}, busy_{false}, stop_{false};
  std::thread thread_;
};
}  // namespace

PipelineExecutor::PipelineExecutor(Model& model, Backend& be, Comm& pp_comm, pp::Schedule s)
    : model_(model), be_(be), comm_(pp_comm), rank_(pp_comm.rank()) {
  set_schedule(std::move(s));
  in_.assign(size_t(model.batch() * model.seq_len()), 0);
  tg_.assign(in_.size(), -1);
}

void PipelineExecutor::set_schedule(pp::Schedule s) {
  ADGT_CHECK(s.pp == comm_.size(), "pipeline executor: schedule '" << s.name << "' has pp=" << s.pp
                                                                   << " but the pipeline group has "
                                                                   << comm_.size() << " ranks");
  ADGT_CHECK(s.virtual_stages == model_.num_chunks(),
             "pipeline executor: schedule '" << s.name << "' has " << s.virtual_stages
                                             << " chunks per rank but this rank holds "
                                             << model_.num_chunks());
  ADGT_CHECK(2 * (int64_t(s.microbatches) * s.num_stages()) <= kMaxTag,
             "pipeline executor: " << s.microbatches << " micro-batches x " << s.num_stages()
                                   << " stages exceed the message tags (at most "
                                   << kMaxTag / 2 << ")");
  // On NCCL (rendezvous sends, matched by order) each rank's receives move
  // to their place in the messages' global order, which cannot deadlock;
  // checked again here (parallel/pipeline/grouped.hpp). ADGT_PP_RENDEZVOUS=1
  // runs the same lists on MPI, so the CPU tests run what NCCL would.
  static const bool force = [] {
    const char* e = std::getenv("ADGT_PP_RENDEZVOUS");
    return e && std::string(e) == "1";
  }();
  if (comm_.rendezvous_sends() || force) {
    static bool told = false;
    if (force && !comm_.rendezvous_sends() && rank_ == 0 && !told)
      std::fprintf(stderr, "pipeline: ADGT_PP_RENDEZVOUS=1: the schedule runs as pp::for_rendezvous\n");
    told = true;
    s = pp::for_rendezvous(s);
    pp::validate_grouped(s);
  }
  ADGT_CHECK(self_msgs_.empty(), "pipeline executor: a schedule change with "
                                     << self_msgs_.size() << " in-memory hand-overs pending");
  sched_ = std::move(s);
  slot_of_.assign(size_t(model_.num_chunks()), {});
  free_slots_.assign(size_t(model_.num_chunks()), {});
  for (int c = 0; c < model_.num_chunks(); ++c)
    for (int k = model_.num_slots(c); k-- > 0;) free_slots_[size_t(c)].push_back(k);
}

int PipelineExecutor::tag(int kind, int mb, int receiving_stage) const {
  return 2 * (mb * sched_.num_stages() + receiving_stage) + kind;
}

int PipelineExecutor::slot_for(int chunk, int mb) {
  auto& m = slot_of_[size_t(chunk)];
  auto it = m.find(mb);
  if (it != m.end()) return it->second;
  auto& fr = free_slots_[size_t(chunk)];
  if (fr.empty()) {
    model_.add_slot(chunk);
    fr.push_back(model_.num_slots(chunk) - 1);
  }
  const int s = fr.back();
  fr.pop_back();
  m[mb] = s;
  peak_held_ = std::max(peak_held_, ++held_);
  return s;
}

void PipelineExecutor::release_slot(int chunk, int mb) {
  auto& m = slot_of_[size_t(chunk)];
  auto it = m.find(mb);
  ADGT_CHECK(it != m.end(), "pipeline executor: micro-batch " << mb << " of chunk " << chunk
                                                              << " has no activations to release");
  free_slots_[size_t(chunk)].push_back(it->second);
  m.erase(it);
  --held_;
}

Tensor PipelineExecutor::send_buffer(const Tensor& like) {
  const size_t bytes = like.bytes();
  for (SendBuf& b : sends_) {
    if (b.id >= 0 && comm_.send_done(b.id)) b.id = -1;
    if (b.id == -1 && b.buf.bytes() == bytes) {
      b.id = -2;  // reserved; the isend sets the real id
      return Tensor(b.buf.data(), like.dtype, {like.numel()});
    }
  }
  sends_.push_back({Buffer(be_, bytes), -2});
  return Tensor(sends_.back().buf.data(), like.dtype, {like.numel()});
}

void PipelineExecutor::isend_copy(const Tensor& t, int peer, int tg) {
  Tensor b = send_buffer(t);
  be_.copy(b, Tensor(t.data, t.dtype, {t.numel()}));
  // No wait here: the comm orders the send after the copy (NcclComm by an
  // event on the compute stream; host-staged DeviceComm by its host copy,
  // which waits for the stream; host tensors are done when copy returns).
  const int64_t id = comm_.isend(b, peer, tg);
  for (SendBuf& s : sends_)
    if (s.buf.data() == b.data) s.id = id;
}

Buffer PipelineExecutor::take_buffer(std::vector<Buffer>& pool, size_t bytes) {
  for (size_t f = 0; f < pool.size(); ++f)
    if (pool[f].bytes() == bytes) {
      Buffer b = std::move(pool[f]);
      pool.erase(pool.begin() + std::ptrdiff_t(f));
      return b;
    }
  return Buffer(be_, bytes);
}

void PipelineExecutor::hand_over(const Tensor& t, int tg, std::vector<Buffer>& pool) {
  ADGT_CHECK(!self_msgs_.count(tg), "pipeline executor: rank " << rank_ << " hands message tag " << tg
                                                               << " to itself twice");
  Buffer b = take_buffer(pool, t.bytes());
  be_.copy(Tensor(b.data(), t.dtype, {t.numel()}), Tensor(t.data, t.dtype, {t.numel()}));
  self_msgs_.emplace(tg, std::move(b));
}

Buffer PipelineExecutor::take_over(int tg, const pp::Instr& in) {
  auto it = self_msgs_.find(tg);
  ADGT_CHECK(it != self_msgs_.end(), "pipeline executor: rank " << rank_ << " " << pp::to_string(in)
                                                                << " from itself before its send");
  Buffer b = std::move(it->second);
  self_msgs_.erase(it);
  return b;
}

double PipelineExecutor::last_busy_seconds() const {
  double b = 0;
  for (const auto& e : timeline_) b += e.end - e.start;
  return b;
}

double PipelineExecutor::last_compute_seconds() const {
  double b = 0;
  for (const auto& e : timeline_) b += e.own_seconds();
  return b;
}

// One step's state: what run_step's instructions share.
struct PipelineExecutor::StepRun {
  const MicroBatchFetch& fetch;
  double grad_scale;
  const GradHooks& hooks;
  const std::vector<pp::Instr>& list;
  // On an emulation's virtual clock the timeline is in that clock's time
  // (what a rank with a core of its own would see): the backend's marks are
  // wall time, in which ranks sharing cores wait for each other's turn.
  bool vclock = false;
  double v_start = 0;
  std::vector<std::pair<double, double>> vmarks;  // per timeline entry, with vclock
  // Time in the receives (waiting for a neighbour, or the transport's copy),
  // on the timeline's clock: the virtual one, else the host's wall clock
  // when the receives block the host (a host backend). A device's receive
  // only enqueues (NCCL): not measured there (-1).
  bool host_waits = false;
  std::vector<std::pair<int, int>> marks;  // per timeline entry: its start and end marks
  double loss_sum = 0;
  SendProgress* progress = nullptr;
  // The helper thread may call MPI only while this thread makes no MPI call:
  // not when a compute itself communicates (tensor parallelism, the MoE
  // all-to-all).
  bool progress_ok = false;
  // Snapshots of input gradients between a backward and its SendGrad.
  std::map<std::pair<int, int>, Tensor> grad_out;
  // Per chunk: whether its last weight gradients came from a fused Backward
  // that reported its units (hooks.unit) and summed its tp partials.
  std::vector<char> fused_last;
  // Each compute's busy time is measured as CPU time on a host backend with
  // one thread per rank, as counted FLOPs on the model clock, else -1.
  bool cpu_clock = false;
  // Each chunk's last backward of the step: MoE expert replicas send their
  // gradients (summed over the micro-batches) back to the owners there, once
  // a step (Model::defer_replica_grads), before the chunk's ReduceGrads.
  std::vector<size_t> last_backward;
  // log.trace: the recorder's time at the step's start (the timeline's 0);
  // host_spans: every instruction's span is taken in the loop, from the end
  // of the previous one (its bookkeeping and the started collectives'
  // progress included), on the recorder's clock (a host backend), else only
  // the non-compute ones.
  bool tracing = false, host_spans = false;
  double trace0 = 0;
  Backend* ranges = nullptr;  // the recorder's profiler ranges (NVTX), nullptr: none
};

double PipelineExecutor::clock_now(const StepRun& st) const {
  return st.vclock ? slow_->now() : wall_seconds();
}

void PipelineExecutor::recv_timed(StepRun& st, Tensor t, int peer, int tg) {
  const double w0 = st.host_waits ? clock_now(st) : 0.0;
  comm_.recv(t, peer, tg);
  if (st.host_waits) {
    const double w1 = clock_now(st);
    wait_s_ += w1 - w0;
    msg_times_.push_back({peer, tg, false, w1});
  }
}

void PipelineExecutor::note_sent(StepRun& st, int peer, int tg) {
  if (st.host_waits) msg_times_.push_back({peer, tg, true, clock_now(st)});
}

// Every compute instruction runs here: the helper thread moves sends while
// it computes (when `helper`), and the slowdown hook (inactive unless
// emulated) stretches it, the helper still moving sends. Returns the
// piece's busy time (ExecutedInstr::busy).
template <class Piece>
double PipelineExecutor::compute(StepRun& st, bool helper, Piece&& piece) {
  const auto work = [&] { return slow_ ? slow_->compute_now() : thread_cpu_seconds(); };
  const double c0 = st.cpu_clock ? work() : 0;
  if (helper) st.progress->compute_begin();
  if (slow_) slow_->begin();
  piece();
  const double busy = st.cpu_clock ? (work() - c0) * (slow_ ? slow_->factor() : 1.0) : -1.0;
  if (slow_) slow_->catch_up();
  st.progress->compute_end();
  return busy;
}

void PipelineExecutor::timeline_entry(StepRun& st, const ExecutedInstr& e, int m0, double v0) {
  st.marks.emplace_back(m0, be_.mark());
  if (st.vclock) st.vmarks.emplace_back(v0 - st.v_start, slow_->now() - st.v_start);
  timeline_.push_back(e);
}

void PipelineExecutor::exec_transfer(StepRun& st, size_t i, const pp::Instr& in, int stage) {
  const int c = in.chunk, mb = in.microbatch;
  switch (in.op) {
    case pp::Op::RecvAct: {
      const int slot = slot_for(c, mb);
      if (in.peer == rank_) {  // the vee placement's turn on rank pp-1: in memory
        Buffer b = take_over(tag(kAct, mb, stage), in);
        const Tensor dst = model_.stage_input(c, slot);
        Tensor src = dst;
        src.data = b.data();
        be_.copy(dst, src);
        free_self_.push_back(std::move(b));
        break;
      }
      recv_timed(st, model_.stage_input(c, slot), in.peer, tag(kAct, mb, stage));
      break;
    }
    case pp::Op::RecvGrad: {
      if (in.peer == rank_) {
        grads_in_[{c, mb}] = take_over(tag(kGrad, mb, stage), in);
        break;
      }
      const Tensor out = model_.stage_output(c, slot_for(c, mb));
      // Reuse a buffer whose gradient a backward has consumed: the rank
      // holds only the gradients received and not yet used.
      Buffer& b = grads_in_[{c, mb}];
      if (b.bytes() != out.bytes()) b = take_buffer(free_grads_, out.bytes());
      recv_timed(st, Tensor(b.data(), out.dtype, {out.numel()}), in.peer, tag(kGrad, mb, stage));
      break;
    }
    case pp::Op::SendAct: {
      const int slot = slot_for(c, mb);
      if (in.peer == rank_) {
        hand_over(model_.stage_output(c, slot), tag(kAct, mb, stage + 1), free_self_);
        break;
      }
      isend_copy(model_.stage_output(c, slot), in.peer, tag(kAct, mb, stage + 1));
      note_sent(st, in.peer, tag(kAct, mb, stage + 1));
      break;
    }
    case pp::Op::SendGrad: {
      auto it = st.grad_out.find({c, mb});
      ADGT_CHECK(it != st.grad_out.end(), "pipeline executor: rank " << rank_ << " #" << i << " "
                                                                     << pp::to_string(in)
                                                                     << " before its backward");
      if (in.peer == rank_) {  // into a buffer of the received gradients' pool
        hand_over(it->second, tag(kGrad, mb, stage - 1), free_grads_);
        for (SendBuf& s : sends_)
          if (s.buf.data() == it->second.data) s.id = -1;  // the snapshot's buffer is free again
        st.grad_out.erase(it);
        break;
      }
      const int64_t id = comm_.isend(it->second, in.peer, tag(kGrad, mb, stage - 1));
      note_sent(st, in.peer, tag(kGrad, mb, stage - 1));
      for (SendBuf& s : sends_)
        if (s.buf.data() == it->second.data) s.id = id;
      st.grad_out.erase(it);
      break;
    }
    default: break;
  }
}

void PipelineExecutor::exec_forward(StepRun& st, const pp::Instr& in) {
  const int c = in.chunk, mb = in.microbatch;
  ExecutedInstr e{in, 0, 0};
  const int m0 = be_.mark();
  const double v0 = st.vclock ? slow_->now() : 0.0;
  const int slot = slot_for(c, mb);
  const bool first = model_.chunk_has_embedding(c), last = model_.chunk_has_head(c);
  e.busy = compute(st, st.progress_ok, [&] {
    if (first || last || model_.needs_inputs_everywhere()) st.fetch(mb, in_.data(), tg_.data());
    const double l = model_.forward_chunk(c, slot, in_.data(), tg_.data(), st.grad_scale);
    if (last) st.loss_sum += l;
  });
  timeline_entry(st, e, m0, v0);
}

void PipelineExecutor::exec_backward(StepRun& st, size_t i, const pp::Instr& in, int stage) {
  const int c = in.chunk, mb = in.microbatch;
  ExecutedInstr e{in, 0, 0};
  const int m0 = be_.mark();
  const double v0 = st.vclock ? slow_->now() : 0.0;
  const bool split = in.op == pp::Op::BackwardInput;
  const int slot = slot_for(c, mb);
  Tensor d_out;
  if (!model_.chunk_has_head(c)) {
    auto it = grads_in_.find({c, mb});
    ADGT_CHECK(it != grads_in_.end(), "pipeline executor: rank "
                                          << rank_ << " #" << i << " " << pp::to_string(in)
                                          << " without its output gradient");
    const Tensor out = model_.stage_output(c, slot);
    d_out = Tensor(it->second.data(), out.dtype, {out.numel()});
  }
  // The chunk's last fused Backward reports its gradient units as they
  // complete, so their buckets start during it (and move at each later
  // unit). Starting a bucket is an MPI call of this thread, so the
  // helper thread stays out of this compute (MPI_THREAD_SERIALIZED).
  const auto& list = st.list;
  const bool last_w = !split && st.hooks.unit && i + 1 < list.size() &&
                      list[i + 1].op == pp::Op::ReduceGrads && list[i + 1].chunk == c;
  std::function<void(int64_t, int64_t)> unit;
  if (last_w) unit = slow_ ? slow_->wrap(st.hooks.unit) : st.hooks.unit;
  model_.defer_replica_grads(i != st.last_backward[size_t(c)]);
  e.busy = compute(st, st.progress_ok && !last_w,
                   [&] { model_.backward_chunk(c, slot, d_out, split, unit, last_w); });
  st.fused_last[size_t(c)] = last_w;
  if (auto it = grads_in_.find({c, mb}); it != grads_in_.end()) {  // consumed
    free_grads_.push_back(std::move(it->second));
    grads_in_.erase(it);
  }
  if (stage > 0) {  // snapshot dL/d(input) for the SendGrad
    Tensor g = model_.input_grad();
    Tensor b = send_buffer(g);
    be_.copy(b, Tensor(g.data, g.dtype, {g.numel()}));
    st.grad_out[{c, mb}] = b;
  }
  if (!split) release_slot(c, mb);
  timeline_entry(st, e, m0, v0);
}

void PipelineExecutor::exec_backward_weight(StepRun& st, const pp::Instr& in) {
  const int c = in.chunk, mb = in.microbatch;
  ExecutedInstr e{in, 0, 0};
  const int m0 = be_.mark();
  const double v0 = st.vclock ? slow_->now() : 0.0;
  const int slot = slot_for(c, mb);
  e.busy = compute(st, st.progress_ok, [&] { model_.backward_weight(c, slot); });
  release_slot(c, mb);
  timeline_entry(st, e, m0, v0);
}

void PipelineExecutor::finish_step(StepRun& st) {
  const int m_end = be_.mark();
  const std::vector<double> t = be_.take_marks();  // the step's one wait for the timeline
  for (size_t j = 0; j < timeline_.size(); ++j) {
    timeline_[j].start = t[size_t(st.marks[j].first)];
    timeline_[j].end = t[size_t(st.marks[j].second)];
  }
  if (st.vclock)
    for (size_t j = 0; j < timeline_.size(); ++j)
      std::tie(timeline_[j].start, timeline_[j].end) = st.vmarks[j];
  step_s_ = timeline_.empty() ? (st.vclock ? slow_->now() - st.v_start : t[size_t(m_end)])
                              : timeline_.back().end;
  // A device backend's compute spans on the rank's trace are the timeline's
  // (device times; the host only enqueued them), under the names the
  // schedule prints (pp::to_string). A host backend's were taken in the loop.
  if (st.tracing && !st.host_spans)
    for (const ExecutedInstr& e : timeline_)
      trace::recorder().span(pp::to_string(e.instr), "compute", st.trace0 + e.start, st.trace0 + e.end,
                             trace::kMainTrack,
                             "{\"mb\": " + std::to_string(e.instr.microbatch) + ", \"chunk\": " +
                                 std::to_string(e.instr.chunk) + "}");
  st.loss_sum += model_.take_deferred_loss();  // the forwards returned 0
  model_.defer_losses(false);
  ADGT_CHECK(self_msgs_.empty(), "pipeline executor: rank " << rank_ << " still holds "
                                                             << self_msgs_.size()
                                                             << " messages to itself after the step");
  for (int c = 0; c < model_.num_chunks(); ++c)
    ADGT_CHECK(slot_of_[size_t(c)].empty(),
               "pipeline executor: rank " << rank_ << " chunk " << c << " still holds "
                                          << slot_of_[size_t(c)].size()
                                          << " micro-batches' activations after the step");
}

double PipelineExecutor::run_step(const MicroBatchFetch& fetch, double grad_scale,
                                  const GradHooks& hooks) {
  const auto& list = sched_.ranks[size_t(rank_)];
  StepRun st{fetch, grad_scale, hooks, list};
  timeline_.clear();
  timeline_.reserve(list.size());
  comm_.barrier();  // a common start, so the timelines of the ranks line up
  st.vclock = slow_ && slow_->virtual_clock();
  st.v_start = st.vclock ? slow_->now() : 0.0;
  st.host_waits = st.vclock || be_.is_host();
  wait_s_ = st.host_waits ? 0.0 : -1.0;
  msg_times_.clear();
  held_ = peak_held_ = 0;  // every slot is free between steps (checked at the end)
  // The timeline from the backend's marks (no wait per instruction on a
  // device; taken once after the step): mark 0 is the start.
  (void)be_.take_marks();
  be_.mark();
  st.tracing = trace::recorder().on();
  st.trace0 = st.tracing ? trace::recorder().now() : 0.0;
  st.host_spans = st.tracing && (be_.is_host() || st.vclock);
  st.ranges = trace::recorder().ranges();
  model_.defer_losses(true);  // the head's losses are read once, after the step
  std::vector<Comm*> moving{&comm_};
  moving.insert(moving.end(), progress_comms_.begin(), progress_comms_.end());
  // On the emulation's virtual clock a message's time is the link model's,
  // not when its bytes moved: the helper polls as seldom as a blocking
  // receive does there (mpi_poll_interval_us, 200 us), else every 20 us.
  // Without a spare core on the host, every 200 us (mpi_comm.hpp host_spare_core).
  const int poll_us = st.vclock ? std::max(20, mpi_poll_interval_us()) : host_spare_core() ? 20 : 200;
  SendProgress progress(moving, poll_us);
  st.progress = &progress;
  // While a Recv or WaitSends waits for a neighbour (the bubble), the started
  // data-parallel collectives move along on this thread.
  struct WaitHook {
    Comm& c;
    ~WaitHook() { c.set_wait_hook({}); }
  } clear_hook{comm_};
  if (!progress_comms_.empty())
    comm_.set_wait_hook([this] {
      for (Comm* pc : progress_comms_) pc->progress();
    });
  // (ZeRO-2/3's store starts its gathers and reduce-scatters inside the computes.)
  st.progress_ok = model_.tp_size() == 1 && !model_.has_moe() && !model_.unit_storage();
  st.fused_last.assign(size_t(model_.num_chunks()), 0);
  st.cpu_clock = (be_.is_host() && omp_get_max_threads() == 1) || (slow_ && slow_->model_clock());
  st.last_backward.assign(size_t(std::max(model_.num_chunks(), 1)), list.size());
  for (size_t j = 0; j < list.size(); ++j)
    if ((list[j].op == pp::Op::Backward || list[j].op == pp::Op::BackwardInput) && list[j].chunk >= 0 &&
        size_t(list[j].chunk) < st.last_backward.size())
      st.last_backward[size_t(list[j].chunk)] = j;
  struct ReplicaReturn {
    Model& m;
    ~ReplicaReturn() { m.defer_replica_grads(false); }
  } replica_return{model_};

  // Spans in the loop follow each other: one starts where the last ended,
  // so the bookkeeping between instructions (and the recording itself) is
  // in the next instruction's span, not in a gap.
  double t_prev = st.tracing ? trace::recorder().now() : 0.0;
  if (st.tracing) trace::recorder().span("pipeline setup", "pipeline", st.trace0, t_prev);
  for (size_t i = 0; i < list.size(); ++i) {
    const pp::Instr& in = list[i];
    const bool span_here = st.host_spans || (st.tracing && !pp::is_compute(in.op));
    const double t_in = st.host_spans ? t_prev : span_here ? trace::recorder().now() : 0.0;
    // A profiler's range of the same name (NVTX on CUDA: the kernels the
    // instruction launches fall under it in Nsight Systems).
    const std::string name = span_here || st.ranges ? pp::to_string(in) : std::string();
    if (st.ranges) st.ranges->range_push(name.c_str());
    for (Comm* pc : progress_comms_) pc->progress();
    const int stage = in.chunk >= 0 ? sched_.stage(rank_, in.chunk) : -1;
    switch (in.op) {
      case pp::Op::RecvAct:
      case pp::Op::RecvGrad:
      case pp::Op::SendAct:
      case pp::Op::SendGrad: exec_transfer(st, i, in, stage); break;
      case pp::Op::Forward: exec_forward(st, in); break;
      case pp::Op::Backward:
      case pp::Op::BackwardInput: exec_backward(st, i, in, stage); break;
      case pp::Op::BackwardWeight: exec_backward_weight(st, in); break;
      case pp::Op::ReduceGrads:
        if (hooks.chunk) hooks.chunk(in.chunk, st.fused_last[size_t(in.chunk)] != 0);
        break;
      case pp::Op::WaitSends:
        comm_.wait_sends();
        for (SendBuf& s : sends_) s.id = -1;
        break;
    }
    if (st.ranges) st.ranges->range_pop();
    if (span_here) {
      const double t_out = trace::recorder().now();
      t_prev = t_out;
      trace::recorder().span(name,
                             pp::is_compute(in.op)                                 ? "compute"
                             : pp::is_recv(in.op) || in.op == pp::Op::WaitSends ? "wait"
                                                                                  : "pipeline",
                             t_in, t_out, trace::kMainTrack,
                             "{\"mb\": " + std::to_string(in.microbatch) + ", \"chunk\": " +
                                 std::to_string(in.chunk) + "}");
    }
  }
  if (st.tracing) trace::recorder().span("pipeline finish", "pipeline", t_prev, trace::recorder().now());
  finish_step(st);
  return st.loss_sum;
}

double PipelineExecutor::forward_only(const int32_t* inputs, const int32_t* targets) {
  const int S = sched_.num_stages();
  double loss = 0;
  for (int s = 0; s < S; ++s) {
    if (sched_.rank_of_stage(s) != rank_) continue;
    const int c = sched_.chunk_of_stage(s);
    const int slot = 0;  // nothing else is in flight during evaluation
    if (s > 0 && sched_.rank_of_stage(s - 1) != rank_)  // else handed over below, in memory
      comm_.recv(model_.stage_input(c, slot), sched_.rank_of_stage(s - 1), tag(kAct, 0, s));
    const double l = model_.forward_chunk(c, slot, inputs, targets, 0.0);
    if (model_.chunk_has_head(c)) loss = l;
    if (s + 1 < S && sched_.rank_of_stage(s + 1) == rank_) {  // the vee placement's turn
      const Tensor dst = model_.stage_input(sched_.chunk_of_stage(s + 1), slot);
      Tensor src = dst;
      src.data = model_.stage_output(c, slot).data;
      be_.copy(dst, src);
    } else if (s + 1 < S) {
      isend_copy(model_.stage_output(c, slot), sched_.rank_of_stage(s + 1), tag(kAct, 0, s + 1));
    }
  }
  comm_.wait_sends();
  for (SendBuf& b : sends_) b.id = -1;
  return loss;
}

}  // namespace adgt

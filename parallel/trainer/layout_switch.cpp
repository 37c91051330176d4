// The trainer's in-memory layout switch (docs/reliability.md, "In-memory
// layout switch"): at a step boundary, the state of the running layout is
// moved over MPI into a new engine built for the requested layout, without
// touching disk. Trainer members; the loop calls run_switch.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/layout.hpp"
#include "core/metrics.hpp"
#include "parallel/pipeline/run_schedule.hpp"
#include "parallel/control/hook.hpp"
#include "parallel/fault/progress.hpp"
#include "parallel/comm/mpi_comm.hpp"
#include "parallel/switch/reshard.hpp"
#include "parallel/switch/shared_sources.hpp"
#include "parallel/switch/switch_request.hpp"
#include "parallel/trainer/trainer.hpp"

namespace adgt {

namespace {
std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Appends `text` to <path>.rejected under a comment saying when and why: the
// refused requests of a run, kept for the user (never read back).
void append_rejected(const std::string& path, int64_t step, const std::string& why,
                     const std::string& text) {
  std::ofstream out(path + ".rejected", std::ios::app);
  out << "# refused at the boundary after step " << step << ": " << why << "\n" << text;
  if (!text.empty() && text.back() != '\n') out << "\n";
}

// Rank 0: takes the first request of the control file due after `step`,
// rewrites the file with the others, and returns the decision: {"request":
// text, "line", "overrides"} or with {"error": why}. Once no line is left the
// file becomes switch.done if its last request was applied, and goes away if
// it was refused; a refused line (and a file that cannot be parsed) is
// appended to switch.rejected with the reason.
nlohmann::json take_request(const RunConfig& cfg, int64_t step, int world) {
  namespace fs = std::filesystem;
  const std::string path = switch_file(cfg.log.dir);
  std::error_code ec;
  std::string text;
  try {
    text = read_text(path);
    std::vector<SwitchRequest> due, later;
    split_due(parse_switch_requests(text, path), step, due, later);
    if (due.empty()) return nlohmann::json::object();
    const SwitchRequest req = due.front();
    std::vector<SwitchRequest> rest(due.begin() + 1, due.end());
    rest.insert(rest.end(), later.begin(), later.end());
    nlohmann::json d = {{"request", req.text}, {"line", req.line}, {"overrides", req.overrides}};
    try {
      switched_config(cfg, req, world, path);  // refused here, before any rank tears down
    } catch (const ConfigError& e) {
      d["error"] = std::string(e.what()) + " (the line is now in " + path + ".rejected)";
      append_rejected(path, step, e.what(), req.text);
    }
    if (!rest.empty()) {
      const std::string tmp = path + ".tmp";
      std::ofstream(tmp) << format_switch_requests(rest);
      fs::rename(tmp, path, ec);
    } else if (d.contains("error")) {
      fs::remove(path, ec);
    } else {
      fs::rename(path, path + ".done", ec);
    }
    return d;
  } catch (const ConfigError& e) {
    append_rejected(path, step, e.what(), text);
    fs::remove(path, ec);
    return {{"error", std::string(e.what()) + " (the file is now in " + path + ".rejected)"}};
  }
}

int mpi_world_rank() {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) return -1;
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
}  // namespace

namespace {
// The engine a switch would build is the one running (expert replicas aside).
bool same_engine(const RunConfig& a, const RunConfig& b) {
  return layout_of(a) == layout_of(b) && a.train.micro_batch == b.train.micro_batch &&
         a.train.recompute == b.train.recompute &&
         a.train.recompute_layers == b.train.recompute_layers &&
         a.parallel.bucket_mb == b.parallel.bucket_mb && a.parallel.overlap == b.parallel.overlap;
}
}  // namespace

bool Trainer::experts_in_place(const RunConfig& next, const std::string& who, MetricsLog* log) {
  // Expert placement and replicas change in memory without a new engine:
  // replicas are shadows of the owners' weights (nothing moves), and a new
  // owner table moves only the experts' weights and moments (same sizes on
  // every rank). Gradient compression's residuals would belong to other
  // experts after a move: then the switch (which drops them with a note).
  const ParallelConfig& a = next.parallel;
  const ParallelConfig& b = cfg_.parallel;
  if (a.expert_replicas == b.expert_replicas && a.expert_placement == b.expert_placement) return false;
  RunConfig same = next;
  same.parallel.expert_placement = b.expert_placement;
  if (!same_engine(same, cfg_)) return false;
  const bool move = a.expert_placement != b.expert_placement;
  if (move && (engine_->reducer().has_compression_state() || cfg_.parallel.zero >= 1)) return false;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t bytes0 = engine_->groups().ep->stats().bytes;
  try {  // a bad text is refused before anything moves, the same on every rank
    if (auto err = expert_replicas_error(next)) throw ConfigError(*err);
    if (move) engine_->move_experts(a.expert_placement);
    engine_->set_expert_replicas(a.expert_replicas);
  } catch (const ConfigError& e) {
    if (lead()) {
      std::fprintf(stderr, "switch at step %ld refused: %s; training goes on as before\n",
                   long(step_), e.what());
      if (log)
        log->log_record({{"event", "expert_replicas"}, {"step", step_}, {"by", who},
                         {"refused", e.what()}});
    }
    return true;
  }
  cfg_.parallel.expert_placement = a.expert_placement;
  cfg_.parallel.expert_replicas = a.expert_replicas;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double mb[1] = {double(engine_->groups().ep->stats().bytes - bytes0) / 1e6};
  engine_->groups().world->all_reduce(Tensor(mb, DType::F64, {1}));
  if (lead()) {
    std::printf("%s at step %ld (%s) in %.3f s, %.1f MB between ranks%s%s\n",
                move ? "experts moved in memory" : "expert replicas set", long(step_), who.c_str(), s,
                mb[0], a.expert_replicas.empty() ? "" : "; replicas ", a.expert_replicas.c_str());
    std::fflush(stdout);
    if (log) {
      nlohmann::json rec = {{"event", move ? "expert_move" : "expert_replicas"}, {"step", step_},
                            {"by", who}, {"replicas", a.expert_replicas}, {"seconds", s},
                            {"mb", mb[0]}};
      if (move) rec["placement"] = a.expert_placement;
      log->log_record(rec);
    }
  }
  return true;
}

bool Trainer::run_switch(MetricsLog* log) {
  Comm& world = *engine_->groups().world;
  // Decide, broadcast, log: rank 0 takes the file's due request.
  nlohmann::json rec;
  const nlohmann::json in = {{"file", switch_file(cfg_.log.dir)}};
  const nlohmann::json d = decide_broadcast(
      "switch-file", step_, world, in,
      [&](const nlohmann::json&) {
        nlohmann::json r = take_request(cfg_, step_, world.size());
        if (r.empty()) return nlohmann::json{{"quiet", true}};
        if (!r.contains("error") && mpi_world_rank() < 0)
          r["error"] = "an in-memory layout switch needs an MPI launch (mpirun or srun)";
        return r;
      },
      &rec);
  if (log && !rec.is_null()) log->log_record(rec);
  if (!d.contains("request") && !d.contains("error")) return false;
  const std::string request = d.value("request", std::string());
  if (d.contains("error")) {
    if (lead()) {
      std::fprintf(stderr, "switch at step %ld refused: %s; training goes on in the current layout\n",
                   long(step_), d["error"].get<std::string>().c_str());
      if (log)
        log->log_record({{"event", "switch"}, {"step", step_}, {"request", request},
                         {"refused", d["error"]}});
    }
    return false;
  }
  SwitchRequest req;
  req.text = request;
  req.line = d.value("line", 0);
  req.overrides = d["overrides"].get<std::vector<std::string>>();
  const RunConfig next = switched_config(cfg_, req, world.size(), switch_file(cfg_.log.dir));
  if (experts_in_place(next, request, log)) return false;
  if (same_engine(next, cfg_)) {
    if (lead()) std::printf("switch at step %ld: '%s' is the layout in use; nothing to do\n",
                            long(step_), request.c_str());
    return false;
  }
  switch_layout(next, request, log);
  return true;
}

bool Trainer::apply_layout_request(const std::vector<std::string>& overrides, const std::string& who,
                                   MetricsLog* log) {
  SwitchRequest req;
  req.overrides = overrides;
  for (const std::string& o : overrides) req.text += (req.text.empty() ? "" : " ") + o;
  RunConfig next;
  try {
    next = switched_config(cfg_, req, engine_->groups().world->size(), who);
  } catch (const ConfigError& e) {  // the same on every rank
    if (lead()) {
      std::fprintf(stderr, "switch at step %ld refused: %s; training goes on in the current layout\n",
                   long(step_), e.what());
      if (log)
        log->log_record({{"event", "switch"}, {"step", step_}, {"request", who + ": " + req.text},
                         {"refused", e.what()}});
    }
    return false;
  }
  if (experts_in_place(next, who, log)) return false;
  switch_layout(next, who + ": " + req.text, log);
  return true;
}

namespace {

// This rank's state in the running layout as host copies, with room to
// spare: these pages become the new layout's receive buffers (touched
// memory; fresh pages cost a fault each, the larger part of a switch on a
// host whose memory is slow to fault in).
RankState copy_out_state(Engine& e) {
  RankState src;
  ShardLayout lay = e.shard_layout();
  CheckpointState st;
  const size_t room = size_t(e.model().flat_size()) * 5 / 4;
  for (auto* v : {&st.params, &st.exp_avg, &st.exp_avg_sq}) v->reserve(room);
  e.fill_checkpoint(st, lay);
  src.shards = {lay, std::move(st.specs)};
  src.params = std::move(st.params);
  src.exp_avg = std::move(st.exp_avg);
  src.exp_avg_sq = std::move(st.exp_avg_sq);
  return src;
}

// An f64 run whose layout stays (a switch of train.micro_batch or
// train.recompute only, on the same ranks): the master weights and AdamW's
// moments in f64, put back over the fp32 copies the reshard carries, so the
// switch rounds nothing (the power controller's micro-batch switch changes
// the numbers only by the accumulation order: docs/power.md). Not under
// ZeRO-2/3, whose state lives in the sharded store.
struct ExactCarry {
  int world_rank = -1;
  int64_t lo = 0, hi = 0;
  std::vector<double> master, m, v;
  bool on() const { return world_rank >= 0; }
};

bool same_ranks_layout(const RunConfig& a, const RunConfig& b) {
  Layout la = layout_of(a), lb = layout_of(b);
  la.microbatches = lb.microbatches = 0;  // follows the micro-batch
  return la == lb;
}

std::vector<double> f64_to_host(Backend& be, const Tensor& t) {
  std::vector<double> out(size_t(t.numel()));
  be.to_host(out.data(), t.data, out.size() * sizeof(double));
  return out;
}

ExactCarry exact_carry_out(Engine& e, const RunConfig& from, const RunConfig& to, int world_rank) {
  ExactCarry c;
  // (The flat buffers exist only without ZeRO-2/3: ask for them after.)
  if (from.parallel.zero >= 2 || !same_ranks_layout(from, to) || e.model().master().dtype != DType::F64)
    return c;
  Backend& be = e.backend();
  AdamW& opt = e.optimizer().adamw();
  c.world_rank = world_rank, c.lo = opt.lo(), c.hi = opt.hi();
  c.master = f64_to_host(be, e.model().master());
  c.m = f64_to_host(be, opt.exp_avg());
  c.v = f64_to_host(be, opt.exp_avg_sq());
  return c;
}

// After restore_resharded: the new engine's state as the old one had it,
// where this process kept its place and buffers (else the fp32 copies stay).
bool exact_carry_in(Engine& e, const ExactCarry& c, int world_rank) {
  if (!c.on() || c.world_rank != world_rank) return false;
  AdamW& opt = e.optimizer().adamw();
  const Tensor master = e.model().master(), m = opt.exp_avg(), v = opt.exp_avg_sq();
  if (master.dtype != DType::F64 || size_t(master.numel()) != c.master.size() || opt.lo() != c.lo ||
      opt.hi() != c.hi || size_t(m.numel()) != c.m.size() || size_t(v.numel()) != c.v.size())
    return false;
  Backend& be = e.backend();
  be.to_device(master.data, c.master.data(), c.master.size() * sizeof(double));
  be.to_device(m.data, c.m.data(), c.m.size() * sizeof(double));
  be.to_device(v.data, c.v.data(), c.v.size() * sizeof(double));
  e.model().sync_params();
  return true;
}

// Receive buffers for cross-memory reads, touched now: on the hosts
// measured, pages faulted in after the old engine's memory is freed cost
// about 5x more (docs/reliability.md). With room to spare for a new layout
// that holds more; the window path reuses src's pages instead.
RankState touched_receive_buffers(const SharedSources& shared, const RankState& src) {
  RankState recv;
  if (shared.mode() != SharedSources::Mode::CrossMemory) return recv;
  const std::vector<float>* from[3] = {&src.params, &src.exp_avg, &src.exp_avg_sq};
  std::vector<float>* to[3] = {&recv.params, &recv.exp_avg, &recv.exp_avg_sq};
  for (int g = 0; g < 3; ++g) {
    to[g]->reserve(from[g]->capacity());
    to[g]->resize(from[g]->size());
  }
  return recv;
}

// The new rank's place and zeroed buffers in the new engine's layout, on
// touched pages: the host copy's when the sources are read from the window,
// those made ready for cross-memory reads otherwise (none for messages).
RankState new_rank_state(Engine& e, SharedSources::Mode mode, RankState& src, RankState& recv) {
  RankState dst;
  ShardLayout lay = e.shard_layout();
  if (e.optimizer().sharded()) {
    lay.state_lo = e.optimizer().adamw().lo();
    lay.state_hi = e.optimizer().adamw().hi();
  }
  dst.shards = {lay, e.model().table()};
  const auto n = size_t(e.model().flat_size());
  const size_t m = lay.state_hi >= 0 ? size_t(lay.state_hi - lay.state_lo) : n;
  RankState& pages = mode == SharedSources::Mode::Window ? src : recv;
  dst.params = std::move(pages.params);
  dst.exp_avg = std::move(pages.exp_avg);
  dst.exp_avg_sq = std::move(pages.exp_avg_sq);
  dst.params.assign(n, 0.0f);
  dst.exp_avg.assign(m, 0.0f);
  dst.exp_avg_sq.assign(m, 0.0f);
  return dst;
}

// Restores the new engine from the resharded state (a ZeRO-1 chunk is
// placed in the whole buffer, as a loaded checkpoint's).
void restore_resharded(Engine& e, RankState& dst) {
  CheckpointState st;
  st.params = std::move(dst.params);
  if (dst.shards.lay.state_hi >= 0) {
    const auto n = size_t(e.model().flat_size());
    st.exp_avg.assign(n, 0.0f);
    st.exp_avg_sq.assign(n, 0.0f);
    std::copy(dst.exp_avg.begin(), dst.exp_avg.end(), st.exp_avg.begin() + dst.shards.lay.state_lo);
    std::copy(dst.exp_avg_sq.begin(), dst.exp_avg_sq.end(),
              st.exp_avg_sq.begin() + dst.shards.lay.state_lo);
  } else {
    st.exp_avg = std::move(dst.exp_avg);
    st.exp_avg_sq = std::move(dst.exp_avg_sq);
  }
  e.restore_checkpoint(st);
}

// The slowest rank's seconds per phase: a rank waits in the next collective
// for the others, so rank 0's phases alone can mislead. Collective over world.
nlohmann::json slowest_phases(Comm& world, const nlohmann::json& phases) {
  nlohmann::json phases_max = nlohmann::json::object();
  std::vector<double> v;
  for (auto it = phases.begin(); it != phases.end(); ++it) v.push_back(it.value().get<double>());
  world.all_reduce(Tensor(v.data(), DType::F64, {int64_t(v.size())}), ReduceOp::Max);
  size_t i = 0;
  for (auto it = phases.begin(); it != phases.end(); ++it) phases_max[it.key()] = v[i++];
  return phases_max;
}

}  // namespace

bool Trainer::switch_keeps_lead(const RunConfig& next, const Placement& placement, Comm& world) {
  int32_t moved[1] = {lead() != (placement.layout_rank(mpi_world_rank()) == 0) ? 1 : 0};
  world.all_reduce(Tensor(moved, DType::I32, {1}), ReduceOp::Max);
  if (!moved[0]) return true;
  if (lead())
    std::fprintf(stderr, "switch at step %ld refused: the placement of %s makes another process "
                         "world rank 0 (the rank that logs); save and resume instead\n",
                 long(step_), describe(layout_of(next)).c_str());
  return false;
}

ParallelContext Trainer::rebuild_groups(const RunConfig& next, const Placement& placement,
                                        const std::string& plan_json) {
  // Tear down the running engine and its wrappers, then build the new groups
  // (collective over MPI_COMM_WORLD) and the new engine on them.
  controllers_.clear();
  engine_.reset();
  // The WAN bytes so far (docs/sites.md), read while the transports live.
  const double wan_sent = emulation_ && emulation_->state ? emulation_->state->wan_bytes_sent() : 0;
  site_comms_.clear();
  device_comms_.clear();
  emulated_comms_.clear();
  std::unique_ptr<ProcessGroups> prev = std::move(switched_groups_);
  cfg_ = next;
  switched_groups_ = std::make_unique<ProcessGroups>(make_process_groups(layout_of(cfg_), placement));
  prev.reset();
  ProcessGroups& pg = *switched_groups_;
  ParallelContext ctx = context_of(pg);
  ctx.plan_json = plan_json;
  if (!cfg_.emulate.cluster.empty()) {
    // The rank's clock goes on across the switch (a virtual clock keeps its time).
    std::optional<emulate::Clock> clock;
    if (emulation_ && emulation_->state) clock = std::move(emulation_->state->clock);
    own_emulation_ = emulate::setup_emulation(cfg_, pg.world.get(), pg.world->rank(), &pg.placement);
    if (clock && clock->kind() == own_emulation_->clock)
      own_emulation_->state->clock = std::move(*clock);
    own_emulation_->state->wan_bytes_gone = wan_sent;
    ctx.emulation = own_emulation_.get();
  }
  return ctx;
}

void Trainer::switch_layout(const RunConfig& next, const std::string& why, MetricsLog* log) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  // Moving a large state takes long: the watchdog's long deadline (docs/reliability.md).
  fault::PhaseScope switching(fault::Phase::LayoutSwitch);
  // Seconds of each phase on this rank (logged from rank 0).
  nlohmann::json phases = nlohmann::json::object();
  auto t_phase = t0;
  const auto phase = [&](const char* name) {
    const auto now = clock::now();
    phases[name] = std::chrono::duration<double>(now - t_phase).count();
    t_phase = now;
  };
  SwitchRecord rec;
  rec.why = why;
  // The layout really running: parallel.adapt may have changed the pipeline
  // schedule since the run file's (the schedule the executor runs).
  {
    Layout running = layout_of(cfg_);
    if (engine_->pipelined()) running.schedule = engine_->pipeline()->schedule().name;
    rec.from = describe(running);
  }
  const ParallelContext old = engine_->groups();
  // The new layout's rank placement; world rank 0 (which logs and commits
  // checkpoints) must stay on the same process.
  const Placement placement = place_launch(next);
  if (!switch_keeps_lead(next, placement, *old.world)) return;

  // This rank's state in the running layout, and what is not sharded: the
  // MoE selection biases (summed over the pipeline, as a save does).
  RankState src = copy_out_state(*engine_);
  const int src_rank = world_rank_;
  const ExactCarry exact = exact_carry_out(*engine_, cfg_, next, world_rank_);
  std::vector<double> bias;
  const bool moe_bias = engine_->model().has_moe() && cfg_.model.moe_aux_free;
  if (moe_bias) {
    bias = engine_->model().moe_bias_table();
    old.pp->all_reduce(Tensor(bias.data(), DType::F64, {int64_t(bias.size())}));
  }
  // FP8 delayed scaling's amax histories, by layer (summed over the pipeline).
  std::vector<double> fp8_hist;
  int64_t fp8_steps = 0;
  if (Fp8Linears* f = engine_->model().fp8(); f && f->options().delayed) {
    fp8_hist = engine_->model().fp8_history_table();
    fp8_steps = f->history_steps();
    old.pp->all_reduce(Tensor(fp8_hist.data(), DType::F64, {int64_t(fp8_hist.size())}));
  }
  // Where the new layout's ranks on this node read their pieces of this
  // state (cross-memory from the host copy, or from the node's shared memory).
  phase("copy_out");
  std::optional<SharedSources> shared(std::in_place, src);
  RankState recv = touched_receive_buffers(*shared, src);
  rec.had_ef = engine_->reducer().has_compression_state();
  rec.schedule_before = engine_->pipelined() ? engine_->pipeline()->schedule().name : std::string();
  phase("window");

  const ParallelContext ctx = rebuild_groups(next, placement, old.plan_json);
  phase("groups");
  wire(ctx, /*init=*/false);  // the state arrives below
  phase("engine");

  // The new rank's place and buffers, filled from every rank's old state.
  RankState dst = new_rank_state(*engine_, shared->mode(), src, recv);
  phase("buffers");
  rec.exchange = shared->describe();
  {
    std::unique_ptr<MpiComm> everyone = MpiComm::world("switch");
    const std::vector<std::string> places = everyone->all_gather_strings(
        place_record(src_rank, src.shards, world_rank_, dst.shards));
    phase("plan");
    const StateView mine =
        shared->shared() ? shared->views()[size_t(everyone->rank())] : view_of(src);
    rec.rs = reshard(src.shards, mine, src_rank, dst, world_rank_, *everyone, places, shared->views());
    shared.reset();  // collective: every process of the node has read its pieces
  }
  phase("exchange");
  phases["exchange_plan"] = rec.rs.plan_s;
  phases["exchange_pack"] = rec.rs.pack_s;
  phases["exchange_transfer"] = rec.rs.transfer_s;
  phases["exchange_unpack"] = rec.rs.unpack_s;
  src = {};
  restore_resharded(*engine_, dst);
  int32_t rounded[1] = {exact_carry_in(*engine_, exact, world_rank_) ? 0 : 1};  // on any rank
  engine_->groups().world->all_reduce(Tensor(rounded, DType::I32, {1}), ReduceOp::Max);
  rec.exact = rounded[0] == 0;
  if (moe_bias) engine_->model().set_moe_bias_table(bias);
  if (!fp8_hist.empty()) engine_->model().set_fp8_history_table(fp8_hist, fp8_steps);
  phase("restore");
  rec.phases = phases;
  report_switch(rec, t0, log);
}

void Trainer::report_switch(const SwitchRecord& rec, std::chrono::steady_clock::time_point t0, MetricsLog* log) {
  double moved[3] = {double(rec.rs.sent_bytes), double(rec.rs.local_bytes), double(rec.rs.shared_bytes)};
  engine_->groups().world->all_reduce(Tensor(moved, DType::F64, {3}));
  const nlohmann::json phases_max = slowest_phases(*engine_->groups().world, rec.phases);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++switches_;
  const std::string table = rank_table(*switched_groups_, dev_.device_id, dev_.transport, emulation_);
  if (!lead()) return;
  std::printf("switch at step %ld: %s -> %s in %.3f s (%.1f MB between ranks, %.1f MB within; "
              "%.1f MB of it read without a message, by %s; request: %s)\n%s",
              long(step_), rec.from.c_str(), describe(layout_of(cfg_)).c_str(), seconds,
              moved[0] / 1e6, moved[1] / 1e6, moved[2] / 1e6, rec.exchange.c_str(), rec.why.c_str(),
              table.c_str());
  if (rec.had_ef)
    std::fprintf(stderr, "note: switch at step %ld: gradient compression's error-feedback state is "
                         "dropped (the layout changed); it restarts at zero\n", long(step_));
  // Into a pipeline: its stages and schedule, as at the start of a run.
  if (engine_->pipelined()) std::printf("%s", describe_pipeline_schedule(cfg_).c_str());
  std::fflush(stdout);
  if (!log) return;
  nlohmann::json r = {{"event", "switch"},
                      {"step", step_},
                      {"request", rec.why},
                      {"from", rec.from},
                      {"to", describe(layout_of(cfg_))},
                      {"schedule_before", rec.schedule_before},
                      {"seconds", seconds},
                      {"moved_bytes", moved[0]},
                      {"local_bytes", moved[1]},
                      {"shared_bytes", moved[2]},
                      {"exchange", rec.exchange},
                      {"moves", rec.rs.moves},
                      {"phases_s", rec.phases},
                      {"phases_max_s", phases_max}};
  // An f64 run: whether its state crossed in f64 (ExactCarry) or as fp32.
  if (cfg_.train.dtype == "f64") r["exact_f64"] = rec.exact;
  log->log_record(r);
}

}  // namespace adgt

#include "parallel/trainer/trainer.hpp"

#include "parallel/control/expert_controller.hpp"
#include "parallel/control/schedule_controller.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include <omp.h>

#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/async_save.hpp"
#include "core/checkpoint/sharded.hpp"
#include "core/metrics.hpp"
#include "core/optimizer.hpp"
#include "core/trace.hpp"
#include "core/data/blend.hpp"
#include "core/data/document_eos.hpp"
#include "core/data/sampler.hpp"
#include "core/data/data_check.hpp"
#include "core/data/token_shard.hpp"
#include "kernels/attention_choice.hpp"
#include "kernels/check.hpp"
#include "kernels/clock.hpp"
#include "parallel/control/compress_controller.hpp"
#include "parallel/comm/site_comm.hpp"
#include "parallel/compress/level.hpp"
#include "parallel/dp/compression_state.hpp"
#include "parallel/fault/progress.hpp"
#include "parallel/comm/mpi_env.hpp"
#include "parallel/pipeline/run_schedule.hpp"
#include "parallel/sim/power_slowdown.hpp"
#include "parallel/metrics/step_logger.hpp"
#include "parallel/switch/switch_request.hpp"
#include "parallel/metrics/tei_meter.hpp"
#include "parallel/metrics/telemetry_sources.hpp"
#include "parallel/metrics/trace_file.hpp"
#include "parallel/trainer/trainer_state.hpp"

namespace adgt {

namespace {
std::atomic<int> g_stop_signal{0};
void on_stop_signal(int sig) { g_stop_signal.store(sig); }

// Fault injection for the emulated device's test (ctest
// emulated_catches_host_read_*): ADGT_TEST_HOST_READ=1 makes the trainer read
// its first weight through the raw pointer after step 1, the bug the emulated
// device exists to catch (host code touching device memory). Harmless on the
// CPU backend, a fault naming the buffer on the emulated device, an illegal
// access on CUDA.
void inject_host_read(const Model& model) {
  static const bool on = [] {
    const char* v = std::getenv("ADGT_TEST_HOST_READ");
    return v && std::string(v) == "1";
  }();
  if (!on) return;
  volatile const char* p = static_cast<const char*>(model.master().data);
  const char first = p[0];
  std::fprintf(stderr, "ADGT_TEST_HOST_READ: read the first weight byte (%d) from host code\n",
               int(first));
}

// The coordinates a rank's compression state belongs to (state/compress/rank_coords
// of its rank file): a resume restores it only at the same place of the same layout.
std::vector<int64_t> rank_coords(const ShardLayout& l) {
  return {l.tp, l.dp, l.pp, l.ep, l.tp_rank, l.dp_rank, l.pp_rank, l.ep_rank};
}

// ADGT_CHECK_DP_REPLICAS=1 (tests/compress/): after the run every data-parallel
// replica must hold the same parameters, bit for bit. Collective over the world.
void check_dp_replicas(Model& model, const ParallelContext& g, bool lead) {
  const char* v = std::getenv("ADGT_CHECK_DP_REPLICAS");
  if (!v || std::string(v) != "1") return;
  const std::vector<float> p = model.params_to_host();
  uint64_t h = 0xcbf29ce484222325ull;
  const auto* b = reinterpret_cast<const unsigned char*>(p.data());
  for (size_t i = 0; i < p.size() * 4; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  int32_t mm[8];  // the hash's four 16-bit words, and their negations: max and -min over dp
  for (int k = 0; k < 4; ++k) {
    mm[k] = int32_t((h >> (16 * k)) & 0xffff);
    mm[4 + k] = -mm[k];
  }
  // The ranks holding the same parameters: dp with cp's ranks; of them the
  // same experts' holders under expert parallelism (edp x cp).
  Comm* same = g.ep && g.ep->size() > 1 && g.edpcp ? g.edpcp : g.dpcp;
  same->all_reduce(Tensor(mm, DType::I32, {8}), ReduceOp::Max);
  int32_t differ[1] = {0};
  for (int k = 0; k < 4; ++k) differ[0] |= mm[k] != -mm[4 + k];
  g.world->all_reduce(Tensor(differ, DType::I32, {1}), ReduceOp::Max);
  ADGT_CHECK(!differ[0], "ADGT_CHECK_DP_REPLICAS: the data-parallel replicas' parameters differ "
                         "after the run (" << same->name() << "=" << same->size() << ")");
  if (lead) {
    std::printf("dp replicas: parameters bit-identical over %s=%d (rank 0 hash %016llx)\n",
                same == g.dp ? "dp" : same == g.dpcp ? "dp x cp" : "edp x cp", same->size(),
                (unsigned long long)h);
    std::fflush(stdout);
  }
}
}  // namespace

void install_stop_handlers() {
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGUSR1, on_stop_signal);
}

int pending_stop_signal() { return g_stop_signal.load(); }

// Wraps each group of ctx in a DeviceComm, so collectives on device tensors
// are staged through host memory or go to NCCL (parallel/comm/device_comm.hpp).
// Distinct group objects get one wrapper each; a missing group (a single
// process) becomes a wrapped SelfComm, whose copies would otherwise be host
// code on device memory. With nccl every group of more than one rank gets an
// NCCL communicator (made in this fixed order on every rank); the pipeline
// executor then runs its schedule with the receives in the messages' global
// order (pp::for_rendezvous), which NCCL's rendezvous sends need.
static std::vector<std::unique_ptr<Comm>> wrap_device_groups(ParallelContext& ctx, Backend& be,
                                                             bool nccl) {
  return wrap_groups(
      ctx,
      [&](Group, Comm& c) -> std::unique_ptr<Comm> {
        std::unique_ptr<Comm> device;
        if (nccl && c.size() > 1) device = make_nccl_comm(c, be);
        return std::make_unique<DeviceComm>(c, be, std::move(device));
      },
      /*fill=*/true);
}

Trainer::Trainer(const RunConfig& cfg, ParallelContext ctx, std::optional<DevicePlan> plan)
    : cfg_(cfg) {
  // Every layout and model runs on every device: collectives on device
  // memory go through DeviceComm (NCCL, or host-staged MPI).
  // Without a plan (a single process: tests, tools) make_backend resolves
  // cfg.train.device itself, and device memory is staged (no NCCL).
  if (plan)
    dev_ = *plan;
  else
    dev_.device = cfg.train.device;
  backend_ = make_backend(dev_.device, dev_.cuda_device);
  // Profiler ranges (NVTX on CUDA) named as the trace's spans: with log.trace,
  // or ADGT_NVTX=1 for an Nsight Systems run without a trace (docs/trace.md).
  if (const char* nvtx = std::getenv("ADGT_NVTX");
      backend_->has_ranges() && (!cfg.log.trace.empty() || (nvtx && std::string(nvtx) == "1")))
    trace::recorder().set_ranges(backend_.get());
  if (cfg.train.flush_denormals && backend_->name().rfind("cuda", 0) != 0)
    flush_denormals_ = std::make_unique<cpu::FlushDenormals>();
  // train.attention: the CUDA backend's bf16 kernel (auto decides per shape on
  // its first call); the CPU and emulated backends refuse flash and cudnn.
  configure_attention(*backend_, cfg.train.attention);
  // A missing or mismatched shard is an input error every rank reports:
  // agreed over the world (a rank that finds it first must not abort the
  // others before they print), then thrown on every rank together.
  std::string shard_error;
  try {
    train_shards_ = open_checked_blend(cfg.data.train, "data.train", cfg.model);
    val_shards_ = open_checked_blend(cfg.data.val, "data.val", cfg.model);
    if (cfg.train.document_mask || cfg.model.rope_reset_per_document) {
      std::vector<std::string> files;
      for (const auto& s : train_shards_) files.push_back(s->path());
      cfg_.data.eos_id = resolve_document_eos(cfg.data.eos_id, files, cfg.data.tokenizer,
                                              cfg.model.vocab_size);
    }
  } catch (const std::exception& e) {
    shard_error = e.what();
  }
  if (ctx.world && ctx.world->size() > 1) shard_error = agree_error(*ctx.world, shard_error);
  if (!shard_error.empty()) throw CollectiveError(shard_error);
  {
    const std::vector<BlendSource> blend = parse_blend(cfg.data.train, "data.train");
    std::vector<const TokenShard*> shards;
    std::vector<double> weights;
    for (size_t s = 0; s < blend.size(); ++s) {
      shards.push_back(train_shards_[s].get());
      weights.push_back(blend[s].weight);
    }
    sampler_ = std::make_unique<BlendSampler>(shards, weights, cfg.model.seq_len, cfg.train.seed);
  }
  val_sources_ = parse_blend(cfg.data.val, "data.val");
  trace_steps_ = parse_step_range(cfg.log.trace);
  wire(std::move(ctx));
}

void Trainer::wire(ParallelContext ctx, bool init) {
  const RunConfig& cfg = cfg_;
  if (!cfg.emulate.cluster.empty()) {
    // Every group's Comm is delayed by the cluster model, under the device
    // staging (parallel/emulate/, docs/emulation.md).
    emulation_ = ctx.emulation;
    if (!emulation_) {
      own_emulation_ = emulate::setup_emulation(cfg, ctx.world, ctx.world_rank);
      emulation_ = own_emulation_.get();
    }
    if (dev_.nccl())
      throw CollectiveError("emulate.cluster=\"" + cfg.emulate.cluster +
                            "\": the emulation delays MPI transports of CPU ranks, but this run's "
                            "collectives go to NCCL; use train.device=cpu or emulated");
    if (emulation_->clock == emulate::ClockKind::Virtual &&
        (!backend_->is_host() || omp_get_max_threads() != 1))
      throw CollectiveError(
          "emulate.clock=virtual counts each rank's training thread's CPU time as its compute, "
          "so it needs the cpu backend with one thread per rank (OMP_NUM_THREADS=1); this run "
          "has " + std::string(backend_->is_host() ? "" : "a device backend and ") +
          std::to_string(omp_get_max_threads()) + " thread(s)");
    if (emulation_->clock == emulate::ClockKind::Model && dev_.device == "cuda")
      throw CollectiveError(
          "emulate.clock=model counts the matmul FLOPs of the CPU kernels as each rank's "
          "compute, so it needs train.device cpu or emulated; this run's device is cuda");
    if (emulation_->clock == emulate::ClockKind::Model)  // the experts' spans too
      backend_->set_span_clock([st = emulation_->state] { return st->clock.compute_now(); });
    emulation_->slowdown.set_backend(backend_.get());
    emulated_comms_ = emulate::wrap_emulated_groups(ctx, *emulation_);
  }
  // With a device backend the groups are wrapped for it first, so a group
  // reduced over sites splits into device sub-groups (NCCL communicators of
  // their own), its scratch on the device.
  if (!backend_->is_host()) device_comms_ = wrap_device_groups(ctx, *backend_, dev_.nccl());
  if (!ctx.sites.empty() && cfg.parallel.site_reduce == "hierarchical") {
    // Data-parallel groups spanning sites reduce inside each site first and
    // cross the wide-area link once (docs/sites.md).
    std::vector<std::string> notes;
    site_comms_ = wrap_site_groups(ctx, emulation_, &notes,
                                   backend_->is_host() ? nullptr : backend_.get(), dev_.nccl());
    if (ctx.world_rank == 0) {
      // One line per shape: "dp, edp groups reduce ..." when both are split alike.
      std::vector<std::pair<std::string, const SiteComm*>> lines;
      for (const auto& c : site_comms_)
        if (const auto* sc = dynamic_cast<const SiteComm*>(c.get())) {
          auto same = std::find_if(lines.begin(), lines.end(), [&](const auto& l) {
            return l.second->split().sites == sc->split().sites &&
                   l.second->split().per_site == sc->split().per_site;
          });
          if (same == lines.end()) lines.emplace_back(sc->name(), sc);
          else same->first += ", " + sc->name();
        }
      for (const auto& [names, sc] : lines)
        std::printf("sites: %s groups reduce hierarchically (%d sites x %d ranks: inside each "
                    "site, then one cross-site exchange of each rank's 1/%d shard)\n",
                    names.c_str(), sc->split().sites, sc->split().per_site, sc->split().per_site);
      for (const auto& n : notes) std::printf("sites: %s\n", n.c_str());
    }
  }
  // Outermost: the calls the engine makes (earlier layouts' wrappers kept).
  if (trace_steps_ || trace::recorder().ranges())
    for (auto& c : wrap_traced_groups(ctx)) traced_comms_.push_back(std::move(c));
  engine_ = std::make_unique<Engine>(cfg, ctx, *backend_, init);
  world_rank_ = ctx.world_rank;
  if (cfg.train.attention == "auto" && ctx.world && ctx.world->size() > 1) {
    // Decide, broadcast, log: rank 0's measured choice for this layout's
    // attention shape is every rank's (kernels/attention_choice.hpp), so no
    // two ranks run different kernels. Re-decided when the layout changes.
    // (One process decides per shape inside the backend, at first use.)
    configure_attention(*backend_, "auto");
    const Model& m = engine_->model();
    AttentionShape s = m.attention_shape();
    // A masked run decides the masked shape (probe_attention reads no
    // boundaries: any non-null pointer marks it; cudnn is then left out).
    static const int32_t kMasked = 0;
    if (cfg.train.document_mask) s.doc_start = &kMasked;
    const nlohmann::json in = {{"B", s.B},
                               {"T", s.T},
                               {"heads", s.n_heads},
                               {"kv_heads", s.n_kv_heads},
                               {"head_dim", s.head_dim},
                               {"dtype", dtype_name(m.dtype())},
                               {"document_mask", cfg.train.document_mask},
                               {"backend", backend_->name()}};
    const bool say = backend_->name().rfind("cuda", 0) == 0;
    nlohmann::json rec;
    const nlohmann::json d = decide_broadcast(
        "attention", step_, *ctx.world, in,
        [&](const nlohmann::json&) {
          const std::string k = probe_attention(*backend_, s, m.dtype());
          nlohmann::json out = {{"attention", k}};
          char b[200];
          std::snprintf(b, sizeof b,
                        "train.attention=auto -> %s on every rank (rank 0's choice for B=%ld T=%ld "
                        "heads %ld/%ld head_dim %ld, %s)",
                        k.c_str(), long(s.B), long(s.T), long(s.n_heads), long(s.n_kv_heads),
                        long(s.head_dim), dtype_name(m.dtype()));
          if (say) out["console"] = b;
          return out;
        },
        &rec);
    configure_attention(*backend_, d.at("attention").get<std::string>());
    if (!rec.is_null()) unlogged_.push_back(std::move(rec));
  }
  {
    // Gradient compression at the configured level (auto: off until a
    // controller sets levels through GradReducer::set_level).
    compress::Settings cs;
    cs.level = compress::parse_level(cfg.parallel.grad_compression);
    cs.powersgd_rank = int(cfg.parallel.powersgd_rank);
    cs.min_elems = cfg.parallel.compress_min_elems;
    cs.seed = cfg.train.seed;
    engine_->reducer().set_compression(cs, *backend_);
  }
  controllers_.clear();
  // The pipeline schedule's re-planner (docs/adaptation.md): greedy and
  // zb-v (list-scheduled from costs) re-plan once after step 2 from the
  // measured costs; with parallel.adapt on (the default) it then re-plans
  // from the detectors' warm-up on.
  const bool list_scheduled = cfg.parallel.schedule == "greedy" || cfg.parallel.schedule == "zb-v";
  if (engine_->pipelined() && (cfg.parallel.adapt != "off" || list_scheduled))
    controllers_.push_back(adapt::make_schedule_adapter(cfg));
  if (cfg.parallel.grad_compression == "auto")  // docs/compression.md, "Controller"
    controllers_.push_back(compress::make_compress_controller(cfg, *engine_));
  if (engine_->model().has_moe() && cfg.parallel.ep > 1 && cfg.parallel.expert_replace_interval > 0)
    controllers_.push_back(adapt::make_expert_placement_controller(cfg));  // docs/adaptation.md
  // emulate.power_cap_w (docs/power.md): this rank computes
  // as the capped device would at this layout's micro-batch; with
  // parallel.adapt on, the power controller re-plans the micro-batch.
  if (emulation_ && cfg.emulate.power_cap_w > 0) {
    const cluster::Device& dev = emulation_->cluster.device;
    if (!dev.power.on())
      throw ConfigError("emulate.power_cap_w=" + std::to_string(cfg.emulate.power_cap_w) +
                        ": emulate.cluster=" + cfg.emulate.cluster + "'s device " + dev.name +
                        " has no power model (device.power, docs/cluster.md)");
    const double f = sim::power_cap_slowdown(cfg, dev, cfg.emulate.power_cap_w, ctx.coords.pp);
    emulation_->set_power_factor(f);
    if (ctx.world_rank == 0)
      std::printf("emulate.power_cap_w=%g W: pipeline rank 0 computes x%.3f at micro-batch %ld (%s's "
                  "power model: %s)\n",
                  cfg.emulate.power_cap_w, f, long(cfg.train.micro_batch), dev.name.c_str(),
                  dev.power.source.c_str());
  }  // the power controller is the caller's (adgt-train: make_power_controller)
  for (const ControllerFactory& f : factories_)
    if (auto c = f(cfg)) controllers_.push_back(std::move(c));
}

void Trainer::add_controller_factory(ControllerFactory f) {
  factories_.push_back(std::move(f));
  if (auto c = factories_.back()(cfg_)) controllers_.push_back(std::move(c));
}

std::optional<TelemetryInterval> Trainer::take_control_telemetry() {
  std::lock_guard<std::mutex> lk(telemetry_mu_);
  if (!telemetry_) return std::nullopt;
  telemetry_->sample_now();  // a window is never empty: a reading closes it
  return telemetry_->take(kControlReader);
}

Trainer::~Trainer() {
  if (trace::recorder().ranges() == backend_.get()) trace::recorder().set_ranges(nullptr);  // goes with it
}

ParallelContext context_of(const ProcessGroups& pg) {
  ParallelContext ctx;
  ctx.tp = pg.tp.get();
  ctx.dp = pg.dp.get();
  ctx.pp = pg.pp.get();
  ctx.ep = pg.ep.get();
  ctx.edp = pg.edp.get();
  // Context parallelism's groups; with cp = 1 the dp group is the dp x cp one
  // (the same object: one reducer's communicator, one NCCL communicator).
  ctx.cp = pg.layout.cp > 1 ? pg.cp.get() : nullptr;
  ctx.dpcp = pg.layout.cp > 1 ? pg.dpcp.get() : ctx.dp;
  // The experts' replicas: edp, times cp (all of dpcp when ep = 1).
  ctx.edpcp = pg.layout.cp == 1 ? ctx.edp : pg.layout.ep == 1 ? ctx.dpcp : pg.edpcp.get();
  ctx.world = pg.world.get();
  ctx.world_rank = pg.world->rank();
  ctx.layout = pg.layout;
  ctx.coords = pg.coords;
  ctx.sites = pg.placement.layout_sites();
  return ctx;
}

void Trainer::load(const std::string& step_dir) {
  // Collective over the world: each rank reads its own shards (any writer layout);
  // an error on any rank stops every rank with that message.
  Model& model = engine_->model();
  CheckpointState st = load_checkpoint_sharded(step_dir, model.table(), engine_->shard_layout(),
                                               *engine_->groups().world);
  engine_->restore_checkpoint(st);
  step_ = st.step;
  samples_seen_ = st.samples_seen;
  const RestoredTrainerState ts = restore_trainer_state(st, cfg_.model, step_dir);
  opt_steps_ = ts.opt_steps;
  if (model.has_moe() && cfg_.model.moe_aux_free) {
    if (!ts.has_moe_bias && lead())
      std::fprintf(stderr, "warning: checkpoint %s has no MoE selection biases; they restart at "
                           "their initial values (model.moe_bias_init_zipf)\n",
                   step_dir.c_str());
    if (ts.has_moe_bias) model.set_moe_bias_table(ts.moe_bias);
  }
  if (Fp8Linears* f = model.fp8(); f && f->options().delayed) {
    std::vector<double> t;
    int64_t steps = 0;
    bool no_experts = false;
    if (take_fp8_state(st, cfg_.model, f->options().history, t, steps, step_dir, &no_experts)) {
      model.set_fp8_history_table(t, steps);
      if (no_experts && lead())
        std::fprintf(stderr, "note: checkpoint %s has no FP8 amax history for the experts' GEMMs "
                             "(saved before they ran in FP8); they start from current scaling\n",
                     step_dir.c_str());
    } else if (lead()) {
      std::fprintf(stderr, "note: checkpoint %s has no FP8 amax history (a bf16 or tensorwise "
                           "run's); delayed scaling starts from current scaling\n",
                   step_dir.c_str());
    }
  }
  {
    // Gradient compression's error feedback: per rank, restored only into the
    // same place of the same layout and bucket plan; otherwise dropped on every
    // rank (docs/compression.md).
    std::map<std::string, StateEntry> rs = load_rank_state(step_dir, world_rank_);
    std::string why;
    if (!rs.empty()) {
      auto c = rs.find("compress/rank_coords");
      if (c == rs.end() || c->second.ints != rank_coords(engine_->shard_layout()))
        why = "it was saved by another layout or rank placement";
      else
        why = restore_compression_state(engine_->reducer(), rs);
    }
    why = agree_error(*engine_->groups().world, why);
    if (!why.empty()) {
      engine_->reducer().clear_compression_state();
      if (lead())
        std::fprintf(stderr, "note: checkpoint %s: gradient compression's error-feedback state is "
                             "dropped (%s); it restarts at zero\n", step_dir.c_str(), why.c_str());
    }
  }
  // A resume with other schedule keys (train.steps raised to train longer, a
  // new lr) changes the learning rate from the next step on: say how.
  if (lead() && !st.config_yaml.empty()) {
    try {
      const RunConfig saved = load_config_text(st.config_yaml, step_dir + ":meta/config_yaml");
      const std::string note = lr_schedule_change(saved.train, cfg_.train, st.step);
      if (!note.empty()) std::printf("note: %s\n", note.c_str());
    } catch (const ConfigError&) {  // a saved config this build cannot read: nothing to compare
    }
  }
  if (st.seed != cfg_.train.seed && lead())
    std::fprintf(stderr, "warning: checkpoint %s was trained with train.seed=%llu, this run has %llu\n",
                 step_dir.c_str(), (unsigned long long)st.seed,
                 (unsigned long long)cfg_.train.seed);
}

void Trainer::save(MetricsLog* metrics, TeiMeter& tei, bool wait) {
  // Every rank writes its own pieces (checkpoint format version 2).
  const auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  // checkpoint.async: the previous save is committed first (at most one in
  // flight), and its host buffers are filled again in place.
  if (saver_ && saver_->in_flight()) commit_checkpoint(metrics, tei, true);
  const auto t0 = std::chrono::steady_clock::now();
  ShardLayout lay = engine_->shard_layout();
  CheckpointState st = saver_ ? saver_->take_buffers() : CheckpointState{};
  engine_->fill_checkpoint(st, lay);
  st.step = step_;
  st.samples_seen = samples_seen_;
  st.seed = cfg_.train.seed;
  if (lead()) st.config_yaml = to_yaml(cfg_);
  Model& model = engine_->model();
  std::vector<double> bias;
  if (model.has_moe() && cfg_.model.moe_aux_free) {
    // Every pipeline stage holds its layers' biases (the same on its tp, dp and
    // ep replicas); the sum over the pipeline group gives rank 0 the whole table.
    bias = model.moe_bias_table();
    engine_->groups().pp->all_reduce(Tensor(bias.data(), DType::F64, {int64_t(bias.size())}));
  }
  std::string schedule;
  if (engine_->pipelined()) {
    const pp::Schedule& s = engine_->pipeline()->schedule();
    schedule = nlohmann::json({{"name", s.name}, {"kept", s.detail.empty() ? s.name : s.detail},
                               {"pp", s.pp}, {"microbatches", s.microbatches},
                               {"virtual_stages", s.virtual_stages},
                               {"placement", stage_placement_name(s.placement)}})
                   .dump();
  }
  st.state = trainer_state(cfg_.model, opt_steps_, bias, schedule);
  if (Fp8Linears* f = model.fp8(); f && f->options().delayed) {
    // Each pipeline stage holds its layers' histories (the same on its tp,
    // dp and cp replicas); the sum over the pipeline gives the whole table.
    std::vector<double> t = model.fp8_history_table();
    engine_->groups().pp->all_reduce(Tensor(t.data(), DType::F64, {int64_t(t.size())}));
    put_fp8_state(st.state, cfg_.model, t, f->history_steps(), f->options().history);
  }
  st.rank_state = compression_state(engine_->reducer());  // per rank (docs/compression.md)
  if (!st.rank_state.empty())
    st.rank_state["compress/rank_coords"] = StateEntry::of_ints(rank_coords(lay));
  if (!engine_->groups().plan_json.empty())  // recorded, not restored (docs/planner.md)
    st.state["plan/chosen"] = StateEntry::of_text(engine_->groups().plan_json);
  Comm& world = *engine_->groups().world;
  if (!cfg_.checkpoint.async_save) {
    last_checkpoint_ = save_checkpoint_sharded(cfg_.checkpoint.dir, st, lay, world, cfg_.checkpoint.keep);
    const double stall = since(t0);
    tei.add_checkpoint(stall);
    if (lead()) {
      std::printf("checkpoint: %s\n", last_checkpoint_.c_str());
      std::fflush(stdout);
    }
    if (metrics)
      metrics->log_record({{"event", "checkpoint"}, {"mode", "sync"}, {"step", step_},
                           {"dir", last_checkpoint_}, {"stall_s", stall}});
    return;
  }
  // checkpoint.async (docs/reliability.md): the state is in host memory now;
  // the write runs on the saver's thread, the commit at a later step boundary.
  const double copy_s = since(t0);
  if (!saver_) saver_ = std::make_unique<AsyncCheckpointSaver>();
  const auto t_begin = std::chrono::steady_clock::now();
  saver_->start(std::move(st), lay, world, cfg_.checkpoint.dir, cfg_.checkpoint.keep);
  saver_copy_s_ = copy_s;
  tei.add_checkpoint(copy_s + since(t_begin));
  if (lead()) {
    std::printf("checkpoint: step %ld copied to host memory in %.3f s, writing in the background\n",
                long(step_), copy_s);
    std::fflush(stdout);
  }
  if (wait) commit_checkpoint(metrics, tei, true);
}

void Trainer::commit_checkpoint(MetricsLog* metrics, TeiMeter& tei, bool wait) {
  if (!saver_ || !saver_->in_flight()) return;
  // An error of any rank's write is thrown here on every rank: training stops,
  // the previous checkpoint stays the newest complete one (docs/reliability.md).
  const auto c = wait ? saver_->finish(*engine_->groups().world) : saver_->poll(*engine_->groups().world);
  if (!c) return;
  last_checkpoint_ = c->dir;
  // The stall: what the step boundaries spent on this save (the copy, the
  // begin phase, the polls, waiting for the writer, the commit).
  const double stall = saver_copy_s_ + c->begin_s + c->poll_s + c->wait_s + c->commit_s;
  tei.add_checkpoint(c->poll_s + c->wait_s + c->commit_s);
  if (lead()) {
    std::printf("checkpoint: %s (async: saved at step %ld, committed at step %ld; stall %.3f s, "
                "write %.3f s)\n", c->dir.c_str(), long(c->step), long(step_), stall, c->write_s);
    std::fflush(stdout);
  }
  if (metrics)
    metrics->log_record({{"event", "checkpoint"}, {"mode", "async"}, {"step", c->step},
                         {"committed_step", step_}, {"dir", c->dir}, {"stall_s", stall},
                         {"copy_s", saver_copy_s_}, {"begin_s", c->begin_s}, {"poll_s", c->poll_s},
                         {"polls", c->polls}, {"wait_s", c->wait_s}, {"commit_s", c->commit_s},
                         {"write_s", c->write_s}});
}

void Trainer::fetch_micro_batch(int64_t first_sample, int64_t a, int32_t* in, int32_t* tg) {
  // Global sample first + (a*dp + d)*B + b goes to data-parallel rank d, so a
  // step reads the same samples whatever the layout.
  const int64_t B = cfg_.train.micro_batch, T = cfg_.model.seq_len;
  const Comm& dp = *engine_->groups().dp;
  const int64_t D = dp.size(), d = dp.rank();
  std::vector<int32_t> window(size_t(T + 1));
  for (int64_t b = 0; b < B; ++b) {
    sampler_->sample(first_sample + (a * D + d) * B + b, window.data());
    std::copy(window.begin(), window.end() - 1, in + b * T);
    std::copy(window.begin() + 1, window.end(), tg + b * T);
  }
}

void Trainer::print_header(double peak) const {
  const TrainConfig& t = cfg_.train;
  const ParallelContext& g = engine_->groups();
  const std::string cp_text =
      g.cp && g.cp->size() > 1
          ? "cp " + std::to_string(g.cp->size()) + " (" + cfg_.parallel.cp_mode + ", seq " +
                std::to_string(cfg_.model.seq_len / g.cp->size()) + " a rank), "
          : std::string();
  const std::string zero_text = engine_->optimizer().sharded() ? " (ZeRO-1)"
                                : engine_->zero_store()
                                    ? " (ZeRO-" + std::to_string(engine_->zero_store()->level()) + ")"
                                    : "";
  std::printf("training %s: %ld steps from step %ld, %ld tokens/step (micro_batch %ld x seq %ld x "
              "accum %ld x dp %d), tp %d%s, %sdp %d%s, pp %d, backend %s %s, %d threads/rank, MFU peak "
              "%.3g TFLOP/s per rank (%s)\n",
              cfg_.source.c_str(), long(t.steps), long(step_), long(t.global_batch * cfg_.model.seq_len),
              long(t.micro_batch), long(cfg_.model.seq_len), long(cfg_.accum_steps()), g.dp->size(),
              g.tp->size(),
              cfg_.parallel.sequence_parallel && g.tp->size() > 1 ? " (sequence parallel)" : "",
              cp_text.c_str(), g.dp->size(), zero_text.c_str(),
              g.pp->size(),
              backend_->name().c_str(), t.dtype.c_str(), omp_get_max_threads(), peak,
              cfg_.log.peak_tflops > 0 ? "log.peak_tflops"
              : cfg_.emulate.model_clock()  ? "emulate.model_flops"
              : backend_->peak_is_measured() ? "measured sgemm"
                                       : "the device's rated figure");
  if (engine_->pipelined()) std::printf("%s", describe_pipeline_schedule(cfg_).c_str());
  // The launcher's rank table names the emulation when it set it up (several ranks).
  if (emulation_ && (own_emulation_ || g.world->size() == 1))
    std::printf("%s\n", emulation_->summary().c_str());
  std::fflush(stdout);
}

void Trainer::log_decisions(MetricsLog* log) {
  if (log)
    for (const nlohmann::json& rec : unlogged_) log->log_record(rec);
  unlogged_.clear();
}

int Trainer::agreed_stop_signal(bool* switch_due) {
  const ParallelContext& g = engine_->groups();
  // [0]: a stop signal; [1]: world rank 0 sees a due layout switch request.
  int32_t flags[2] = {g_stop_signal.load(), 0};
  if (switch_due && lead()) flags[1] = switch_request_due(cfg_.log.dir, step_);
  g.tp->all_reduce(Tensor(flags, DType::I32, {2}), ReduceOp::Max);
  g.dp->all_reduce(Tensor(flags, DType::I32, {2}), ReduceOp::Max);
  g.pp->all_reduce(Tensor(flags, DType::I32, {2}), ReduceOp::Max);
  if (g.cp && g.cp->size() > 1) g.cp->all_reduce(Tensor(flags, DType::I32, {2}), ReduceOp::Max);
  if (switch_due) *switch_due = flags[1] != 0;
  return flags[0];
}

std::unique_ptr<MetricsLog> Trainer::open_metrics_log(std::vector<TeiRun>& earlier_runs) {
  if (!lead()) return nullptr;
  const bool append = step_ > 0 || continue_log_;  // a resume appends
  if (append) {
    const std::string path = (std::filesystem::path(cfg_.log.dir) / "metrics.jsonl").string();
    end_torn_line(path);
    earlier_runs = read_tei_runs(path);
  }
  return std::make_unique<MetricsLog>(cfg_.log.dir, append);
}

void Trainer::prepare_async_save() {
  if (!cfg_.checkpoint.async_save) return;
  // The staging buffers of the asynchronous saves, mapped in the background
  // now so that no save's copy pays for fresh pages (docs/reliability.md).
  if (!saver_) saver_ = std::make_unique<AsyncCheckpointSaver>();
  ShardedAdamW& opt = engine_->optimizer();
  const auto n = size_t(engine_->model().flat_size());
  saver_->prepare_buffers(n, opt.sharded() ? size_t(opt.adamw().hi() - opt.adamw().lo()) : n);
}

void Trainer::trace_begin() {
  // A common start: each rank's times count from its clock's time after the
  // world's barrier (one instant on a virtual clock, and on the wall clock
  // the barrier's exit skew, microseconds on one host).
  engine_->groups().world->barrier();
  trace::recorder().start([this] { return step_clock(); }, step_clock());
}

void Trainer::trace_end() {
  const ParallelContext& g = engine_->groups();
  const std::string path = (std::filesystem::path(cfg_.log.dir) / "trace.json").string();
  const nlohmann::json about = {
      {"config", cfg_.source},
      {"steps", cfg_.log.trace},
      {"clock", emulation_ && emulation_->clock != emulate::ClockKind::Wall ? "emulated" : "wall"},
      {"layout", describe(engine_->layout())},
      {"schedule", engine_->pipelined() ? engine_->pipeline()->schedule().name : ""},
      {"world", g.world->size()}};
  write_trace_file(*g.world, world_rank_, engine_->layout(), g.coords, path, about.dump());
  if (lead()) {
    std::printf("trace: steps %s of every rank in %s (open in https://ui.perfetto.dev or "
                "chrome://tracing)\n", cfg_.log.trace.c_str(), path.c_str());
    std::fflush(stdout);
  }
}

double Trainer::step_clock() const {
  return emulation_ && emulation_->clock != emulate::ClockKind::Wall ? emulation_->state->clock.now()
                                                                      : wall_seconds();
}

StepReport Trainer::run_step(TeiMeter& tei, TrainSummary& sum, int64_t first_step, int64_t& consecutive_bad) {
  using clock = std::chrono::steady_clock;
  const TrainConfig& t = cfg_.train;
  // (a run resumed inside the traced steps starts recording at its first step)
  if (trace_steps_ && !trace::recorder().on() && step_ + 1 >= trace_steps_->first &&
      step_ + 1 <= trace_steps_->second)
    trace_begin();
  trace::Recorder& rec = trace::recorder();
  const double trace_t0 = rec.now();
  const auto t0 = clock::now();
  const double v0 = step_clock();
  const ParallelContext& g = engine_->groups();
  if (emulation_) emulation_->at_step(step_);  // a straggler injected mid-run starts here
  tei.start_step();
  StepReport r;
  r.first_step = first_step;
  r.total_steps = t.steps;
  r.tp_bytes = -g.tp->stats().bytes, r.dp_bytes = -g.dp->stats().bytes, r.pp_bytes = -g.pp->stats().bytes;
  r.tp_seconds = -g.tp->stats().seconds, r.pp_seconds = -g.pp->stats().seconds;
  r.ep_seconds = -g.ep->stats().seconds;
  // cp = 1: a group of one that may be shared with other groups of one.
  const bool cp_on = g.cp->size() > 1;
  if (cp_on) r.cp_bytes = -g.cp->stats().bytes, r.cp_seconds = -g.cp->stats().seconds;
  const int64_t reads0 = backend_->host_reads();
  r.lr = lr_at(t, step_);
  const int64_t first_sample = samples_seen_;
  const double tp_s0 = g.tp->stats().seconds, ep_s0 = g.ep->stats().seconds,
               cp_s0 = cp_on ? g.cp->stats().seconds : 0.0;
  r.loss = engine_->forward_backward([&](int a, int32_t* in, int32_t* tg) {
    fetch_micro_batch(first_sample, a, in, tg);
  });
  // TEI: exposed communication of the forward/backward (blocking tp and ep
  // calls, the dp reduction's wait) and the pipeline's idle time.
  TeiStepTimes tt;
  tt.comm_s = (g.tp->stats().seconds - tp_s0) + (g.ep->stats().seconds - ep_s0) +
              (cp_on ? g.cp->stats().seconds - cp_s0 : 0.0) + engine_->last_times().dp_wait_s +
              engine_->last_times().dp_compressed_s;
  if (engine_->pipelined())
    tt.bubble_s = std::max(0.0, engine_->pipeline()->last_step_seconds() -
                                    engine_->pipeline()->last_busy_seconds());
  samples_seen_ += t.global_batch;
  if (sampler_->sources() > 1)
    for (int s = 0; s < sampler_->sources(); ++s)
      r.source_tokens.push_back(sampler_->consumed(s, samples_seen_) * cfg_.model.seq_len);
  const auto t_opt = clock::now();
  {
    trace::Span span("grad norm", "optimizer");
    r.grad_norm = engine_->grad_norm();
  }
  // Loss and norm are identical on every rank (deterministic reductions), so
  // every rank takes the same branch.
  r.applied = std::isfinite(r.loss) && std::isfinite(r.grad_norm);
  if (r.applied) {
    trace::Span span("optimizer", "optimizer");
    engine_->apply_update(r.lr, ++opt_steps_, clip_coefficient(r.grad_norm, t.grad_clip));
    consecutive_bad = 0;
  } else {
    ++sum.skipped_steps;
    ++consecutive_bad;
    if (lead())
      std::fprintf(stderr, "step %ld: non-finite %s (loss %g, grad norm %g); update skipped\n",
                   long(step_ + 1), std::isfinite(r.loss) ? "gradient norm" : "loss", r.loss,
                   r.grad_norm);
    ADGT_CHECK(consecutive_bad <= t.max_skipped_steps,
               consecutive_bad << " consecutive steps had a non-finite loss or gradient; "
                                  "stopping (train.max_skipped_steps="
                               << t.max_skipped_steps << "); lower train.lr or resume from "
                                                         "an earlier checkpoint");
  }
  tt.optimizer_s = std::chrono::duration<double>(clock::now() - t_opt).count();
  r.step = ++step_;
  if (step_ == 1) inject_host_read(engine_->model());
  r.skipped_steps = sum.skipped_steps;
  r.tp_bytes += g.tp->stats().bytes, r.dp_bytes += g.dp->stats().bytes, r.pp_bytes += g.pp->stats().bytes;
  r.tp_seconds += g.tp->stats().seconds, r.pp_seconds += g.pp->stats().seconds;
  r.ep_seconds += g.ep->stats().seconds;
  if (cp_on) r.cp_bytes += g.cp->stats().bytes, r.cp_seconds += g.cp->stats().seconds;
  if (reads0 >= 0) r.host_reads = backend_->host_reads() - reads0;
  r.seconds = step_clock() - v0;
  tt.seconds = r.seconds;
  if (rec.on())
    rec.span("step " + std::to_string(step_), "step", trace_t0, rec.now(), trace::kMainTrack,
             "{\"loss\": " + nlohmann::json(r.loss).dump() + ", \"seconds\": " +
                 nlohmann::json(r.seconds).dump() + "}");
  // The watchdog's automatic deadline (docs/reliability.md) is wall time.
  fault::step_finished(std::chrono::duration<double>(clock::now() - t0).count());
  tei.add_step(tt, r.applied);
  return r;
}

void Trainer::evaluate_now(MetricsLog* metrics, TeiMeter& tei, TrainSummary& sum) {
  const auto t_eval = std::chrono::steady_clock::now();
  fault::PhaseScope eval_phase(fault::Phase::Eval);  // the watchdog's long deadline
  const ValLoss vl = evaluate_sources();
  if (metrics) {
    std::printf("eval step %ld: %s\n", long(step_), format_val_loss(vl.loss, vl.by_source).c_str());
    std::fflush(stdout);
    metrics->log_eval(step_, vl.loss, vl.by_source);
  }
  sum.final_val_loss = vl.loss;
  tei.add_eval(std::chrono::duration<double>(std::chrono::steady_clock::now() - t_eval).count());
}

void Trainer::finish_summary(TrainSummary& sum, MetricsLog* metrics, TeiMeter& tei,
                             const StepLogger& logger, std::chrono::steady_clock::time_point t_start) {
  const ParallelContext& g = engine_->groups();
  {
    fault::PhaseScope save_phase(fault::Phase::CheckpointSave);
    commit_checkpoint(metrics, tei, true);  // a save still in flight (checkpoint.async)
  }
  check_dp_replicas(engine_->model(), g, lead());
  sum.steps_done = step_;
  // The run's energy per token and throttled share (docs/telemetry.md):
  // stops the telemetry sampler; collective. In the TEI's end record too.
  sum.energy = logger.finish_telemetry(*g.world);
  tei.set_run_energy(sum.energy);
  sum.tei = tei.record(*g.world, TeiMeter::At::End, step_, logger.peak_tflops());
  sum.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  const double per_step = logger.mean_step_seconds();
  sum.tokens_per_s = per_step > 0 ? double(cfg_.train.global_batch * cfg_.model.seq_len) / per_step : 0;
  sum.final_train_loss = logger.final_train_loss();
  sum.checkpoint = last_checkpoint_;
  // The largest backend allocation peak over the world (-1 where untracked).
  double mem_peak[1] = {double(backend_->peak_allocated_bytes())};
  g.world->all_reduce(Tensor(mem_peak, DType::F64, {1}), ReduceOp::Max);
  sum.peak_device_bytes = int64_t(mem_peak[0]);
  // The bytes that crossed the emulated WAN, every rank's (docs/sites.md).
  if (emulation_ && emulation_->cluster.sites.size() > 1) {
    double wan[1] = {emulation_->state->wan_bytes_sent()};
    g.world->all_reduce(Tensor(wan, DType::F64, {1}), ReduceOp::Sum);
    sum.wan_bytes = wan[0];
    sum.wan_steps = step_ - run_start_step_;
  }
}

TrainSummary Trainer::train() {
  const TrainConfig& t = cfg_.train;
  const ParallelContext& g0 = engine_->groups();  // the start's groups (a layout switch replaces them)
  // On the model clock the peak is its compute rate (what the launch plan and
  // adgt-sim use too): the MFU is then the step's share of counted matmul time.
  const bool model_peak = cfg_.log.peak_tflops <= 0 && cfg_.emulate.model_clock();
  const bool measured_peak = cfg_.log.peak_tflops <= 0 && !model_peak;
  const double peak = model_peak      ? cfg_.emulate.model_flops / 1e12
                      : measured_peak ? backend_->peak_tflops_for(engine_->model().dtype())
                                      : cfg_.log.peak_tflops;
  std::vector<TeiRun> earlier_runs;  // a resume appends: the job's earlier runs (docs/tei.md)
  std::unique_ptr<MetricsLog> metrics = open_metrics_log(earlier_runs);
  TrainSummary sum;
  run_start_step_ = step_;
  if (metrics) sum.metrics_path = metrics->path();
  if (lead()) print_header(peak);
  if (lead() && trace_steps_ && step_ >= trace_steps_->second)
    std::printf("log.trace=%s: this run starts after step %ld, past the traced steps; no trace is "
                "written\n", cfg_.log.trace.c_str(), long(step_));
  prepare_async_save();
  // The hook after every step: the step metrics, then the controllers (made
  // again after a layout switch: the new engine has its own).
  {
    std::lock_guard<std::mutex> lk(telemetry_mu_);
    telemetry_ = make_telemetry_sampler(cfg_.log.telemetry_interval_s, dev_, lead(), cfg_.log.telemetry_source);
  }
  StepLogger logger(cfg_, *backend_, metrics.get(), peak, measured_peak, telemetry_);
  std::unique_ptr<StepHook> hook;
  const auto make_hook = [&] {
    hook = std::make_unique<StepHook>();
    hook->add(logger);
    for (auto& c : controllers_) hook->add(*c);
  };
  make_hook();
  // The Training Efficiency Index's counters (parallel/metrics/tei_meter.hpp).
  TeiMeter tei(cfg_, g0.world->size(), metrics.get(), std::move(earlier_runs), step_,
               logger.peak_tflops());
  if (metrics && !g0.plan_json.empty())  // parallel.auto's choice (docs/planner.md)
    metrics->log_record({{"event", "plan"}, {"step", step_},
                         {"plan", nlohmann::json::parse(g0.plan_json)}});
  log_decisions(metrics.get());

  const auto t_start = std::chrono::steady_clock::now();
  int64_t consecutive_bad = 0;
  const int64_t first_step = step_;
  while (step_ < t.steps) {
    const StepReport r = run_step(tei, sum, first_step, consecutive_bad);
    const ParallelContext& g = engine_->groups();
    // A layout change a controller decided (a layer move, a re-plan, an
    // expert placement), made below at this boundary.
    // The step boundary's phases, on the timeline while log.trace records.
    const LayoutRequest layout_request = [&] {
      trace::Span span("step hook", "control");
      return hook->after_step(*engine_, r, *g.world, metrics.get());
    }();
    const bool last = step_ == t.steps;
    if (step_ % cfg_.log.interval == 0 || last) {
      trace::Span span("tei record", "control");
      tei.record(*g.world, TeiMeter::At::Interval, step_, logger.peak_tflops());
    }
    if (t.eval_interval > 0 && (step_ % t.eval_interval == 0 || last)) {
      trace::Span span("eval", "eval");
      evaluate_now(metrics.get(), tei, sum);
    }
    bool switch_due = false;
    const int sig = [&] {
      trace::Span span("stop signal", "control");
      return agreed_stop_signal(&switch_due);
    }();
    {
      trace::Span span("checkpoint commit", "checkpoint");
      commit_checkpoint(metrics.get(), tei, false);  // checkpoint.async: once every rank has written
    }
    if (sig || (last && cfg_.checkpoint.at_end) ||
        (cfg_.checkpoint.interval > 0 && step_ % cfg_.checkpoint.interval == 0)) {
      trace::Span span("checkpoint save", "checkpoint");
      fault::PhaseScope save_phase(fault::Phase::CheckpointSave);  // the watchdog's long deadline
      save(metrics.get(), tei, sig || last);  // at a stop or the end: committed before going on
      tei.record(*g.world, TeiMeter::At::Checkpoint, step_, logger.peak_tflops());
    }
    if (sig) {
      if (lead())
        std::printf("stopping at step %ld on signal %d (checkpoint saved)\n", long(step_), sig);
      sum.stopped_by_signal = true;
      break;
    }
    // A layout switch asked for in <log.dir>/switch (docs/reliability.md):
    // between steps, after this boundary's checkpoint, which is committed
    // first (checkpoint.async) since the switch replaces the groups.
    if ((switch_due || !layout_request.empty()) && !last) {
      commit_checkpoint(metrics.get(), tei, true);
      const bool changed =
          !layout_request.empty()
              ? apply_layout_request(layout_request.overrides, "controller " + layout_request.by,
                                     metrics.get())
              : run_switch(metrics.get());
      if (changed) make_hook();
      log_decisions(metrics.get());
    }
    if (trace_steps_ && trace::recorder().on() && step_ >= trace_steps_->second) trace_end();
  }
  if (trace::recorder().on()) trace_end();  // stopped (a signal) inside the traced steps
  finish_summary(sum, metrics.get(), tei, logger, t_start);
  return sum;
}

}  // namespace adgt

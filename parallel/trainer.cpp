#include "parallel/trainer.hpp"

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

#include "core/checkpoint.hpp"
#include "core/memory_estimate.hpp"
#include "core/metrics.hpp"
#include "core/sampler.hpp"
#include "core/token_shard.hpp"
#include "kernels/check.hpp"
#include "parallel/pipeline_plan.hpp"
#include "parallel/schedule/simulate.hpp"

namespace adgt {

namespace {
std::atomic<int> g_stop_signal{0};
void on_stop_signal(int sig) { g_stop_signal.store(sig); }

DType parse_dtype(const std::string& s) {
  return s == "f64" ? DType::F64 : s == "bf16" ? DType::BF16 : DType::F32;
}

std::unique_ptr<TokenShard> open_shard(const std::string& path, const char* key,
                                       const ModelConfig& m) {
  ADGT_CHECK(std::filesystem::exists(path),
             key << ": token shard '" << path
                 << "' does not exist; prepare it with `adgt-data prepare` (scripts/prepare_data.sh)");
  auto s = std::make_unique<TokenShard>(path);
  ADGT_CHECK(s->vocab_size() <= m.vocab_size,
             key << ": shard '" << path << "' was tokenized with vocabulary " << s->vocab_size()
                 << " but model.vocab_size=" << m.vocab_size << "; set model.vocab_size >= "
                 << s->vocab_size());
  return s;
}
}  // namespace

void install_stop_handlers() {
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGUSR1, on_stop_signal);
}

Trainer::Trainer(const RunConfig& cfg, ParallelContext ctx) : cfg_(cfg), ctx_(ctx) {
  if (!ctx_.tp) ctx_.tp = &self_tp_;
  if (!ctx_.dp) ctx_.dp = &self_dp_;
  if (!ctx_.pp) ctx_.pp = &self_pp_;
  if (!ctx_.ep) ctx_.ep = &self_ep_;
  if (!ctx_.edp) ctx_.edp = ctx_.ep->size() > 1 ? &self_edp_ : ctx_.dp;
  if (!ctx_.world) ctx_.world = &self_world_;
  ADGT_CHECK(ctx_.tp->size() == cfg.parallel.tp && ctx_.dp->size() == cfg.parallel.dp &&
                 ctx_.pp->size() == cfg.parallel.pp,
             "Trainer: process groups (tp " << ctx_.tp->size() << ", dp " << ctx_.dp->size()
                                            << ", pp " << ctx_.pp->size()
                                            << ") do not match parallel.tp=" << cfg.parallel.tp
                                            << ", parallel.dp=" << cfg.parallel.dp
                                            << ", parallel.pp=" << cfg.parallel.pp);
  // The CUDA backend runs single-process dense models for now: collectives
  // over device memory (NCCL) are not wired into the trainer, and the MoE
  // exchange goes through host-memory collectives. `auto` then means cpu.
  const int world = ctx_.tp->size() * ctx_.dp->size() * ctx_.pp->size();
  const bool device_collectives = world > 1 || cfg.model.n_experts > 0;
  std::string device = cfg.train.device;
  if (device == "auto" && device_collectives) device = "cpu";
  ADGT_CHECK(!(device == "cuda" && device_collectives),
             "train.device=cuda: " << (world > 1 ? "runs over several ranks (" + std::to_string(world) +
                                                       " here)"
                                                 : std::string("mixture-of-experts models"))
                                   << " need device collectives, which the CUDA path does not "
                                      "have yet; use train.device: cpu (or auto)");
  backend_ = make_backend(device);
  train_shard_ = open_shard(cfg.data.train, "data.train", cfg.model);
  val_shard_ = open_shard(cfg.data.val, "data.val", cfg.model);
  sampler_ = std::make_unique<Sampler>(*train_shard_, cfg.model.seq_len, cfg.train.seed);
  const DType dt = parse_dtype(cfg.train.dtype);
  TensorParallel tp;
  tp.comm = ctx_.tp;
  tp.sequence_parallel = cfg.parallel.sequence_parallel;
  tp.flat_multiple = 16 * (cfg.parallel.zero ? cfg.parallel.dp : 1);
  const int pp = int(cfg.parallel.pp), v = int(cfg.parallel.virtual_stages);
  const StageSlice slice =
      stage_slice(stage_layer_counts(cfg), pp, v, pipelined() ? ctx_.pp->rank() : 0);
  ExpertParallel ep;
  ep.comm = ctx_.ep;
  for (int64_t r : cfg.parallel.expert_placement) ep.placement.push_back(int(r));
  model_ = std::make_unique<Model>(cfg.model, *backend_, dt, cfg.train.micro_batch,
                                   cfg.model.seq_len, tp, &slice, ep);
  model_->init_weights(cfg.train.seed);
  dp_ = std::make_unique<DataParallel>(*backend_, *model_, cfg.train, cfg.parallel, *ctx_.dp,
                                       *ctx_.tp, ctx_.pp, ctx_.ep, ctx_.edp);
  if (pipelined()) {
    pp::Schedule sched = make_pipeline_schedule(cfg);
    pipe_ = std::make_unique<PipelineExecutor>(*model_, *backend_, *ctx_.pp, std::move(sched));
  }
}

Trainer::~Trainer() = default;

ShardLayout Trainer::layout() const {
  ShardLayout lay;
  lay.tp = ctx_.tp->size();
  lay.tp_rank = ctx_.tp->rank();
  lay.dp = ctx_.dp->size();
  lay.dp_rank = ctx_.dp->rank();
  lay.pp = ctx_.pp->size();
  lay.pp_rank = ctx_.pp->rank();
  lay.ep = ctx_.ep->size();
  lay.ep_rank = ctx_.ep->rank();
  lay.description = "tp=" + std::to_string(lay.tp) + " dp=" + std::to_string(lay.dp) +
                    " zero=" + std::to_string(dp_->zero() ? 1 : 0) + " sequence_parallel=" +
                    std::to_string(cfg_.parallel.sequence_parallel && lay.tp > 1 ? 1 : 0) +
                    " pp=" + std::to_string(lay.pp) + " ep=" + std::to_string(lay.ep);
  if (pipelined())
    lay.description += " schedule=" + cfg_.parallel.schedule +
                       " virtual_stages=" + std::to_string(cfg_.parallel.virtual_stages);
  return lay;
}

void Trainer::load(const std::string& step_dir) {
  // Collective over the world: each rank reads its own shards (any writer layout);
  // an error on any rank stops every rank with that message.
  CheckpointState st = load_checkpoint_sharded(step_dir, model_->table(), layout(), *ctx_.world);
  const auto n = size_t(model_->flat_size());
  for (auto* v : {&st.params, &st.exp_avg, &st.exp_avg_sq}) v->resize(n, 0.0f);
  model_->params_from_host(st.params);
  dp_->load_state(st.exp_avg, st.exp_avg_sq);
  step_ = st.step;
  samples_seen_ = st.samples_seen;
  opt_steps_ = st.rng_state.empty() ? st.step : int64_t(st.rng_state[0]);
  // Words 1..: the MoE selection biases (n_layers x E doubles, bit copies), when saved.
  if (model_->has_moe() && cfg_.model.moe_aux_free) {
    std::vector<double> t(size_t(cfg_.model.n_layers * cfg_.model.n_experts), 0.0);
    if (st.rng_state.size() == 1 + t.size())
      std::memcpy(t.data(), st.rng_state.data() + 1, t.size() * 8);
    else if (lead())
      std::fprintf(stderr, "warning: checkpoint %s has no MoE selection biases; they restart at 0\n",
                   step_dir.c_str());
    model_->set_moe_bias_table(t);
  }
  if (st.seed != cfg_.train.seed && lead())
    std::fprintf(stderr, "warning: checkpoint %s was trained with train.seed=%llu, this run has %llu\n",
                 step_dir.c_str(), (unsigned long long)st.seed,
                 (unsigned long long)cfg_.train.seed);
}

std::string Trainer::save() {
  // Every rank writes its own pieces (checkpoint format version 2); under ZeRO-1
  // each dp rank writes the AdamW state of its own chunk, so nothing is gathered.
  ShardLayout lay = layout();
  CheckpointState st;
  st.specs = model_->table();
  st.params = model_->params_to_host();
  if (dp_->zero()) {
    AdamW& opt = dp_->optimizer();
    st.exp_avg = opt.to_host(opt.exp_avg());
    st.exp_avg_sq = opt.to_host(opt.exp_avg_sq());
    lay.state_lo = opt.lo();
    lay.state_hi = opt.hi();
  } else {
    st.exp_avg = dp_->full_exp_avg();
    st.exp_avg_sq = dp_->full_exp_avg_sq();
  }
  st.step = step_;
  st.samples_seen = samples_seen_;
  st.seed = cfg_.train.seed;
  if (lead()) st.config_yaml = to_yaml(cfg_);
  st.rng_state = {uint64_t(opt_steps_)};  // trainer state word 0: AdamW updates applied
  if (model_->has_moe() && cfg_.model.moe_aux_free) {
    // Every pipeline stage holds its layers' biases (the same on its tp, dp and
    // ep replicas); the sum over the pipeline group gives rank 0 the whole table.
    std::vector<double> t = model_->moe_bias_table();
    ctx_.pp->all_reduce(Tensor(t.data(), DType::F64, {int64_t(t.size())}));
    const size_t w0 = st.rng_state.size();
    st.rng_state.resize(w0 + t.size());
    std::memcpy(st.rng_state.data() + w0, t.data(), t.size() * 8);
  }
  last_checkpoint_ =
      save_checkpoint_sharded(cfg_.checkpoint.dir, st, lay, *ctx_.world, cfg_.checkpoint.keep);
  return last_checkpoint_;
}

void Trainer::fetch_micro_batch(int64_t first_sample, int64_t a, int32_t* in, int32_t* tg) {
  // Global sample first + (a*dp + d)*B + b goes to data-parallel rank d, so a
  // step reads the same samples whatever the layout.
  const int64_t B = cfg_.train.micro_batch, T = cfg_.model.seq_len;
  const int64_t D = ctx_.dp->size(), d = ctx_.dp->rank();
  std::vector<int32_t> window(size_t(T + 1));
  for (int64_t b = 0; b < B; ++b) {
    sampler_->sample(first_sample + (a * D + d) * B + b, window.data());
    std::copy(window.begin(), window.end() - 1, in + b * T);
    std::copy(window.begin() + 1, window.end(), tg + b * T);
  }
}

double Trainer::run_pipeline_step(int64_t first_sample) {
  const int64_t A = cfg_.accum_steps(), D = ctx_.dp->size();
  double loss[1] = {pipe_->run_step(
      [&](int mb, int32_t* in, int32_t* tg) { fetch_micro_batch(first_sample, mb, in, tg); },
      1.0 / double(A * D))};
  model_->finish_sequence_parallel_grads();
  dp_->reduce_gradients();
  // The loss is known on the last stage; every rank logs and checks the same value.
  ctx_.pp->all_reduce(Tensor(loss, DType::F64, {1}));
  ctx_.dp->all_reduce(Tensor(loss, DType::F64, {1}));
  return loss[0] / double(A * D);
}

void Trainer::trace_pipeline_step() {
  // ADGT_PIPELINE_TRACE=DIR: every pipeline rank appends each step's executed
  // compute instructions (seconds from the step's common start) to
  // DIR/pipeline_rank_<world rank>.jsonl: the executor's own timeline.
  static const char* dir = std::getenv("ADGT_PIPELINE_TRACE");
  if (!dir || !*dir) return;
  std::filesystem::create_directories(dir);
  const std::string path =
      std::string(dir) + "/pipeline_rank_" + std::to_string(ctx_.world_rank) + ".jsonl";
  std::FILE* f = std::fopen(path.c_str(), "a");
  ADGT_CHECK(f, "ADGT_PIPELINE_TRACE: cannot append to " << path);
  std::fprintf(f, "{\"step\": %ld, \"pp_rank\": %d, \"span\": %.9f, \"ops\": [", long(step_ + 1),
               ctx_.pp->rank(), pipe_->last_step_seconds());
  bool first = true;
  for (const ExecutedInstr& e : pipe_->timeline()) {
    std::fprintf(f, "%s[\"%s\", %d, %d, %.9f, %.9f]", first ? "" : ", ", pp::op_name(e.instr.op),
                 e.instr.microbatch, e.instr.chunk, e.start, e.end);
    first = false;
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);
}

void Trainer::replan_from_measurements() {
  // Mean F, B and W time per stage from this step's timeline; a fused Backward
  // counts half as B and half as W. The maximum over the world (every tp and
  // dp replica of a stage) is the same on every rank, and greedy is a pure
  // function of it, so every rank gets the same schedule.
  const int pp = ctx_.pp->size(), r = ctx_.pp->rank();
  const int S = pp * int(cfg_.parallel.virtual_stages);
  std::vector<double> sum(size_t(3 * S), 0.0), n(size_t(3 * S), 0.0);
  for (const ExecutedInstr& e : pipe_->timeline()) {
    const size_t s = size_t(e.instr.chunk * pp + r);
    const double d = e.end - e.start;
    switch (e.instr.op) {
      case pp::Op::Forward: sum[s] += d; n[s] += 1; break;
      case pp::Op::BackwardInput: sum[size_t(S) + s] += d; n[size_t(S) + s] += 1; break;
      case pp::Op::BackwardWeight: sum[size_t(2 * S) + s] += d; n[size_t(2 * S) + s] += 1; break;
      case pp::Op::Backward:
        sum[size_t(S) + s] += d / 2; n[size_t(S) + s] += 1;
        sum[size_t(2 * S) + s] += d / 2; n[size_t(2 * S) + s] += 1;
        break;
      default: break;
    }
  }
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = n[i] > 0 ? sum[i] / n[i] : 0.0;
  ctx_.world->all_reduce(Tensor(sum.data(), DType::F64, {int64_t(sum.size())}), ReduceOp::Max);
  pp::StageCosts c;
  for (int s = 0; s < S; ++s) {
    c.f.push_back(std::max(sum[size_t(s)], 1e-9));
    c.b.push_back(std::max(sum[size_t(S + s)], 1e-9));
    c.w.push_back(sum[size_t(2 * S + s)]);
  }
  pp::Schedule sched = make_pipeline_schedule(cfg_, &c);
  if (lead()) {
    std::printf("greedy: re-planned from the measured stage times (ms per micro-batch):\n");
    for (int s = 0; s < S; ++s)
      std::printf("  stage %d: F %.3f  B %.3f  W %.3f\n", s, 1e3 * c.f[size_t(s)],
                  1e3 * c.b[size_t(s)], 1e3 * c.w[size_t(s)]);
    const pp::SimResult sim = pp::simulate(sched, c);
    std::printf("  kept %s; predicted bubble %.1f%% (idle / (pp x makespan))\n",
                sched.detail.empty() ? sched.name.c_str() : sched.detail.c_str(),
                100.0 * sim.bubble_fraction);
    std::fflush(stdout);
  }
  pipe_->set_schedule(std::move(sched));
}

double Trainer::measured_bubble() {
  double busy[1] = {pipe_->last_busy_seconds()}, span[1] = {pipe_->last_step_seconds()};
  ctx_.pp->all_reduce(Tensor(busy, DType::F64, {1}));
  ctx_.pp->all_reduce(Tensor(span, DType::F64, {1}), ReduceOp::Max);
  return span[0] > 0 ? 1.0 - busy[0] / (double(ctx_.pp->size()) * span[0]) : 0.0;
}

double Trainer::run_micro_batches(int64_t first_sample) {
  if (pipelined()) return run_pipeline_step(first_sample);
  const int64_t B = cfg_.train.micro_batch, T = cfg_.model.seq_len, A = cfg_.accum_steps();
  const int64_t D = ctx_.dp->size();
  std::vector<int32_t> in(size_t(B * T)), tg(size_t(B * T));
  double loss_sum = 0;
  for (int64_t a = 0; a < A; ++a) {
    fetch_micro_batch(first_sample, a, in.data(), tg.data());
    loss_sum += model_->forward(in.data(), tg.data(), 1.0 / double(A * D));
    const bool last = a + 1 == A;
    model_->backward(last ? dp_->bucket_hook() : std::function<void(int64_t, int64_t)>(), last);
  }
  dp_->finish_gradients();
  double total[1] = {loss_sum};
  ctx_.dp->all_reduce(Tensor(total, DType::F64, {1}));
  return total[0] / double(A * D);
}

double Trainer::evaluate() {
  const int64_t B = cfg_.train.micro_batch, T = cfg_.model.seq_len;
  int64_t n = num_eval_windows(*val_shard_, T);
  ADGT_CHECK(n > 0, "data.val: shard '" << val_shard_->path() << "' has fewer than "
                                        << T + 1 << " tokens (model.seq_len + 1)");
  if (cfg_.train.eval_batches > 0) n = std::min(n, cfg_.train.eval_batches * B);
  std::vector<int32_t> window(size_t(T + 1)), in(size_t(B * T)), tg(size_t(B * T));
  double total = 0;
  int64_t tokens = 0;
  for (int64_t w0 = 0; w0 < n; w0 += B) {
    std::fill(in.begin(), in.end(), 0);
    std::fill(tg.begin(), tg.end(), -1);  // padding rows of a short last batch are ignored
    const int64_t rows = std::min(B, n - w0);
    for (int64_t b = 0; b < rows; ++b) {
      eval_window(*val_shard_, T, w0 + b, window.data());
      std::copy(window.begin(), window.end() - 1, in.begin() + b * T);
      std::copy(window.begin() + 1, window.end(), tg.begin() + b * T);
    }
    const double l = pipelined() ? pipe_->forward_only(in.data(), tg.data())
                                 : model_->forward(in.data(), tg.data(), 0.0);
    total += l * double(rows * T);
    tokens += rows * T;
  }
  if (pipelined()) {  // the loss is known on the last stage
    double t[1] = {total};
    ctx_.pp->all_reduce(Tensor(t, DType::F64, {1}));
    total = t[0];
  }
  return total / double(tokens);
}

TrainSummary Trainer::train() {
  const TrainConfig& t = cfg_.train;
  const int64_t tokens_per_step = t.global_batch * cfg_.model.seq_len;
  const double flops_per_token =
      estimate_memory(cfg_, compute_bytes_per_element(cfg_)).flops_per_token;
  const bool measured_peak = cfg_.log.peak_tflops <= 0;
  double peak = measured_peak ? backend_->peak_tflops_for(parse_dtype(t.dtype)) : cfg_.log.peak_tflops;
  std::unique_ptr<MetricsLog> metrics_ptr;
  if (lead()) metrics_ptr = std::make_unique<MetricsLog>(cfg_.log.dir, step_ > 0);
  MetricsLog* metrics = metrics_ptr.get();
  const int world = ctx_.tp->size() * ctx_.dp->size() * ctx_.pp->size();
  TrainSummary sum;
  if (metrics) sum.metrics_path = metrics->path();

  if (lead()) {
    std::printf("training %s: %ld steps from step %ld, %ld tokens/step (micro_batch %ld x seq %ld x "
                "accum %ld x dp %d), tp %d%s, dp %d%s, pp %d, backend %s %s, %d threads/rank, MFU peak "
                "%.3g TFLOP/s per rank (%s)\n",
                cfg_.source.c_str(), long(t.steps), long(step_), long(tokens_per_step),
                long(t.micro_batch), long(cfg_.model.seq_len), long(cfg_.accum_steps()),
                ctx_.dp->size(), ctx_.tp->size(),
                cfg_.parallel.sequence_parallel && ctx_.tp->size() > 1 ? " (sequence parallel)" : "",
                ctx_.dp->size(), dp_->zero() ? " (ZeRO-1)" : "", ctx_.pp->size(),
                backend_->name().c_str(),
                t.dtype.c_str(), omp_get_max_threads(), peak,
                cfg_.log.peak_tflops > 0 ? "log.peak_tflops"
                : backend_->is_host() ? "measured sgemm" : "the device's rated figure");
    if (pipelined()) std::printf("%s", describe_pipeline_schedule(cfg_).c_str());
    std::fflush(stdout);
  }

  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  double timed_s = 0;
  int64_t timed_steps = 0, consecutive_bad = 0, first_step = step_;
  double interval_loss = 0;
  int64_t interval_n = 0;
  while (step_ < t.steps) {
    const auto t0 = clock::now();
    const int64_t tp_bytes0 = ctx_.tp->stats().bytes, dp_bytes0 = ctx_.dp->stats().bytes,
                  pp_bytes0 = ctx_.pp->stats().bytes;
    const double lr = lr_at(t, step_);
    model_->zero_grads();
    model_->reset_moe_stats();
    const double loss = run_micro_batches(samples_seen_);
    samples_seen_ += t.global_batch;
    if (pipelined()) trace_pipeline_step();
    // Greedy plans with the FLOP cost model first, then once with the times
    // measured on the second step (the first warms caches and buffers).
    if (pipelined() && cfg_.parallel.schedule == "greedy" && step_ == first_step + 1)
      replan_from_measurements();
    const double bubble = pipelined() ? measured_bubble() : -1.0;
    const double gn = dp_->grad_norm();
    // Loss and norm are identical on every rank (deterministic reductions), so
    // every rank takes the same branch.
    const bool finite = std::isfinite(loss) && std::isfinite(gn);
    if (finite) {
      dp_->step(lr, ++opt_steps_, clip_coefficient(gn, t.grad_clip));
      if (cfg_.model.moe_aux_free) model_->update_moe_bias(ctx_.edp);
      consecutive_bad = 0;
      interval_loss += loss;
      ++interval_n;
    } else {
      ++sum.skipped_steps;
      ++consecutive_bad;
      if (lead())
        std::fprintf(stderr, "step %ld: non-finite %s (loss %g, grad norm %g); update skipped\n",
                     long(step_ + 1), std::isfinite(loss) ? "gradient norm" : "loss", loss, gn);
      ADGT_CHECK(consecutive_bad <= t.max_skipped_steps,
                 consecutive_bad << " consecutive steps had a non-finite loss or gradient; "
                                    "stopping (train.max_skipped_steps="
                                 << t.max_skipped_steps << "); lower train.lr or resume from "
                                                           "an earlier checkpoint");
    }
    ++step_;
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    if (step_ > first_step + 1) {  // the first step warms caches and thread pools
      timed_s += dt;
      ++timed_steps;
    }
    const double elapsed = std::chrono::duration<double>(clock::now() - t_start).count();
    const int64_t tp_bytes = ctx_.tp->stats().bytes - tp_bytes0,
                  dp_bytes = ctx_.dp->stats().bytes - dp_bytes0;
    if (metrics && (step_ % cfg_.log.interval == 0 || step_ == t.steps)) {
      StepMetrics m;
      m.world = world;
      m.tp_bytes = tp_bytes;
      m.dp_bytes = dp_bytes;
      m.pp_bytes = ctx_.pp->stats().bytes - pp_bytes0;
      for (const MoeLayerStep& x : model_->moe_stats()) {
        MoeLayerMetrics y;
        y.layer = x.layer;
        y.load = x.load;
        y.tokens = x.tokens;
        y.dropped = x.dropped;
        y.aux = x.calls ? x.aux / double(x.calls) : 0;
        y.a2a_bytes = x.a2a_bytes;
        y.a2a_seconds = x.a2a_seconds;
        m.moe.push_back(std::move(y));
      }
      m.bubble = bubble;
      m.step = step_;
      m.total_steps = t.steps;
      m.loss = interval_n ? interval_loss / double(interval_n) : loss;
      m.lr = lr;
      m.grad_norm = gn;
      m.tokens_per_s = double(tokens_per_step) / dt;
      m.tflops = m.tokens_per_s * flops_per_token / 1e12 / double(world);  // per rank
      if (measured_peak && peak > 0 && m.tflops > peak)  // the start-up figure read low
        peak = backend_->remeasure_peak_tflops();
      m.peak_tflops = peak;
      m.mfu = peak > 0 ? m.tflops / peak : -1;
      m.elapsed_s = elapsed;
      const double per_step = timed_steps ? timed_s / double(timed_steps) : dt;
      m.eta_s = per_step * double(t.steps - step_);
      m.skipped_steps = sum.skipped_steps;
      std::printf("%s\n", format_step_line(m).c_str());
      std::fflush(stdout);
      metrics->log_step(m);
      sum.final_train_loss = m.loss;
      interval_loss = 0;
      interval_n = 0;
    }
    const bool last = step_ == t.steps;
    if (t.eval_interval > 0 && (step_ % t.eval_interval == 0 || last)) {
      const double vl = evaluate();
      if (metrics) {
        std::printf("eval step %ld: val loss %.4f\n", long(step_), vl);
        std::fflush(stdout);
        metrics->log_eval(step_, vl);
      }
      sum.final_val_loss = vl;
    }
    // A signal to any rank stops every rank at this step boundary.
    int32_t sig_flag[1] = {g_stop_signal.load()};
    ctx_.tp->all_reduce(Tensor(sig_flag, DType::I32, {1}), ReduceOp::Max);
    ctx_.dp->all_reduce(Tensor(sig_flag, DType::I32, {1}), ReduceOp::Max);
    ctx_.pp->all_reduce(Tensor(sig_flag, DType::I32, {1}), ReduceOp::Max);
    const int sig = sig_flag[0];
    if (sig || last ||
        (cfg_.checkpoint.interval > 0 && step_ % cfg_.checkpoint.interval == 0)) {
      const std::string dir = save();
      if (lead()) {
        std::printf("checkpoint: %s\n", dir.c_str());
        std::fflush(stdout);
      }
    }
    if (sig) {
      if (lead())
        std::printf("stopping at step %ld on signal %d (checkpoint saved)\n", long(step_), sig);
      sum.stopped_by_signal = true;
      break;
    }
  }
  sum.steps_done = step_;
  sum.wall_s = std::chrono::duration<double>(clock::now() - t_start).count();
  sum.tokens_per_s = timed_steps ? double(tokens_per_step * timed_steps) / timed_s : 0;
  sum.checkpoint = last_checkpoint_;
  return sum;
}

}  // namespace adgt

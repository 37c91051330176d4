#include "parallel/engine/engine.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/model/init_weights.hpp"
#include "core/trace.hpp"
#include "kernels/check.hpp"
#include "parallel/cost/stages.hpp"
#include "parallel/cp/chunks.hpp"
#include "parallel/cp/support.hpp"
#include "parallel/cp/ring_context.hpp"
#include "parallel/cp/ulysses_context.hpp"
#include "parallel/dp/grad_norm.hpp"
#include "parallel/emulate/slowdown.hpp"
#include "parallel/pipeline/run_schedule.hpp"

namespace adgt {

namespace {
emulate::ComputeSlowdown g_no_slowdown;  // factor 1: every call returns at once
DType parse_dtype(const std::string& s) {
  return s == "f64" ? DType::F64 : (s == "bf16" || s == "fp8") ? DType::BF16 : DType::F32;
}
}  // namespace

Engine::Engine(const RunConfig& config, const ParallelContext& ctx, Backend& be, bool init)
    : cfg_(config), ctx_(ctx), be_(be) {
  layout_ = ctx.layout ? *ctx.layout : layout_of(config);
  cfg_.parallel = with_layout(config.parallel, layout_);
  const RunConfig& cfg = cfg_;
  if (const std::string why = context_parallel_unsupported(cfg); !why.empty())
    throw std::runtime_error("Engine: " + why);
  ADGT_CHECK(layout_.cp == 1 || be.name().rfind("cuda", 0) != 0,
             "Engine: parallel.cp=" << layout_.cp << " on " << be.name()
                                    << ": context parallelism does not run on CUDA yet "
                                       "(docs/context-parallel.md); use train.device: cpu or emulated");
  if (!ctx_.tp) ctx_.tp = &self_tp_;
  if (!ctx_.dp) ctx_.dp = &self_dp_;
  if (!ctx_.pp) ctx_.pp = &self_pp_;
  if (!ctx_.ep) ctx_.ep = &self_ep_;
  if (!ctx_.edp) ctx_.edp = ctx_.ep->size() > 1 ? &self_edp_ : ctx_.dp;
  if (!ctx_.world) ctx_.world = &self_world_;
  if (!ctx_.cp) ctx_.cp = &self_cp_;
  if (!ctx_.dpcp) ctx_.dpcp = ctx_.cp->size() > 1 ? &self_dpcp_ : ctx_.dp;
  if (!ctx_.edpcp && ctx_.cp->size() == 1) ctx_.edpcp = ctx_.edp;
  if (!ctx_.edpcp && ctx_.ep->size() == 1) ctx_.edpcp = ctx_.dpcp;
  ADGT_CHECK(ctx_.edpcp && ctx_.edpcp->size() * ctx_.ep->size() == ctx_.dpcp->size(),
             "Engine: the experts' replica group (edp x cp) is missing or does not match dp x cp="
                 << ctx_.dpcp->size() << " over ep=" << ctx_.ep->size());
  ADGT_CHECK(ctx_.cp->size() == layout_.cp && ctx_.dpcp->size() == layout_.cp * layout_.dp &&
                 ctx_.cp->rank() == ctx_.coords.cp,
             "Engine: the cp group (size " << ctx_.cp->size() << ", rank " << ctx_.cp->rank()
                                           << ") does not match parallel.cp=" << layout_.cp
                                           << " (cp rank " << ctx_.coords.cp << ")");
  ADGT_CHECK(ctx_.tp->size() == cfg.parallel.tp && ctx_.dp->size() == cfg.parallel.dp &&
                 ctx_.pp->size() == cfg.parallel.pp,
             "Trainer: process groups (tp " << ctx_.tp->size() << ", dp " << ctx_.dp->size()
                                            << ", pp " << ctx_.pp->size()
                                            << ") do not match parallel.tp=" << cfg.parallel.tp
                                            << ", parallel.dp=" << cfg.parallel.dp
                                            << ", parallel.pp=" << cfg.parallel.pp);
  const RankCoords& c = ctx_.coords;
  ADGT_CHECK(ctx_.tp->rank() == c.tp && ctx_.dp->rank() == c.dp && ctx_.pp->rank() == c.pp &&
                 (ctx_.ep->size() == 1 || ctx_.ep->rank() == c.ep),
             "Engine: this rank's group ranks (tp " << ctx_.tp->rank() << ", dp " << ctx_.dp->rank()
                                                    << ", pp " << ctx_.pp->rank()
                                                    << ") are not its layout coordinates (tp " << c.tp
                                                    << ", dp " << c.dp << ", pp " << c.pp << ")");
  overlap_ = cfg.parallel.overlap;
  slow_ = ctx_.slowdown ? ctx_.slowdown : &g_no_slowdown;
  TensorParallel tp;
  tp.comm = ctx_.tp;
  tp.sequence_parallel = cfg.parallel.sequence_parallel;
  tp.flat_multiple = 16 * (cfg.parallel.zero ? cfg.parallel.dp * cfg.parallel.cp : 1);
  const bool pipelined = ctx_.pp->size() > 1;
  const int pp = int(cfg.parallel.pp), v = int(cfg.parallel.virtual_stages);
  const StageSlice slice =
      stage_slice(stage_layer_counts(cfg), pp, v, pipelined ? ctx_.pp->rank() : 0,
                  placement_of_schedule(cfg.parallel.schedule));
  ExpertParallel ep;
  ep.comm = ctx_.ep;
  ep.aux_group = layout_.cp > 1 ? ctx_.cp : nullptr;  // the aux loss over whole sequences
  for (int64_t r : cfg.parallel.expert_placement) ep.placement.push_back(int(r));
  // Context parallelism: the model holds this rank's seq_len / cp tokens of
  // each sequence and runs its attention around the cp ring, or between two
  // all-to-alls (cp_mode all-to-all).
  if (layout_.cp > 1 && layout_.cp_mode == "all-to-all")
    context_ = std::make_unique<cp::UlyssesContextAttention>(be_, *ctx_.cp);
  else if (layout_.cp > 1)
    context_ = std::make_unique<cp::RingContextAttention>(be_, *ctx_.cp);
  model_ = std::make_unique<Model>(cfg.model, be_, parse_dtype(cfg.train.dtype), cfg.train.micro_batch,
                                   cfg.model.seq_len / layout_.cp, tp, &slice, ep,
                                   RecomputePolicy{parse_recompute(cfg.train.recompute),
                                                   cfg.train.recompute_layers},
                                   cfg.train.fused_projections, context_.get());
  model_->set_documents(int32_t(cfg.data.eos_id), cfg.train.document_mask,
                        cfg.model.rope_reset_per_document);
  // train.dtype fp8: the layers' GEMMs in FP8 (core/model/fp8_linear.hpp);
  // amaxes of tensors split over tp or cp are maxed over those groups.
  if (cfg.train.dtype == "fp8")
    ADGT_CHECK(be_.fp8_unsupported().empty(), "train.dtype: fp8: " << be_.fp8_unsupported());
  Fp8Options f8 = fp8_options(cfg.train);
  f8.allgather = cfg.parallel.fp8_allgather;
  // train.fp8_weight_cache (auto: ZeRO-3 freeing each unit's gathered
  // weights after use casts them at each use, no whole model of codes).
  f8.cache_weights = fp8_weight_cache_on(cfg);
  model_->enable_fp8(f8, ctx_.cp->size() > 1 ? ctx_.cp : nullptr);
  const int64_t zero_level = ctx_.dpcp->size() > 1 ? cfg.parallel.zero : 0;
  // ZeRO-2/3: the store takes the initial weights (below), and the model's
  // flat buffers are never made.
  if (init && zero_level < 2) model_->init_weights(cfg.train.seed);  // else the caller restores a state
  if (!cfg.parallel.expert_replicas.empty() || cfg.parallel.expert_slots > 0)
    set_expert_replicas(cfg.parallel.expert_replicas);
  // Gradients (and ZeRO-1's AdamW chunks) over the ranks holding the same
  // weights: dp, times cp under context parallelism; the experts' over edp
  // (times cp).
  const bool zero = zero_level == 1;
  Comm* edp = ctx_.ep->size() > 1 ? ctx_.edpcp : nullptr;
  if (zero_level >= 2) {
    // ZeRO-2/3: the store takes this rank's shard of the weights now and
    // holds the gradients (and weights) from here on (docs/zero.md).
    if (cfg.parallel.grad_compression != "off")
      throw ConfigError("parallel.grad_compression=" + cfg.parallel.grad_compression +
                        " with parallel.zero=" + std::to_string(zero_level) +
                        " is not supported yet (compression acts on the bucketed all-reduce and "
                        "ZeRO-1's reduce-scatter; docs/zero.md); use grad_compression: off or zero: 1");
    ZeroOptions zo;
    zo.level = int(zero_level);
    zo.prefetch = int(cfg.parallel.zero3_prefetch);
    zo.reshard_after_forward = cfg.parallel.zero3_reshard_after_forward;
    zo.pipelined = ctx_.pp->size() > 1;
    std::vector<float> initial;
    if (init) {  // the model's initial weights, drawn on the host as Model::init_weights does
      initial.resize(size_t(model_->flat_size()));
      draw_init_weights(model_->table(), cfg.model.init_std, cfg.train.seed, initial.data(),
                        model_->flat_size());
    }
    store_ = std::make_unique<ZeroStore>(*model_, be_, *ctx_.dpcp, zo, init ? initial.data() : nullptr,
                                         edp);  // expert weights over their replicas (edp x cp)
    store_->set_clock([s = slow_] { return s->now(); });
    model_->set_unit_storage(store_.get());
    store_->publish();
  }
  // Under ZeRO-2/3 the store reduces the gradients: the bucket reducer gets
  // a group of one (no buckets).
  reducer_ = std::make_unique<GradReducer>(*model_, store_ ? self_dp_ : *ctx_.dpcp,
                                           store_ ? nullptr : edp, zero, cfg.parallel.bucket_mb);
  reducer_->set_clock([s = slow_] { return s->now(); });  // the emulation's clock, else wall
  if (store_)
    opt_ = std::make_unique<ShardedAdamW>(be_, *model_, cfg.train, *store_);
  else
    opt_ = std::make_unique<ShardedAdamW>(be_, *model_, cfg.train, zero ? ctx_.dpcp : nullptr);
  if (pipelined) {
    pipe_ = std::make_unique<PipelineExecutor>(*model_, be_, *ctx_.pp, engine_schedule(cfg));
    pipe_->set_progress_comms(reducer_->comms());
    pipe_->set_slowdown(slow_);
  }
  // Replicas return their gradients once per step: without a pipeline in
  // the last micro-batch's backward (run_micro_batches knows it), in a
  // pipeline in each chunk's last backward (the executor sets it per
  // instruction).
  model_->defer_replica_grads(!pipelined);
  in_.assign(size_t(cfg.train.micro_batch * cfg.model.seq_len), 0);
  tg_.assign(in_.size(), -1);
  if (layout_.cp > 1) {
    in_local_.assign(in_.size() / size_t(layout_.cp), 0);
    tg_local_.assign(in_local_.size(), -1);
  }
}


Engine::~Engine() = default;

void Engine::move_experts(const std::vector<int64_t>& owner) {
  ADGT_CHECK(!opt_->sharded() && !store_, "move_experts: ZeRO shards the moments; experts need zero: 0");
  const int64_t E = cfg_.model.n_experts;
  Comm& ep = *ctx_.ep;
  const int P = ep.size(), me = ep.rank();
  const std::vector<int> was_t(layout_.expert_placement.begin(), layout_.expert_placement.end());
  const std::vector<int> new_t(owner.begin(), owner.end());
  const ExpertPlacement was(E, P, was_t), now(E, P, new_t);
  Model& m = *model_;
  const int L = m.num_moe_layers();
  const int64_t block = m.expert_block();
  // The buffers an expert lives in: the compute weights, the fp32 master
  // (mixed precision), the AdamW moments (whole: ZeRO-1 is not used with ep).
  std::vector<Tensor> bufs = {m.params()};
  if (m.mixed()) bufs.push_back(m.master());
  bufs.push_back(opt_->adamw().exp_avg());
  bufs.push_back(opt_->adamw().exp_avg_sq());
  // Send to d: the experts d will own that this rank owns now (ascending
  // id), each layer's block; receive from s the experts this rank will own
  // that s owns now, in the same order.
  std::vector<int64_t> sc(size_t(P), 0), sd(size_t(P), 0), rc(size_t(P), 0), rd(size_t(P), 0);
  int64_t ns = 0, nr = 0;
  for (int d = 0; d < P; ++d) {
    sd[size_t(d)] = ns, rd[size_t(d)] = nr;
    for (int64_t e : now.local_experts(d))
      if (was.owner(e) == me) sc[size_t(d)] += L * block;
    for (int64_t e : now.local_experts(me))
      if (was.owner(e) == d) rc[size_t(d)] += L * block;
    ns += sc[size_t(d)], nr += rc[size_t(d)];
  }
  for (const Tensor& b : bufs) {
    const DType dt = b.dtype;
    auto at = [&](const Tensor& t, int64_t off) {
      return Tensor(static_cast<char*>(t.data) + size_t(off) * dtype_size(dt), dt, {block});
    };
    Buffer send_b(be_, size_t(std::max<int64_t>(ns, 1)) * dtype_size(dt));
    Buffer recv_b(be_, size_t(std::max<int64_t>(nr, 1)) * dtype_size(dt));
    const Tensor send(send_b.data(), dt, {std::max<int64_t>(ns, 1)}),
        recv(recv_b.data(), dt, {std::max<int64_t>(nr, 1)});
    int64_t k = 0;
    for (int d = 0; d < P; ++d)
      for (int64_t e : now.local_experts(d)) {
        if (was.owner(e) != me) continue;
        for (int l = 0; l < L; ++l, k += block)
          be_.copy(at(send, k), at(b, m.expert_offset(l, size_t(was.local_index(e)))));
      }
    ep.all_to_allv(recv, rc, rd, send, sc, sd);
    k = 0;
    for (int s = 0; s < P; ++s)
      for (int64_t e : now.local_experts(me)) {
        if (was.owner(e) != s) continue;
        for (int l = 0; l < L; ++l, k += block)
          be_.copy(at(b, m.expert_offset(l, size_t(now.local_index(e)))), at(recv, k));
      }
  }
  if (m.has_moe()) m.set_expert_placement(new_t, &ep);
  layout_.expert_placement = owner;
  cfg_.parallel.expert_placement = owner;
  cfg_.parallel.expert_replicas.clear();
}

Tensor Engine::scratch_tensor(int64_t n, DType dt) {
  const size_t need = size_t(std::max<int64_t>(n, 1)) * dtype_size(dt);
  if (scratch_.bytes() < need) scratch_ = Buffer(be_, need);
  return Tensor(scratch_.data(), dt, {std::max<int64_t>(n, 1)});
}

void Engine::set_expert_replicas(const std::string& text) {
  RunConfig next = cfg_;
  next.parallel.expert_replicas = text;
  if (auto err = expert_replicas_error(next)) throw ConfigError(*err);
  const int64_t E = cfg_.model.n_experts, ep = ctx_.ep->size(), slots = cfg_.parallel.expert_slots;
  if (E <= 0) return;
  const std::vector<int> owner(layout_.expert_placement.begin(), layout_.expert_placement.end());
  const ExpertReplicas r =
      ExpertReplicas::parse(ExpertPlacement(E, int(ep), owner), text, int(slots > 0 ? slots : E / ep));
  if (model_->has_moe()) model_->set_expert_replicas(r);
  cfg_.parallel.expert_replicas = text;
}

double Engine::forward_backward(const MicroBatchFetch& fetch) {
  {
    trace::Span s("step setup", "compute");
    model_->zero_grads();
    if (Fp8Linears* f = model_->fp8()) {  // the weights were updated: cast again; delayed scales
      f->invalidate_weights();
      f->begin_step();
    }
    if (store_) store_->begin_step();
    model_->reset_moe_stats();
  }
  const double loss = pipelined() ? run_pipeline_step(fetch) : run_micro_batches(fetch);
  // Delayed scaling: the step's amaxes over the ranks holding the same layers.
  if (Fp8Linears* f = model_->fp8()) f->end_step({ctx_.tp, ctx_.dpcp});
  if (pipelined()) {
    trace::Span s("measure bubble", "pipeline");
    measure_bubble();
  } else {
    times_.bubble = times_.bubble_idle = -1.0;
    times_.held = -1;
  }
  return loss;
}

std::pair<const int32_t*, const int32_t*> Engine::local_batch(const int32_t* in, const int32_t* tg) {
  if (layout_.cp == 1) return {in, tg};
  const int64_t B = cfg_.train.micro_batch, T = cfg_.model.seq_len;
  const int r = ctx_.cp->rank(), P = ctx_.cp->size();
  cp::local_tokens(in, in_local_.data(), B, T, r, P);
  cp::local_tokens(tg, tg_local_.data(), B, T, r, P);
  return {in_local_.data(), tg_local_.data()};
}

double Engine::run_micro_batches(const MicroBatchFetch& fetch) {
  // D: the ranks whose losses make the step's mean (each a mean over its tokens).
  const int64_t A = cfg_.accum_steps(), D = ctx_.dpcp->size();
  model_->defer_losses(true);  // one host read of the losses per step
  // On the trace (log.trace) under the names a one-stage schedule's
  // instructions print (pp::to_string): what adgt-sim --trace names them.
  // Named only where a span is kept (log.trace) or a profiler range pushed (NVTX).
  const bool named = trace::recorder().on() || trace::recorder().ranges();
  auto name = [&](pp::Op op, int64_t a) {
    return named ? pp::to_string(pp::Instr{op, int(a), 0}) : std::string();
  };
  for (int64_t a = 0; a < A; ++a) {
    {
      trace::Span s(named ? "fetch " + std::to_string(a) : std::string(), "data");
      fetch(int(a), in_.data(), tg_.data());
    }
    const auto [in, tg] = local_batch(in_.data(), tg_.data());
    // Each forward and backward is a compute piece of the slowdown hook
    // (parallel/emulate/slowdown.hpp; inactive unless emulated).
    {
      trace::Span s(name(pp::Op::Forward, a), "compute");
      slow_->run([&] { model_->forward(in, tg, 1.0 / double(A * D)); });
    }
    trace::Span backward_span(name(pp::Op::Backward, a), "compute");
    const bool last = a + 1 == A;
    // The last micro-batch's backward starts each bucket's reduction as it completes it.
    // Under ZeRO-2/3 every micro-batch's gradients are final for the store,
    // which reduce-scatters each unit as the backward completes it (tp partial
    // sums finished per micro-batch: sums, the same up to rounding order).
    slow_->begin();
    model_->backward(slow_->wrap(last && overlap_ ? reducer_->ready_hook()
                                                  : std::function<void(int64_t, int64_t)>()),
                     last || store_ != nullptr);
    slow_->catch_up();
  }
  finish_dp_grads();
  const double loss_sum = model_->take_deferred_loss();
  model_->defer_losses(false);
  double total[1] = {loss_sum};
  ctx_.dpcp->all_reduce(Tensor(total, DType::F64, {1}));
  return total[0] / double(A * D);
}

double Engine::run_pipeline_step(const MicroBatchFetch& whole) {
  const int64_t A = cfg_.accum_steps(), D = ctx_.dpcp->size();
  // Under context parallelism the executor's micro-batches are this rank's
  // chunks of the sequences the trainer reads.
  const int64_t B = cfg_.train.micro_batch, T = cfg_.model.seq_len;
  MicroBatchFetch chunks = [&](int mb, int32_t* in, int32_t* tg) {
    whole(mb, in_.data(), tg_.data());
    cp::local_tokens(in_.data(), in, B, T, ctx_.cp->rank(), ctx_.cp->size());
    cp::local_tokens(tg_.data(), tg, B, T, ctx_.cp->rank(), ctx_.cp->size());
  };
  const MicroBatchFetch& fetch = layout_.cp > 1 ? chunks : whole;
  std::vector<char> reduced(size_t(model_->num_chunks()), 0);
  auto grads_final = [&](int c, bool fused_last) {
    // Partial sums over tp first (SP norms, MoE routers; a chunk's last fused
    // backward did them itself), then the chunk's buckets.
    if (!fused_last) model_->reduce_tp_partial_grads(c);
    reducer_->chunk_ready(c);
    if (store_) store_->chunk_done(c);
    reduced[size_t(c)] = 1;
  };
  GradHooks hooks;
  if (overlap_) {
    hooks.chunk = grads_final;
    hooks.unit = reducer_->ready_hook();
  }
  double loss[1] = {0};
  {
    trace::Span s("pipeline step", "pipeline");  // the executor's set-up and finish included
    loss[0] = pipe_->run_step(fetch, 1.0 / double(A * D), hooks);
  }
  {
    trace::Span s("remaining grad reductions", "pipeline");
    for (int c = 0; c < model_->num_chunks(); ++c)  // a schedule without ReduceGrads
      if (!reduced[size_t(c)]) grads_final(c, false);
  }
  finish_dp_grads();
  // The loss is known on the last stage; every rank logs and checks the same value.
  ctx_.pp->all_reduce(Tensor(loss, DType::F64, {1}));
  ctx_.dpcp->all_reduce(Tensor(loss, DType::F64, {1}));
  return loss[0] / double(A * D);
}

void Engine::finish_dp_grads() {
  {
    trace::Span s("dp wait", "wait");
    reducer_->finish_grad_sync();
  }
  times_.dp_wait_s = reducer_->last_wait_seconds();
  times_.dp_compressed_s = reducer_->last_compression().seconds;
  if (store_) {
    trace::Span s("zero grads wait", "wait");
    finish_zero_grads();
  }
}

void Engine::finish_zero_grads() {
  store_->finish_grads();
  const ZeroTimes& z = store_->last_times();
  times_.zero_gathers = z.gathers, times_.zero_reduces = z.reduces;
  times_.zero_gather_bytes = z.gather_bytes;
  times_.zero_gather_wait_s = z.gather_wait_s, times_.zero_reduce_wait_s = z.reduce_wait_s;
  times_.dp_wait_s = z.gather_wait_s + z.reduce_wait_s;  // the exposed part
}

void Engine::measure_bubble() {
  // 1 - sum of busy time / (pp x the slowest rank's step time), over the
  // pipeline group. Of it, idle: the receives' waits and each rank's time
  // after its last instruction until the slowest rank's; the rest is the
  // ranks' own work between instructions (copies for sends, bookkeeping).
  // (not measured where a rank's receives do not block its host: -1).
  const double own_span = pipe_->last_step_seconds(), wait = pipe_->last_wait_seconds();
  double sums[3] = {pipe_->last_busy_seconds(), wait - own_span, wait < 0 ? 1.0 : 0.0};
  double span[2] = {own_span, double(pipe_->last_peak_held())};
  ctx_.pp->all_reduce(Tensor(sums, DType::F64, {3}));
  ctx_.pp->all_reduce(Tensor(span, DType::F64, {2}), ReduceOp::Max);
  times_.held = int64_t(span[1]);
  const double P = double(ctx_.pp->size());
  times_.bubble = span[0] > 0 ? 1.0 - sums[0] / (P * span[0]) : 0.0;
  times_.bubble_idle =
      sums[2] > 0 ? -1.0
      : span[0] > 0 ? std::clamp((sums[1] + P * span[0]) / (P * span[0]), 0.0, 1.0)
                    : 0.0;
}

double Engine::grad_norm() {
  GradNormGroups g;
  g.tp = ctx_.tp;
  g.chunks = opt_->sharded() ? ctx_.dpcp : nullptr;
  g.ep = ctx_.ep->size() > 1 ? ctx_.ep : nullptr;
  g.pp = ctx_.pp;
  if (store_) {  // the shard's pieces: disjoint over the sharding group (experts': their replicas)
    g.chunks = ctx_.dpcp;
    g.expert_chunks = store_->expert_group();
    const Tensor gs = store_->grad_shard();
    return global_grad_norm(be_, store_->shards().table, gs, 0, gs.numel(), g);
  }
  return global_grad_norm(be_, model_->table(), model_->grads(), opt_->lo(), opt_->hi(), g);
}

void Engine::apply_update(double lr, int64_t opt_step, double clip_coef) {
  slow_->run([&] {
    opt_->step(lr, opt_step, clip_coef);
    if (cfg_.model.moe_aux_free) model_->update_moe_bias(ctx_.edpcp);
  });
  model_->sync_expert_replicas();  // the shadows take the owners' new weights
}

double Engine::eval_loss(const int32_t* inputs, const int32_t* targets) {
  if (Fp8Linears* f = model_->fp8()) f->invalidate_weights();  // updated since the step's cast
  const auto [in, tg] = local_batch(inputs, targets);  // this rank's chunks under cp
  double l[1];
  if (!pipelined()) {
    l[0] = model_->forward(in, tg, 0.0);
  } else {
    l[0] = pipe_->forward_only(in, tg);  // known on the last stage
    ctx_.pp->all_reduce(Tensor(l, DType::F64, {1}));
  }
  if (layout_.cp > 1) {  // the mean of the cp ranks' means: each holds as many of every row's tokens
    ctx_.cp->all_reduce(Tensor(l, DType::F64, {1}));
    l[0] /= double(ctx_.cp->size());
  }
  return l[0];
}

ShardLayout Engine::shard_layout() const { return shard_layout_of(layout_, ctx_.coords); }

void Engine::fill_checkpoint(CheckpointState& st, ShardLayout& lay) {
  // Every rank writes its own pieces; under ZeRO-1 each dp rank writes the
  // AdamW state of its own chunk, so nothing is gathered.
  // Into st's buffers: a recycled staging state (checkpoint.async) is reused
  // in place, without touching fresh memory.
  st.specs = model_->table();
  if (store_) {
    // ZeRO-2/3: gathered over the sharding group into the whole local
    // buffers (a collective; the saved tensors are ZeRO 0's).
    store_->shard_to_flat_host(store_->master_shard(), st.params);
    opt_->full_exp_avg(st.exp_avg);
    opt_->full_exp_avg_sq(st.exp_avg_sq);
    return;
  }
  model_->params_to_host(st.params);
  if (opt_->sharded()) {
    AdamW& opt = opt_->adamw();
    opt.to_host(opt.exp_avg(), st.exp_avg);
    opt.to_host(opt.exp_avg_sq(), st.exp_avg_sq);
    lay.state_lo = opt.lo();
    lay.state_hi = opt.hi();
  } else {
    opt_->full_exp_avg(st.exp_avg);
    opt_->full_exp_avg_sq(st.exp_avg_sq);
  }
}

void Engine::restore_checkpoint(CheckpointState& st) {
  const auto n = size_t(model_->flat_size());
  for (auto* v : {&st.params, &st.exp_avg, &st.exp_avg_sq}) v->resize(n, 0.0f);
  if (store_)
    store_->load_weights(st.params.data(), st.params.size());
  else
    model_->params_from_host(st.params);
  opt_->load_state(st.exp_avg, st.exp_avg_sq);
  model_->sync_expert_replicas();
}

}  // namespace adgt

#include "parallel/metrics/step_logger.hpp"

#include <cmath>
#include <cstdio>

#include "parallel/cost/memory.hpp"

namespace adgt {

StepLogger::StepLogger(const RunConfig& cfg, Backend& be, MetricsLog* log, double peak_tflops,
                       bool measured_peak, std::shared_ptr<TelemetrySampler> telemetry)
    : cfg_(cfg), be_(be), log_(log), peak_(peak_tflops), measured_peak_(measured_peak),
      flops_per_token_(estimate_memory(cfg, compute_bytes_per_element(cfg)).flops_per_token),
      telemetry_(std::move(telemetry)) {}

RunEnergy StepLogger::finish_telemetry(Comm& world) const {
  if (cfg_.log.telemetry_interval_s <= 0) return {};
  TelemetryTotals mine;
  if (telemetry_) {
    telemetry_->stop();
    mine = telemetry_->totals();
  }
  return reduce_run_energy(mine, double(steps_seen_) * double(cfg_.train.global_batch * cfg_.model.seq_len),
                           world);
}

void StepLogger::observe(Engine& e, const StepReport& r, Comm& world) {
  ++steps_seen_;
  if (r.step > r.first_step + 1) {  // the first step warms caches and thread pools
    timed_s_ += r.seconds;
    ++timed_steps_;
  }
  if (r.applied) {
    interval_loss_ += r.loss;
    ++interval_n_;
  }
  if (r.step % cfg_.log.interval != 0 && r.step != r.total_steps) return;
  const ParallelContext& g = e.groups();
  // The data-parallel reduction each rank waited for after its step's work,
  // its compressed buckets' reduce included (on the step's path too): mean and
  // maximum over the world (collective: every rank logs at the same steps).
  const double dp_exposed = e.last_times().dp_wait_s + e.last_times().dp_compressed_s;
  double dp_wait[3] = {dp_exposed, dp_exposed, e.last_times().dp_compressed_s};
  if (g.dpcp->size() > 1) {
    // Sums of the exposed time and of its compressed part in one call.
    double sums[2] = {dp_wait[0], dp_wait[2]};
    world.all_reduce(Tensor(sums, DType::F64, {2}));
    world.all_reduce(Tensor(dp_wait + 1, DType::F64, {1}), ReduceOp::Max);
    dp_wait[0] = sums[0] / double(world.size());
    dp_wait[2] = sums[1] / double(world.size());
  }
  // The interval's telemetry (taken without waiting for a reading; reduced
  // on every rank, a rank without a sampler adding nothing).
  std::vector<TelemetryStat> telemetry;
  if (cfg_.log.telemetry_interval_s > 0)
    telemetry = reduce_telemetry(telemetry_ ? telemetry_->take() : TelemetryInterval{}, world);
  // MoE loads and drops: each rank's are its ep group's tokens (the same on
  // every member), summed over the ranks holding the same experts for the
  // other tokens of the batch (edp x cp), so the record counts the whole
  // batch as the single process does, in any layout.
  std::vector<MoeLayerStep> moe = e.model().moe_stats();
  if (!moe.empty() && g.edpcp && g.edpcp->size() > 1) {
    std::vector<double> counts;
    for (const MoeLayerStep& x : moe) {
      counts.insert(counts.end(), x.load.begin(), x.load.end());
      counts.push_back(double(x.tokens));
      counts.push_back(double(x.dropped));
    }
    g.edpcp->all_reduce(Tensor(counts.data(), DType::F64, {int64_t(counts.size())}));
    size_t i = 0;
    for (MoeLayerStep& x : moe) {
      for (int64_t& l : x.load) l = std::llround(counts[i++]);
      x.tokens = std::llround(counts[i++]);
      x.dropped = std::llround(counts[i++]);
    }
  }
  if (!log_) return;
  StepMetrics m;
  m.telemetry = std::move(telemetry);
  m.world = g.tp->size() * g.dpcp->size() * g.pp->size();  // dp x cp
  m.tp_bytes = r.tp_bytes;
  m.dp_bytes = r.dp_bytes;
  m.pp_bytes = r.pp_bytes;
  for (const MoeLayerStep& x : moe) {
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
  m.bubble = e.last_times().bubble;
  m.bubble_idle = e.last_times().bubble_idle;
  m.held = e.last_times().held;
  if (e.reducer().level_mix() != "off") {  // gradient compression (docs/compression.md)
    m.grad_compression = e.reducer().level_mix();
    m.gc_sent_bytes = e.reducer().last_compression().sent_bytes;
    m.gc_fp32_bytes = e.reducer().last_compression().fp32_bytes;
    if (g.dpcp->size() > 1) m.gc_seconds = dp_wait[2];
  }
  if (const ZeroStore* z = e.zero_store()) {
    const StepTimes& t = e.last_times();
    m.zero_level = z->level();
    m.zero_gathers = t.zero_gathers, m.zero_reduces = t.zero_reduces;
    m.zero_gather_bytes = t.zero_gather_bytes;
    m.zero_gather_wait_s = t.zero_gather_wait_s, m.zero_reduce_wait_s = t.zero_reduce_wait_s;
  }
  m.dp_wait_s = g.dpcp->size() > 1 ? dp_wait[0] : -1.0;
  m.dp_wait_max_s = g.dpcp->size() > 1 ? dp_wait[1] : -1.0;
  m.tp_wait_s = g.tp->size() > 1 ? r.tp_seconds : -1.0;
  m.pp_wait_s = g.pp->size() > 1 ? r.pp_seconds : -1.0;
  m.ep_wait_s = g.ep->size() > 1 ? r.ep_seconds : -1.0;
  m.cp_wait_s = g.cp->size() > 1 ? r.cp_seconds : -1.0;
  m.cp_bytes = g.cp->size() > 1 ? r.cp_bytes : -1;
  m.host_reads = r.host_reads;
  m.source_tokens = r.source_tokens;
  m.step = r.step;
  m.total_steps = r.total_steps;
  m.loss = interval_n_ ? interval_loss_ / double(interval_n_) : r.loss;
  m.lr = r.lr;
  m.grad_norm = r.grad_norm;
  m.tokens_per_s = double(cfg_.train.global_batch * cfg_.model.seq_len) / r.seconds;
  m.tflops = m.tokens_per_s * flops_per_token_ / 1e12 / double(m.world);  // per rank
  if (measured_peak_ && peak_ > 0 && m.tflops > peak_)  // the start-up figure read low
    peak_ = be_.remeasure_peak_tflops();
  m.peak_tflops = peak_;
  m.mfu = peak_ > 0 ? m.tflops / peak_ : -1;
  m.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double per_step = timed_steps_ ? mean_step_seconds() : r.seconds;
  m.eta_s = per_step * double(r.total_steps - r.step);
  m.skipped_steps = r.skipped_steps;
  std::printf("%s\n", format_step_line(m).c_str());
  std::fflush(stdout);
  log_->log_step(m);
  final_loss_ = m.loss;
  interval_loss_ = 0;
  interval_n_ = 0;
}

}  // namespace adgt

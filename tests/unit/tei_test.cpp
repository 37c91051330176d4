// The Training Efficiency Index's accounting (parallel/metrics/tei.hpp, docs/tei.md)
// against hand-computed cases: one clean run, a crash with lost work and a
// restart gap, a resume from an older checkpoint, skipped steps, the
// recompute estimate, runs with different peaks; the recompute FLOPs against
// the formulas written out; the metrics.jsonl records read back.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "core/comm.hpp"
#include "core/config.hpp"
#include "core/metrics.hpp"
#include "parallel/metrics/tei.hpp"
#include "parallel/metrics/tei_meter.hpp"

using namespace adgt;

namespace {
TeiSnapshot snap(int64_t step, bool ckpt, TeiCounters c) { return {step, ckpt, c}; }

TeiCounters counters(int64_t steps, double wall, double startup, double step_s, double comm,
                     double bubble, double opt, double ckpt, double eval, double model_flops) {
  TeiCounters c;
  c.steps = steps;
  c.wall_s = wall;
  c.startup_s = startup;
  c.step_s = step_s;
  c.comm_s = comm;
  c.bubble_s = bubble;
  c.optimizer_s = opt;
  c.checkpoint_s = ckpt;
  c.eval_s = eval;
  c.model_flops = model_flops;
  return c;
}
}  // namespace

TEST_CASE("one clean run: every category is its share of the device-seconds", "[tei]") {
  TeiRun r;
  r.devices = 2;
  r.peak_flops = 1e9;
  // 100 device-seconds: 10 start-up, 70 in steps (5 comm, 3 bubble, 2 optimizer,
  // so 60 compute of which 2e10 FLOPs at 1e9 FLOP/s = 20 useful), 4 saves, 6 eval.
  r.snapshots = {snap(10, false, counters(10, 100, 10, 70, 5, 3, 2, 4, 6, 2e10))};
  const TeiBreakdown b = tei_account({r});
  REQUIRE(b.valid);
  CHECK(b.tei == Approx(0.20));
  CHECK(b.useful == Approx(0.20));
  CHECK(b.below_peak == Approx(0.40));
  CHECK(b.recompute == Approx(0.0).margin(1e-15));
  CHECK(b.comm == Approx(0.05));
  CHECK(b.bubble == Approx(0.03));
  CHECK(b.optimizer == Approx(0.02));
  CHECK(b.checkpoint == Approx(0.04));
  CHECK(b.eval == Approx(0.06));
  CHECK(b.startup == Approx(0.10));
  CHECK(b.lost == Approx(0.0).margin(1e-15));
  CHECK(b.other == Approx(0.10));
  CHECK(b.sum() == Approx(1.0));
  CHECK(b.wall_s == Approx(50));  // 100 device-seconds on 2 devices
  CHECK(b.device_s == Approx(100));
  CHECK(b.counted_steps == 10);
  CHECK(b.lost_steps == 0);
  CHECK(b.runs == 1);
}

TEST_CASE("a crash after a checkpoint: the work after it is lost, the restart gap apart", "[tei]") {
  TeiRun a;  // fresh; checkpoint at step 5 (30 s), crashed after step 8 (last record at 45 s)
  a.id = 1;
  a.peak_flops = 1e9;
  a.start_unix = 1000;
  a.snapshots = {snap(5, true, counters(5, 30, 5, 20, 2, 0, 1, 3, 0, 5e9)),
                 snap(8, false, counters(8, 45, 5, 32, 3, 0, 2, 3, 0, 8e9))};
  TeiRun b;  // resumed from step 5, 15 s after a's last record; ran to step 10
  b.id = 2;
  b.resumed_from = 5;
  b.peak_flops = 1e9;
  b.start_unix = 1000 + 45 + 15;
  b.snapshots = {snap(10, false, counters(5, 40, 8, 25, 2, 0, 1, 4, 0, 5e9))};
  const TeiBreakdown t = tei_account({a, b});
  REQUIRE(t.valid);
  // Run a's kept point is its step-5 checkpoint: useful 5, compute 20-2-1 = 17
  // (12 below peak), comm 2, optimizer 1, saves 3, start-up 5, other
  // 30-(5+20+3) = 2, lost 45-30 = 15. Run b: useful 5, compute 25-2-1 = 22
  // (17 below peak), comm 2, optimizer 1, saves 4, start-up 8, other 40-(8+25+4) = 3.
  const double C = 85;
  CHECK(t.tei == Approx(10 / C));
  CHECK(t.below_peak == Approx(29 / C));
  CHECK(t.comm == Approx(4 / C));
  CHECK(t.optimizer == Approx(2 / C));
  CHECK(t.checkpoint == Approx(7 / C));
  CHECK(t.startup == Approx(13 / C));
  CHECK(t.lost == Approx(15 / C));
  CHECK(t.other == Approx(5 / C));
  CHECK(t.sum() == Approx(1.0));
  CHECK(t.counted_steps == 10);
  CHECK(t.lost_steps == 3);  // steps 6, 7, 8 were redone
  CHECK(t.gap_s == Approx(15));
  CHECK(t.wall_s == Approx(85));
  CHECK(t.counted_flops == Approx(1e10));
  CHECK(t.capacity_flops == Approx(85e9));
}

TEST_CASE("a resume from an older checkpoint loses the later runs' work back to it", "[tei]") {
  TeiRun a;  // checkpoints at 4 and 8, last record at 10
  a.peak_flops = 1e9;
  a.snapshots = {snap(4, true, counters(4, 20, 2, 16, 0, 0, 0, 2, 0, 4e9)),
                 snap(8, true, counters(8, 38, 2, 32, 0, 0, 0, 4, 0, 8e9)),
                 snap(10, false, counters(10, 46, 2, 40, 0, 0, 0, 4, 0, 1e10))};
  TeiRun b;  // from 8, died at 12 without a checkpoint
  b.resumed_from = 8;
  b.peak_flops = 1e9;
  b.snapshots = {snap(12, false, counters(4, 20, 3, 16, 0, 0, 0, 0, 0, 4e9))};
  TeiRun c;  // from 4 (older), to 6
  c.resumed_from = 4;
  c.peak_flops = 1e9;
  c.snapshots = {snap(6, false, counters(2, 10, 2, 8, 0, 0, 0, 0, 0, 2e9))};
  const TeiBreakdown t = tei_account({a, b, c});
  REQUIRE(t.valid);
  // a keeps its step-4 checkpoint (cutoff min(8, 4) = 4): useful 4, 12 below
  // peak, saves 2, start-up 2, lost 46-20 = 26. b keeps only its start-up (3),
  // lost 20-3 = 17. c: useful 2, 6 below peak, start-up 2.
  const double C = 76;
  CHECK(t.tei == Approx(6 / C));
  CHECK(t.below_peak == Approx(18 / C));
  CHECK(t.startup == Approx(7 / C));
  CHECK(t.checkpoint == Approx(2 / C));
  CHECK(t.lost == Approx(43 / C));
  CHECK(t.other == Approx(0.0).margin(1e-12));
  CHECK(t.sum() == Approx(1.0));
  CHECK(t.counted_steps == 6);
  CHECK(t.lost_steps == 6 + 4);
}

TEST_CASE("skipped steps are lost work; recompute is the estimated share of compute", "[tei]") {
  TeiRun r;
  r.peak_flops = 1e9;
  TeiCounters c = counters(10, 20, 2, 8, 0, 0, 0, 0, 0, 3e9);
  c.skipped_steps = 2;
  c.skipped_s = 4;
  c.recompute_flops = 1e9;  // compute 8 s: 8 x 1/(3+1) = 2 s recompute, 3 s useful, 3 below peak
  r.snapshots = {snap(10, false, c)};
  const TeiBreakdown t = tei_account({r});
  REQUIRE(t.valid);
  CHECK(t.useful == Approx(3 / 20.0));
  CHECK(t.recompute == Approx(2 / 20.0));
  CHECK(t.below_peak == Approx(3 / 20.0));
  CHECK(t.lost == Approx(4 / 20.0));
  CHECK(t.startup == Approx(2 / 20.0));
  CHECK(t.other == Approx(6 / 20.0));
  CHECK(t.counted_steps == 8);
  CHECK(t.lost_steps == 2);
}

TEST_CASE("runs with different peaks and device counts add up in peak FLOPs", "[tei]") {
  TeiRun a, b;
  a.peak_flops = 1e9;
  a.devices = 1;
  a.snapshots = {snap(2, true, counters(2, 10, 1, 9, 0, 0, 0, 0, 0, 2e9))};
  b.peak_flops = 2e9;
  b.devices = 2;
  b.resumed_from = 2;
  b.snapshots = {snap(4, false, counters(2, 10, 1, 9, 0, 0, 0, 0, 0, 4e9))};
  const TeiBreakdown t = tei_account({a, b});
  REQUIRE(t.valid);
  CHECK(t.tei == Approx(6e9 / (1e10 + 2e10)));
  CHECK(t.sum() == Approx(1.0));
  CHECK(t.wall_s == Approx(10 + 5));
}

TEST_CASE("no peak or no record: no TEI", "[tei]") {
  CHECK_FALSE(tei_account({}).valid);
  TeiRun r;
  CHECK_FALSE(tei_account({r}).valid);  // died before its first record
  r.snapshots = {snap(1, false, counters(1, 1, 1, 0, 0, 0, 0, 0, 0, 1))};
  CHECK_FALSE(tei_account({r}).valid);  // peak unknown
  CHECK(format_tei(tei_account({r})).empty());
}

TEST_CASE("recompute FLOPs per token follow the flops.hpp formulas", "[tei]") {
  // C 64, H 4, KV 2, hd 16, F 160, T 64, L 2. Per layer and token: the
  // projections 2(2*64*4*16 + 2*64*2*16) = 24576, the attention core (no
  // causal discount, as MFU counts it) 4*16*4*64 = 16384, the FFN 6*64*160 = 61440.
  const std::vector<std::string> small = {
      "model.d_model=64",     "model.n_layers=2",   "model.n_heads=4", "model.n_kv_heads=2",
      "model.ffn_hidden=160", "model.seq_len=64",   "model.vocab_size=256"};
  auto cfg = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), small.begin(), small.end());
    return load_config(ADGT_SOURCE_DIR "/configs/tiny.yaml", extra);
  };
  CHECK(recompute_flops_per_token(cfg({})) == 0);
  CHECK(recompute_flops_per_token(cfg({"train.recompute=selective"})) == Approx(2 * 16384.0));
  CHECK(recompute_flops_per_token(cfg({"train.recompute=full"})) == Approx(2 * 102400.0));
  CHECK(recompute_flops_per_token(cfg({"train.recompute=full", "train.recompute_layers=1"})) ==
        Approx(102400.0));
}

TEST_CASE("the meter's records read back: checkpoints and the last snapshot", "[tei]") {
  const std::string dir = ADGT_BINARY_DIR "/tei_test_log";
  std::filesystem::remove_all(dir);
  const RunConfig cfg = load_config(ADGT_SOURCE_DIR "/configs/tiny.yaml");
  SelfComm world("world");
  {
    MetricsLog log(dir, false);
    TeiMeter m(cfg, 1, &log, {}, 0, 1.0);
    TeiStepTimes st;
    st.seconds = 0.01;
    for (int64_t s = 1; s <= 4; ++s) {
      m.start_step();
      m.add_step(st, s != 3);
      m.record(world, TeiMeter::At::Interval, s, 1.0);
      if (s == 2) {
        m.add_checkpoint(0.005);
        m.record(world, TeiMeter::At::Checkpoint, s, 1.0);
      }
    }
    const TeiBreakdown b = m.record(world, TeiMeter::At::End, 4, 1.0);
    REQUIRE(b.valid);
    CHECK(b.counted_steps == 3);
    CHECK(b.lost_steps == 1);  // the skipped step 3
    CHECK(b.sum() == Approx(1.0));
  }
  const std::string path = dir + "/metrics.jsonl";
  std::ofstream(path, std::ios::app) << "{\"event\": \"tei\", \"at\": \"interv";  // torn
  end_torn_line(path);
  {
    std::ifstream in(path, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(all.back() == '\n');
  }
  const std::vector<TeiRun> runs = read_tei_runs(path);
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].id == 1);
  CHECK(runs[0].peak_flops == Approx(1e12));
  REQUIRE(runs[0].snapshots.size() == 2);  // the step-2 checkpoint and the end
  CHECK(runs[0].snapshots[0].checkpoint);
  CHECK(runs[0].snapshots[0].step == 2);
  CHECK(runs[0].snapshots[0].c.steps == 2);
  CHECK(runs[0].snapshots[1].step == 4);
  CHECK(runs[0].snapshots[1].c.steps == 4);
  CHECK(runs[0].snapshots[1].c.skipped_steps == 1);
  CHECK(runs[0].snapshots[1].c.checkpoint_s == Approx(0.005));
  std::filesystem::remove_all(dir);
}

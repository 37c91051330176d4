// The ranks' telemetry together (docs/telemetry.md): a log interval's fields
// for the step record, and the run's energy per token and throttled share for
// the end-of-run summary and the TEI's end record. Both collective over the
// world; a rank without a source takes part with nothing measured, and a
// field no rank measured stays absent.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/comm.hpp"
#include "core/metrics.hpp"
#include "parallel/metrics/telemetry.hpp"

namespace adgt {

// Per-sample fields: min, max and mean over every sample of every rank.
// Per-rank fields (energy_j: each rank's energy of the interval, with the
// total; the throttled shares: each rank's throttled seconds over the seconds
// its readings covered): min, mean, max over the ranks that measured them.
std::vector<TelemetryStat> reduce_telemetry(const TelemetryInterval& mine, Comm& world);

struct RunEnergy {
  int energy_ranks = 0;    // ranks that read an energy counter (0: energy absent)
  double energy_j = 0;     // their energy over the run, summed, J
  double tokens = 0;       // tokens the run's steps trained (global_batch x seq_len each)
  int throttle_ranks = 0;  // ranks that read throttle reasons (0: throttling absent)
  double observed_s = 0;   // seconds their readings covered, summed over them
  double throttled_s = 0;  // of it, with any reason set
  bool has_energy() const { return energy_ranks > 0 && tokens > 0; }
  double j_per_token() const { return energy_j / tokens; }
  bool has_throttle() const { return throttle_ranks > 0 && observed_s > 0; }
  double throttled_share() const { return throttled_s / observed_s; }
};

RunEnergy reduce_run_energy(const TelemetryTotals& mine, double tokens, Comm& world);

// The summary's lines (each ending in '\n'); "" when nothing was measured.
std::string format_run_energy(const RunEnergy& e);
// {"energy_j", "tokens", "j_per_token", "ranks"} and {"throttled_share",
// "throttle_ranks"} where measured; an empty object when nothing was.
nlohmann::json run_energy_json(const RunEnergy& e);

}  // namespace adgt

#include "parallel/cluster/power.hpp"

#include <algorithm>
#include <cmath>

namespace adgt::cluster {

double capped_clock(const PowerModel& p, double dyn_w) {
  if (!p.on() || dyn_w <= 0) return 1.0;
  const double room = p.cap() - p.idle_w;
  if (room >= dyn_w) return 1.0;
  if (room <= 0) return 1e-3;  // a cap at or below idle: as slow as the model goes
  return std::max(1e-3, std::pow(room / dyn_w, 1.0 / p.clock_exponent));
}

double dynamic_joules(const PowerModel& p, double flops, int bytes_per_element, double bytes_moved,
                      double clock) {
  const double pj = bytes_per_element == 1   ? p.pj_per_flop_fp8
                    : bytes_per_element == 2 ? p.pj_per_flop_bf16
                                             : p.pj_per_flop_fp32;
  // The FLOPs' energy follows the clock (voltage); HBM's does not.
  return 1e-12 * (pj * flops * std::pow(clock, p.clock_exponent - 1) + p.pj_per_byte * bytes_moved);
}

}  // namespace adgt::cluster

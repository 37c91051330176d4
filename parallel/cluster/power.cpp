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

namespace {

double seg_seconds(const PowerSegment& s, double c) {
  return std::max(s.compute_s / c, s.memory_s) + s.overhead_s;
}

}  // namespace

LimiterStep limiter_walk(const PowerModel& p, const std::vector<PowerSegment>& step) {
  LimiterStep r;
  for (const PowerSegment& s : step) r.free_s += seg_seconds(s, 1.0), r.free_dyn_j += s.flop_j + s.byte_j;
  r.capped_s = r.free_s, r.capped_dyn_j = r.free_dyn_j;
  if (!p.on() || !p.limiter() || r.free_s <= 0) return r;
  const double tau = p.limiter_window_s, cap = p.cap(), k = p.clock_exponent;
  // A hold of 0 would chatter at the cap in zero time: a thousandth of the window.
  const double hold = std::max(p.limiter_hold_s, 1e-3 * tau);
  const double brake = std::clamp(p.limiter_brake_clock, 1e-3, 1.0);
  // Event by event (a kernel's power is constant, so the average between
  // events is exact): the average crossing the cap upwards trips the brake,
  // its falling back to the cap starts the hold, the hold's end releases it.
  // Enough steps for the average to forget its start many times over; the
  // later half is measured.
  const double most = double(std::max<int64_t>(8, 2000000 / int64_t(step.size() + 1)));  // kernels walked
  const int64_t reps = int64_t(std::clamp(std::ceil(60.0 * (tau + hold) / r.free_s), 8.0, most));
  double avg = p.idle_w + r.free_dyn_j / r.free_s;  // start at the free step's mean power
  bool above = avg > cap, braked = above;
  double held = 0;  // the hold left, while braked below the cap
  double t_sum = 0, e_sum = 0, b_sum = 0;
  const int64_t measured_from = reps / 2;
  for (int64_t rep = 0; rep < reps; ++rep) {
    double t_rep = 0, e_rep = 0, b_rep = 0;
    for (const PowerSegment& s : step) {
      double left = 1.0;  // the share of this kernel still to run
      while (left > 0) {
        const double c = braked ? brake : 1.0;
        const double T = seg_seconds(s, c);
        if (T <= 0) break;
        const double dyn_w = (s.flop_j * std::pow(c, k - 1) + s.byte_j) / T;
        const double w = p.idle_w + dyn_w;
        double dt = left * T;
        enum { kNone, kUp, kDown, kRelease } ev = kNone;
        if (above) {
          if (w < cap) {
            const double t = tau * std::log((avg - w) / (cap - w));
            if (t < dt) dt = std::max(0.0, t), ev = kDown;
          }
        } else {
          if (w > cap) {
            const double t = tau * std::log((w - avg) / (w - cap));
            if (t < dt) dt = std::max(0.0, t), ev = kUp;
          }
          if (braked && held < dt) dt = held, ev = kRelease;
        }
        avg = (ev == kUp || ev == kDown) ? cap : w + (avg - w) * std::exp(-dt / tau);
        t_rep += dt, e_rep += dyn_w * dt;
        if (braked) b_rep += dt;
        left = ev == kNone ? 0.0 : left - dt / T;
        if (!above && braked && ev != kRelease) held -= dt;
        if (ev == kUp) above = true, braked = true;
        if (ev == kDown) above = false, held = hold;
        if (ev == kRelease) braked = false, held = 0;
      }
    }
    if (rep >= measured_from) t_sum += t_rep, e_sum += e_rep, b_sum += b_rep;
  }
  if (b_sum == 0) return r;  // never braked: the free step (not its sum piece by piece)
  const double n = double(reps - measured_from);
  r.capped_s = t_sum / n, r.capped_dyn_j = e_sum / n;
  r.braked_share = t_sum > 0 ? b_sum / t_sum : 0;
  return r;
}

}  // namespace adgt::cluster

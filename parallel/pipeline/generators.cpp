#include "parallel/pipeline/generators.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "parallel/pipeline/timeline.hpp"
#include "parallel/pipeline/validate.hpp"

namespace adgt::pp {
namespace {

using Order = std::vector<std::vector<ComputeStep>>;

std::string num(long long v) { return std::to_string(v); }

std::string join(const std::vector<long long>& xs, const char* sep = ",") {
  std::string s;
  for (size_t i = 0; i < xs.size(); ++i) s += (i ? sep : "") + num(xs[i]);
  return s;
}

std::vector<long long> divisors(long long n) {
  std::vector<long long> d;
  for (long long i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// The display name of a schedule in error messages.
std::string title(const std::string& name) {
  if (name == "gpipe") return "GPipe";
  if (name == "1f1b") return "1F1B";
  if (name == "interleaved") return "the interleaved schedule";
  if (name == "zb-h1") return "ZB-H1";
  return name;
}

// ---- the hand-written orders (arguments already checked) ----

Order gpipe_order(int pp, int m) {
  Order o(static_cast<size_t>(pp));
  for (auto& r : o) {
    for (int k = 0; k < m; ++k) r.push_back({Op::Forward, k, 0});
    for (int k = 0; k < m; ++k) r.push_back({Op::Backward, k, 0});
  }
  return o;
}

Order one_f_one_b_order(int pp, int m) {
  Order o(static_cast<size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    auto& out = o[static_cast<size_t>(r)];
    const int warm = std::min(pp - r - 1, m);
    for (int k = 0; k < warm; ++k) out.push_back({Op::Forward, k, 0});
    for (int i = 0; i < m - warm; ++i) {
      out.push_back({Op::Forward, warm + i, 0});
      out.push_back({Op::Backward, i, 0});
    }
    for (int k = m - warm; k < m; ++k) out.push_back({Op::Backward, k, 0});
  }
  return o;
}

Order zb_h1_order(int pp, int m) {
  Order o(static_cast<size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    auto& out = o[static_cast<size_t>(r)];
    const int warm = std::min(pp - r - 1, m);
    int next_w = 0;
    // After the k-th BackwardInput (k = 0, 1, ...), the oldest pending W when k >= r.
    auto backward = [&](int k) {
      out.push_back({Op::BackwardInput, k, 0});
      if (k >= r) out.push_back({Op::BackwardWeight, next_w++, 0});
    };
    for (int k = 0; k < warm; ++k) out.push_back({Op::Forward, k, 0});
    for (int i = 0; i < m - warm; ++i) {
      out.push_back({Op::Forward, warm + i, 0});
      backward(i);
    }
    for (int k = m - warm; k < m; ++k) backward(k);
    while (next_w < m) out.push_back({Op::BackwardWeight, next_w++, 0});
  }
  return o;
}

// extra_warm[r] (when given): forwards rank r runs in its warm-up beyond
// Megatron's count (more held, less waiting; clamped to m v).
Order interleaved_order(int pp, int m, int v, const std::vector<int>* extra_warm = nullptr) {
  Order o(static_cast<size_t>(pp));
  const int total = m * v;
  const int group = pp * v;
  auto fwd = [&](int k) {
    const int g = k % group;
    return ComputeStep{Op::Forward, (k / group) * pp + g % pp, g / pp};
  };
  auto bwd = [&](int k) {
    const int g = k % group;
    return ComputeStep{Op::Backward, (k / group) * pp + g % pp, v - 1 - g / pp};
  };
  for (int r = 0; r < pp; ++r) {
    auto& out = o[static_cast<size_t>(r)];
    const int extra = extra_warm ? (*extra_warm)[static_cast<size_t>(r)] : 0;
    const int warm = m == pp ? total : std::min(2 * (pp - r - 1) + (v - 1) * pp + extra, total);
    for (int k = 0; k < warm; ++k) out.push_back(fwd(k));
    for (int i = 0; i < total - warm; ++i) {
      out.push_back(fwd(warm + i));
      out.push_back(bwd(i));
    }
    for (int k = total - warm; k < total; ++k) out.push_back(bwd(k));
  }
  return o;
}

// ---- greedy list scheduling ----

struct Policy {
  bool b_first;     // B before F when both are ready (else F first)
  bool w_fit_only;  // start a W only if it ends before the rank's next F or B can start
  bool f_deep;      // v > 1: of the ready forwards, the highest chunk's first (else the lowest's)
  const char* name;
  bool w_frees = false;  // a micro-batch stays admitted until its last weight gradient on the
                         // rank (else until its chunk-0 input backward): the limit then caps
                         // what the rank holds, W's included (ZB-V's memory rule)
};

constexpr double kInf = std::numeric_limits<double>::infinity();

// The state of one list-scheduling pass (list_schedule below): per stage, how
// many forwards (F), input backwards (B) and weight backwards (W) have run and
// when each F and B ends; per rank, when it is free next and how many
// micro-batches it has admitted; the order so far.
class ListScheduler {
 public:
  ListScheduler(int pp, int v, int m, const StageCosts& c, std::int64_t limit, const Policy& pol,
                StagePlacement place)
      : pp_(pp), v_(v), m_(m), S_(pp * v), c_(c), limit_(limit), pol_(pol) {
    // rank_of[s], chunk_of[s]; stages_of[r]: rank r's stages by chunk (chunk 0
    // first, which is also the lowest stage in both placements).
    rank_of_.assign(U(S_), 0), chunk_of_.assign(U(S_), 0);
    stages_of_.assign(U(pp), {});
    for (int r = 0; r < pp; ++r)
      for (int ch = 0; ch < v; ++ch) {
        const int s = stage_of(place, pp, r, ch);
        rank_of_[U(s)] = r, chunk_of_[U(s)] = ch;
        stages_of_[U(r)].push_back(s);
      }
    endF_.assign(U(S_), std::vector<double>(U(m), kInf));
    endB_.assign(U(S_), std::vector<double>(U(m), kInf));
    nf_.assign(U(S_), 0), nb_.assign(U(S_), 0), nw_.assign(U(S_), 0);
    admitted_.assign(U(pp), 0);
    w_done_.assign(U(pp), std::vector<int>(U(m), 0));
    free_at_.assign(U(pp), 0.0);
    order_.assign(U(pp), {});
    left_ = 3 * m * S_;
  }

  // Runs every step; nothing when every rank stalls.
  std::optional<Order> run_all() {
    while (left_ > 0) {
      double T = kInf;
      for (int r = 0; r < pp_; ++r)
        if (remaining(r) > 0) T = std::min(T, free_at_[U(r)]);
      if (start_ready(T)) continue;
      // Nothing could start at T: the waiting ranks move to the next event.
      if (advance_waiting(T)) continue;
      // No event ahead: only W's can move (fit-only held them back), else a stall.
      if (!start_held_weight(T)) return std::nullopt;
    }
    return order_;
  }

 private:
  static size_t U(int i) { return static_cast<size_t>(i); }

  // When stage s's next F, B or W can start (kInf: not yet known, or none left).
  double ready_f(int s) const {
    const int k = nf_[U(s)];
    if (k >= m_ || (s < pp_ && admitted_[U(s)] >= limit_)) return kInf;
    if (s == 0) return 0.0;
    const double e = endF_[U(s - 1)][U(k)];
    return e < kInf ? e + c_.message(rank_of_[U(s - 1)], rank_of_[U(s)], pp_) : kInf;
  }
  double ready_b(int s) const {
    const int k = nb_[U(s)];
    if (k >= nf_[U(s)]) return kInf;
    if (s == S_ - 1) return endF_[U(s)][U(k)];
    const double e = endB_[U(s + 1)][U(k)];
    return e < kInf ? e + c_.message(rank_of_[U(s + 1)], rank_of_[U(s)], pp_) : kInf;
  }
  double ready_w(int s) const {
    const int k = nw_[U(s)];
    return k < nb_[U(s)] ? endB_[U(s)][U(k)] : kInf;
  }
  // Steps rank r has yet to run.
  int remaining(int r) const {
    int n = 0;
    for (int s : stages_of_[U(r)]) n += 3 * m_ - nf_[U(s)] - nb_[U(s)] - nw_[U(s)];
    return n;
  }
  // Runs stage s's next `op` from time t.
  void run(int s, Op op, double t) {
    const int r = rank_of_[U(s)];
    double dur = 0;
    int k = 0;
    if (op == Op::Forward) {
      k = nf_[U(s)]++;
      dur = c_.f[U(s)];
      endF_[U(s)][U(k)] = t + dur;
      if (s < pp_) ++admitted_[U(r)];
    } else if (op == Op::BackwardInput) {
      k = nb_[U(s)]++;
      dur = c_.b[U(s)];
      endB_[U(s)][U(k)] = t + dur;
      if (s < pp_ && !pol_.w_frees) --admitted_[U(r)];
    } else {
      k = nw_[U(s)]++;
      dur = c_.w[U(s)];
      if (pol_.w_frees && ++w_done_[U(r)][U(k)] == v_) --admitted_[U(r)];
    }
    order_[U(r)].push_back({op, k, chunk_of_[U(s)]});
    free_at_[U(r)] = t + dur;
    --left_;
  }
  // Of rank r's stages, the one whose `ready` is at most T, chosen by `better`
  // (-1: none).
  template <class Ready, class Better>
  int pick(int r, double T, Ready&& ready, Better&& better) const {
    int best = -1;
    for (int s : stages_of_[U(r)])
      if (ready(s) <= T && (best < 0 || better(s, best))) best = s;
    return best;
  }
  template <class Ready>
  double earliest(int r, Ready&& ready) const {
    double t = kInf;
    for (int s : stages_of_[U(r)]) t = std::min(t, ready(s));
    return t;
  }
  // Rank r's W to run at T: the oldest input backward's (-1: none ready).
  int pick_w(int r, double T) const {
    return pick(r, T, [&](int s) { return ready_w(s); }, [&](int a, int b) { return ready_w(a) < ready_w(b); });
  }

  // Every rank free at T starts its next step, if one is ready; whether any did.
  bool start_ready(double T) {
    const auto f_ready = [&](int s) { return ready_f(s); };
    const auto b_ready = [&](int s) { return ready_b(s); };
    bool progressed = false;
    for (int r = 0; r < pp_; ++r) {
      if (remaining(r) == 0 || free_at_[U(r)] != T) continue;
      // B: the earliest ready, then the oldest micro-batch; F: the deepest or
      // the shallowest chunk; W: the oldest input backward's.
      const int sb = pick(r, T, b_ready, [&](int a, int b) {
        const double ra = ready_b(a), rb = ready_b(b);
        return ra != rb ? ra < rb : nb_[U(a)] < nb_[U(b)];
      });
      const int sf = pick(r, T, f_ready, [&](int a, int b) { return pol_.f_deep ? a > b : a < b; });
      const int sw = pick_w(r, T);
      const double next_fb = std::min(earliest(r, f_ready), earliest(r, b_ready));
      int done_b = 0;
      for (int s : stages_of_[U(r)]) done_b += nb_[U(s)];
      const bool can_w = sw >= 0 && (!pol_.w_fit_only || done_b == m_ * v_ ||
                                     (next_fb < kInf && T + c_.w[U(sw)] <= next_fb));
      if (pol_.b_first && sb >= 0) run(sb, Op::BackwardInput, T);
      else if (sf >= 0) run(sf, Op::Forward, T);
      else if (sb >= 0) run(sb, Op::BackwardInput, T);
      else if (can_w) run(sw, Op::BackwardWeight, T);
      else continue;
      progressed = true;
    }
    return progressed;
  }

  // The ranks waiting at T move to the next event (a rank freeing up or a step
  // becoming ready); false when there is none ahead.
  bool advance_waiting(double T) {
    double next = kInf;
    for (int r = 0; r < pp_; ++r) {
      if (remaining(r) == 0) continue;
      if (free_at_[U(r)] > T) next = std::min(next, free_at_[U(r)]);
      for (int s : stages_of_[U(r)])
        for (double x : {ready_f(s), ready_b(s), ready_w(s)})
          if (x > T) next = std::min(next, x);
    }
    if (next < kInf) {
      for (int r = 0; r < pp_; ++r)
        if (remaining(r) > 0 && free_at_[U(r)] == T) free_at_[U(r)] = next;
      return true;
    }
    return false;
  }

  // The first rank waiting at T with a W ready runs it; false when none has one.
  bool start_held_weight(double T) {
    for (int r = 0; r < pp_; ++r) {
      if (remaining(r) == 0 || free_at_[U(r)] != T) continue;
      const int sw = pick_w(r, T);
      if (sw >= 0) {
        run(sw, Op::BackwardWeight, T);
        return true;
      }
    }
    return false;
  }

  const int pp_, v_, m_, S_;
  const StageCosts& c_;
  const std::int64_t limit_;
  const Policy& pol_;
  std::vector<int> rank_of_, chunk_of_;           // per stage
  std::vector<std::vector<int>> stages_of_;       // per rank
  std::vector<std::vector<double>> endF_, endB_;  // per stage and micro-batch (kInf: not run)
  std::vector<int> nf_, nb_, nw_;                 // per stage: F, B, W run so far
  std::vector<std::int64_t> admitted_;            // per rank
  std::vector<std::vector<int>> w_done_;          // per rank and micro-batch: W's run (w_frees)
  std::vector<double> free_at_;                   // per rank
  Order order_;
  int left_ = 0;  // steps not yet run, all ranks
};

// One list-scheduling pass over S = pp * v stages (stage s on the rank and
// chunk that `place` gives: looped s % pp and s / pp). A micro-batch is
// admitted on a rank by its chunk-0 forward and leaves with its chunk-0
// input backward (with Policy::w_frees: its last W); at most `limit` are
// admitted at once, and the forwards of later chunks of admitted micro-batches always
// may run, so every admitted micro-batch can finish (no deadlock by memory).
// With v = 1 the admitted micro-batches are the activations in flight.
// Returns nothing when every rank stalls (a guard; it cannot happen).
std::optional<Order> list_schedule(int pp, int v, int m, const StageCosts& c, std::int64_t limit,
                                   const Policy& pol, StagePlacement place = StagePlacement::looped) {
  return ListScheduler(pp, v, m, c, limit, pol, place).run_all();
}

// The interleaved order with each fused Backward split into its input
// backward and a weight backward deferred as in ZB-H1: after the k-th input
// backward of rank r (k = 0, 1, ...), the oldest pending W runs when
// k >= defer * r; the rest fill the cool-down.
Order interleaved_split_order(int pp, int m, int v, const std::vector<int>& defer,
                              const std::vector<int>* extra_warm = nullptr) {
  Order o = interleaved_order(pp, m, v, extra_warm);
  for (int r = 0; r < pp; ++r) {
    std::vector<ComputeStep> out;
    std::vector<ComputeStep> pending;
    size_t next_w = 0;
    int k = 0;
    for (const ComputeStep& st : o[static_cast<size_t>(r)]) {
      if (st.op != Op::Backward) {
        out.push_back(st);
        continue;
      }
      out.push_back({Op::BackwardInput, st.microbatch, st.chunk});
      pending.push_back({Op::BackwardWeight, st.microbatch, st.chunk});
      if (k++ >= defer[static_cast<size_t>(r)]) out.push_back(pending[next_w++]);
    }
    while (next_w < pending.size()) out.push_back(pending[next_w++]);
    o[static_cast<size_t>(r)] = std::move(out);
  }
  return o;
}

std::int64_t peak_of(const Schedule& s) {
  std::int64_t peak = 0;
  for (std::int64_t p : peak_inflight(s)) peak = std::max(peak, p);
  return peak;
}

}  // namespace

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names{"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "greedy"};
  return names;
}

void check_schedule_args(const std::string& schedule, int pp, int v, int m, StagePlacement placement) {
  const auto& names = schedule_names();
  if (std::find(names.begin(), names.end(), schedule) == names.end()) {
    std::string list;
    for (size_t i = 0; i < names.size(); ++i) list += (i ? ", " : "") + names[i];
    throw ScheduleError("parallel.schedule=\"" + schedule + "\": unknown pipeline schedule; use one of " + list);
  }
  if (pp < 1) throw ScheduleError("parallel.pp=" + num(pp) + ": must be >= 1");
  if (m < 1) throw ScheduleError("parallel.microbatches=" + num(m) + ": must be >= 1");
  if (v < 1) throw ScheduleError("parallel.virtual_stages=" + num(v) + ": must be >= 1");
  const bool vee = placement == StagePlacement::vee;
  if (schedule == "zb-v" && !vee)
    throw ScheduleError("parallel.schedule=\"zb-v\" runs on the V-shaped (vee) stage placement only; "
                        "adgt-train places its stages so, adgt-schedule with --placement vee");
  if (vee) {
    if (v != 2)
      throw ScheduleError("parallel.virtual_stages=" + num(v) +
                          ": the vee stage placement (zb-v) places two chunks per rank (stages r and 2pp-1-r); use "
                          "virtual_stages=2");
    if (pp < 2)
      throw ScheduleError("parallel.pp=" + num(pp) + ": the vee stage placement (zb-v) needs at least 2 pipeline ranks; "
                          "use pp >= 2");
    if (schedule != "zb-v" && schedule != "greedy")
      throw ScheduleError("parallel.schedule=\"" + schedule +
                          "\" does not run on the vee stage placement; use zb-v or greedy there, or the looped "
                          "placement");
    return;  // zb-v and greedy take any m >= 1
  }
  if (schedule == "interleaved") {
    if (v < 2)
      throw ScheduleError("parallel.virtual_stages=" + num(v) +
                          ": the interleaved schedule needs at least 2 chunks per rank; use "
                          "virtual_stages >= 2, or parallel.schedule=1f1b");
    if (pp < 2)
      throw ScheduleError("parallel.pp=" + num(pp) +
                          ": the interleaved schedule needs at least 2 pipeline ranks; use pp >= 2, or "
                          "parallel.virtual_stages=1");
  } else if (v > 1 && schedule == "greedy" && pp < 2) {
    throw ScheduleError("parallel.pp=" + num(pp) + ": greedy with parallel.virtual_stages=" + num(v) +
                        " needs at least 2 pipeline ranks; use pp >= 2, or virtual_stages=1");
  } else if (v > 1 && schedule != "greedy") {
    throw ScheduleError("parallel.virtual_stages=" + num(v) + " needs parallel.schedule=interleaved, greedy or zb-v (got " +
                        schedule + "); use virtual_stages=1, or schedule=interleaved, greedy or zb-v");
  }
  if ((schedule == "1f1b" || schedule == "zb-h1" || schedule == "interleaved") && m < pp) {
    const std::string t = title(schedule);
    std::string cap = t;
    if (!cap.empty()) cap[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(cap[0])));
    throw ScheduleError("parallel.microbatches=" + num(m) + " < parallel.pp=" + num(pp) + ": " + cap +
                        " needs at least pp micro-batches; use >= " + num(pp));
  }
  if (schedule == "interleaved" && m % pp != 0) {
    const int lo = (m / pp) * pp, hi = lo + pp;
    throw ScheduleError("parallel.microbatches=" + num(m) + " is not a multiple of parallel.pp=" + num(pp) +
                        ": the interleaved schedule runs micro-batches in groups of pp (as Megatron does); use " +
                        (lo >= pp ? num(lo) + " or " + num(hi) : num(hi)));
  }
}

void check_pipeline_config(int n_layers, int pp, int v, int m, const std::string& schedule,
                           StagePlacement placement) {
  check_schedule_args(schedule, pp, v, m, placement);
  if (n_layers < 1) throw ScheduleError("model.n_layers=" + num(n_layers) + ": must be >= 1");
  if (n_layers % pp != 0)
    throw ScheduleError("model.n_layers=" + num(n_layers) + " is not divisible by parallel.pp=" + num(pp) +
                        ": every pipeline stage holds the same number of layers; use pp in {" +
                        join(divisors(n_layers)) + "}");
  if (n_layers % (pp * v) != 0) {
    std::vector<long long> ok;
    for (long long d : divisors(n_layers / pp))
      if (schedule != "interleaved" || d >= 2) ok.push_back(d);
    std::string fix = ok.empty() ? "no virtual_stages >= 2 divides n_layers/pp=" + num(n_layers / pp) +
                                       "; use parallel.schedule=1f1b"
                                 : "use virtual_stages in {" + join(ok) + "}";
    throw ScheduleError("model.n_layers=" + num(n_layers) +
                        " is not divisible by parallel.pp x parallel.virtual_stages = " + num(pp) + " x " +
                        num(v) + " = " + num(pp * v) + " stages: every stage holds the same number of layers; " +
                        fix);
  }
}

Schedule gpipe(int pp, int m) {
  check_schedule_args("gpipe", pp, 1, m);
  return from_compute_order("gpipe", pp, m, 1, gpipe_order(pp, m));
}

Schedule one_f_one_b(int pp, int m) {
  check_schedule_args("1f1b", pp, 1, m);
  return from_compute_order("1f1b", pp, m, 1, one_f_one_b_order(pp, m));
}

Schedule interleaved_1f1b(int pp, int m, int v) {
  check_schedule_args("interleaved", pp, v, m);
  return from_compute_order("interleaved", pp, m, v, interleaved_order(pp, m, v));
}

Schedule zb_h1(int pp, int m) {
  check_schedule_args("zb-h1", pp, 1, m);
  return from_compute_order("zb-h1", pp, m, 1, zb_h1_order(pp, m));
}

Schedule greedy(int pp, int m, const StageCosts& costs, std::int64_t mem_limit_microbatches,
                std::int64_t held_limit, StagePlacement placement) {
  if (pp < 1) throw ScheduleError("parallel.pp=" + num(pp) + ": must be >= 1");
  const int v = costs.stages() > pp && costs.stages() % pp == 0 ? costs.stages() / pp : 1;
  check_schedule_args("greedy", pp, v, m, placement);
  check_costs(costs, pp * v, "greedy");
  if (mem_limit_microbatches < 1)
    throw ScheduleError("greedy: mem_limit_microbatches=" + num(mem_limit_microbatches) +
                        ": at least one micro-batch's activations must fit on a rank; use >= 1 (1F1B needs " +
                        num(std::min(pp, m)) + ")");
  const std::int64_t limit = mem_limit_microbatches;

  std::optional<Schedule> best;
  double best_time = kInf;
  auto consider = [&](Schedule s, const std::string& detail) {
    if (max_held_activations(s) > held_limit) return;  // over the memory the run planned for
    // With the measured spread of single instructions (costs.jitter) the
    // variant expected fastest when they wander, else the medians' fastest.
    const double t = expected_makespan(s, costs);
    if (t < best_time * (1 - 1e-12)) {
      best_time = t;
      s.name = "greedy";
      s.detail = detail;
      best = std::move(s);
    }
  };
  std::vector<Policy> policies = {{true, false, false, "list scheduling, B first, W fills idle time"},
                                  {false, false, false, "list scheduling, F first, W fills idle time"},
                                  {true, true, false, "list scheduling, B first, W only where it fits"},
                                  {false, true, false, "list scheduling, F first, W only where it fits"}};
  if (v > 1) {
    policies.push_back({true, false, true, "list scheduling, B first, deepest F, W fills idle time"});
    policies.push_back({false, false, true, "list scheduling, F first, deepest F, W fills idle time"});
    policies.push_back({true, true, true, "list scheduling, B first, deepest F, W only where it fits"});
    policies.push_back({false, true, true, "list scheduling, F first, deepest F, W only where it fits"});
  }
  // On the vee placement, the same with the limit counted to each
  // micro-batch's last W on the rank (ZB-V's rule: W's cannot pile up).
  for (size_t i = 0, n = placement == StagePlacement::vee ? policies.size() : 0; i < n; ++i) {
    Policy p = policies[i];
    p.w_frees = true;
    policies.push_back(p);
  }
  for (const Policy& pol : policies) {
    if (auto o = list_schedule(pp, v, m, costs, limit, pol, placement))
      consider(from_compute_order("greedy", pp, m, v, *o, placement),
               std::string(pol.name) + (pol.w_frees ? ", admitted to the last W" : ""));
  }
  // The hand-written orders, where they fit the memory limit: greedy is never
  // worse than them on the given costs. With several chunks, the interleaved
  // order (fused, and split with its weight backwards deferred as in ZB-H1),
  // held to the held-activations limit only.
  if (v == 1) {
    for (auto [name, order] : {std::pair{"1f1b order", one_f_one_b_order(pp, m)},
                               std::pair{"zb-h1 order", zb_h1_order(pp, m)}}) {
      Schedule s = from_compute_order("greedy", pp, m, 1, order);
      if (peak_of(s) <= limit) consider(std::move(s), name);
    }
  } else if (placement == StagePlacement::looped && m >= pp && m % pp == 0) {
    consider(from_compute_order("greedy", pp, m, v, interleaved_order(pp, m, v)), "interleaved order");
    std::vector<int> best_defer;
    double best_sim = kInf;
    for (int d = 0; d <= 2 * v; ++d) {
      std::vector<int> dv(static_cast<size_t>(pp));
      for (int r = 0; r < pp; ++r) dv[static_cast<size_t>(r)] = d * r;
      Schedule s = from_compute_order("greedy", pp, m, v, interleaved_split_order(pp, m, v, dv));
      if (max_held_activations(s) <= held_limit) {
        const double t = time_schedule(s, costs).makespan;
        if (t < best_sim) best_sim = t, best_defer = dv;
      }
      consider(std::move(s), "interleaved order, split, W deferred " + num(d) + " x rank");
    }
    // From the best of those, per-rank deferrals and extra warm-up forwards
    // (coordinate descent on the medians' simulated makespan; a few
    // hundred simulations).
    if (!best_defer.empty()) {
      std::vector<int> dv = best_defer, ew(static_cast<size_t>(pp), 0);
      bool improved = true;
      for (int sweep = 0; sweep < 3 && improved; ++sweep) {
        improved = false;
        for (int r = 0; r < pp; ++r)
          for (int e = 0; e <= 2; ++e)
            for (int d = 0; d <= 2 * v * pp; ++d) {
              std::vector<int> dt = dv, et = ew;
              dt[static_cast<size_t>(r)] = d, et[static_cast<size_t>(r)] = e;
              if (dt == dv && et == ew) continue;
              Schedule s = from_compute_order("greedy", pp, m, v, interleaved_split_order(pp, m, v, dt, &et));
              if (max_held_activations(s) > held_limit) continue;
              try {
                validate(s);
              } catch (const ScheduleError&) {
                continue;
              }
              const double t = time_schedule(s, costs).makespan;
              if (t < best_sim * (1 - 1e-9)) best_sim = t, dv = dt, ew = et, improved = true;
            }
      }
      if (dv != best_defer || std::any_of(ew.begin(), ew.end(), [](int e) { return e != 0; })) {
        std::string d, e;
        for (int r = 0; r < pp; ++r)
          d += (r ? "," : "") + num(dv[static_cast<size_t>(r)]), e += (r ? "," : "") + num(ew[static_cast<size_t>(r)]);
        consider(from_compute_order("greedy", pp, m, v, interleaved_split_order(pp, m, v, dv, &ew)),
                 "interleaved order, split, W deferred per rank " + d + ", extra warm-up " + e);
      }
    }
  }
  if (!best)
    throw ScheduleError("greedy: no schedule fits mem_limit_microbatches=" + num(limit) +
                        (held_limit < std::numeric_limits<std::int64_t>::max()
                             ? " and held activations <= " + num(held_limit)
                             : std::string()) +
                        " on pp=" + num(pp));
  return *best;
}

Schedule zb_v(int pp, int m, const StageCosts& costs) {
  check_schedule_args("zb-v", pp, 2, m, StagePlacement::vee);
  const StageCosts c = costs.f.empty() ? StageCosts::uniform(2 * pp, 1, 1, 1) : costs;
  check_costs(c, 2 * pp, "zb-v");
  // 1F1B's activations: pp stages' worth, 2pp chunks of half a stage.
  Schedule s = greedy(pp, m, c, pp, 2 * std::int64_t(pp), StagePlacement::vee);
  s.name = "zb-v";
  return s;
}

Schedule make_schedule(const std::string& name, int pp, int m, int v, const StageCosts& costs,
                       std::int64_t mem_limit, std::int64_t held_limit, StagePlacement placement) {
  check_schedule_args(name, pp, v, m, placement);
  if (name == "zb-v") return zb_v(pp, m, costs);
  if (name == "gpipe") return gpipe(pp, m);
  if (name == "1f1b") return one_f_one_b(pp, m);
  if (name == "interleaved") return interleaved_1f1b(pp, m, v);
  if (name == "zb-h1") return zb_h1(pp, m);
  if (mem_limit < 0)
    throw ScheduleError("greedy: memory limit " + num(mem_limit) + ": use >= 1 micro-batches, or 0 for pp");
  const StageCosts c = costs.f.empty() ? StageCosts::uniform(pp * v, 1, 1, 1) : costs;
  check_costs(c, pp * v, "greedy");
  return greedy(pp, m, c, mem_limit == 0 ? pp : mem_limit, held_limit, placement);
}

}  // namespace adgt::pp

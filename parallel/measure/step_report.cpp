#include "parallel/measure/step_report.hpp"

namespace adgt {

double rank_compute_seconds(Engine& e, const StepReport& r) {
  if (e.pipelined()) return e.pipeline()->last_compute_seconds();
  return r.seconds - r.tp_seconds - r.pp_seconds - r.ep_seconds - r.cp_seconds -
         e.last_times().dp_wait_s;
}

}  // namespace adgt

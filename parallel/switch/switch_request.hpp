// Requests to change the layout of a running job in memory
// (docs/reliability.md, "In-memory layout switch"). The user writes the control
// file <log.dir>/switch, one request per line:
//
//   parallel.tp=1 parallel.pp=4        # at the next step boundary
//   @6 parallel.tp=2 parallel.pp=1 parallel.dp=4   # at the boundary after step 6
//
// Each line is "[@STEP] key=value ..." with keys from layout_keys()
// (core/layout.hpp) and parallel.bucket_mb / parallel.overlap; '#' starts a
// comment. World rank 0 reads the file at every step boundary; a due line is
// applied on every rank at that boundary (decided on rank 0, broadcast), the
// file keeps the lines not yet due and becomes switch.done once all are
// applied. A line that cannot apply (an unknown or non-layout key, a layout
// the world or the model does not allow) is refused with the reason, logged,
// and training goes on in the current layout.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"

namespace adgt {

struct SwitchRequest {
  int64_t at_step = -1;                // apply at the boundary after this step; -1: the next one
  std::vector<std::string> overrides;  // "section.key=value", in order
  int line = 0;                        // 1-based line of the control file
  std::string text;                    // the line as written (without the comment)
};

// Parses the control file's text. A malformed line ("@x", "tp=1" without a
// section, "@-3") is a ConfigError naming `path` and the line.
std::vector<SwitchRequest> parse_switch_requests(const std::string& text, const std::string& path);

// The requests of `reqs` due after step `step` (at_step < 0 or <= step), in
// order, and the rest (left in the file).
void split_due(const std::vector<SwitchRequest>& reqs, int64_t step, std::vector<SwitchRequest>& due,
               std::vector<SwitchRequest>& later);

// The configuration after the request: `cfg` with its overrides, validated,
// the world size kept (tp * pp * dp = `world`). Throws ConfigError naming the
// file, line and key for a key that is not a layout key or a value that does
// not validate.
RunConfig switched_config(const RunConfig& cfg, const SwitchRequest& req, int world,
                          const std::string& path);

// <log_dir>/switch: the control file's path.
std::string switch_file(const std::string& log_dir);
// Whether <log_dir>/switch exists and holds a request due after `step`, or
// cannot be parsed (so that the switch logs why). World rank 0 asks at every
// step boundary: one stat() when there is no file.
bool switch_request_due(const std::string& log_dir, int64_t step);

// The request's lines as the file holds them (for rewriting the rest).
std::string format_switch_requests(const std::vector<SwitchRequest>& reqs);

}  // namespace adgt

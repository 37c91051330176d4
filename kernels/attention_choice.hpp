// train.attention: which attention kernel a backend runs, and the rule
// `auto` picks one by (docs/cuda.md, "Attention kernels").
//
//   auto   the CUDA backend, bf16: on the first call of each shape, every
//          candidate that takes the shape (flash, cudnn) runs forward and
//          backward on that call's q, k, v and a drawn dout; each is checked
//          against the others and against the exact kernel (a reference,
//          never timed or chosen) by relative error within the dtype's bound
//          (a disagreement is refused: an error naming both kernels, the
//          tensor and the error); then each is timed a few iterations within
//          a budget (~1.5 s) and the faster kept, the table printed on stderr.
//          Deterministic given the timings; with several processes the
//          trainer decides on rank 0 and fixes the broadcast answer on every
//          rank (probe_attention). Elsewhere: the backend's only kernel.
//   flash  the handwritten FlashAttention-2-style kernels (CUDA, bf16), the
//          exact kernel where they do not apply (logged once per reason)
//   cudnn  cuDNN SDPA through cudnn-frontend (CUDA, bf16); a shape cuDNN has
//          no engine for, or a build without it, is an error naming the fix
//   exact  the reference kernel (the CPU backend's only one; on CUDA, bf16
//          through fp32 copies)
// f32 and f64 have one kernel on every backend (exact). The CPU and emulated
// backends accept auto and exact and refuse flash and cudnn, naming the key.
//
// The choice itself (choose_attention) is pure: candidates are run functions
// and a timer is passed in, so the CPU tests drive it with a fake timer and a
// deliberately wrong candidate.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/backend.hpp"

namespace adgt {

enum class AttentionSetting { Auto, Flash, Cudnn, Exact };

// "auto" | "flash" | "cudnn" | "exact"; anything else throws naming `source`
// ("train.attention", "ADGT_ATTENTION") and the values.
AttentionSetting parse_attention_setting(const std::string& value, const char* source);
const char* attention_setting_name(AttentionSetting s);

// Applies train.attention (`value`) to `be`: the CUDA backend's
// set_attention; the CPU and emulated backends accept auto and exact and
// throw for flash and cudnn ("train.attention=flash: the cpu backend has one
// attention kernel (exact); ...").
void configure_attention(Backend& be, const std::string& value);

// The kernel `be` runs attention of shape s in dtype dt with: the setting's
// kernel when fixed; under auto the decision for s, taken now (one forward
// on scratch tensors of random values, which runs the choice) if s is
// undecided; "exact" on backends with one kernel. With more than one process
// the trainer takes rank 0's answer, broadcasts it and fixes it on every rank
// with configure_attention (decide, broadcast, log: ranks never run
// different kernels). Document masking: s.doc_start non-null (its memory is
// not read; the probe draws a layout of its own) decides the masked shape,
// which never picks cudnn (it has no document masking); a run with
// train.document_mask must probe with it, or an unmasked cudnn answer would
// be fixed for masked calls (an error naming flash and auto).
std::string probe_attention(Backend& be, const AttentionShape& s, DType dt);

// The relative error two attention kernels may differ by on `dt` outputs:
// bf16 1e-2 (the CUDA-vs-CPU tests' bound), f32 1e-4, f64 1e-10.
double attention_rel_bound(DType dt);
// ||a - b||_2 / max(||a||_2, ||b||_2) (0 when both are 0; +inf when a size
// differs or either holds a NaN or an infinity): symmetric, so "a vs b" and
// "b vs a" agree.
double attention_rel_err(const std::vector<float>& a, const std::vector<float>& b);

// ---- the choice (pure) ----
struct AttentionCandidate {
  std::string name;        // "flash", "cudnn", "exact"
  bool reference = false;  // checked against, never timed or chosen (the exact kernel)
  // Forward and backward on the probe inputs into the candidate's own outputs.
  std::function<void()> run;
  // Output `i` (AttentionChoiceOptions::outputs order) after run(), as floats.
  std::function<std::vector<float>(int i)> output;
};

struct AttentionChoiceOptions {
  double rel_bound = 1e-2;  // attention_rel_bound(dtype)
  double budget_s = 1.5;    // timing budget over all timed candidates together
  int min_iters = 2;        // timed runs per candidate at least (also past the budget)...
  int max_iters = 20;       // ...and at most
  std::vector<std::string> outputs = {"out", "dq", "dk", "dv"};
  std::string what;         // the call, for messages: "bf16 B=8 T=2048 H=16 KV=16 head_dim=128"
  std::string setting = "train.attention=auto";  // named in the error
};

// Seconds one call of `f` takes (the caller waits for the device inside).
using AttentionTimer = std::function<double(const std::function<void()>& f)>;

struct AttentionTiming {
  std::string name;
  bool reference = false;
  int iters = 0;        // timed runs (0: not timed)
  double best_s = 0;    // the fastest run
  double median_s = 0;
};

struct AttentionChoice {
  std::string chosen;
  std::vector<AttentionTiming> timings;  // in candidate order
  // Per pair "flash vs cudnn": the largest relative error over the outputs.
  std::vector<std::string> agreement;
  // Candidates left out because their first run threw: "cudnn: <what()>".
  std::vector<std::string> failed;
  std::string table() const;  // markdown: kernel, role, runs, best ms, median ms, chosen
};

// Runs every candidate once (warm-up: graph building, first-touch; one whose
// run throws is left out and listed in `failed`), checks
// every pair on every output (throws std::runtime_error, naming the setting,
// the call, both kernels, the output and the error, when any pair exceeds
// rel_bound; when a reference takes part, the message names the kernels that
// disagree with it and suggests one that agrees), then times the timed
// candidates round-robin — each at least min_iters and at most max_iters runs,
// stopping once their total passes budget_s — and chooses the lowest best
// time, ties to the earlier candidate. One timed candidate: chosen untimed
// (still checked). Throws when no timed candidate is left.
AttentionChoice choose_attention(const std::vector<AttentionCandidate>& candidates,
                                 const AttentionTimer& timer, const AttentionChoiceOptions& opt);

}  // namespace adgt

// The trainer's named checkpoint state (CheckpointState::state, stored as
// state/<name> in checkpoint.h5; docs/checkpoint-format.md): what each part of
// the run contributes on save and takes back on load.
//
//   trainer/opt_steps      ints (1)   AdamW updates applied (steps minus skipped ones)
//   moe/bias/layer_<l>     reals (E)  MoE layer l's aux-loss-free selection bias
//                                     (model.moe_aux_free), bit-exact
//   pipeline/schedule      text       the pipeline schedule in use, as JSON: name and
//                                     the variant kept (greedy); recorded, not restored
//   plan/chosen            text       parallel.auto's plan as JSON (docs/planner.md);
//                                     recorded, not restored (a resume plans anew)
//   fp8/amax_history       reals      train.fp8_recipe delayed: every FP8 GEMM's amax
//                                     history (n_layers x 7 roles (q, k, v, o, gate,
//                                     up, down) x 2 (input, output gradient) x
//                                     fp8/amax_history_len[1]), oldest first
//   fp8/expert_amax_history reals     the same for the MoE experts' GEMMs (n_layers x
//                                     n_experts x 3 (w1, w3, w2) x 2 x history); a
//                                     model with experts only
//   fp8/amax_history_len   ints (2)   steps filled, history length
//
// Checkpoints written before named state packed the first two into
// meta/rng_state (word 0: the update count; then n_layers x E doubles as bit
// copies); with_legacy_state() turns those words into the entries above, so
// old checkpoints load unchanged.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.hpp"
#include "core/config.hpp"

namespace adgt {

// The entries above from their values. `moe_bias`: the (n_layers x E) table
// of Model::moe_bias_table() summed over the pipeline stages (empty: no MoE
// bias balancing). `schedule_json`: "" without a pipeline.
std::map<std::string, StateEntry> trainer_state(const ModelConfig& m, int64_t opt_steps,
                                                const std::vector<double>& moe_bias,
                                                const std::string& schedule_json);

// What a load restores.
struct RestoredTrainerState {
  int64_t opt_steps = 0;
  bool has_moe_bias = false;
  std::vector<double> moe_bias;  // (n_layers x E) when has_moe_bias, zero rows for dense layers
};

// From a loaded checkpoint: its named state, or for an older checkpoint the
// entries its meta/rng_state words stand for (no words at all: the update
// count is the step). An entry of the wrong kind or length is an error naming
// it and the checkpoint.
RestoredTrainerState restore_trainer_state(const CheckpointState& st, const ModelConfig& m,
                                           const std::string& where);

// FP8 delayed scaling's histories (Model::fp8_history_table, summed over the
// pipeline stages) as the fp8/ entries above: fp8/amax_history the dense
// linears', fp8/expert_amax_history (a model with experts) the experts'.
void put_fp8_state(std::map<std::string, StateEntry>& s, const ModelConfig& m,
                   const std::vector<double>& table, int64_t steps, int64_t history);
// The saved histories re-laid for a history of `history` steps (the newest
// ones kept), and the steps filled; false when the checkpoint has none (a
// bf16 or tensorwise run's). A malformed entry is an error naming it. A
// model with experts whose checkpoint has no expert histories (an fp8 run's
// from before the experts were FP8) takes them empty: *experts_missing.
bool take_fp8_state(const CheckpointState& st, const ModelConfig& m, int64_t history,
                    std::vector<double>& table, int64_t& steps, const std::string& where,
                    bool* experts_missing = nullptr);

// The named entries a pre-named-state checkpoint's rng_state words stand for.
std::map<std::string, StateEntry> with_legacy_state(const CheckpointState& st, const ModelConfig& m);

}  // namespace adgt

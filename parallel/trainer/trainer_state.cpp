#include "parallel/trainer/trainer_state.hpp"

#include <algorithm>
#include <cstring>

#include "kernels/check.hpp"

namespace adgt {

namespace {
constexpr const char* kOptSteps = "trainer/opt_steps";

std::string bias_name(int64_t layer) { return "moe/bias/layer_" + std::to_string(layer); }
}  // namespace

std::map<std::string, StateEntry> trainer_state(const ModelConfig& m, int64_t opt_steps,
                                                const std::vector<double>& moe_bias,
                                                const std::string& schedule_json) {
  std::map<std::string, StateEntry> s;
  s[kOptSteps] = StateEntry::of_ints({opt_steps});
  const int64_t E = m.n_experts;
  if (!moe_bias.empty())
    for (int64_t l = 0; l < m.n_layers; ++l)
      if (m.is_moe_layer(l))
        s[bias_name(l)] = StateEntry::of_reals(
            std::vector<double>(moe_bias.begin() + l * E, moe_bias.begin() + (l + 1) * E));
  if (!schedule_json.empty()) s["pipeline/schedule"] = StateEntry::of_text(schedule_json);
  return s;
}

std::map<std::string, StateEntry> with_legacy_state(const CheckpointState& st, const ModelConfig& m) {
  if (!st.state.empty()) return st.state;
  std::map<std::string, StateEntry> s;
  s[kOptSteps] = StateEntry::of_ints({st.rng_state.empty() ? st.step : int64_t(st.rng_state[0])});
  const size_t table = size_t(m.n_layers * m.n_experts);
  if (m.n_experts > 0 && m.moe_aux_free && st.rng_state.size() == 1 + table) {
    std::vector<double> t(table);
    std::memcpy(t.data(), st.rng_state.data() + 1, table * 8);
    for (auto& [k, v] : trainer_state(m, 0, t, ""))
      if (k != kOptSteps) s[k] = v;
  }
  return s;
}

RestoredTrainerState restore_trainer_state(const CheckpointState& st, const ModelConfig& m,
                                           const std::string& where) {
  const std::map<std::string, StateEntry> s = with_legacy_state(st, m);
  RestoredTrainerState r;
  auto it = s.find(kOptSteps);
  if (it == s.end()) throw CheckpointError(where + ": state/" + kOptSteps + " is missing");
  if (it->second.kind != StateEntry::Kind::Ints || it->second.ints.size() != 1)
    throw CheckpointError(where + ": state/" + kOptSteps + " must hold one integer");
  r.opt_steps = it->second.ints[0];
  if (m.n_experts > 0 && m.moe_aux_free) {
    const int64_t E = m.n_experts;
    r.moe_bias.assign(size_t(m.n_layers * E), 0.0);
    r.has_moe_bias = true;
    for (int64_t l = 0; l < m.n_layers; ++l) {
      if (!m.is_moe_layer(l)) continue;
      auto b = s.find(bias_name(l));
      if (b == s.end()) {
        r.has_moe_bias = false;
        continue;
      }
      if (b->second.kind != StateEntry::Kind::Reals || int64_t(b->second.reals.size()) != E)
        throw CheckpointError(where + ": state/" + bias_name(l) + " must hold model.n_experts=" +
                              std::to_string(E) + " reals");
      std::copy(b->second.reals.begin(), b->second.reals.end(), r.moe_bias.begin() + l * E);
    }
    if (!r.has_moe_bias) std::fill(r.moe_bias.begin(), r.moe_bias.end(), 0.0);
  }
  return r;
}

namespace {
constexpr const char* kFp8History = "fp8/amax_history";
constexpr const char* kFp8Experts = "fp8/expert_amax_history";
constexpr const char* kFp8Len = "fp8/amax_history_len";
size_t fp8_dense_rows(const ModelConfig& m) { return size_t(m.n_layers) * 7 * 2; }
size_t fp8_expert_rows(const ModelConfig& m) { return size_t(m.n_layers * m.n_experts) * 3 * 2; }
}  // namespace

void put_fp8_state(std::map<std::string, StateEntry>& s, const ModelConfig& m,
                   const std::vector<double>& table, int64_t steps, int64_t history) {
  const size_t dense = fp8_dense_rows(m) * size_t(history);
  ADGT_CHECK(table.size() == dense + fp8_expert_rows(m) * size_t(history),
             "put_fp8_state: a table of " << table.size() << " values for this model");
  s[kFp8History] = StateEntry::of_reals(std::vector<double>(table.begin(), table.begin() + std::ptrdiff_t(dense)));
  if (m.n_experts > 0)
    s[kFp8Experts] = StateEntry::of_reals(std::vector<double>(table.begin() + std::ptrdiff_t(dense), table.end()));
  s[kFp8Len] = StateEntry::of_ints({std::min(steps, history), history});
}

bool take_fp8_state(const CheckpointState& st, const ModelConfig& m, int64_t history,
                    std::vector<double>& table, int64_t& steps, const std::string& where,
                    bool* experts_missing) {
  if (experts_missing) *experts_missing = false;
  auto h = st.state.find(kFp8History);
  auto n = st.state.find(kFp8Len);
  if (h == st.state.end() && n == st.state.end()) return false;
  if (h == st.state.end() || n == st.state.end())
    throw CheckpointError(where + ": state/" + (h == st.state.end() ? kFp8History : kFp8Len) +
                          " is missing (the other fp8/ entry is there)");
  if (n->second.kind != StateEntry::Kind::Ints || n->second.ints.size() != 2 ||
      n->second.ints[1] < 1 || n->second.ints[0] < 0 || n->second.ints[0] > n->second.ints[1])
    throw CheckpointError(where + ": state/" + kFp8Len + " must hold (steps, history), 0 <= steps <= history");
  const int64_t saved_h = n->second.ints[1], saved_n = n->second.ints[0];
  const size_t rows = fp8_dense_rows(m), erows = fp8_expert_rows(m);
  if (h->second.kind != StateEntry::Kind::Reals || h->second.reals.size() != rows * size_t(saved_h))
    throw CheckpointError(where + ": state/" + kFp8History + " must hold n_layers x 7 x 2 x " +
                          std::to_string(saved_h) + " reals");
  // The experts' rows (a model with experts); a checkpoint of an fp8 run from
  // before the experts' GEMMs were FP8 has none: their histories start empty.
  const std::vector<double>* ex = nullptr;
  if (erows) {
    auto x = st.state.find(kFp8Experts);
    if (x == st.state.end()) {
      if (experts_missing) *experts_missing = true;
    } else if (x->second.kind != StateEntry::Kind::Reals ||
               x->second.reals.size() != erows * size_t(saved_h)) {
      throw CheckpointError(where + ": state/" + kFp8Experts +
                            " must hold n_layers x n_experts x 3 x 2 x " +
                            std::to_string(saved_h) + " reals");
    } else {
      ex = &x->second.reals;
    }
  }
  steps = std::min(saved_n, history);
  table.assign((rows + erows) * size_t(history), 0.0);
  auto take = [&](const std::vector<double>& src, size_t r, size_t dst_row) {
    for (int64_t k = 0; k < steps; ++k)  // the newest `steps` of the saved ones, oldest first
      table[dst_row * size_t(history) + size_t(k)] = src[r * size_t(saved_h) + size_t(saved_n - steps + k)];
  };
  for (size_t r = 0; r < rows; ++r) take(h->second.reals, r, r);
  if (ex)
    for (size_t r = 0; r < erows; ++r) take(*ex, r, rows + r);
  return true;
}

}  // namespace adgt

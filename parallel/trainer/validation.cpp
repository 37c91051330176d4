// The trainer's evaluation (trainer.hpp, ValLoss): every source of data.val
// evaluated alone over its first windows, in the same batches a run with
// that source alone evaluates, so a source's loss is that run's val_loss at
// the same model state, bit for bit; a blend's val_loss is their weighted
// mean (docs/config.md, "Data blends").
#include <algorithm>
#include <vector>

#include "core/data/sampler.hpp"
#include "core/data/token_shard.hpp"
#include "kernels/check.hpp"
#include "parallel/trainer/trainer.hpp"

namespace adgt {

double Trainer::evaluate_shard(const TokenShard& shard) {
  const int64_t B = cfg_.train.micro_batch, T = cfg_.model.seq_len;
  int64_t n = num_eval_windows(shard, T);
  ADGT_CHECK(n > 0, "data.val: shard '" << shard.path() << "' has fewer than "
                                        << T + 1 << " tokens (model.seq_len + 1)");
  if (cfg_.train.eval_batches > 0) n = std::min(n, cfg_.train.eval_batches * B);
  std::vector<int32_t> window(size_t(T + 1)), in(size_t(B * T)), tg(size_t(B * T));
  double total = 0;
  int64_t tokens = 0;
  for (int64_t w0 = 0; w0 < n; w0 += B) {
    std::fill(in.begin(), in.end(), 0);
    std::fill(tg.begin(), tg.end(), -1);  // padding rows of a short last batch are ignored
    const int64_t rows = std::min(B, n - w0);
    for (int64_t b = 0; b < rows; ++b) {
      eval_window(shard, T, w0 + b, window.data());
      std::copy(window.begin(), window.end() - 1, in.begin() + b * T);
      std::copy(window.begin() + 1, window.end(), tg.begin() + b * T);
    }
    total += engine_->eval_loss(in.data(), tg.data()) * double(rows * T);
    tokens += rows * T;
  }
  return total / double(tokens);
}

ValLoss Trainer::evaluate_sources() {
  ValLoss out;
  if (val_shards_.size() == 1) {  // one source: its loss, as before blends
    out.loss = evaluate_shard(*val_shards_[0]);
    return out;
  }
  // The weights are normalised (sum 1); summed in the list's order.
  for (size_t s = 0; s < val_shards_.size(); ++s) {
    const double loss = evaluate_shard(*val_shards_[s]);
    out.by_source.emplace_back(val_sources_[s].path, loss);
    out.loss += val_sources_[s].weight * loss;
  }
  return out;
}

}  // namespace adgt

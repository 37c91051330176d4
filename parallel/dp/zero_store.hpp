// ZeRO-2 and ZeRO-3 (docs/zero.md): the model's gradients (2) and weights
// (3) held as this rank's shard over the sharding group (dp x cp), unit by
// unit (zero_shards.hpp), as the Model's UnitStorage.
//
// Gradients: a unit's gradient buffer is made (zeroed) when the backward
// first writes it, reduce-scattered (asynchronously, a Comm Work) as soon as
// the backward completes the unit, and freed once its piece has been added
// into the shard's gradient: every micro-batch, so the accumulation over
// micro-batches happens in the shard and at most a few units' whole
// gradients exist at once.
//
// Weights (ZeRO-3): the master (fp32) and, in mixed precision, the bf16
// compute copy are shards; before a unit's forward and again before its
// backward the unit's compute weights are all-gathered into a buffer of
// their own, the next `prefetch` units' gathers started at the same time
// (so they travel while this unit computes), and a gathered unit is freed
// when a pass moves past it (after the forward unless
// reshard_after_forward is false, after its backward).
//
// ZeRO-2 keeps the whole compute weights in the model's flat buffer: after
// each update the shards' new values are all-gathered into it, unit by unit.
//
// Collectives start in the order the model names its units, the same on
// every rank of the group.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "core/comm.hpp"
#include "core/model/model.hpp"
#include "core/model/unit_storage.hpp"
#include "kernels/backend.hpp"
#include "kernels/clock.hpp"
#include "parallel/dp/zero_shards.hpp"

namespace adgt {

struct ZeroOptions {
  int level = 2;                      // 2 or 3
  int prefetch = 1;                   // ZeRO-3: units gathered ahead
  bool reshard_after_forward = true;  // ZeRO-3
  // Pipeline parallelism: a chunk's gradients accumulate whole over the
  // step's micro-batches and are reduce-scattered at its ReduceGrads
  // (chunk_done), as the gradient buckets are; reshard_after_forward false
  // keeps every gathered unit until the update.
  bool pipelined = false;
};

// What the store's collectives did in the last step (forward_backward and
// the update), seconds on the clock set_clock gives.
struct ZeroTimes {
  int64_t gathers = 0, gather_bytes = 0;   // unit gathers started (weights), their bytes sent
  int64_t reduces = 0, reduce_bytes = 0;   // unit reduce-scatters (gradients)
  double gather_wait_s = 0;  // waiting for gathers a unit needed: the exposed part
  double reduce_wait_s = 0;  // waiting for reduce-scatters (to free a unit, at the step's end)
  double update_gather_s = 0;  // ZeRO-2: the whole weights' gather after the update
};

class ZeroStore final : public UnitStorage {
 public:
  // `initial`: the model's whole flat weights on the host (flat_size fp32
  // values: the drawn initial weights), of which the store keeps its pieces;
  // nullptr: zeros (a state restored at once with load_weights). The caller
  // then hands the store to model.set_unit_storage before anything uses the
  // model's flat buffers, so they are never made (the model makes them at
  // their first use).
  // `experts`: with expert parallelism, the experts' replica group (edp x
  // cp), over which expert weights shard (nullptr: every weight over `group`).
  ZeroStore(Model& model, Backend& be, Comm& group, const ZeroOptions& o, const float* initial,
            Comm* experts = nullptr);
  ~ZeroStore() override;

  // --- UnitStorage ---
  bool holds_weights() const override { return opt_.level >= 3; }
  bool holds_grads() const override { return true; }
  void begin_unit(Pass pass, int unit, const std::vector<int>& reads) override;
  void grads_done(int unit) override;
  char* weights(int unit, int64_t at) override;
  char* grads(int unit, int64_t at) override;

  // --- the step ---
  // Zeroes the shard's gradient (the step's first micro-batch adds into it).
  void begin_step();
  // Pipelined: every gradient of model chunk `chunk` is final for the step;
  // its units' reduce-scatters start.
  void chunk_done(int chunk);
  // Every unit's reduce-scatter finished and added into the shard.
  void finish_grads();
  // After AdamW updated the master shard (and wrote the compute shard):
  // ZeRO-2 gathers the new weights into the model; ZeRO-3 drops the
  // gathered units (stale).
  void after_update();

  const ZeroShards& shards() const { return shards_; }
  int level() const { return opt_.level; }
  Comm& group() const { return group_; }
  Comm* expert_group() const { return experts_; }
  Tensor master_shard() const;   // (shard_size) master dtype
  Tensor grad_shard() const;     // (shard_size) master dtype, the reduced mean gradients
  // (shard_size) the compute dtype's copy AdamW writes in mixed precision; empty otherwise.
  Tensor compute_shard() const;

  // --- whole-model host copies (collective over the group) ---
  // A shard-layout tensor (any float dtype) as the model's whole flat
  // buffer on the host (fp32; zeros between units).
  void shard_to_flat_host(const Tensor& shard, std::vector<float>& out);
  // The inverse: this rank's pieces of a whole flat host buffer into `shard`.
  void flat_host_to_shard(const float* flat, size_t n, Tensor shard);
  // The weights from a whole flat host buffer (a checkpoint, a layout
  // switch): the master shard, its compute copy, and under ZeRO-2 the
  // model's flat weights. Collective.
  void load_weights(const float* flat, size_t n);
  // The shards' weights into the model (ZeRO-2: its flat weights, gathered;
  // collective), as after an update: once after construction.
  void publish();

  // The clock the waits are timed on (the emulation's virtual clock under emulation).
  void set_clock(std::function<double()> now) { now_ = std::move(now); }
  const ZeroTimes& last_times() const { return last_; }
  // Bytes the store holds now and the most it held at once since the last
  // reset (gathered units and unit gradients; not the shards).
  int64_t working_bytes() const { return working_; }
  int64_t peak_working_bytes() const { return peak_working_; }

 private:
  struct Gather {
    Buffer buf;  // per_rank x ranks elements, compute dtype
    Work work;
    bool waited = false;
  };
  struct Reduce {
    int unit = 0;  // shard unit
    Buffer grad, out;
    Work work;
  };
  const std::vector<int>& segments(int grad_unit) const { return shards_.by_grad_unit[size_t(grad_unit)]; }
  int segment_at(int grad_unit, int64_t at) const;  // the one of grad_unit's segments holding `at`
  Comm& group_of(const ZeroUnit& u) const { return u.group ? *experts_ : group_; }
  Tensor slot(const Tensor& shard, const ZeroUnit& u) const;  // u's slot of a shard tensor
  void start_gather(int seg);   // a shard unit (segment)
  void wait_gather(int seg);
  void free_gather(int seg);
  void start_unit(int grad_unit);  // each segment's gather
  void wait_unit(int grad_unit);
  void reap(bool all);           // finished reduce-scatters into the shard (all: wait for each)
  void reduce(int grad_unit);    // start grad unit's reduce-scatter
  void account(int64_t delta);
  // Unit buffers are reused, not freed: a device backend's free waits for
  // its stream (CUDA: cudaStreamSynchronize + cudaFree), which would stall
  // every overlap. take() returns the smallest kept buffer of at least
  // `bytes` (else a new one), give() keeps one for later.
  Buffer take(size_t bytes);
  void give(Buffer b);
  // The units a pass needs after `unit`, in its order (grad-unit indices).
  std::vector<int> upcoming(Pass pass, int grad_unit) const;

  Model& model_;
  Backend& be_;
  Comm& group_;
  Comm* experts_;
  ZeroOptions opt_;
  ZeroShards shards_;
  DType wdt_, mdt_;   // compute and master dtypes
  int n_units_ = 0;   // grad units
  std::vector<int> chunk_of_;  // per grad unit: its model chunk
  Buffer master_, compute_, grad_;  // shards
  std::map<int, Gather> gathered_;  // shard unit -> its gathered weights (ZeRO-3)
  std::map<int, Buffer> unit_grads_;  // shard unit -> its gradient this micro-batch
  std::deque<Reduce> reducing_;
  std::vector<Buffer> pool_;  // buffers given back, for take()
  ZeroTimes cur_, last_;
  int64_t working_ = 0, peak_working_ = 0;
  std::function<double()> now_ = [] { return wall_seconds(); };
};

}  // namespace adgt

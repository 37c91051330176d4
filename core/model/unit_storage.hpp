// Where a model's weights and gradients live when this rank does not keep
// them whole (ZeRO-2: the gradients; ZeRO-3: the weights too;
// parallel/dp/zero_store.hpp, docs/zero.md). The storage is by gradient
// unit (Model::grad_units: a layer, the embedding, the final norm with the
// head). The model names each unit before a pass computes with it, and
// reads a unit's weights or gradients only between that call and the
// next; the storage gathers, prefetches, frees and reduces around it.
#pragma once
#include <cstdint>
#include <vector>

namespace adgt {

class UnitStorage {
 public:
  enum class Pass { Forward, Backward };
  virtual ~UnitStorage() = default;
  virtual bool holds_weights() const = 0;  // else the model's flat weight buffer holds them
  virtual bool holds_grads() const = 0;    // else the model's flat gradient buffer
  // The pass is about to compute unit `unit` (an index into grad_units()),
  // reading the weights of `reads` (the unit itself and, for a layer's
  // forward, the next unit's first norm at its end; the tied embedding for
  // the head). The unit's weights are ready when this returns; another
  // read's may still be arriving (weights() waits for them).
  virtual void begin_unit(Pass pass, int unit, const std::vector<int>& reads) = 0;
  // The backward has completed unit `unit`'s gradients for this micro-batch.
  virtual void grads_done(int unit) = 0;
  // The address of flat element `at` of unit `unit`'s whole weights (compute
  // dtype) / gradients (master dtype); a parameter's elements are contiguous
  // there (a unit may be held in pieces: its dense and its expert weights).
  virtual char* weights(int unit, int64_t at) = 0;
  virtual char* grads(int unit, int64_t at) = 0;
};

}  // namespace adgt

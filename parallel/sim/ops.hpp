// The ops one rank runs, with their local shapes, and what each costs
// (docs/simulator.md, "Cost tables"): the simulator's per-op cost table. Two
// sources, one interface:
//  - DeviceModelCosts: a roofline of the cluster's device (cluster.hpp's
//    Device) with size-dependent efficiency for GEMMs and attention;
//  - ProfileCosts (profile.hpp): each op timed on the backend in use at its
//    exact shape, cached in a JSON file.
#pragma once
#include <cstdint>
#include <string>
#include <utility>

#include "parallel/cluster/cluster.hpp"

namespace adgt::sim {

enum class OpKind : uint8_t {
  GemmForward,      // y(m,n) = x(m,k) w(n,k)^T             Backend::linear_forward
  GemmInputGrad,    // dx(m,n) = dy(m,k) w(k,n)             linear_backward, dx only
  GemmWeightGrad,   // dw(m,n) += dy(k,m)^T x(k,n)          linear_backward, dw only
  AttentionForward, // causal GQA core: a=B, b=T, c=heads, d=kv heads, e=head_dim
  AttentionBackward,
  RmsNormForward,   // a=rows, b=width (the residual rmsnorm counts the same)
  RmsNormBackward,
  RopeForward,      // a=tokens, b=heads, c=head_dim (one of q or k)
  RopeBackward,
  SwigluForward,    // a=tokens, b=ffn width
  SwigluBackward,
  Add,              // y += x over a elements
  EmbeddingForward, // a=tokens, b=width, c=local vocabulary
  EmbeddingBackward,
  CrossEntropy,     // a=tokens, b=local vocabulary: forward and its gradient (one op)
  AdamW,            // a=elements (fp32 master; b=1 with the bf16 copy cast)
  SumSquares,       // a=elements (the gradient norm)
  // Attention without FlashAttention (Megatron-LM before it; adgt-sim
  // --attention unfused): the scores materialised in memory.
  BatchedGemm,      // a=batch, b=m, c=n, d=k: a GEMMs of (m, k) x (k, n)
  Softmax,          // a=rows, b=columns: fused scale-mask-softmax, read and write
  SoftmaxBackward,  // a=rows, b=columns
  Dropout,          // a=elements: the mask drawn and applied (forward), or applied (backward)
  // Context parallelism's ring (parallel/cp/ring_attention.hpp): one block
  // of b queries against b keys, with its log-sum-exp, full (unmasked) or
  // with Op::causal the causal diagonal block; a=B, b=T, c=heads, d=kv
  // heads, e=head_dim. Backend::attention_block_*.
  AttentionBlockForward,
  AttentionBlockBackward,
  // train.dtype fp8 (docs/fp8.md): the amax and the cast of a = elements of
  // a GEMM operand to FP8 codes (and their transpose on CUDA).
  Fp8Cast,
};
constexpr int kNumOpKinds = 24;
const char* op_kind_name(OpKind k);  // "gemm_forward", ...

struct Op {
  OpKind kind = OpKind::Add;
  int64_t a = 0, b = 0, c = 0, d = 0, e = 0;
  bool fp8 = false;  // a GEMM on FP8 operands (train.dtype fp8: the layers' linears)
  bool causal = false;  // an attention block with the causal mask (AttentionBlock*)
  double flops() const;  // the arithmetic it does (GEMMs 2mnk; attention causal)
  bool operator==(const Op&) const = default;
};
std::string to_string(const Op& op);  // "gemm_forward 2048x768x256"

class OpCosts {
 public:
  virtual ~OpCosts() = default;
  // Seconds for one call of `op` on one device of nominal speed, in `bytes`
  // per element (4 f32, 2 bf16, 8 f64).
  virtual double seconds(const Op& op, int bytes) = 0;
  // Dynamic energy of one call, joules (cluster/power.hpp; the device's idle
  // power is the simulator's to add); < 0: not modelled (no power model, or
  // measured costs).
  virtual double joules(const Op& op, int bytes) {
    (void)op, (void)bytes;
    return -1;
  }
  virtual std::string describe() const = 0;
};

// Roofline: max(flops / (peak x eff(flops)), bytes moved / (hbm x memory
// efficiency)) + kernel_overhead. eff(f) = E f / (f + f_half) with the
// device's GEMM or attention curve; bf16 (or f32) peak by `bytes`, the FP8
// peak (peak_fp8_tflops; the bf16 one where the device has none) for an
// op.fp8 GEMM, whose operands are one byte. Under a power cap
// (device.power.cap_w > 0) the compute side runs at the capped clock
// (cluster/power.hpp) the op's draw at the sustained clock leads to.
class DeviceModelCosts final : public OpCosts {
 public:
  explicit DeviceModelCosts(cluster::Device d) : d_(std::move(d)) {}
  double seconds(const Op& op, int bytes) override;
  double joules(const Op& op, int bytes) override;
  // The clock the op runs at under the cap (1: none, or it fits; and with a
  // limiter, which sets the clock by the step's power: power_slowdown.hpp).
  double clock(const Op& op, int bytes) const;
  // The op as the power model's limiter sees it (power.hpp), at the
  // sustained clock.
  cluster::PowerSegment segment(const Op& op, int bytes) const;
  std::string describe() const override { return "device model (" + d_.name + ")"; }
  // Bytes an op reads and writes (the memory-bound side of the roofline).
  static double bytes_moved(const Op& op, int bytes);

 private:
  // The roofline's two sides at the sustained clock, seconds (no overhead).
  std::pair<double, double> compute_and_memory(const Op& op, int bytes) const;
  int flop_bytes(const Op& op, int bytes) const { return op.fp8 ? 1 : bytes; }
  cluster::Device d_;
};

}  // namespace adgt::sim

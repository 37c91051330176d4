// Op names, FLOPs, bytes and the device roofline (ops.hpp).
#include "parallel/sim/ops.hpp"

#include <algorithm>

#include "parallel/cost/flops.hpp"

namespace adgt::sim {

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::GemmForward: return "gemm_forward";
    case OpKind::GemmInputGrad: return "gemm_input_grad";
    case OpKind::GemmWeightGrad: return "gemm_weight_grad";
    case OpKind::AttentionForward: return "attention_forward";
    case OpKind::AttentionBackward: return "attention_backward";
    case OpKind::RmsNormForward: return "rmsnorm_forward";
    case OpKind::RmsNormBackward: return "rmsnorm_backward";
    case OpKind::RopeForward: return "rope_forward";
    case OpKind::RopeBackward: return "rope_backward";
    case OpKind::SwigluForward: return "swiglu_forward";
    case OpKind::SwigluBackward: return "swiglu_backward";
    case OpKind::Add: return "add";
    case OpKind::EmbeddingForward: return "embedding_forward";
    case OpKind::EmbeddingBackward: return "embedding_backward";
    case OpKind::CrossEntropy: return "cross_entropy";
    case OpKind::AdamW: return "adamw";
    case OpKind::SumSquares: return "sum_squares";
    case OpKind::BatchedGemm: return "batched_gemm";
    case OpKind::Softmax: return "softmax";
    case OpKind::SoftmaxBackward: return "softmax_backward";
    case OpKind::Dropout: return "dropout";
    case OpKind::AttentionBlockForward: return "attention_block_forward";
    case OpKind::AttentionBlockBackward: return "attention_block_backward";
    case OpKind::Fp8Cast: return "fp8_cast";
  }
  return "?";
}

double Op::flops() const {
  switch (kind) {
    case OpKind::GemmForward:
    case OpKind::GemmInputGrad:
    case OpKind::GemmWeightGrad: return gemm_flops(double(a), double(b), double(c));
    case OpKind::AttentionForward:
    case OpKind::AttentionBackward:
      return attention_core_executed_flops(double(a), double(b), double(c), double(e),
                                           kind == OpKind::AttentionBackward);
    case OpKind::AttentionBlockForward:  // every score (a causal block: the causal half)
    case OpKind::AttentionBlockBackward:
      return (causal ? 1 : 2) * attention_core_executed_flops(double(a), double(b), double(c), double(e),
                                                              kind == OpKind::AttentionBlockBackward);
    case OpKind::BatchedGemm: return gemm_flops(double(a), double(b), double(c)) * double(d);
    default: return 0;
  }
}

std::string to_string(const Op& op) {
  std::string s = op_kind_name(op.kind);
  const int64_t dims[5] = {op.a, op.b, op.c, op.d, op.e};
  int n = 0;
  for (int i = 0; i < 5; ++i)
    if (dims[i] != 0) n = i + 1;
  for (int i = 0; i < n; ++i) s += (i ? "x" : " ") + std::to_string(dims[i]);
  if (op.causal) s += " causal";
  return op.fp8 ? s + " fp8" : s;
}

double DeviceModelCosts::bytes_moved(const Op& op, int b) {
  const double a = double(op.a), x = double(op.b), c = double(op.c), d = double(op.d),
               e = double(op.e);
  const int ib = op.fp8 ? 1 : b;  // the operands' bytes
  switch (op.kind) {
    case OpKind::GemmForward:
    case OpKind::GemmInputGrad: return ib * (a * c + x * c) + b * a * x;
    case OpKind::GemmWeightGrad: return ib * (c * a + c * x) + 4 * a * x * 2;  // fp32 dw += 
    case OpKind::Fp8Cast: return b * a * 2 + 2 * a;  // read twice (amax, cast); codes and transpose
    case OpKind::AttentionForward:
    case OpKind::AttentionBlockForward: return b * a * x * (2 * c + 2 * d) * e;
    case OpKind::AttentionBackward:
    case OpKind::AttentionBlockBackward: return b * a * x * (4 * c + 4 * d) * e;
    case OpKind::RmsNormForward: return b * 2 * a * x;
    case OpKind::RmsNormBackward: return b * 3 * a * x;
    case OpKind::RopeForward:
    case OpKind::RopeBackward: return b * 2 * a * x * c;
    case OpKind::SwigluForward: return b * 3 * a * x;
    case OpKind::SwigluBackward: return b * 5 * a * x;
    case OpKind::Add: return b * 3 * a;
    case OpKind::EmbeddingForward: return b * 2 * a * x;
    case OpKind::EmbeddingBackward: return 4 * 2 * a * x;
    case OpKind::CrossEntropy: return b * 3 * a * x;
    case OpKind::AdamW: return 4.0 * 7 * a + (op.b ? 2.0 * a : 0);
    case OpKind::SumSquares: return 4.0 * a;
    case OpKind::BatchedGemm: return b * a * (x * d + d * c + x * c);
    case OpKind::Softmax: return b * 2 * a * x;
    case OpKind::SoftmaxBackward: return b * 3 * a * x;
    case OpKind::Dropout: return (2.0 * b + 1) * a;
  }
  return 0;
}

std::pair<double, double> DeviceModelCosts::compute_and_memory(const Op& op, int bytes) const {
  const double peak =
      (op.fp8 && d_.peak_fp8_flops > 0 ? d_.peak_fp8_flops
       : bytes <= 2                    ? d_.peak_bf16_flops
                                       : d_.peak_fp32_flops) *
      d_.sustained_clock;
  const double f = op.flops();
  double compute = 0;
  if (f > 0) {
    const bool attn = op.kind == OpKind::AttentionForward || op.kind == OpKind::AttentionBackward ||
                      op.kind == OpKind::AttentionBlockForward ||
                      op.kind == OpKind::AttentionBlockBackward;
    const double emax = attn ? d_.attention_efficiency : d_.gemm_efficiency;
    const double half = attn ? d_.attention_half_flops : d_.gemm_half_flops;
    compute = f / (peak * emax * f / (f + half));
  }
  const double memory = bytes_moved(op, bytes) / (d_.hbm_bandwidth * d_.memory_efficiency);
  return {compute, memory};
}

double DeviceModelCosts::clock(const Op& op, int bytes) const {
  if (!d_.power.on() || d_.power.cap_w <= 0 || d_.power.limiter()) return 1.0;
  const auto [compute, memory] = compute_and_memory(op, bytes);
  const double t = std::max(compute, memory) + d_.kernel_overhead;
  const double e = cluster::dynamic_joules(d_.power, op.flops(), flop_bytes(op, bytes), bytes_moved(op, bytes));
  return cluster::capped_clock(d_.power, e / t);
}

cluster::PowerSegment DeviceModelCosts::segment(const Op& op, int bytes) const {
  const auto [compute, memory] = compute_and_memory(op, bytes);
  cluster::PowerSegment s;
  s.compute_s = compute, s.memory_s = memory, s.overhead_s = d_.kernel_overhead;
  s.flop_j = cluster::dynamic_joules(d_.power, op.flops(), flop_bytes(op, bytes), 0);
  s.byte_j = cluster::dynamic_joules(d_.power, 0, flop_bytes(op, bytes), bytes_moved(op, bytes));
  return s;
}

double DeviceModelCosts::seconds(const Op& op, int bytes) {
  const auto [compute, memory] = compute_and_memory(op, bytes);
  return std::max(compute / clock(op, bytes), memory) + d_.kernel_overhead;
}

double DeviceModelCosts::joules(const Op& op, int bytes) {
  if (!d_.power.on()) return -1;
  return cluster::dynamic_joules(d_.power, op.flops(), flop_bytes(op, bytes), bytes_moved(op, bytes),
                                 clock(op, bytes));
}

}  // namespace adgt::sim

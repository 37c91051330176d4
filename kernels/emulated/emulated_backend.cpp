#include "kernels/emulated/emulated_backend.hpp"

#include <cstdlib>
#include <cstring>

#include "kernels/check.hpp"

namespace adgt {

namespace {
size_t reserve_from_env() {
  double gb = 64;
  if (const char* v = std::getenv("ADGT_EMULATED_MEMORY_GB"); v && *v) {
    char* end = nullptr;
    gb = std::strtod(v, &end);
    ADGT_CHECK(end && *end == '\0' && gb > 0,
               "ADGT_EMULATED_MEMORY_GB='" << v << "' is not a positive number of GiB");
  }
  return size_t(gb * double(size_t(1) << 30));
}
}  // namespace

EmulatedBackend::EmulatedBackend() : EmulatedBackend(reserve_from_env()) {}
EmulatedBackend::EmulatedBackend(size_t reserve_bytes) : arena_(reserve_bytes) {}

std::string EmulatedBackend::name() const { return "emulated device (" + cpu_.name() + ")"; }

void EmulatedBackend::dev(const Tensor& t, const char* op, const char* arg, Ranges& r) const {
  if (!t.data) return;
  r.r[r.n++] = {t.data, t.bytes()};
  ADGT_CHECK(arena_.contains(t.data, t.bytes()),
             "emulated device: " << op << "'s " << arg << " " << t.shape_str() << " "
                                 << dtype_name(t.dtype) << " at " << t.data << " is "
                                 << (arena_.in_range(t.data)
                                         ? "not inside one live device buffer (" +
                                               arena_.describe(t.data) + ")"
                                         : std::string("host memory"))
                                 << ": device ops take device tensors only (copy host data "
                                    "with to_device first); on CUDA this would be an illegal "
                                    "address");
}

void* EmulatedBackend::alloc(size_t bytes) { return arena_.alloc(bytes); }

void EmulatedBackend::release(void* p) noexcept {
  const size_t before = arena_.bad_releases();
  arena_.release(p);
  if (arena_.bad_releases() != before)
    defer_error("release", "a pointer that is not a live emulated-device buffer was freed");
}

void EmulatedBackend::to_device(void* dst, const void* src, size_t bytes) {
  throw_deferred_error();
  if (!bytes) return;
  ADGT_CHECK(arena_.contains(dst, bytes),
             "emulated device: to_device's destination " << dst << " (" << bytes
                                                         << " bytes) is not device memory ("
                                                         << arena_.describe(dst) << ")");
  ADGT_CHECK(!arena_.in_range(src), "emulated device: to_device's source "
                                        << src << " is device memory; use copy() between device buffers");
  DeviceArena::Open o(arena_, {{dst, bytes}});
  std::memcpy(dst, src, bytes);
}

void EmulatedBackend::to_host(void* dst, const void* src, size_t bytes) {
  throw_deferred_error();
  ++host_reads_;
  if (!bytes) return;
  ADGT_CHECK(arena_.contains(src, bytes),
             "emulated device: to_host's source " << src << " (" << bytes
                                                  << " bytes) is not device memory ("
                                                  << arena_.describe(src) << ")");
  ADGT_CHECK(!arena_.in_range(dst), "emulated device: to_host's destination "
                                        << dst << " is device memory; use copy() between device buffers");
  DeviceArena::Open o(arena_, {{src, bytes}});
  std::memcpy(dst, src, bytes);
}

void EmulatedBackend::synchronize() {
  ++host_reads_;
  throw_deferred_error();
}

// Every op: check its tensors, open their pages, run the CPU backend's op.
#define ADGT_EMU_OP(op, checks, call)             \
  do {                                            \
    Ranges r_;                                    \
    checks;                                       \
    DeviceArena::Open o_(arena_, r_.r, r_.n);     \
    return cpu_.call;                             \
  } while (0)
#define D(t) dev(t, op, #t, r_)

void EmulatedBackend::zero(Tensor t) {
  const char* op = "zero";
  ADGT_EMU_OP(op, D(t), zero(t));
}
void EmulatedBackend::linear_forward(Tensor y, const Tensor& x, const Tensor& w) {
  const char* op = "linear_forward";
  ADGT_EMU_OP(op, (D(y), D(x), D(w)), linear_forward(y, x, w));
}
void EmulatedBackend::linear_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x,
                                      const Tensor& w, bool accumulate_dx) {
  const char* op = "linear_backward";
  ADGT_EMU_OP(op, (D(dx), D(dw), D(dy), D(x), D(w)), linear_backward(dx, dw, dy, x, w, accumulate_dx));
}
void EmulatedBackend::embedding_forward(Tensor out, const Tensor& table, const Tensor& tokens,
                                        int64_t vocab_start) {
  const char* op = "embedding_forward";
  ADGT_EMU_OP(op, (D(out), D(table), D(tokens)), embedding_forward(out, table, tokens, vocab_start));
}
void EmulatedBackend::embedding_backward(Tensor dtable, const Tensor& dout, const Tensor& tokens,
                                         int64_t vocab_start) {
  const char* op = "embedding_backward";
  ADGT_EMU_OP(op, (D(dtable), D(dout), D(tokens)), embedding_backward(dtable, dout, tokens, vocab_start));
}
void EmulatedBackend::rmsnorm_forward(Tensor out, Tensor rstd, const Tensor& x, const Tensor& w,
                                      double eps) {
  const char* op = "rmsnorm_forward";
  ADGT_EMU_OP(op, (D(out), D(rstd), D(x), D(w)), rmsnorm_forward(out, rstd, x, w, eps));
}
void EmulatedBackend::rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dout, const Tensor& x,
                                       const Tensor& w, const Tensor& rstd) {
  const char* op = "rmsnorm_backward";
  ADGT_EMU_OP(op, (D(dx), D(dw), D(dout), D(x), D(w), D(rstd)), rmsnorm_backward(dx, dw, dout, x, w, rstd));
}
void EmulatedBackend::residual_rmsnorm_forward(Tensor x, const Tensor& y, Tensor out, Tensor rstd,
                                               const Tensor& w, double eps) {
  const char* op = "residual_rmsnorm_forward";
  ADGT_EMU_OP(op, (D(x), D(y), D(out), D(rstd), D(w)), residual_rmsnorm_forward(x, y, out, rstd, w, eps));
}
void EmulatedBackend::rope_forward(Tensor x, const Tensor& cos, const Tensor& sin, int64_t T) {
  const char* op = "rope_forward";
  ADGT_EMU_OP(op, (D(x), D(cos), D(sin)), rope_forward(x, cos, sin, T));
}
void EmulatedBackend::rope_backward(Tensor dx, const Tensor& cos, const Tensor& sin, int64_t T) {
  const char* op = "rope_backward";
  ADGT_EMU_OP(op, (D(dx), D(cos), D(sin)), rope_backward(dx, cos, sin, T));
}
namespace {
// The document-masking boundaries (AttentionShape::doc_start) as a tensor, so
// they are checked to be device memory like every operand; empty when off.
Tensor doc_start_tensor(const AttentionShape& s) {
  if (!s.doc_start) return Tensor();
  return Tensor(const_cast<int32_t*>(s.doc_start), DType::I32, {s.B * s.T});
}
Tensor doc_start_tensor(const AttentionBlock& b) {
  if (!b.q_doc_start) return Tensor();
  return Tensor(const_cast<int32_t*>(b.q_doc_start), DType::I32, {b.B * b.Tq});
}
}  // namespace
int64_t EmulatedBackend::attention_saved_elems(const AttentionShape& s) const {
  return cpu_.attention_saved_elems(s);
}
void EmulatedBackend::attention_forward(Tensor out, Tensor saved, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const AttentionShape& s) {
  const char* op = "attention_forward";
  const Tensor doc_start = doc_start_tensor(s);
  ADGT_EMU_OP(op, (D(out), D(saved), D(q), D(k), D(v), D(doc_start)),
              attention_forward(out, saved, q, k, v, s));
}
void EmulatedBackend::attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                                         const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& out, const Tensor& saved,
                                         const AttentionShape& s) {
  const char* op = "attention_backward";
  const Tensor doc_start = doc_start_tensor(s);
  ADGT_EMU_OP(op, (D(dq), D(dk), D(dv), D(dout), D(q), D(k), D(v), D(out), D(saved), D(doc_start)),
              attention_backward(dq, dk, dv, dout, q, k, v, out, saved, s));
}
void EmulatedBackend::attention_block_forward(Tensor out, Tensor lse, const Tensor& q,
                                              const Tensor& k, const Tensor& v,
                                              const AttentionBlock& b) {
  const char* op = "attention_block_forward";
  const Tensor doc_start = doc_start_tensor(b);
  ADGT_EMU_OP(op, (D(out), D(lse), D(q), D(k), D(v), D(doc_start)),
              attention_block_forward(out, lse, q, k, v, b));
}
void EmulatedBackend::attention_merge(Tensor out, Tensor lse, const Tensor& out_b,
                                      const Tensor& lse_b) {
  const char* op = "attention_merge";
  ADGT_EMU_OP(op, (D(out), D(lse), D(out_b), D(lse_b)), attention_merge(out, lse, out_b, lse_b));
}
void EmulatedBackend::attention_block_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                                               const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& out, const Tensor& lse,
                                               const AttentionBlock& b, bool accumulate_dq) {
  const char* op = "attention_block_backward";
  const Tensor doc_start = doc_start_tensor(b);
  ADGT_EMU_OP(op, (D(dq), D(dk), D(dv), D(dout), D(q), D(k), D(v), D(out), D(lse), D(doc_start)),
              attention_block_backward(dq, dk, dv, dout, q, k, v, out, lse, b, accumulate_dq));
}
void EmulatedBackend::qkv_rope_split(Tensor q, Tensor k, Tensor v, const Tensor& qkv,
                                     const Tensor& cos, const Tensor& sin, int64_t T) {
  const char* op = "qkv_rope_split";
  ADGT_EMU_OP(op, (D(q), D(k), D(v), D(qkv), D(cos), D(sin)), qkv_rope_split(q, k, v, qkv, cos, sin, T));
}
void EmulatedBackend::qkv_rope_merge_backward(Tensor dqkv, const Tensor& dq, const Tensor& dk,
                                              const Tensor& dv, const Tensor& cos,
                                              const Tensor& sin, int64_t T) {
  const char* op = "qkv_rope_merge_backward";
  ADGT_EMU_OP(op, (D(dqkv), D(dq), D(dk), D(dv), D(cos), D(sin)),
              qkv_rope_merge_backward(dqkv, dq, dk, dv, cos, sin, T));
}
void EmulatedBackend::swiglu_packed_forward(Tensor h, const Tensor& gu) {
  const char* op = "swiglu_packed_forward";
  ADGT_EMU_OP(op, (D(h), D(gu)), swiglu_packed_forward(h, gu));
}
void EmulatedBackend::swiglu_packed_backward(Tensor dgu, const Tensor& dh, const Tensor& gu) {
  const char* op = "swiglu_packed_backward";
  ADGT_EMU_OP(op, (D(dgu), D(dh), D(gu)), swiglu_packed_backward(dgu, dh, gu));
}
void EmulatedBackend::swiglu_forward(Tensor h, const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_forward";
  ADGT_EMU_OP(op, (D(h), D(gate), D(up)), swiglu_forward(h, gate, up));
}
void EmulatedBackend::swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dh,
                                      const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_backward";
  ADGT_EMU_OP(op, (D(dgate), D(dup), D(dh), D(gate), D(up)), swiglu_backward(dgate, dup, dh, gate, up));
}
void EmulatedBackend::add_inplace(Tensor y, const Tensor& x) {
  const char* op = "add_inplace";
  ADGT_EMU_OP(op, (D(y), D(x)), add_inplace(y, x));
}
void EmulatedBackend::copy(Tensor dst, const Tensor& src) {
  const char* op = "copy";
  ADGT_EMU_OP(op, (D(dst), D(src)), copy(dst, src));
}
void EmulatedBackend::scale_inplace(Tensor x, double s) {
  const char* op = "scale_inplace";
  ADGT_EMU_OP(op, D(x), scale_inplace(x, s));
}
void EmulatedBackend::cast(Tensor dst, const Tensor& src) {
  const char* op = "cast";
  ADGT_EMU_OP(op, (D(dst), D(src)), cast(dst, src));
}
void EmulatedBackend::fp8_amax(Tensor amax, const Tensor& x, bool accumulate) {
  const char* op = "fp8_amax";
  ADGT_EMU_OP(op, (D(amax), D(x)), fp8_amax(amax, x, accumulate));
}
void EmulatedBackend::fp8_scale(Tensor scale, const Tensor& amax, Fp8Kind kind, int margin) {
  const char* op = "fp8_scale";
  ADGT_EMU_OP(op, (D(scale), D(amax)), fp8_scale(scale, amax, kind, margin));
}
void EmulatedBackend::fp8_quantize(Tensor q, Tensor qt, const Tensor& x, const Tensor& scale) {
  const char* op = "fp8_quantize";
  ADGT_EMU_OP(op, (D(q), D(qt), D(x), D(scale)), fp8_quantize(q, qt, x, scale));
}
void EmulatedBackend::fp8_dequantize(Tensor out, const Tensor& q, const Tensor& scale) {
  const char* op = "fp8_dequantize";
  ADGT_EMU_OP(op, (D(out), D(q), D(scale)), fp8_dequantize(out, q, scale));
}
void EmulatedBackend::combine_rows(Tensor out, const Tensor& y, const Tensor& pos, const Tensor& w,
                                   bool accumulate) {
  const char* op = "combine_rows";
  ADGT_EMU_OP(op, (D(out), D(y), D(pos), D(w)), combine_rows(out, y, pos, w, accumulate));
}
void EmulatedBackend::combine_rows_backward(Tensor dy, Tensor dw, const Tensor& dout,
                                            const Tensor& y, const Tensor& pos, const Tensor& w) {
  const char* op = "combine_rows_backward";
  ADGT_EMU_OP(op, (D(dy), D(dw), D(dout), D(y), D(pos), D(w)), combine_rows_backward(dy, dw, dout, y, pos, w));
}
void EmulatedBackend::moe_route(const MoeRouting& r, const Tensor& logits, const Tensor& bias) {
  const char* op = "moe_route";
  ADGT_EMU_OP(op, (D(r.probs), D(r.choice), D(r.weight), D(r.norm), D(r.w), D(logits), D(bias)),
              moe_route(r, logits, bias));
}
void EmulatedBackend::moe_dispatch_plan(Tensor pos, Tensor send_tok, Tensor stats,
                                        const Tensor& choice, const Tensor& probs,
                                        const Tensor& slot, const MoeCapacity& cap) {
  const char* op = "moe_dispatch_plan";
  ADGT_EMU_OP(op, (D(pos), D(send_tok), D(stats), D(choice), D(probs), D(slot), D(cap.prior)),
              moe_dispatch_plan(pos, send_tok, stats, choice, probs, slot, cap));
}
void EmulatedBackend::moe_router_backward(Tensor dlogits, const MoeRouting& r, const Tensor& dw,
                                          const Tensor& aux_dp, double a) {
  const char* op = "moe_router_backward";
  ADGT_EMU_OP(op, (D(dlogits), D(r.probs), D(r.choice), D(r.weight), D(r.norm), D(dw), D(aux_dp)),
              moe_router_backward(dlogits, r, dw, aux_dp, a));
}
void EmulatedBackend::cross_entropy(Tensor logits, Tensor losses, const Tensor& targets,
                                    double grad_scale) {
  const char* op = "cross_entropy";
  ADGT_EMU_OP(op, (D(logits), D(losses), D(targets)), cross_entropy(logits, losses, targets, grad_scale));
}
void EmulatedBackend::ce_partial_stats(Tensor stats, const Tensor& logits, const Tensor& targets,
                                       int64_t vocab_start, int64_t valid) {
  const char* op = "ce_partial_stats";
  ADGT_EMU_OP(op, (D(stats), D(logits), D(targets)), ce_partial_stats(stats, logits, targets, vocab_start, valid));
}
void EmulatedBackend::ce_combine(Tensor combined, const Tensor& gathered) {
  const char* op = "ce_combine";
  ADGT_EMU_OP(op, (D(combined), D(gathered)), ce_combine(combined, gathered));
}
void EmulatedBackend::ce_finish(Tensor logits, Tensor losses, const Tensor& combined,
                                const Tensor& targets, int64_t vocab_start, int64_t valid,
                                double grad_scale) {
  const char* op = "ce_finish";
  ADGT_EMU_OP(op, (D(logits), D(losses), D(combined), D(targets)),
              ce_finish(logits, losses, combined, targets, vocab_start, valid, grad_scale));
}
double EmulatedBackend::sum_squares(const Tensor& x) {
  const char* op = "sum_squares";
  ++host_reads_;
  ADGT_EMU_OP(op, D(x), sum_squares(x));
}
void EmulatedBackend::sum_squares_ranges(Tensor out, const Tensor& x,
                                         const std::vector<int64_t>& bounds) {
  // The CPU's sums, written on the device side: no host read (as on CUDA).
  const char* op = "sum_squares_ranges";
  const size_t k = bounds.size() / 2;
  ADGT_CHECK(out.dtype == DType::F64 && size_t(out.numel()) >= k && bounds.size() % 2 == 0,
             op << ": out " << out.shape_str() << " " << dtype_name(out.dtype) << " for " << k
                << " ranges (F64, one per range)");
  Ranges r_;
  D(out);
  D(x);
  DeviceArena::Open o_(arena_, r_.r, r_.n);
  const size_t es = dtype_size(x.dtype);
  for (size_t i = 0; i < k; ++i)
    out.ptr<double>()[i] =
        cpu_.sum_squares(Tensor(static_cast<char*>(x.data) + size_t(bounds[2 * i]) * es, x.dtype,
                                {bounds[2 * i + 1] - bounds[2 * i]}));
}
void EmulatedBackend::adamw(Tensor param, const Tensor& grad, Tensor m, Tensor v,
                            const AdamWHyper& h) {
  const char* op = "adamw";
  ADGT_EMU_OP(op, (D(param), D(grad), D(m), D(v)), adamw(param, grad, m, v, h));
}
void EmulatedBackend::adamw_cast(Tensor param, const Tensor& grad, Tensor m, Tensor v, Tensor lowp,
                                 const AdamWHyper& h) {
  const char* op = "adamw_cast";
  ADGT_EMU_OP(op, (D(param), D(grad), D(m), D(v), D(lowp)), adamw_cast(param, grad, m, v, lowp, h));
}

#undef D
#undef ADGT_EMU_OP

}  // namespace adgt

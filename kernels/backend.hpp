// The Backend interface: every piece of math the model and optimizer need, as
// coarse ops on whole tensors (no per-element virtual calls). The CPU reference
// backend (kernels/cpu/) implements it in fp32 and fp64; the CUDA backend
// (kernels/cuda/) is chosen at run time behind the same interface.
//
// Conventions: tensors are row-major; N = B*T token rows; weights are stored
// in HuggingFace layout (out_features, in_features), so a linear layer is
// y = x W^T. "Accumulate" means +=; otherwise outputs are overwritten.
//
// Mixed precision (bf16). Besides all-f32 and all-f64, every op accepts bf16
// activations and weights with these rules:
//  - math in fp32, each bf16 output rounded once (nearest even,
//    kernels/common/bf16.hpp); a bf16 "+=" output is read, added in fp32 and
//    rounded;
//  - parameter gradients are fp32: linear_backward's dw, rmsnorm_backward's
//    dw and embedding_backward's dtable are F32 while x, dy, w are BF16;
//  - statistics are fp32: rmsnorm's rstd, the attention's `saved`, the
//    attention blocks' lse, the rotary cos/sin tables, cross_entropy's
//    losses, ce_* stats/combined/gathered/losses (logits are BF16 and get
//    their gradient in place in BF16), combine_rows_backward's dw (the
//    router weights' gradient; w itself is in the rows' dtype);
//  - sum_squares accepts any float dtype; adamw works on fp32 master weights
//    (adamw_cast also writes their bf16 copy); cast converts between any
//    two float dtypes.
// f32 and f64 calls keep every tensor in the one dtype, as before.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/check.hpp"
#include "kernels/common/fp8.hpp"
#include "kernels/tensor.hpp"

namespace adgt {

struct AdamWHyper {
  double lr = 0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0;
  int64_t step = 1;  // 1-based step count for bias correction
  // The gradient-clipping coefficient, applied as the gradient is read
  // (g * T(grad_scale) in the update's precision; grad itself is left as it
  // is): no separate pass over the gradients. 1 changes nothing, bit for bit.
  double grad_scale = 1;
};

// An FP8 operand of a GEMM: q (E4M3 or E5M2) holds x * scale rounded to FP8,
// so its value is q / scale. qt: the same codes transposed ((cols, rows);
// the CUDA backend's FP8 GEMMs read the backward's operands that way; may be
// empty where a backend does not need it, see fp8_needs_transpose). scale:
// F32 (1) in the backend's memory, a power of two.
struct Fp8Operand {
  Tensor q, qt, scale;
};

struct AttentionShape {
  int64_t B = 0, T = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  // Document masking (train.document_mask): int32 (B*T) in the backend's
  // memory (device memory on CUDA and the emulated device), for each token the
  // position within its sequence (0..T-1) where its document begins:
  // non-decreasing along a sequence, doc_start[b*T + t] <= t. Query t then
  // attends to keys j with doc_start[b*T + t] <= j <= t. nullptr: plain causal.
  const int32_t* doc_start = nullptr;
};

// One block of blockwise (ring) attention: queries (B, Tq, H, hd) against a
// block of keys and values (B, Tk, KV, hd), KV dividing H (grouped-query).
// mask: full — every key of the block is visible to every query; causal —
// the diagonal block of a causal attention (the queries and keys are the same
// Tq == Tk positions): key j is visible to query i iff j <= i.
// Document masking (ring attention over packed documents): q_doc_start, int32
// (B, Tq) in the backend's memory, gives for each query row the position in
// the whole sequence where its document begins, and k_pos the position of the
// block's first key; key j then stays visible to query i only if
// q_doc_start[b*Tq + i] <= k_pos + j. A row that sees no key of the block gets
// out 0 and lse -inf (attention_merge skips it). nullptr: no document mask.
// Every backend runs it (the CUDA block kernels since 2026-12-07:
// kernels/cuda/attention_block_kernels.cuh, AttDims::doc_off).
enum class BlockMask { full, causal };
struct AttentionBlock {
  int64_t B = 0, Tq = 0, Tk = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  BlockMask mask = BlockMask::full;
  const int32_t* q_doc_start = nullptr;
  int64_t k_pos = 0;
};

// Shape/dtype precondition shared by the backends' ops: same dtype, same size.
inline void expect_same(const Tensor& a, const Tensor& b, const char* op) {
  ADGT_CHECK(a.dtype == b.dtype,
             op << ": dtype mismatch " << dtype_name(a.dtype) << " vs " << dtype_name(b.dtype));
  ADGT_CHECK(a.numel() == b.numel(),
             op << ": size mismatch " << a.shape_str() << " vs " << b.shape_str());
}

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual bool is_host() const = 0;  // device memory is host-addressable
  // Whether p points into memory that host code cannot address (device
  // memory of a CUDA or emulated backend): collectives stage such tensors
  // through host memory or hand them to NCCL. Always false when is_host().
  virtual bool is_device_pointer(const void* p) const {
    (void)p;
    return false;
  }

  // ---- memory ----
  virtual void* alloc(size_t bytes) = 0;
  // Never throws: it runs in destructors (~Buffer), also while an exception
  // unwinds. A failure is kept (defer_error) and thrown by the backend's next
  // synchronize(), to_host() or to_device().
  virtual void release(void* p) noexcept = 0;
  // Host memory to device memory. Returns once src may be reused; the copy
  // itself may still be queued (CUDA stages small copies through pinned
  // memory and does not wait), ordered before every later op.
  virtual void to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void zero(Tensor t) = 0;
  // The most bytes alloc() has held at once (the backend's buffers; not its
  // private scratch or the CUDA context); -1 where not tracked (the CPU).
  virtual int64_t peak_allocated_bytes() const { return -1; }
  // The device's memory in bytes (CUDA: cudaMemGetInfo's total; emulated:
  // its arena's reservation); -1 where there is no device limit to respect
  // (host backends).
  virtual int64_t memory_capacity_bytes() const { return -1; }
  // Waits for queued work; throws a failure a noexcept path deferred.
  virtual void synchronize() { throw_deferred_error(); }
  // A named range on a profiler's timeline (CUDA: NVTX, which Nsight Systems
  // shows; log.trace's spans carry the same names, core/trace.hpp), pushed
  // and popped in nested order on the calling thread. Default: nothing.
  virtual bool has_ranges() const { return false; }
  virtual void range_push(const char* name) { (void)name; }
  virtual void range_pop() {}
  // Dense matmul peak in TFLOP/s for MFU: measured (CPU: an sgemm timing) or
  // the device's rated figure. Non-positive when unknown.
  virtual double peak_tflops() = 0;
  // Whether peak_tflops() is a measurement (the CPU's sgemm) rather than a rated figure.
  virtual bool peak_is_measured() const { return is_host(); }
  // Measures again and keeps the best figure (a measurement taken while the
  // machine was busy reads low); returns the updated peak.
  virtual double remeasure_peak_tflops() { return peak_tflops(); }
  // The peak for GEMMs on `dt` inputs (bf16 runs on the tensor cores at a
  // higher rate than fp32 on GPUs); the CPU's measured sgemm otherwise.
  virtual double peak_tflops_for(DType dt) {
    (void)dt;
    return peak_tflops();
  }

  // ---- linear layers ----
  // y(N,O) = x(N,I) w(O,I)^T
  virtual void linear_forward(Tensor y, const Tensor& x, const Tensor& w) = 0;
  // dx(N,I) (=|+=) dy(N,O) w(O,I); dw(O,I) += dy^T x. Either dx or dw may be empty
  // (data == nullptr): split backwards compute them at different times.
  virtual void linear_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x,
                               const Tensor& w, bool accumulate_dx) = 0;

  // ---- embedding ----
  // out(N,C) = table(Vl,C)[tokens(N) - vocab_start]; rows whose token is outside
  // [vocab_start, vocab_start + Vl) (another rank's vocabulary shard) are zero.
  virtual void embedding_forward(Tensor out, const Tensor& table, const Tensor& tokens,
                                 int64_t vocab_start = 0) = 0;
  // dtable(Vl,C) += scatter(dout(N,C)) over the tokens in this shard — deterministic.
  virtual void embedding_backward(Tensor dtable, const Tensor& dout, const Tensor& tokens,
                                  int64_t vocab_start = 0) = 0;

  // ---- RMSNorm ----
  // out(N,C) = x * rstd * w; rstd(N) saved.
  virtual void rmsnorm_forward(Tensor out, Tensor rstd, const Tensor& x, const Tensor& w,
                               double eps) = 0;
  // dx(N,C) += d/dx; dw(C) += d/dw.
  virtual void rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dout, const Tensor& x,
                                const Tensor& w, const Tensor& rstd) = 0;
  // x(N,C) += y; out = rmsnorm(x): the residual add fused with the next norm
  // (one read of x and y instead of three passes). Same numbers as add_inplace
  // then rmsnorm_forward (each rounds x to its dtype before the norm).
  virtual void residual_rmsnorm_forward(Tensor x, const Tensor& y, Tensor out, Tensor rstd,
                                        const Tensor& w, double eps) {
    add_inplace(x, y);
    rmsnorm_forward(out, rstd, x, w, eps);
  }

  // ---- rotary embedding, HuggingFace rotate-half, in place on x(B*T, H, hd) ----
  // cos, sin: (T, hd/2) tables.
  virtual void rope_forward(Tensor x, const Tensor& cos, const Tensor& sin, int64_t T) = 0;
  virtual void rope_backward(Tensor dx, const Tensor& cos, const Tensor& sin, int64_t T) = 0;

  // ---- the fused q/k/v projection's rotary (train.fused_projections) ----
  // qkv(B*T, Hq + 2 KV, hd) holds each row's q, k and v heads side by side
  // (one GEMM's output). Split: q(B*T, Hq, hd) and k(B*T, KV, hd) get their
  // heads rotated as rope_forward does, v(B*T, KV, hd) a copy. Merge (the
  // backward): dqkv's q and k heads are rope_backward of dq and dk, its v
  // heads dv; dq, dk and dv are not changed. The same numbers as
  // rope_forward / rope_backward on separate tensors, bit for bit.
  virtual void qkv_rope_split(Tensor q, Tensor k, Tensor v, const Tensor& qkv, const Tensor& cos,
                              const Tensor& sin, int64_t T) = 0;
  virtual void qkv_rope_merge_backward(Tensor dqkv, const Tensor& dq, const Tensor& dk,
                                       const Tensor& dv, const Tensor& cos, const Tensor& sin,
                                       int64_t T) = 0;

  // ---- causal grouped-query attention (document-masked with s.doc_start) ----
  // q(B,T,H,hd), k,v(B,T,KV,hd) -> out(B,T,H,hd). `saved` holds what the backward
  // needs; its element count is attention_saved_elems().
  virtual int64_t attention_saved_elems(const AttentionShape& s) const = 0;
  virtual void attention_forward(Tensor out, Tensor saved, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const AttentionShape& s) = 0;
  // dq, dk, dv overwritten.
  virtual void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                                  const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& saved,
                                  const AttentionShape& s) = 0;

  // ---- blockwise attention with log-sum-exp statistics (ring attention,
  // parallel/cp/) ----
  // The attention of a query block over several key blocks is built one key
  // block at a time: each block's (out_b, lse_b) is merged into a running
  // (out, lse) by the online-softmax rule, and the backward of each block
  // needs only the final (out, lse). lse (B, H, Tq) is in the statistics
  // dtype (f32 for bf16 and f32 activations, f64 for f64); -inf means "no
  // key seen yet". A backend without these ops throws "not implemented on
  // this backend" (CPU, emulated and CUDA have them; CUDA's are the exact
  // kernels, without the document mask: AttentionBlock).
  //
  // out(B,Tq,H,hd) = softmax(scale q k^T + mask) v over the block's keys,
  // lse(B,H,Tq) = log sum_j exp(scale q_i . k_j) over the visible keys,
  // scale = 1/sqrt(hd). Both overwritten.
  virtual void attention_block_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const AttentionBlock& b);
  // Merges a block's partial result into the running one, per (b, h, i):
  // lse' = log(exp(lse) + exp(lse_b)), out' = exp(lse - lse') out +
  // exp(lse_b - lse') out_b (computed around the larger lse, so it never
  // overflows; an lse of -inf contributes nothing). out, out_b (B,Tq,H,hd);
  // lse, lse_b (B,H,Tq), three-dimensional (they give the shape); out and
  // lse updated in place.
  virtual void attention_merge(Tensor out, Tensor lse, const Tensor& out_b, const Tensor& lse_b);
  // The block's gradient given the FINAL merged out (B,Tq,H,hd) and lse
  // (B,H,Tq) of the whole attention: with P = exp(scale q k^T - lse) on the
  // visible keys and D = rowsum(dout * out) per (b, h, i),
  //   dv(B,Tk,KV,hd) = P^T dout, dk = scale dS^T q (both overwritten; the
  //   heads of a kv group summed), dq (=|+=) scale dS k,
  // where dS = P * (dout v^T - D). Summed over every key block, these are
  // attention_backward's gradients.
  virtual void attention_block_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                                        const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& out, const Tensor& lse,
                                        const AttentionBlock& b, bool accumulate_dq);

  // ---- SwiGLU: h = silu(gate) * up ----
  virtual void swiglu_forward(Tensor h, const Tensor& gate, const Tensor& up) = 0;
  virtual void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dh, const Tensor& gate,
                               const Tensor& up) = 0;

  // The fused gate/up projection's SwiGLU: gu(N, 2F) holds each row's gate
  // (columns [0, F)) and up ([F, 2F)); h(N, F) = silu(gate) * up, and
  // dgu(N, 2F) = (dgate | dup). Per element the numbers of swiglu_forward /
  // swiglu_backward on separate tensors.
  virtual void swiglu_packed_forward(Tensor h, const Tensor& gu) = 0;
  virtual void swiglu_packed_backward(Tensor dgu, const Tensor& dh, const Tensor& gu) = 0;

  // ---- elementwise ----
  virtual void add_inplace(Tensor y, const Tensor& x) = 0;  // y += x
  virtual void copy(Tensor dst, const Tensor& src) = 0;
  virtual void scale_inplace(Tensor x, double s) = 0;
  // dst = src converted to dst's dtype (f32/f64/bf16, same element count).
  virtual void cast(Tensor dst, const Tensor& src) = 0;

  // ---- FP8 (train.dtype: fp8; docs/fp8.md, kernels/common/fp8.hpp) ----
  // The defaults refuse with a named error; the CPU backend (and the
  // emulated device) implement them exactly, the CUDA backend with kernels.
  // amax (F32 (1)) = max |x| over x (BF16 or F32); accumulate: max(amax, that).
  // A NaN in x makes amax NaN.
  virtual void fp8_amax(Tensor amax, const Tensor& x, bool accumulate);
  // scale (F32 (1)) = 2^fp8_scale_exponent(amax[0], kind, margin), computed
  // where the tensors live (no host read).
  virtual void fp8_scale(Tensor scale, const Tensor& amax, Fp8Kind kind, int margin);
  // q (E4M3 | E5M2, x's shape) = float_to_fp8(x * scale[0]) for x (rows, cols)
  // in BF16 or F32; qt (optional, (cols, rows), q's dtype) = q transposed.
  virtual void fp8_quantize(Tensor q, Tensor qt, const Tensor& x, const Tensor& scale);
  // out (BF16 | F32) = fp8_to_float(q) / scale[0] (exact in F32; rounded once in BF16).
  virtual void fp8_dequantize(Tensor out, const Tensor& q, const Tensor& scale);
  // Why this device cannot run FP8 GEMMs ("" when it can): the CUDA backend
  // below sm_89 (FP8 tensor cores are Ada's and Hopper's).
  virtual std::string fp8_unsupported() const { return ""; }
  // Whether linear_*_fp8 read the transposed codes (qt) of dy, x and w.
  virtual bool fp8_needs_transpose() const { return false; }
  // The row count an FP8 GEMM's operands must be a multiple of to take the
  // backend's FP8 GEMMs rather than its dequantized fallback (cuBLASLt: 16;
  // the emulated device models the same). Fp8Linears pads rows to it (a MoE
  // expert's rows are any count).
  virtual int64_t fp8_row_multiple() const { return 1; }
  // FP8 GEMMs with fp32 accumulation: linear_forward / linear_backward on the
  // operands' values (q / scale), outputs as their bf16 versions give them
  // (y, dx BF16 rounded once, dw F32 accumulated). The default dequantizes
  // into fp32 scratch and runs the fp32 GEMMs: the exact emulation.
  virtual void linear_forward_fp8(Tensor y, const Fp8Operand& x, const Fp8Operand& w);
  virtual void linear_backward_fp8(Tensor dx, Tensor dw, const Fp8Operand& dy,
                                   const Fp8Operand& x, const Fp8Operand& w, bool accumulate_dx);

  // ---- indexed rows (mixture-of-experts combine; the dispatch's row gather is
  // embedding_forward with the row indices as tokens) ----
  // out(N,C) (=|+=) sum over j < k, ascending, with pos[t,j] >= 0 of
  // w[t,j] * y[pos[t,j]]; pos (N,k) int32 rows of y(M,C); w (N,k) in out's dtype,
  // or empty (data == nullptr) for weights 1. A row with no pos >= 0 is 0 (or kept).
  virtual void combine_rows(Tensor out, const Tensor& y, const Tensor& pos, const Tensor& w,
                            bool accumulate) = 0;
  // combine_rows' backward: dy[pos[t,j]] = w[t,j] * dout[t] (dout[t] with w empty)
  // for every pos >= 0 (each row of dy named at most once; rows not named are left
  // as they are); dw(N,k) = <dout[t], y[pos[t,j]]>, 0 where pos < 0. Either of
  // dy, dw may be empty.
  virtual void combine_rows_backward(Tensor dy, Tensor dw, const Tensor& dout, const Tensor& y,
                                     const Tensor& pos, const Tensor& w) = 0;

  // ---- mixture-of-experts routing (core/model/moe.hpp's semantics) ----
  // Routing math is in R = f64 for f64 logits, else f32 (bf16 logits read as
  // fp32); the router backward's in f64. Every op here is deterministic.
  struct MoeRouting {
    Tensor probs;   // (N, E) R: softmax of the logits
    Tensor choice;  // (N, k) int32: the top-k experts by probs + bias, descending, ties to the lower id
    Tensor weight;  // (N, k) R: the chosen probs / norm
    Tensor norm;    // (N) R: the sum of the chosen probs, in choice order
    Tensor w;       // (N, k) in the logits' dtype: weight, combine_rows' weights
  };
  // Fills r from logits (N, E) (any float dtype); bias: F64 (E) added to the
  // selection score only, or empty. k = r.choice's columns.
  virtual void moe_route(const MoeRouting& r, const Tensor& logits, const Tensor& bias) = 0;
  // An expert's capacity in moe_dispatch_plan. factor <= 0: dropless. The
  // rows are cut into runs of `segment` rows (0: one run of all N); each run
  // is part of a capacity group of `group_rows` rows (0: the run is its own
  // group), which may span runs on other ranks (context parallelism cuts a
  // group into chunks). Expert e keeps at most cap = ceil(factor x
  // group_rows x k / E) of a group's assignments to it, in assignment order:
  // in a run, those before the group's cap-th, counting `prior` (I32 (N /
  // segment, E): the assignments to e in the run's group before the run;
  // empty: none, and N % segment == 0 is then not needed).
  struct MoeCapacity {
    double factor = 0;
    int64_t segment = 0;
    int64_t group_rows = 0;
    Tensor prior;
  };
  // The dispatch plan. slot (E) int32: each expert's place in the send order
  // (destination rank x experts per rank + local index; a permutation of
  // 0..E-1). Capacity (cap.factor > 0): per group (MoeCapacity), expert e
  // keeps the first ceil(factor * rows * k / E) of the group's assignments to
  // it in assignment order (t*k+j); the rest are dropped. Out:
  //   pos (N, k) int32: the send row of each kept assignment, -1 if dropped;
  //     send rows are by slot, then assignment order;
  //   send_tok (>= N*k) int32: the token of each send row (the first
  //     sum(kept) entries are written);
  //   stats F64 (2E + 2 + E): [assignments routed to each expert before drops
  //     (E), the column sums of probs (E), N, dropped, kept per slot (E)].
  virtual void moe_dispatch_plan(Tensor pos, Tensor send_tok, Tensor stats, const Tensor& choice,
                                 const Tensor& probs, const Tensor& slot,
                                 const MoeCapacity& cap) = 0;
  // dlogits (N, E), in the logits' dtype, = softmax backward of g, where
  // g[e] = a * aux_dp[e] + sum over j with choice[t,j] == e of
  // (dw[t,j] - sum_i dw[t,i] weight[t,i]) / norm[t]; dw (N, k) in the
  // statistics dtype (combine_rows_backward's), aux_dp F64 (E). Math in f64.
  virtual void moe_router_backward(Tensor dlogits, const MoeRouting& r, const Tensor& dw,
                                   const Tensor& aux_dp, double a) = 0;

  // ---- fused classifier ----
  // logits(N,V) -> per-token losses(N) (fp32/fp64 like logits); logits are
  // replaced by dloss/dlogits * grad_scale. Rows whose target is < 0 are
  // ignored (loss 0, gradient 0). Returns nothing; read losses back.
  virtual void cross_entropy(Tensor logits, Tensor losses, const Tensor& targets,
                             double grad_scale) = 0;

  // ---- vocab-parallel classifier (logits split over ranks by vocabulary) ----
  // Per row of this rank's logits(N, Vl) (only the first `valid` columns are real
  // vocabulary; columns map to ids vocab_start + j): stats(N,3) = [max m,
  // sum exp(x - m), the target's logit if this rank owns it else 0].
  virtual void ce_partial_stats(Tensor stats, const Tensor& logits, const Tensor& targets,
                                int64_t vocab_start, int64_t valid) = 0;
  // gathered(R,N,3) from all R ranks in rank order -> combined(N,3) = [global max M,
  // sum_r s_r exp(m_r - M), target logit]; identical on every rank.
  virtual void ce_combine(Tensor combined, const Tensor& gathered) = 0;
  // losses(N) = log S + M - target logit (0 for ignored rows); logits are replaced
  // by grad_scale * (softmax - onehot) over the valid columns (padding columns 0).
  virtual void ce_finish(Tensor logits, Tensor losses, const Tensor& combined,
                         const Tensor& targets, int64_t vocab_start, int64_t valid,
                         double grad_scale) = 0;

  // ---- optimizer ----
  // Sum of squares of x as double.
  virtual double sum_squares(const Tensor& x) = 0;
  // out[i] (F64 (k), device memory) = sum_squares(x[bounds[2i], bounds[2i+1])),
  // bit for bit, left on the device: k sums for one host read instead of k.
  // The default computes each on the host and copies them in.
  virtual void sum_squares_ranges(Tensor out, const Tensor& x, const std::vector<int64_t>& bounds);
  // Calls that waited for the device to hand the host a value (to_host,
  // sum_squares, synchronize, take_marks) since the backend was made; -1
  // where not counted (the CPU, whose memory the host reads directly).
  virtual int64_t host_reads() const { return -1; }

  // Timestamps of the backend's queue without waiting on it (the pipeline
  // executor's timeline): mark() records "now" as the device reaches it (CUDA:
  // an event on the stream; the CPU: the clock, its ops being done when they
  // return) and returns its index since the last take_marks(); take_marks()
  // waits once and returns every mark's seconds after the first, then clears.
  virtual int mark();
  virtual std::vector<double> take_marks();
  // The backend's own time for spans of its queue, read later without a wait
  // of their own (the expert controller's capacities: what a rank's experts
  // and its dense layers take). span_begin() opens a span and returns its id
  // (-1: not measured here), span_end(id) closes it; span_seconds(id) is the
  // time between (-1 for id -1), waiting for the span's end if it has not
  // been reached; clear_spans() ends the ids' life (the next span_begin()
  // reuses them). The CPU: the calling thread's CPU time, measured only
  // when the rank computes with one thread (what the rank did itself when
  // ranks share cores); CUDA: events on the stream (cudaEventElapsedTime).
  // At most kMaxSpans between clear_spans() calls (the model clears them
  // every step); later ones are not measured.
  static constexpr int kMaxSpans = 1 << 16;
  virtual int span_begin();
  virtual void span_end(int id);
  virtual double span_seconds(int id);
  virtual void clear_spans();
  // What a host backend's spans are timed on instead of the thread's CPU
  // time, in seconds (the emulation's model clock: the counted matmul FLOPs
  // at its rate, parallel/emulate/clock.hpp); measured then whatever the
  // threads. Empty: the thread's CPU time again.
  void set_span_clock(std::function<double()> c) { span_clock_ = std::move(c); }
  // One AdamW step on a flat range (PyTorch's AdamW update order).
  virtual void adamw(Tensor param, const Tensor& grad, Tensor m, Tensor v,
                     const AdamWHyper& h) = 0;
  // adamw on fp32 master weights `param`, then lowp = param in lowp's dtype
  // (bf16): the mixed-precision step. Backends fuse it into one pass.
  virtual void adamw_cast(Tensor param, const Tensor& grad, Tensor m, Tensor v, Tensor lowp,
                          const AdamWHyper& h) {
    adamw(param, grad, m, v, h);
    cast(lowp, param);
  }

 protected:
  // A failure on a path that must not throw (release), kept until the next
  // synchronize/to_host/to_device; the first one is kept, later ones counted.
  void defer_error(const char* op, const char* what) noexcept;
  // Throws the deferred failure, if any, and clears it.
  void throw_deferred_error();

 private:
  std::string deferred_error_;
  int deferred_more_ = 0;
  std::vector<std::chrono::steady_clock::time_point> marks_;
  std::vector<double> spans_;  // per span: begin, end (thread CPU seconds; end -1 while open)
  std::function<double()> span_clock_;
};

// Owns memory on a backend.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend& be, size_t bytes) : be_(&be), bytes_(bytes) {
    if (bytes) p_ = be.alloc(bytes);
  }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      be_ = o.be_; p_ = o.p_; bytes_ = o.bytes_;
      o.p_ = nullptr; o.bytes_ = 0;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }
  void reset() noexcept {
    if (p_ && be_) be_->release(p_);
    p_ = nullptr; bytes_ = 0;
  }
  void* data() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  Backend* be_ = nullptr;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// What the CUDA runtime says about devices: how many are visible, or why it
// could not tell (a CUDA error other than "no device": an old driver, a
// broken installation). Without a CUDA build: 0 devices, no error.
struct DeviceQuery {
  int count = 0;
  std::string error;  // "" or "cudaErrorInsufficientDriver (CUDA driver version is insufficient ...)"
  // Whether an NVIDIA driver is installed at all (libcuda.so.1 loads, or
  // /dev/nvidiactl exists). Without one, train.device=auto uses the CPU
  // silently: the runtime's error is then only "there is no GPU here".
  bool driver = true;
};
DeviceQuery cuda_device_query();
// libcuda.so.1 can be loaded, or /dev/nvidiactl exists.
bool nvidia_driver_present();
// Whether this binary has the CUDA backend.
bool cuda_backend_built();
// Number of visible CUDA devices (0 when CUDA is not built, on no device or on any error).
int cuda_device_count();

// The device a run gets for train.device = `device` ("auto", "cpu", "cuda" or
// "emulated": the CPU backend behind the device boundary,
// kernels/emulated/emulated_backend.hpp), from a device query and whether the binary has the CUDA backend:
// "cpu" or "cuda", and for auto falling back to the CPU because of a CUDA
// error, a warning naming it (else ""). Throws with the cause and a fix
// (cuda without a device, without the backend, or with a CUDA error; an
// unknown name). Pure: tests pass fake queries.
struct DeviceChoice {
  std::string device;
  std::string warning;
};
DeviceChoice choose_device(const std::string& device, const DeviceQuery& q, bool cuda_built);

// "cpu", "cuda" or "emulated"; "auto" picks CUDA when a GPU is visible and the CUDA
// backend is built (choose_device; its warning goes to stderr). Throws with a
// clear message otherwise.
// cuda_device: the GPU index for "cuda" (a rank's pick_local_device), or -1
// for the current device.
std::unique_ptr<Backend> make_backend(const std::string& device, int cuda_device = -1);

// The UUID of CUDA device `device` ("GPU-xxxxxxxx-..."), the id the device
// assignment check compares across ranks (indices repeat under per-task
// CUDA_VISIBLE_DEVICES). Throws without CUDA or on a CUDA error.
std::string cuda_device_uuid(int device);

}  // namespace adgt

// The LLaMA decoder (LlamaForCausalLM semantics) written against the Backend
// interface: hand-written forward and backward, no autograd. Model math knows
// nothing about ranks: shapes come from this rank's parameter shards, and the
// few collectives tensor parallelism needs go through the Comm it is given
// (a SelfComm for one process).
//
// Tensor parallelism (Megatron): column-parallel q/k/v and gate/up, row-parallel
// o and down (their partial outputs all-reduced), vocab-parallel embedding and
// cross-entropy (logits stay split by vocabulary). With sequence parallelism the
// residual stream and norms hold N/tp token rows: all-gather before the
// column-parallel layers, reduce-scatter after the row-parallel ones.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/comm.hpp"
#include "core/config.hpp"
#include "core/model/context_attention.hpp"
#include "core/model/fp8_linear.hpp"
#include "core/model/moe.hpp"
#include "core/model/param_table.hpp"
#include "core/model/stage_slice.hpp"
#include "core/model/unit_storage.hpp"
#include "kernels/backend.hpp"

namespace adgt {

struct TensorParallel {
  Comm* comm = nullptr;            // the tp group; nullptr = a single rank
  bool sequence_parallel = false;  // ignored when the group has one rank
  int64_t flat_multiple = 16;      // flat buffers are padded to a multiple of this (ZeRO chunks)
};

// Expert parallelism (mixture-of-experts models): the ep group and the
// owner ep rank of each expert (empty: contiguous blocks).
struct ExpertParallel {
  Comm* comm = nullptr;
  std::vector<int> placement;
  // Context parallelism: the cp group, whose ranks hold the rest of each
  // sequence; the aux loss is over all of its tokens (MoeLayer's aux_group),
  // as one process computes it over the whole micro-batch. nullptr: none.
  Comm* aux_group = nullptr;
};

// One MoE layer's figures, summed over the micro-batches since the last
// reset_moe_stats() (loads and drops over the ep group).
struct MoeLayerStep {
  int64_t layer = 0;              // global layer index
  std::vector<int64_t> load;      // (E) assignments per expert, before drops
  int64_t tokens = 0, dropped = 0;
  double aux = 0;                 // sum of the aux loss values (without coef)
  int64_t calls = 0;              // forwards
  int64_t a2a_bytes = 0;          // this rank's all-to-all payload, forward + backward
  double a2a_seconds = 0;
  int64_t expert_rows = 0;  // rows this rank's experts computed, forward + backward
  int64_t shadow_rows = 0;  // of expert_rows (forward), the replicas' (MoeStats::shadow_rows)
};

// One MoE layer's backend time since the last reset_moe_stats(), forward +
// backward (Backend::span_seconds: the rank's thread CPU time on the CPU,
// events on CUDA); -1 where not measured (several threads per rank).
struct MoeLayerTimes {
  double expert_s = -1;  // this rank's experts (its local FFNs)
  // The layer outside its MoE block (its attention branch and norms,
  // recomputation included): the same work on every rank of a pipeline
  // stage, so its time measures the rank's speed (the expert controller's
  // capacities).
  double dense_s = -1;
};

// Activation recompute (train.recompute): what a layer keeps per micro-batch
// in flight, the rest recomputed in its backward from what it kept, with the
// forward's own ops in the forward's order (bitwise the numbers of keeping
// everything). Recomputed activations live in one shared set of layer
// buffers, so their memory is paid once instead of once per layer and slot.
//   None:      everything (the default).
//   Selective: Megatron-Core's: the attention core (its output and the
//              backend's saved statistics: the CPU's T x T probabilities)
//              and the SwiGLU product are recomputed; an MoE layer's expert
//              FFN keeps its own state.
//   Full:      the first `layers` layers of each model chunk (0: all) keep
//              only their input and recompute the rest of the layer (an MoE
//              layer's experts and routing are not re-run: the MoE block
//              keeps its state); the other layers keep everything.
enum class Recompute { None, Selective, Full };
struct RecomputePolicy {
  Recompute mode = Recompute::None;
  int64_t layers = 0;  // Full: layers per chunk that recompute, from its first; 0 = all
};
Recompute parse_recompute(const std::string& s);  // "none" | "selective" | "full"

// A flat range [begin, end) of parameters whose gradients a backward
// completes together (a layer; the final norm with the head; the embedding).
struct GradUnit {
  int chunk = 0;
  int64_t begin = 0, end = 0;
};

class Model {
 public:
  // B sequences of T tokens per micro-batch; dtype F32 (or F64 for reference
  // checks), or BF16 for mixed precision: bf16 weights and activations, with
  // fp32 master weights, gradients and statistics (see kernels/backend.hpp).
  // `stage`: the part of the model this rank holds under pipeline parallelism
  // (nullptr: the whole model, one chunk with embedding and head).
  // fused: one GEMM for q/k/v and one for gate/up (train.fused_projections;
  // the weights are adjacent in the flat buffer, core/model/param_table.hpp).
  // The forward's numbers are the unfused path's bit for bit; the input
  // gradient of a fused GEMM sums over all its output columns in one
  // product instead of adding three (or two) products, so the backward's
  // d(ln1) and d(ln2) differ by rounding (weight gradients do not).
  // `context` (not owned; context parallelism, core/model/context_attention.hpp):
  // T is this rank's tokens of a sequence, and `context` computes the
  // attention and gives the tokens' rotary positions.
  Model(const ModelConfig& cfg, Backend& be, DType dtype, int64_t B, int64_t T,
        TensorParallel tp = {}, const StageSlice* stage = nullptr, ExpertParallel ep = {},
        RecomputePolicy recompute = {}, bool fused = true, ContextAttention* context = nullptr);

  const ModelConfig& config() const { return cfg_; }
  const StageSlice& stage() const { return stage_; }
  const std::vector<ParamSpec>& table() const { return table_; }
  DType dtype() const { return dtype_; }           // weights and activations
  DType master_dtype() const { return mdt_; }      // master weights, gradients, statistics
  bool mixed() const { return dtype_ != mdt_; }
  int64_t batch() const { return B_; }
  int64_t seq_len() const { return T_; }
  int tp_size() const { return tp_->size(); }
  bool fused_projections() const { return fused_; }
  const AttentionShape& attention_shape() const { return att_shape_; }
  int64_t flat_size() const { return flat_n_; }     // flat buffer length (padded)
  Tensor params() const { return flat(params_); }  // (flat_size) the compute weights
  Tensor grads() const { return flat(grads_, mdt_); }  // (flat_size) master dtype
  // The master weights the optimizer updates (fp32); params() itself unless mixed.
  Tensor master() const { return mixed() ? flat(master_, mdt_) : params(); }
  // params()[lo, hi) = master()[lo, hi) rounded to the compute dtype (no-op unless mixed).
  void sync_params(int64_t lo = 0, int64_t hi = -1);
  Tensor param(size_t i) const;
  Tensor grad(size_t i) const;

  // N(0, init_std) for matrices and embeddings, ones for norms. Each global
  // tensor draws from its own stream keyed by (seed, global name) and this rank
  // takes its shard, so every layout starts from the same weights; f32 and f64
  // models get the same values.
  void init_weights(uint64_t seed);
  // What the last init_weights took: drawing on the host, and the values'
  // copy to the backend with the working-precision cast (adgt-train's
  // start-up line).
  struct InitTimes {
    double draw_s = 0, to_device_s = 0;
  };
  const InitTimes& init_times() const { return init_times_; }
  // Host copies of the flat (master) weights as fp32 / from fp32 (checkpoints).
  std::vector<float> params_to_host() const;
  // The same into `out` (resized; its memory reused when big enough: a
  // checkpoint's staging buffer).
  void params_to_host(std::vector<float>& out) const;
  void params_from_host(const std::vector<float>& flat);
  void params_from_host(const float* flat, size_t n);  // n: flat_size()
  std::vector<double> grads_to_host_f64() const;
  void zero_grads();
  // ZeRO-2/3 (core/model/unit_storage.hpp): the weights and/or gradients
  // live in `s` by gradient unit from now on, and the model frees the flat
  // buffers `s` holds (params() / master() / grads() are then refused).
  // nullptr: none (the flat buffers stay).
  void set_unit_storage(UnitStorage* s);
  // train.dtype fp8 (core/model/fp8_linear.hpp): the layers' q/k/v, o,
  // gate/up and down GEMMs and the MoE experts' w1/w3 (or w13) and w2 GEMMs
  // in FP8 from now on (the head and the router stay bf16). Needs bf16
  // compute. cp: the context-parallel group (nullptr: none).
  void enable_fp8(const Fp8Options& o, Comm* cp);
  Fp8Linears* fp8() { return fp8_.get(); }
  // Delayed scaling's amax histories by global layer and role (q, k, v, o,
  // gate, up, down; a fused site fills its roles alike): (n_layers x 7 x 2
  // (x, dy) x history), then, with experts, by global layer, expert and
  // projection (w1, w3, w2): (n_layers x n_experts x 3 x 2 x history); zero
  // for layers elsewhere (and for dense layers' experts), and the steps filled.
  std::vector<double> fp8_history_table() const;
  // Loads such a table (a fused site takes the max over its roles).
  void set_fp8_history_table(const std::vector<double>& t, int64_t steps);
  const UnitStorage* unit_storage() const { return store_; }
  // The grad_units() index of each parameter's unit.
  const std::vector<int>& unit_of_param() const { return unit_of_param_; }

  // ---- the whole model (no pipeline: one chunk holding embedding and head) ----
  // inputs, targets: host (B, T) int32; a target < 0 is ignored. Returns the
  // mean loss over the valid targets and leaves, for backward(), the gradient
  // of grad_scale * mean loss w.r.t. the logits.
  double forward(const int32_t* inputs, const int32_t* targets, double grad_scale);
  // Accumulates parameter gradients (+=) of the last forward's scaled loss.
  // last_micro_batch: the step's final backward, after which the gradients are
  // complete (with SP, the norm weights' partial sums over token rows are then
  // all-reduced over tp, once). on_ready(begin, end) is then called with flat
  // ranges whose gradients are final, in the order they complete: the
  // ranges of grad_units(), in that order (gradient buckets).
  void backward(const std::function<void(int64_t, int64_t)>& on_ready = {},
                bool last_micro_batch = true);
  // Deferred losses: one host read per step instead of one per micro-batch.
  // While on, a head chunk's forward keeps its per-row losses on the device
  // and returns 0; take_deferred_loss() reads them all at once and returns
  // the sum of the micro-batches' mean losses in the order they ran (the
  // number that adding the forwards' returns gives, bit for bit).
  void defer_losses(bool on) { defer_losses_ = on; }
  double take_deferred_loss();
  // Packed documents (train.document_mask, model.rope_reset_per_document): in
  // each sequence a new document starts after every `eos` token. mask:
  // attention stays inside a token's document (AttentionShape::doc_start);
  // rope_reset: rotary positions restart at 0 at each document's start. Either
  // makes every chunk's forward read the micro-batch's token ids (inputs), and
  // leaves the numbers of a run without it unchanged when off.
  void set_documents(int32_t eos, bool mask, bool rope_reset);
  bool needs_inputs_everywhere() const { return docs_.mask || docs_.rope_reset; }
  // If on, forward() keeps a host copy of this rank's logits (N, Vl) before the loss.
  void set_capture_logits(bool on) { capture_logits_ = on; }
  const std::vector<double>& captured_logits() const { return logits_host_; }

  // ---- pipeline stages ----
  // Chunk c holds the layers stage().chunks[c]; chunk 0 of the first pipeline
  // rank also the embedding, the last chunk of the last rank the final norm,
  // head and loss. A micro-batch in flight keeps its activations in a slot of
  // its chunk; slots are made on demand (add_slot) and reused.
  int num_chunks() const { return int(chunks_.size()); }
  bool chunk_has_embedding(int c) const { return stage_.embedding && c == 0; }
  bool chunk_has_head(int c) const { return stage_.head && c + 1 == num_chunks(); }
  int num_slots(int chunk) const { return int(chunks_[size_t(chunk)].slots.size()); }
  void add_slot(int chunk);
  // (Nl, C): where a stage without the embedding takes its input.
  Tensor stage_input(int chunk, int slot);
  // (Nl, C): a stage's output after forward_chunk (stages without the head).
  Tensor stage_output(int chunk, int slot);
  // The chunk's forward. inputs: token ids, used by the embedding chunk;
  // targets: used by the head chunk, which returns the mean loss over the valid
  // targets (others return 0) and keeps the scaled logit gradient in the slot.
  double forward_chunk(int chunk, int slot, const int32_t* inputs, const int32_t* targets,
                       double grad_scale);
  // The chunk's backward from d_out = dL/d(stage output) (Nl, C) (ignored by the
  // head chunk). Leaves dL/d(stage input) in input_grad() (chunks without the
  // embedding). split: weight gradients other than the norms' are deferred to
  // backward_weight (zero-bubble schedules), which needs the slot kept until then.
  void backward_chunk(int chunk, int slot, const Tensor& d_out, bool split,
                      const std::function<void(int64_t, int64_t)>& on_ready = {},
                      bool last_micro_batch = false);
  Tensor input_grad() const { return d_resid_; }  // (Nl, C)
  void backward_weight(int chunk, int slot);
  // The gradients of chunk `chunk` that are partial sums over tp: with SP
  // every norm weight's (each rank's token rows), and with tp > 1 every MoE
  // router's (each tp rank's share of the experts' FFN) are all-reduced over
  // tp. Pipeline steps call backward_chunk with last_micro_batch = false, then
  // this once per chunk; non-pipeline steps do it in the last micro-batch's
  // backward.
  void reduce_tp_partial_grads(int chunk);
  // Chunk by chunk (0, 1, ...), the units whose gradients the chunk's
  // backward completes, in the order it completes them (the ranges
  // backward()'s on_ready receives).
  std::vector<GradUnit> grad_units() const;

  // ---- mixture of experts ----
  bool has_moe() const { return !moe_.empty(); }
  std::vector<MoeLayerStep> moe_stats() const { return moe_step_; }
  // Per MoE layer, as moe_stats(); reads the backend's spans (on a device,
  // a wait for the last one's end: none after the step).
  std::vector<MoeLayerTimes> moe_times() const;
  void reset_moe_stats();
  // Aux-loss-free balancing: each layer's selection bias follows the step's
  // load, summed over `replicas` (the ranks outside the ep group that share
  // the router: the expert-data-parallel group). Collective over replicas.
  void update_moe_bias(Comm* replicas);
  // The selection biases of this rank's MoE layers as (global layer, E values)
  // rows of an (n_layers x E) table, zeros for layers it does not hold; and back.
  std::vector<double> moe_bias_table() const;
  void set_moe_bias_table(const std::vector<double>& t);
  // A new owner table for the same ep group (ExpertPlacement's rules), in
  // place: the parameter table's names and the MoE layers follow it; the
  // flat buffers keep their layout (every rank holds as many experts of the
  // same shapes), so the caller moves the experts' values between the ranks
  // first (Engine::move_experts). Replicas are dropped. Not collective.
  void set_expert_placement(const std::vector<int>& owner, Comm* ep);
  // Flat-buffer offset (elements) of MoE layer `moe`'s local expert `i`: its
  // w1, w3 and w2, one contiguous block of expert_block() elements.
  int64_t expert_offset(int moe, size_t i) const;
  int64_t expert_block() const;
  int num_moe_layers() const { return int(moe_.size()); }
  // Expert replicas (core/model/moe_replicas.hpp) in every MoE layer, synced
  // at once (collective over ep); ExpertReplicas() removes them. The
  // replicas must be made for this model's expert placement.
  void set_expert_replicas(const ExpertReplicas& r);
  // The owners' weights into the shadows; after every change to the weights
  // (the trainer: after each update and each restore). Collective over ep.
  void sync_expert_replicas();
  // The MoE layers' placement (nullptr without MoE layers on this stage).
  const ExpertPlacement* expert_placement() const {
    return moe_.empty() ? nullptr : &moe_.front()->placement();
  }
  // On: expert replicas' gradients go back to their owners only in a
  // backward with last_micro_batch (backward(..., true)) or after this is
  // turned off again, summed over the micro-batches since; off (the
  // default): after every backward. The engine turns it on without a
  // pipeline (run_micro_batches knows the last micro-batch); the pipeline
  // executor turns it off for each chunk's last backward of the step.
  void defer_replica_grads(bool on) { defer_replica_grads_ = on; }
  const ExpertReplicas* expert_replicas() const {
    return moe_.empty() ? nullptr : &moe_.front()->replicas();
  }

 private:
  struct LayerActs {  // saved for the backward; N = B*T token rows, Nl = N/tp with SP
    Tensor x_in;    // (Nl, C) residual stream entering the layer
    Tensor ln1;     // (N, C) normed input of the column-parallel q/k/v (gathered with SP)
    Tensor rstd1;   // (Nl)
    Tensor q;       // (N, Hl*hd) after rotary
    Tensor k, v;    // (N, KVl*hd), k after rotary
    Tensor att_saved;  // backend-defined (CPU: probabilities (B, Hl, T, T))
    Tensor att;     // (N, Hl*hd) attention output before o_proj
    Tensor x_mid;   // (Nl, C) residual after attention
    Tensor ln2;     // (N, C)
    Tensor rstd2;   // (Nl)
    Tensor gate, up, h;  // (N, Fl); gate and up unfused only
    Tensor gu;           // (N, 2 Fl) fused: each row's gate then up
    // Output gradients kept by a split backward for backward_weight (made on first use).
    Tensor d_down, d_o;   // (N, C)
    Tensor d_gate, d_up;  // (N, Fl)         unfused
    Tensor d_q;           // (N, Hl*hd)      unfused
    Tensor d_k, d_v;      // (N, KVl*hd)     unfused
    Tensor d_gu;          // (N, 2 Fl)       fused
    Tensor d_qkv;         // (N, (Hl + 2 KVl) hd) fused
  };
  struct Slot {
    std::vector<LayerActs> layers;
    Tensor x_out;                      // (Nl, C) the chunk's output (x_final with the head)
    // Head chunk only:
    Tensor lnf;                        // (N, C) final norm output (gathered with SP)
    Tensor rstdf;                      // (Nl)
    Tensor logits;                     // (N, Vl) this rank's vocabulary shard; then dL/dlogits
    Tensor losses;                     // (N) per-row loss, master dtype
    Tensor in_tok, tgt_tok;            // (N) int32
    Tensor d_emb;                      // (N, C) split backward of the embedding chunk
    // set_documents: each token's document start (N) int32 and, with
    // rope_reset, its position in the document (N) int32 and the rotary
    // tables gathered at those positions (N, hd/2).
    Tensor doc_start, doc_pos, rope_cos, rope_sin;
    double grad_scale = 0;             // the forward's (MoE aux loss gradient)
  };
  struct Chunk {
    int64_t first_layer = 0, n_layers = 0;  // global layer range
    size_t first_local = 0;                 // index into layer_idx_
    std::vector<Slot> slots;
  };
  struct LayerIdx {
    size_t in_norm, q, k, v, o, post_norm, gate, up, down;
    int moe = -1;  // index into moe_ (MoE layers; gate/up/down are kNone then)
    size_t router = size_t(-1);
    std::vector<size_t> w1, w2, w3;  // local experts, ascending global id
  };
  // What a backward does beyond the plain gradients: split (defer the weight
  // gradients to backward_weight) and last_micro_batch (finish the tp partial sums).
  struct BackwardMode {
    bool split = false;
    bool last_micro_batch = false;
  };

  // ---- construction phases (model.cpp), in the constructor's order ----
  void check_arguments() const;  // dtype, sequence length and tp divisibility, stage slice
  void index_params(size_t n_local_experts);  // table_ by role; chunks_, layer_idx_, vocab shard
  void make_moe_layers(const ExpertPlacement& placement, Comm* ep);  // moe_, moe_step_
  void make_flat_buffers(int64_t flat_multiple);  // params_, grads_ (and master_), zeroed
  void make_scratch();        // the backward's gradient buffers, SP rows, vocab-parallel loss stats
  void plan_recompute();      // layer_rc_, and rc_ (the shared buffers) when anything recomputes
  // A layer's saved activations: new buffers, except what `shared` takes from
  // rc_ (selective: the attention core and SwiGLU product; full: all but x_in).
  // An MoE layer (moe) has no dense FFN: no gate/up and h (its block's buffers are MoeLayer's).
  LayerActs layer_acts(Recompute shared, bool moe = false);
  void alloc_core(LayerActs& a, bool moe = false);  // att_saved, att, h: what selective recompute shares
  void build_rope_tables();   // rope_cos_, rope_sin_ allocated and filled
  // The rotary tables a slot's q and k take: the model's (T, hd/2) rows by
  // position in the sequence, or with rope_reset the slot's per-token rows.
  struct Rope {
    Tensor cos, sin;
    int64_t T;
  };
  Rope rope_of(const Slot& s) const;
  AttentionShape attention_of(const Slot& s) const;  // att_shape_, masked by the slot's documents
  // The attention of a layer: the backend's, or context_'s over the cp group.
  void attention_forward(LayerActs& a, const Slot& s);
  void attention_backward(const LayerActs& a, const Slot& s);
  void load_documents(Slot& s, const int32_t* inputs);  // set_documents' per-micro-batch part

  // ---- pass pieces (model_forward_backward.cpp) ----
  Slot& slot_of(int chunk, int slot) { return chunks_[size_t(chunk)].slots[size_t(slot)]; }
  void embedding_forward(Slot& s, const int32_t* inputs);  // token ids -> layers[0].x_in
  int64_t load_targets(Slot& s, const int32_t* targets);   // -> s.tgt_tok; returns the valid count
  // Layer l of the chunk; ln1_ready: its ln1 was computed by the previous
  // layer's fused add. Returns whether this layer's final add computed the
  // next norm (the next layer's ln1, or the head's final norm).
  bool layer_forward(int chunk, int slot, size_t l, bool ln1_ready);
  // Final norm (unless lnf_ready), logits, loss; returns the mean loss.
  double head_forward(Slot& s, bool lnf_ready, int64_t n_valid, double grad_scale);
  void head_backward(Slot& s, BackwardMode mode);  // logit gradient -> d_resid_
  void layer_backward(int chunk, int slot, size_t l, BackwardMode mode);  // d_resid_ in and out
  // q, k, v from ln1, rotated (the forward's, and the recompute's: one code path).
  void qkv_forward(LayerActs& a, const LayerIdx& w, const Rope& rope);
  // gate and up (or gu) from ln2, and the SwiGLU product h of a dense layer.
  void gate_up_forward(LayerActs& a, const LayerIdx& w);
  void swiglu_forward(LayerActs& a);
  // Parameters first..last (adjacent in the flat buffer: q..v, gate..up) as
  // one (rows, C) matrix of weights, or of their gradients.
  Tensor weights(size_t first, size_t last) const;
  Tensor weight_grads(size_t first, size_t last) const;
  // What layer l's forward dropped (layer_rc_), recomputed into rc_ from what it kept.
  void recompute_layer(int chunk, int slot, size_t l);
  void embedding_backward(Slot& s, bool split);    // d_resid_ -> the embedding's gradient
  // With SP a norm weight's gradient is a partial sum over this rank's rows;
  // partials accumulate over micro-batches and are summed over tp once.
  void finish_norm_grad(size_t w, bool last_micro_batch);
  MoeParams moe_params(const LayerIdx& w, bool grads) const;
  void moe_forward(Slot& s, LayerActs& a, const LayerIdx& w, int slot, Tensor out);
  void moe_backward(Slot& s, LayerActs& a, const LayerIdx& w, int slot, bool last_micro_batch);
  static constexpr size_t kNone = size_t(-1);

  Tensor flat(const Buffer& b) const { return flat(b, dtype_); }
  Tensor flat(const Buffer& b, DType dt) const;
  std::vector<double> read_host(const Tensor& t) const;  // any float dtype -> double
  Tensor act(int64_t rows, int64_t cols, DType dt);  // a new buffer owned by the model
  void make_split_buffers(Slot& s, int chunk);  // a split backward's d_* buffers, on first use
  // Sequence-parallel boundaries (identities / all-reduce without SP).
  void gather_rows(Tensor full, const Tensor& local);   // (Nl,C) -> (N,C)
  void reduce_rows(Tensor local, Tensor partial);       // (N,C) partial sums -> (Nl,C)
  void norm_forward(Tensor full_out, Tensor rstd, const Tensor& x, size_t w);
  // x += y, then norm_forward of x (one fused backend op).
  void add_norm_forward(Tensor x, const Tensor& y, Tensor full_out, Tensor rstd, size_t w);
  void loss_forward(Slot& s, double scale);
  std::pair<int64_t, int64_t> range(size_t first, size_t last) const;
  std::vector<GradUnit> chunk_units(int chunk) const;  // grad_units() of one chunk

  ModelConfig cfg_;
  StageSlice stage_;
  Backend& be_;
  DType dtype_, mdt_;
  int64_t B_, T_, N_, Nl_;
  Comm* tp_;
  SelfComm self_;
  ContextAttention* context_ = nullptr;  // context parallelism: the attention over the cp group
  bool sp_;
  int64_t vocab_start_ = 0, vocab_valid_ = 0, flat_n_;
  InitTimes init_times_;
  int64_t Hl_, KVl_, Fl_, Vl_ = 0;
  AttentionShape att_shape_;
  std::vector<ParamSpec> table_;
  std::vector<LayerIdx> layer_idx_;  // this rank's layers, chunk by chunk
  RecomputePolicy recompute_;
  bool fused_;
  std::vector<Recompute> layer_rc_;  // per entry of layer_idx_
  LayerActs rc_;                     // the recomputed activations' one set of buffers
  std::vector<Chunk> chunks_;
  std::vector<std::unique_ptr<MoeLayer>> moe_;  // this rank's MoE layers, in layer order
  std::vector<MoeLayerStep> moe_step_;
  Comm* moe_aux_group_ = nullptr;  // ExpertParallel::aux_group
  // Per MoE layer, the backend spans (Backend::span_begin) since the last
  // reset_moe_stats(): its experts', the whole layer's and its MoE block's
  // (moe_times(): dense = layers - blocks).
  struct MoeSpans {
    std::vector<int> expert, layer, block;
  };
  std::vector<MoeSpans> moe_spans_;
  bool defer_replica_grads_ = false;
  size_t emb_idx_ = kNone, norm_idx_ = kNone, head_idx_ = kNone;
  // (flat_size) weights, gradients, master weights (mixed only); made (zeroed)
  // at their first use, so a ZeRO-2/3 model never holds what its store holds.
  mutable Buffer params_, grads_, master_;
  UnitStorage* store_ = nullptr;    // set_unit_storage's (not owned)
  std::vector<int> unit_of_param_;  // per parameter: its grad_units() index
  // The unit-storage events of a pass (no-ops without a storage).
  void store_forward(int chunk, int64_t layer);  // layer -1: embedding, n_layers: head
  void store_backward(int chunk, int64_t layer);
  int unit_index(int chunk, int64_t layer) const;  // grad_units() index (one chunk)
  std::vector<Buffer> owned_;  // activations and scratch
  // The layers' linear GEMMs: through fp8_ when its site covers weights wi..wl.
  void mm_fwd(Tensor y, const Tensor& x, size_t wi, size_t wl);
  void mm_bwd(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, size_t wi, size_t wl,
              bool accumulate_dx);
  std::unique_ptr<Fp8Linears> fp8_;
  void add_expert_sites(int64_t layer, MoeLayer& m);
  // Under SP: full = the gathered ln_local_, the output of norm parameter
  // norm_w; as FP8 codes when parallel.fp8_allgather gives it a site.
  void gather_norm(Tensor full, size_t norm_w);
  // Per norm parameter: the FP8 sites reading its gathered output (its
  // gather moves codes at the first's scale), or none.
  std::vector<std::vector<int>> fp8_gather_sites_;
  std::vector<size_t> fp8_table_rows(int site) const;  // model_fp8.cpp
  size_t fp8_table_size() const;
  std::vector<int> fp8_site_;  // per parameter: the FP8 site of the linear starting there, or -1
  Tensor ln_local_;             // (Nl, C) norm output before the gather (SP only)
  Tensor partial_;              // (N, C) row-parallel partial sums (SP only)
  // Backward scratch; without SP d_full_ is d_resid_ and d_tmp_local_ is d_tmp_.
  Tensor d_resid_;              // (Nl, C) dL/d(residual stream)
  Tensor d_full_;               // (N, C) d_resid_ gathered
  Tensor d_tmp_;                // (N, C) a block's input gradient, partial over tp
  Tensor d_tmp_local_;          // (Nl, C) d_tmp_ reduced
  Tensor dq_, d_att_;           // (N, Hl*hd)
  Tensor dk_, dv_;              // (N, KVl*hd)
  Tensor dgate_, dup_, dh_;     // (N, Fl); dgate_, dup_ unfused
  Tensor dgu_;                  // (N, 2 Fl) fused
  // Fused: the q/k/v GEMM's output in the forward (and a recompute), its
  // gradient in the backward: (N, (Hl + 2 KVl) hd).
  Tensor qkv_;
  // Vocab-parallel cross-entropy (tp > 1, head rank): per-row statistics.
  Tensor ce_stats_;             // (N, 3) this rank's
  Tensor ce_gathered_;          // (tp*N, 3) every tp rank's
  Tensor ce_combined_;          // (N, 3)
  Tensor rope_cos_, rope_sin_;  // (T, hd/2)
  struct Documents {
    int32_t eos = -1;
    bool mask = false, rope_reset = false;
  } docs_;
  bool capture_logits_ = false;
  bool defer_losses_ = false;
  Tensor loss_rows_;                 // (cap*N) the deferred per-row losses, master dtype
  int64_t loss_cap_ = 0;             // micro-batches loss_rows_ holds
  std::vector<int64_t> loss_valid_;  // valid targets of each deferred micro-batch
  std::vector<double> logits_host_;
};

}  // namespace adgt

// Model's forward and backward passes (see model.hpp): the chunk passes,
// their per-layer, embedding and head pieces, the sequence-parallel
// boundaries, the loss, the gradient units and the MoE blocks' glue.
#include "core/model/model.hpp"

#include <cstdint>
#include <exception>
#include <functional>
#include <vector>

#include "kernels/check.hpp"

namespace adgt {

namespace {

// A MoE layer's spans (Model::moe_times: its dense time is the layer's less
// its MoE block's): the layer's from construction to destruction, the
// block's around moe(). Null ids (a dense layer): nothing measured.
template <class Spans>
class LayerSpans {
 public:
  LayerSpans(Backend& be, Spans* ids) : be_(be), ids_(ids), id_(ids ? be.span_begin() : -1) {}
  // Not while unwinding (the layer threw: its span stays open, unread).
  ~LayerSpans() noexcept(false) {
    if (!ids_ || std::uncaught_exceptions() > unwinding_) return;
    be_.span_end(id_);
    ids_->layer.push_back(id_);
  }
  LayerSpans(const LayerSpans&) = delete;
  LayerSpans& operator=(const LayerSpans&) = delete;
  template <class F>
  void moe(F&& block) {
    const int id = ids_ ? be_.span_begin() : -1;
    block();
    if (!ids_) return;
    be_.span_end(id);
    ids_->block.push_back(id);
  }

 private:
  Backend& be_;
  Spans* ids_;
  int id_;
  int unwinding_ = std::uncaught_exceptions();
};

}  // namespace

void Model::gather_rows(Tensor full, const Tensor& local) {
  if (sp_) tp_->all_gather(full, local);
}

void Model::reduce_rows(Tensor local, Tensor partial) {
  if (sp_)
    tp_->reduce_scatter(local, partial);
  else
    tp_->all_reduce(partial);  // `local` is `partial` without SP
}

void Model::norm_forward(Tensor full_out, Tensor rstd, const Tensor& x, size_t w) {
  if (sp_) {
    be_.rmsnorm_forward(ln_local_, rstd, x, param(w), cfg_.norm_eps);
    gather_norm(full_out, w);
  } else {
    be_.rmsnorm_forward(full_out, rstd, x, param(w), cfg_.norm_eps);
  }
}

void Model::add_norm_forward(Tensor x, const Tensor& y, Tensor full_out, Tensor rstd, size_t w) {
  if (sp_) {
    be_.residual_rmsnorm_forward(x, y, ln_local_, rstd, param(w), cfg_.norm_eps);
    gather_norm(full_out, w);
  } else {
    be_.residual_rmsnorm_forward(x, y, full_out, rstd, param(w), cfg_.norm_eps);
  }
}

void Model::loss_forward(Slot& s, double scale) {
  if (tp_->size() == 1) {
    be_.cross_entropy(s.logits, s.losses, s.tgt_tok, scale);
    return;
  }
  // Vocab-parallel: per-rank row statistics, gathered, combined identically on
  // every rank; the full logits are never assembled.
  be_.ce_partial_stats(ce_stats_, s.logits, s.tgt_tok, vocab_start_, vocab_valid_);
  tp_->all_gather(ce_gathered_, ce_stats_);
  be_.ce_combine(ce_combined_, ce_gathered_);
  be_.ce_finish(s.logits, s.losses, ce_combined_, s.tgt_tok, vocab_start_, vocab_valid_, scale);
}

double Model::forward(const int32_t* inputs, const int32_t* targets, double grad_scale) {
  ADGT_CHECK(num_chunks() == 1 && chunk_has_embedding(0) && chunk_has_head(0),
             "Model::forward: this rank holds a pipeline stage; use forward_chunk");
  return forward_chunk(0, 0, inputs, targets, grad_scale);
}

void Model::backward(const std::function<void(int64_t, int64_t)>& on_ready,
                     bool last_micro_batch) {
  backward_chunk(0, 0, Tensor(), false, on_ready, last_micro_batch);
}

double Model::forward_chunk(int chunk, int slot, const int32_t* inputs, const int32_t* targets,
                            double grad_scale) {
  Slot& s = slot_of(chunk, slot);
  const bool head = chunk_has_head(chunk);
  s.grad_scale = grad_scale;
  if (needs_inputs_everywhere()) load_documents(s, inputs);
  if (chunk_has_embedding(chunk)) {
    store_forward(chunk, -1);
    embedding_forward(s, inputs);
  }
  const int64_t n_valid = head ? load_targets(s, targets) : 0;
  // Each residual add is fused with the norm that reads its result
  // (residual_rmsnorm_forward; the same numbers as the add then the norm).
  bool normed = false;  // the next norm's output was computed by the previous layer's add
  for (size_t l = 0; l < s.layers.size(); ++l) {
    store_forward(chunk, int64_t(l));
    normed = layer_forward(chunk, slot, l, normed);
  }
  if (!head) return 0.0;
  store_forward(chunk, int64_t(s.layers.size()));
  return head_forward(s, normed, n_valid, grad_scale);
}

void Model::embedding_forward(Slot& s, const int32_t* inputs) {
  const int64_t N = N_;
  for (int64_t i = 0; i < N; ++i)
    ADGT_CHECK(inputs[i] >= 0 && inputs[i] < cfg_.vocab_size,
               "token id " << inputs[i] << " at row " << i << " outside the vocabulary [0,"
                           << cfg_.vocab_size << ")");
  be_.to_device(s.in_tok.data, inputs, size_t(N) * 4);
  Tensor x0 = s.layers[0].x_in;
  Tensor dst = sp_ ? partial_ : x0;
  be_.embedding_forward(dst, param(emb_idx_), s.in_tok, vocab_start_);
  reduce_rows(x0, dst);
}

int64_t Model::load_targets(Slot& s, const int32_t* targets) {
  const int64_t N = N_;
  int64_t n_valid = 0;
  for (int64_t i = 0; i < N; ++i) {
    ADGT_CHECK(targets[i] < cfg_.vocab_size, "target " << targets[i] << " at row " << i
                                                       << " outside the vocabulary [0,"
                                                       << cfg_.vocab_size << ")");
    n_valid += targets[i] >= 0;
  }
  be_.to_device(s.tgt_tok.data, targets, size_t(N) * 4);
  return n_valid;
}

void Model::qkv_forward(LayerActs& a, const LayerIdx& w, const Rope& r) {
  if (fused_) {
    mm_fwd(qkv_, a.ln1, w.q, w.v);
    be_.qkv_rope_split(a.q, a.k, a.v, qkv_, r.cos, r.sin, r.T);
    return;
  }
  mm_fwd(a.q, a.ln1, w.q, w.q);
  mm_fwd(a.k, a.ln1, w.k, w.k);
  mm_fwd(a.v, a.ln1, w.v, w.v);
  be_.rope_forward(a.q, r.cos, r.sin, r.T);
  be_.rope_forward(a.k, r.cos, r.sin, r.T);
}

void Model::gate_up_forward(LayerActs& a, const LayerIdx& w) {
  if (fused_) {
    mm_fwd(a.gu, a.ln2, w.gate, w.up);
    return;
  }
  mm_fwd(a.gate, a.ln2, w.gate, w.gate);
  mm_fwd(a.up, a.ln2, w.up, w.up);
}

void Model::swiglu_forward(LayerActs& a) {
  if (fused_)
    be_.swiglu_packed_forward(a.h, a.gu);
  else
    be_.swiglu_forward(a.h, a.gate, a.up);
}

bool Model::layer_forward(int chunk, int slot, size_t l, bool ln1_ready) {
  const Chunk& ch = chunks_[size_t(chunk)];
  Slot& s = slot_of(chunk, slot);
  LayerActs& a = s.layers[l];
  const LayerIdx& w = layer_idx_[ch.first_local + l];
  LayerSpans spans(be_, w.moe >= 0 ? &moe_spans_[size_t(w.moe)] : nullptr);
  // Attention branch: x_mid = x_in + o(attention(rope(q), rope(k), v)).
  if (!ln1_ready) norm_forward(a.ln1, a.rstd1, a.x_in, w.in_norm);
  qkv_forward(a, w, rope_of(s));
  attention_forward(a, s);
  Tensor o = sp_ ? partial_ : a.x_mid;
  mm_fwd(o, a.att, w.o, w.o);
  reduce_rows(a.x_mid, o);
  add_norm_forward(a.x_mid, a.x_in, a.ln2, a.rstd2, w.post_norm);
  // MLP branch: out = x_mid + down(swiglu(gate, up)) (or the MoE block).
  const bool last = l + 1 == s.layers.size();
  Tensor next = last ? s.x_out : s.layers[l + 1].x_in;
  Tensor down = sp_ ? partial_ : next;
  if (w.moe >= 0) {
    spans.moe([&] { moe_forward(s, a, w, slot, down); });
  } else {
    gate_up_forward(a, w);
    swiglu_forward(a);
    mm_fwd(down, a.h, w.down, w.down);
  }
  reduce_rows(next, down);
  if (!last) {
    LayerActs& n = s.layers[l + 1];
    add_norm_forward(next, a.x_mid, n.ln1, n.rstd1, layer_idx_[ch.first_local + l + 1].in_norm);
    return true;
  }
  if (chunk_has_head(chunk)) {
    add_norm_forward(next, a.x_mid, s.lnf, s.rstdf, norm_idx_);
    return true;
  }
  be_.add_inplace(next, a.x_mid);
  return false;
}

double Model::head_forward(Slot& s, bool lnf_ready, int64_t n_valid, double grad_scale) {
  if (!lnf_ready) norm_forward(s.lnf, s.rstdf, s.x_out, norm_idx_);
  be_.linear_forward(s.logits, s.lnf, param(head_idx_));
  if (capture_logits_) logits_host_ = read_host(s.logits);
  loss_forward(s, n_valid ? grad_scale / double(n_valid) : 0.0);
  if (defer_losses_) {  // a device copy now, the host read at take_deferred_loss()
    const int64_t k = int64_t(loss_valid_.size());
    if (k >= loss_cap_) {
      const int64_t cap = std::max<int64_t>(4, 2 * loss_cap_);
      Tensor grown = act(cap * N_, 1, mdt_);
      if (k) be_.copy(grown.rows(0, k * N_), loss_rows_.rows(0, k * N_));
      loss_rows_ = grown;
      loss_cap_ = cap;
    }
    be_.copy(loss_rows_.rows(k * N_, N_), s.losses);
    loss_valid_.push_back(n_valid);
    return 0.0;
  }
  double sum = 0;
  for (double x : read_host(s.losses)) sum += x;  // losses: (N) in the master dtype
  return n_valid ? sum / double(n_valid) : 0.0;
}

double Model::take_deferred_loss() {
  const int64_t k = int64_t(loss_valid_.size());
  if (!k) return 0.0;
  const std::vector<double> rows = read_host(loss_rows_.rows(0, k * N_));
  double total = 0;
  for (int64_t j = 0; j < k; ++j) {
    double sum = 0;
    for (int64_t i = 0; i < N_; ++i) sum += rows[size_t(j * N_ + i)];
    total += loss_valid_[size_t(j)] ? sum / double(loss_valid_[size_t(j)]) : 0.0;
  }
  loss_valid_.clear();
  return total;
}

void Model::backward_chunk(int chunk, int slot, const Tensor& d_out, bool split,
                           const std::function<void(int64_t, int64_t)>& on_ready,
                           bool last_micro_batch) {
  Slot& s = slot_of(chunk, slot);
  const BackwardMode mode{split, last_micro_batch};
  if (split) make_split_buffers(s, chunk);
  // The units of grad_units(), reported in their order as they complete.
  const std::vector<GradUnit> units = chunk_units(chunk);
  size_t next_unit = 0;
  auto ready = [&] {
    ADGT_CHECK(next_unit < units.size(), "Model::backward_chunk: more gradient units than "
                                             << units.size() << " in chunk " << chunk);
    const GradUnit& u = units[next_unit++];
    if (store_) store_->grads_done(int(next_unit - 1));
    if (on_ready && !split) on_ready(u.begin, u.end);
  };
  if (chunk_has_head(chunk)) {
    store_backward(chunk, int64_t(s.layers.size()));
    head_backward(s, mode);
    ready();
  } else {
    ADGT_CHECK(d_out.numel() == d_resid_.numel(),
               "Model::backward_chunk: output gradient " << d_out.shape_str() << ", expected "
                                                         << d_resid_.shape_str());
    be_.copy(d_resid_, d_out);
  }
  for (size_t l = s.layers.size(); l-- > 0;) {
    store_backward(chunk, int64_t(l));
    layer_backward(chunk, slot, l, mode);
    ready();
  }
  if (chunk_has_embedding(chunk)) {
    store_backward(chunk, -1);
    embedding_backward(s, split);
    ready();
  }
  ADGT_CHECK(next_unit == units.size(), "Model::backward_chunk: chunk " << chunk << " completed "
                                                                          << next_unit << " of "
                                                                          << units.size()
                                                                          << " gradient units");
}

void Model::finish_norm_grad(size_t w, bool last_micro_batch) {
  if (sp_ && last_micro_batch) tp_->all_reduce(grad(w));
}

void Model::head_backward(Slot& s, BackwardMode mode) {
  // logits now hold dloss/dlogits (scaled). The head's input gradient is a
  // partial sum over vocabulary shards. The split backward keeps them in the
  // slot for the head's weight gradient.
  if (mode.split)
    be_.linear_backward(d_tmp_, Tensor(), s.logits, s.lnf, param(head_idx_), false);
  else
    be_.linear_backward(d_tmp_, grad(head_idx_), s.logits, s.lnf, param(head_idx_), false);
  reduce_rows(d_tmp_local_, d_tmp_);
  be_.zero(d_resid_);
  be_.rmsnorm_backward(d_resid_, grad(norm_idx_), d_tmp_local_, s.x_out, param(norm_idx_),
                       s.rstdf);
  finish_norm_grad(norm_idx_, mode.last_micro_batch);
}

void Model::recompute_layer(int chunk, int slot, size_t l) {
  // The forward's ops on what the layer kept, in the forward's order, so the
  // recomputed activations are the forward's bit for bit (an ln1 the forward
  // got from the previous layer's fused add is the plain norm of x_in).
  const Chunk& ch = chunks_[size_t(chunk)];
  const Slot& s = slot_of(chunk, slot);
  LayerActs& a = slot_of(chunk, slot).layers[l];
  const LayerIdx& w = layer_idx_[ch.first_local + l];
  const Recompute m = layer_rc_[ch.first_local + l];
  if (m == Recompute::None) return;
  const bool full = m == Recompute::Full;
  if (full) {
    norm_forward(a.ln1, a.rstd1, a.x_in, w.in_norm);
    qkv_forward(a, w, rope_of(s));
  }
  attention_forward(a, s);
  if (full) {
    Tensor o = sp_ ? partial_ : a.x_mid;
    mm_fwd(o, a.att, w.o, w.o);
    reduce_rows(a.x_mid, o);
    add_norm_forward(a.x_mid, a.x_in, a.ln2, a.rstd2, w.post_norm);
    if (w.moe < 0) gate_up_forward(a, w);
  }
  if (w.moe < 0) swiglu_forward(a);
}

void Model::layer_backward(int chunk, int slot, size_t l, BackwardMode mode) {
  const Chunk& ch = chunks_[size_t(chunk)];
  Slot& s = slot_of(chunk, slot);
  LayerActs& a = s.layers[l];
  const LayerIdx& w = layer_idx_[ch.first_local + l];
  LayerSpans spans(be_, w.moe >= 0 ? &moe_spans_[size_t(w.moe)] : nullptr);
  recompute_layer(chunk, slot, l);
  // dW and dX of one linear layer (of parameters wi..wl, one matrix when
  // fused): both in one call, as the backend likes it, or the input gradient
  // now and dy kept for backward_weight.
  auto linear_bwd = [&](Tensor dx, size_t wi, size_t wl, const Tensor& dy, const Tensor& x,
                        Tensor saved, bool acc) {
    if (mode.split) {
      mm_bwd(dx, Tensor(), dy, x, wi, wl, acc);
      be_.copy(saved, dy);
    } else {
      mm_bwd(dx, weight_grads(wi, wl), dy, x, wi, wl, acc);
    }
  };
  // d_resid = dL/d(layer output). MLP branch: out = x_mid + down(h).
  gather_rows(d_full_, d_resid_);
  if (w.moe >= 0) {  // weight gradients inside (a split backward does them here too)
    spans.moe([&] { moe_backward(s, a, w, slot, mode.last_micro_batch); });
  } else {
    linear_bwd(dh_, w.down, w.down, d_full_, a.h, a.d_down, false);
    if (fused_) {
      be_.swiglu_packed_backward(dgu_, dh_, a.gu);
      linear_bwd(d_tmp_, w.gate, w.up, dgu_, a.ln2, a.d_gu, false);
    } else {
      be_.swiglu_backward(dgate_, dup_, dh_, a.gate, a.up);
      linear_bwd(d_tmp_, w.gate, w.gate, dgate_, a.ln2, a.d_gate, false);
      linear_bwd(d_tmp_, w.up, w.up, dup_, a.ln2, a.d_up, true);
    }
  }
  reduce_rows(d_tmp_local_, d_tmp_);
  be_.rmsnorm_backward(d_resid_, grad(w.post_norm), d_tmp_local_, a.x_mid, param(w.post_norm),
                       a.rstd2);
  // d_resid = dL/dx_mid. Attention branch: x_mid = x_in + o(att).
  gather_rows(d_full_, d_resid_);
  linear_bwd(d_att_, w.o, w.o, d_full_, a.att, a.d_o, false);
  attention_backward(a, s);
  const Rope r = rope_of(s);
  if (fused_) {
    be_.qkv_rope_merge_backward(qkv_, dq_, dk_, dv_, r.cos, r.sin, r.T);
    linear_bwd(d_tmp_, w.q, w.v, qkv_, a.ln1, a.d_qkv, false);
  } else {
    be_.rope_backward(dq_, r.cos, r.sin, r.T);
    be_.rope_backward(dk_, r.cos, r.sin, r.T);
    linear_bwd(d_tmp_, w.q, w.q, dq_, a.ln1, a.d_q, false);
    linear_bwd(d_tmp_, w.k, w.k, dk_, a.ln1, a.d_k, true);
    linear_bwd(d_tmp_, w.v, w.v, dv_, a.ln1, a.d_v, true);
  }
  reduce_rows(d_tmp_local_, d_tmp_);
  be_.rmsnorm_backward(d_resid_, grad(w.in_norm), d_tmp_local_, a.x_in, param(w.in_norm),
                       a.rstd1);
  finish_norm_grad(w.post_norm, mode.last_micro_batch);
  finish_norm_grad(w.in_norm, mode.last_micro_batch);
  if (w.moe >= 0 && mode.last_micro_batch && tp_->size() > 1) tp_->all_reduce(grad(w.router));
}

void Model::embedding_backward(Slot& s, bool split) {
  gather_rows(d_full_, d_resid_);
  if (split) {
    be_.copy(s.d_emb, d_full_);
  } else {
    be_.embedding_backward(grad(emb_idx_), d_full_, s.in_tok, vocab_start_);
  }
}

std::vector<GradUnit> Model::chunk_units(int chunk) const {
  // The backward's order: the final norm with the head (the norm alone when
  // the head is the tied embedding), the layers from the last, the embedding.
  const Chunk& ch = chunks_[size_t(chunk)];
  std::vector<GradUnit> u;
  auto add = [&](size_t first, size_t last) {
    const auto [b, e] = range(first, last);
    u.push_back({chunk, b, e});
  };
  if (chunk_has_head(chunk)) add(norm_idx_, head_idx_ != emb_idx_ ? head_idx_ : norm_idx_);
  for (size_t l = size_t(ch.n_layers); l-- > 0;) {
    const LayerIdx& w = layer_idx_[ch.first_local + l];
    add(w.in_norm, w.moe >= 0 ? w.w2.back() : w.down);
  }
  if (chunk_has_embedding(chunk)) add(emb_idx_, emb_idx_);
  return u;
}

std::vector<GradUnit> Model::grad_units() const {
  std::vector<GradUnit> all;
  for (int c = 0; c < num_chunks(); ++c) {
    const std::vector<GradUnit> u = chunk_units(c);
    all.insert(all.end(), u.begin(), u.end());
  }
  return all;
}

void Model::backward_weight(int chunk, int slot) {
  const Chunk& ch = chunks_[size_t(chunk)];
  Slot& s = slot_of(chunk, slot);
  // The same weight-gradient products as the fused backward, in the same order.
  if (chunk_has_head(chunk)) {
    store_backward(chunk, int64_t(s.layers.size()));
    be_.linear_backward(Tensor(), grad(head_idx_), s.logits, s.lnf, param(head_idx_), false);
  }
  for (size_t l = s.layers.size(); l-- > 0;) {
    store_backward(chunk, int64_t(l));
    LayerActs& a = s.layers[l];
    const LayerIdx& w = layer_idx_[ch.first_local + l];
    ADGT_CHECK(a.d_o.data, "Model::backward_weight: chunk " << chunk << " slot " << slot
                                                            << " had no split backward");
    recompute_layer(chunk, slot, l);  // the inputs of the weight gradients, once more
    auto dw = [&](size_t wi, size_t wl, const Tensor& dy, const Tensor& x) {
      mm_bwd(Tensor(), weight_grads(wi, wl), dy, x, wi, wl, false);
    };
    if (w.moe < 0) {
      dw(w.down, w.down, a.d_down, a.h);
      if (fused_) {
        dw(w.gate, w.up, a.d_gu, a.ln2);
      } else {
        dw(w.gate, w.gate, a.d_gate, a.ln2);
        dw(w.up, w.up, a.d_up, a.ln2);
      }
    }
    dw(w.o, w.o, a.d_o, a.att);
    if (fused_) {
      dw(w.q, w.v, a.d_qkv, a.ln1);
    } else {
      dw(w.q, w.q, a.d_q, a.ln1);
      dw(w.k, w.k, a.d_k, a.ln1);
      dw(w.v, w.v, a.d_v, a.ln1);
    }
  }
  if (chunk_has_embedding(chunk)) {
    store_backward(chunk, -1);
    be_.embedding_backward(grad(emb_idx_), s.d_emb, s.in_tok, vocab_start_);
  }
}

void Model::reduce_tp_partial_grads(int chunk) {
  const Chunk& ch = chunks_[size_t(chunk)];
  const size_t l0 = ch.first_local, l1 = ch.first_local + size_t(ch.n_layers);
  if (tp_->size() > 1)
    for (size_t l = l0; l < l1; ++l)
      if (layer_idx_[l].moe >= 0) tp_->all_reduce(grad(layer_idx_[l].router));
  if (!sp_) return;
  for (size_t l = l0; l < l1; ++l) {
    tp_->all_reduce(grad(layer_idx_[l].post_norm));
    tp_->all_reduce(grad(layer_idx_[l].in_norm));
  }
  if (chunk_has_head(chunk)) tp_->all_reduce(grad(norm_idx_));
}

MoeParams Model::moe_params(const LayerIdx& w, bool grads) const {
  auto get = [&](size_t i) { return grads ? grad(i) : param(i); };
  MoeParams p;
  p.gate = get(w.router);
  for (size_t i : w.w1) p.w1.push_back(get(i));
  for (size_t i : w.w2) p.w2.push_back(get(i));
  for (size_t i : w.w3) p.w3.push_back(get(i));
  if (fused_)
    for (size_t e = 0; e < w.w1.size(); ++e)
      p.w13.push_back(grads ? weight_grads(w.w1[e], w.w3[e]) : weights(w.w1[e], w.w3[e]));
  return p;
}

void Model::moe_forward(Slot& s, LayerActs& a, const LayerIdx& w, int slot, Tensor out) {
  // The router sees the whole (gathered) normed rows; each tp rank runs its
  // shard of every expert's FFN, so `out` is a partial sum like a dense down_proj's.
  (void)s;
  MoeLayer& m = *moe_[size_t(w.moe)];
  const double aux = m.forward(slot, out, a.ln2, moe_params(w, false));
  const MoeStats& st = m.stats(slot);
  MoeLayerStep& acc = moe_step_[size_t(w.moe)];
  for (size_t e = 0; e < acc.load.size() && e < st.load.size(); ++e) acc.load[e] += st.load[e];
  acc.tokens += st.tokens;
  acc.dropped += st.dropped;
  acc.aux += aux;
  acc.calls += 1;
  acc.a2a_bytes += st.a2a_bytes;
  acc.a2a_seconds += st.a2a_seconds;
  acc.expert_rows += st.expert_rows;
  acc.shadow_rows += st.shadow_rows;
  moe_spans_[size_t(w.moe)].expert.push_back(st.expert_span);
}

void Model::moe_backward(Slot& s, LayerActs& a, const LayerIdx& w, int slot, bool last_micro_batch) {
  (void)a;
  MoeLayer& m = *moe_[size_t(w.moe)];
  // d_tmp_ gets dL/d(ln2) (partial over tp, like the dense gate/up backward).
  // The aux-loss term is the same on every tp rank; scaled by 1/tp it is
  // counted once when the partial sums are reduced. Under context
  // parallelism s.grad_scale weighs this rank's share of the sequence's
  // tokens (1/cp of the LM loss), while the aux loss is one term over all
  // of them, each cp rank differentiating it for its own rows: its scale is
  // cp times that.
  const double cp = moe_aux_group_ ? double(moe_aux_group_->size()) : 1.0;
  be_.zero(d_tmp_);
  m.backward(slot, d_tmp_, moe_params(w, false), moe_params(w, true), d_full_,
             s.grad_scale * cp / double(tp_->size()), !defer_replica_grads_ || last_micro_batch);
  const MoeStats& st = m.stats(slot);
  MoeLayerStep& acc = moe_step_[size_t(w.moe)];
  acc.a2a_bytes += st.a2a_bytes_bwd;
  acc.a2a_seconds += st.a2a_seconds_bwd;
  acc.expert_rows += st.expert_rows_bwd;
  moe_spans_[size_t(w.moe)].expert.push_back(st.expert_span_bwd);
}

}  // namespace adgt

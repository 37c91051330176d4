#include "core/model/model.hpp"

#include <cmath>
#include <cstring>

#include "core/rng.hpp"
#include "kernels/common/bf16.hpp"
#include "kernels/check.hpp"

namespace adgt {

Model::Model(const ModelConfig& cfg, Backend& be, DType dtype, int64_t B, int64_t T,
             TensorParallel tpc, const StageSlice* stage, ExpertParallel epc)
    : cfg_(cfg),
      stage_(stage ? *stage : whole_model(cfg)),
      be_(be),
      dtype_(dtype),
      mdt_(dtype == DType::BF16 ? DType::F32 : dtype),
      B_(B),
      T_(T),
      N_(B * T),
      tp_(tpc.comm),
      self_("tp") {
  if (!tp_) tp_ = &self_;
  const int64_t tp = tp_->size(), r = tp_->rank();
  sp_ = tpc.sequence_parallel && tp > 1;
  ADGT_CHECK(dtype == DType::F32 || dtype == DType::F64 || dtype == DType::BF16,
             "Model: dtype " << dtype_name(dtype) << " not supported (f32, f64 or bf16)");
  ADGT_CHECK(dtype != DType::BF16 || cfg.n_experts == 0,
             "Model: bf16 (train.dtype) is not supported yet for mixture-of-experts models "
             "(model.n_experts=" << cfg.n_experts << "); use f32");
  ADGT_CHECK(T <= cfg.seq_len, "Model: micro-batch length " << T << " exceeds model.seq_len="
                                                            << cfg.seq_len);
  ADGT_CHECK(cfg.n_heads % tp == 0 && cfg.n_kv_heads % tp == 0 && cfg.ffn_hidden % tp == 0,
             "Model: tp=" << tp << " must divide n_heads, n_kv_heads and ffn_hidden");
  ADGT_CHECK(!sp_ || N_ % tp == 0, "Model: sequence parallelism needs B*T=" << N_
                                                                             << " divisible by tp=" << tp);
  ADGT_CHECK(!stage_.chunks.empty(), "Model: a pipeline stage slice with no chunks");
  ADGT_CHECK(!cfg.tie_embeddings || (stage_.embedding && stage_.head),
             "Model: model.tie_embeddings needs the embedding and the head on one rank "
             "(parallel.pp: 1)");
  Nl_ = sp_ ? N_ / tp : N_;
  const int64_t hd = cfg.head_dim();
  Hl_ = cfg.n_heads / tp;
  KVl_ = cfg.n_kv_heads / tp;
  Fl_ = cfg.ffn_hidden / tp;
  att_shape_ = {B, T, Hl_, KVl_, hd};
  // Mixture of experts: this ep rank's experts, from the placement table.
  std::unique_ptr<ExpertPlacement> placement;
  std::vector<int64_t> local_experts;
  if (cfg.n_experts > 0) {
    const int ep = epc.comm ? epc.comm->size() : 1;
    placement = std::make_unique<ExpertPlacement>(
        epc.placement.empty() ? ExpertPlacement::contiguous(cfg.n_experts, ep)
                              : ExpertPlacement(cfg.n_experts, ep, epc.placement));
    local_experts = placement->local_experts(epc.comm ? epc.comm->rank() : 0);
  }
  table_ = build_param_table(cfg, tp, r, &stage_, cfg.n_experts > 0 ? &local_experts : nullptr);
  // Index the table by role, in build_param_table's order.
  size_t i = 0;
  if (stage_.embedding) {
    emb_idx_ = i++;
    vocab_start_ = table_[emb_idx_].shard_dim == 0 ? table_[emb_idx_].shard_start : 0;
    vocab_valid_ = table_[emb_idx_].shard_valid;
    Vl_ = table_[emb_idx_].shape[0];
  }
  for (const auto& [first, end] : stage_.chunks) {
    ADGT_CHECK(end > first, "Model: pipeline chunk [" << first << ", " << end << ") holds no layer");
    Chunk c;
    c.first_layer = first;
    c.n_layers = end - first;
    c.first_local = layer_idx_.size();
    chunks_.push_back(std::move(c));
    for (int64_t l = first; l < end; ++l) {
      LayerIdx li{};
      li.in_norm = i++; li.q = i++; li.k = i++; li.v = i++; li.o = i++;
      li.post_norm = i++;
      if (cfg.is_moe_layer(l)) {
        li.gate = li.up = li.down = kNone;
        li.router = i++;
        for (size_t e = 0; e < local_experts.size(); ++e) {
          li.w1.push_back(i++);
          li.w2.push_back(i++);
          li.w3.push_back(i++);
        }
        li.moe = int(moe_.size());
        MoeOptions o;
        o.n_experts = cfg.n_experts;
        o.top_k = cfg.moe_top_k;
        o.aux_loss_coef = cfg.moe_aux_loss_coef;
        o.aux_free = cfg.moe_aux_free;
        o.bias_rate = cfg.moe_bias_rate;
        o.capacity_factor = cfg.moe_capacity_factor;
        o.aux_over_ep_group = false;  // per rank's micro-batch: layout-independent objective
        moe_.push_back(std::make_unique<MoeLayer>(be, dtype, N_, cfg.d_model, cfg.expert_ffn() / tp,
                                                  o, placement->table(), epc.comm));
        MoeLayerStep st;
        st.layer = l;
        st.load.assign(size_t(cfg.n_experts), 0);
        moe_step_.push_back(st);
      } else {
        li.gate = i++; li.up = i++; li.down = i++;
      }
      layer_idx_.push_back(std::move(li));
    }
  }
  if (stage_.head) {
    norm_idx_ = i++;
    head_idx_ = cfg.tie_embeddings ? emb_idx_ : i++;
    vocab_start_ = table_[head_idx_].shard_dim == 0 ? table_[head_idx_].shard_start : 0;
    vocab_valid_ = table_[head_idx_].shard_valid;
    Vl_ = table_[head_idx_].shape[0];
  }
  ADGT_CHECK(i == table_.size(), "Model: parameter table has unexpected layout");

  const int64_t mult = std::max<int64_t>(16, tpc.flat_multiple);
  flat_n_ = (total_numel(table_) + mult - 1) / mult * mult;
  params_ = Buffer(be, size_t(flat_n_) * dtype_size(dtype));
  grads_ = Buffer(be, size_t(flat_n_) * dtype_size(mdt_));
  be.zero(params());
  be.zero(grads());
  if (mixed()) {
    master_ = Buffer(be, size_t(flat_n_) * dtype_size(mdt_));
    be.zero(master());
  }
  const DType sdt = mdt_;  // statistics: rstd, losses, ce stats, rope tables

  const int64_t C = cfg.d_model, N = N_, Nl = Nl_;
  for (int c = 0; c < num_chunks(); ++c) add_slot(c);
  d_resid_ = act(Nl, C, dtype);
  d_tmp_ = act(N, C, dtype);
  if (sp_) {
    ln_local_ = act(Nl, C, dtype);
    partial_ = act(N, C, dtype);
    d_full_ = act(N, C, dtype);
    d_tmp_local_ = act(Nl, C, dtype);
  } else {  // without SP the local and full row sets coincide
    d_full_ = d_resid_;
    d_tmp_local_ = d_tmp_;
  }
  dq_ = act(N, Hl_ * hd, dtype);
  dk_ = act(N, KVl_ * hd, dtype);
  dv_ = act(N, KVl_ * hd, dtype);
  d_att_ = act(N, Hl_ * hd, dtype);
  dgate_ = act(N, Fl_, dtype);
  dup_ = act(N, Fl_, dtype);
  dh_ = act(N, Fl_, dtype);
  if (tp > 1 && stage_.head) {
    ce_stats_ = act(N, 3, sdt);
    ce_gathered_ = act(tp * N, 3, sdt);
    ce_combined_ = act(N, 3, sdt);
  }
  rope_cos_ = act(T, hd / 2, sdt);
  rope_sin_ = act(T, hd / 2, sdt);
  build_rope_tables();
}

void Model::add_slot(int chunk) {
  Chunk& ch = chunks_[size_t(chunk)];
  const int64_t C = cfg_.d_model, hd = cfg_.head_dim(), N = N_, Nl = Nl_;
  const DType dt = dtype_, sdt = mdt_;
  const int64_t att_saved = be_.attention_saved_elems(att_shape_);
  Slot s;
  s.layers.resize(size_t(ch.n_layers));
  for (auto& a : s.layers) {
    a.x_in = act(Nl, C, dt);
    a.ln1 = act(N, C, dt);
    a.rstd1 = act(Nl, 1, sdt);
    a.q = act(N, Hl_ * hd, dt);
    a.k = act(N, KVl_ * hd, dt);
    a.v = act(N, KVl_ * hd, dt);
    a.att_saved = act(att_saved, 1, sdt);
    a.att = act(N, Hl_ * hd, dt);
    a.x_mid = act(Nl, C, dt);
    a.ln2 = act(N, C, dt);
    a.rstd2 = act(Nl, 1, sdt);
    a.gate = act(N, Fl_, dt);
    a.up = act(N, Fl_, dt);
    a.h = act(N, Fl_, dt);
  }
  s.x_out = act(Nl, C, dt);
  if (chunk_has_head(chunk)) {
    s.lnf = act(N, C, dt);
    s.rstdf = act(Nl, 1, sdt);
    s.logits = act(N, Vl_, dt);
    s.losses = act(N, 1, sdt);
  }
  s.in_tok = act(N, 1, DType::I32);
  s.tgt_tok = act(N, 1, DType::I32);
  ch.slots.push_back(std::move(s));
  for (int64_t l = 0; l < ch.n_layers; ++l) {
    const LayerIdx& w = layer_idx_[ch.first_local + size_t(l)];
    if (w.moe >= 0) {
      const int k = moe_[size_t(w.moe)]->add_slot();
      ADGT_CHECK(k + 1 == int(ch.slots.size()), "Model: MoE slots out of step with the chunk's");
    }
  }
}

void Model::make_split_buffers(Slot& s, int chunk) {
  if (!s.layers.empty() && s.layers[0].d_q.data) return;
  if (s.layers.empty() && (s.d_emb.data || !chunk_has_embedding(chunk))) return;
  const int64_t C = cfg_.d_model, hd = cfg_.head_dim(), N = N_;
  for (auto& a : s.layers) {
    a.d_down = act(N, C, dtype_);
    a.d_gate = act(N, Fl_, dtype_);
    a.d_up = act(N, Fl_, dtype_);
    a.d_o = act(N, C, dtype_);
    a.d_q = act(N, Hl_ * hd, dtype_);
    a.d_k = act(N, KVl_ * hd, dtype_);
    a.d_v = act(N, KVl_ * hd, dtype_);
  }
  if (chunk_has_embedding(chunk)) s.d_emb = act(N, C, dtype_);
}

Tensor Model::stage_input(int chunk, int slot) {
  return chunks_[size_t(chunk)].slots[size_t(slot)].layers[0].x_in;
}

Tensor Model::stage_output(int chunk, int slot) {
  return chunks_[size_t(chunk)].slots[size_t(slot)].x_out;
}

Tensor Model::act(int64_t rows, int64_t cols, DType dt) {
  owned_.emplace_back(be_, size_t(rows * cols) * dtype_size(dt));
  return Tensor(owned_.back().data(), dt, {rows, cols});
}

Tensor Model::flat(const Buffer& b, DType dt) const { return Tensor(b.data(), dt, {flat_n_}); }

void Model::sync_params(int64_t lo, int64_t hi) {
  if (!mixed()) return;
  if (hi < 0) hi = flat_n_;
  if (hi <= lo) return;
  auto part = [&](Tensor t) {
    t.data = static_cast<char*>(t.data) + size_t(lo) * dtype_size(t.dtype);
    t.shape[0] = hi - lo;
    return t;
  };
  be_.cast(part(params()), part(master()));
}

std::vector<double> Model::read_host(const Tensor& t) const {
  const size_t n = size_t(t.numel());
  std::vector<double> out(n);
  if (t.dtype == DType::F64) {
    be_.to_host(out.data(), t.data, n * 8);
  } else if (t.dtype == DType::F32) {
    std::vector<float> f(n);
    be_.to_host(f.data(), t.data, n * 4);
    std::copy(f.begin(), f.end(), out.begin());
  } else {
    ADGT_CHECK(t.dtype == DType::BF16, "Model::read_host: dtype " << dtype_name(t.dtype));
    std::vector<bf16_bits> h(n);
    be_.to_host(h.data(), t.data, n * 2);
    for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(h[i]);
  }
  return out;
}

Tensor Model::param(size_t i) const {
  const ParamSpec& p = table_[i];
  Tensor t(static_cast<char*>(params_.data()) + size_t(p.offset) * dtype_size(dtype_), dtype_, {});
  for (int64_t s : p.shape) t.shape[t.ndim++] = s;
  return t;
}

Tensor Model::grad(size_t i) const {
  Tensor t = param(i);
  t.dtype = mdt_;
  t.data = static_cast<char*>(grads_.data()) + size_t(table_[i].offset) * dtype_size(mdt_);
  return t;
}

std::pair<int64_t, int64_t> Model::range(size_t first, size_t last) const {
  return {table_[first].offset, table_[last].offset + (table_[last].numel + 15) / 16 * 16};
}

void Model::build_rope_tables() {
  // HF: inv_freq[i] = theta^(-2i/hd); angle(t, i) = t * inv_freq[i]; computed in double.
  const int64_t half = cfg_.head_dim() / 2, hd = cfg_.head_dim();
  std::vector<double> c(size_t(T_ * half)), s(size_t(T_ * half));
  for (int64_t t = 0; t < T_; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double inv = std::pow(cfg_.rope_theta, -double(2 * i) / double(hd));
      const double a = double(t) * inv;
      c[size_t(t * half + i)] = std::cos(a);
      s[size_t(t * half + i)] = std::sin(a);
    }
  auto upload = [&](Tensor dst, const std::vector<double>& src) {
    if (dst.dtype == DType::F64) {
      be_.to_device(dst.data, src.data(), src.size() * 8);
    } else {
      std::vector<float> f(src.begin(), src.end());
      be_.to_device(dst.data, f.data(), f.size() * 4);
    }
  };
  upload(rope_cos_, c);
  upload(rope_sin_, s);
}

void Model::init_weights(uint64_t seed) {
  std::vector<float> host(size_t(flat_n_), 0.0f);
  for (const ParamSpec& p : table_) {
    float* dst = host.data() + p.offset;
    if (p.shape.size() == 1) {  // RMSNorm weights
      std::fill(dst, dst + p.numel, 1.0f);
      continue;
    }
    // The whole global tensor's stream, then this rank's shard of it.
    const int64_t rows = p.global_shape[0], cols = p.global_shape[1];
    std::vector<float> g(size_t(rows * cols));
    Rng rng(seed ^ hash_string(p.name));
    for (auto& x : g) x = float(cfg_.init_std * rng.normal());
    if (p.shard_dim < 0) {
      std::copy(g.begin(), g.end(), dst);
    } else if (p.shard_dim == 0) {  // rows [start, start+valid); padding rows stay 0
      std::copy(g.begin() + p.shard_start * cols, g.begin() + (p.shard_start + p.shard_valid) * cols,
                dst);
    } else {  // columns [start, start + local cols)
      const int64_t lc = p.shape[1];
      for (int64_t i = 0; i < rows; ++i)
        std::copy(g.begin() + i * cols + p.shard_start, g.begin() + i * cols + p.shard_start + lc,
                  dst + i * lc);
    }
  }
  params_from_host(host);
}

std::vector<float> Model::params_to_host() const {
  const size_t n = size_t(flat_n_);
  std::vector<float> out(n);
  if (mdt_ == DType::F32) {
    be_.to_host(out.data(), master().data, n * 4);
  } else {
    std::vector<double> d(n);
    be_.to_host(d.data(), master().data, n * 8);
    for (size_t i = 0; i < n; ++i) out[i] = float(d[i]);
  }
  return out;
}

void Model::params_from_host(const std::vector<float>& flat_host) {
  const size_t n = size_t(flat_n_);
  ADGT_CHECK(flat_host.size() == n, "params_from_host: got " << flat_host.size()
                                                             << " values, expected " << n);
  if (mdt_ == DType::F32) {
    be_.to_device(master().data, flat_host.data(), n * 4);
  } else {
    std::vector<double> d(flat_host.begin(), flat_host.end());
    be_.to_device(master().data, d.data(), n * 8);
  }
  sync_params();
}

std::vector<double> Model::grads_to_host_f64() const {
  return read_host(grads());
}

void Model::zero_grads() { be_.zero(grads()); }

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
    gather_rows(full_out, ln_local_);
  } else {
    be_.rmsnorm_forward(full_out, rstd, x, param(w), cfg_.norm_eps);
  }
}

void Model::add_norm_forward(Tensor x, const Tensor& y, Tensor full_out, Tensor rstd, size_t w) {
  if (sp_) {
    be_.residual_rmsnorm_forward(x, y, ln_local_, rstd, param(w), cfg_.norm_eps);
    gather_rows(full_out, ln_local_);
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
  const int64_t N = N_;
  Chunk& ch = chunks_[size_t(chunk)];
  Slot& s = ch.slots[size_t(slot)];
  const bool emb = chunk_has_embedding(chunk), head = chunk_has_head(chunk);
  s.grad_scale = grad_scale;
  int64_t n_valid = 0;
  if (emb) {
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
  if (head) {
    for (int64_t i = 0; i < N; ++i) {
      ADGT_CHECK(targets[i] < cfg_.vocab_size, "target " << targets[i] << " at row " << i
                                                         << " outside the vocabulary [0,"
                                                         << cfg_.vocab_size << ")");
      n_valid += targets[i] >= 0;
    }
    be_.to_device(s.tgt_tok.data, targets, size_t(N) * 4);
  }
  // Each residual add is fused with the norm that reads its result
  // (residual_rmsnorm_forward; the same numbers as the add then the norm).
  bool normed = false;  // this layer's ln1 was computed by the previous layer's add
  for (size_t l = 0; l < s.layers.size(); ++l) {
    LayerActs& a = s.layers[l];
    const LayerIdx& w = layer_idx_[ch.first_local + l];
    if (!normed) norm_forward(a.ln1, a.rstd1, a.x_in, w.in_norm);
    normed = false;
    be_.linear_forward(a.q, a.ln1, param(w.q));
    be_.linear_forward(a.k, a.ln1, param(w.k));
    be_.linear_forward(a.v, a.ln1, param(w.v));
    be_.rope_forward(a.q, rope_cos_, rope_sin_, T_);
    be_.rope_forward(a.k, rope_cos_, rope_sin_, T_);
    be_.attention_forward(a.att, a.att_saved, a.q, a.k, a.v, att_shape_);
    Tensor o = sp_ ? partial_ : a.x_mid;
    be_.linear_forward(o, a.att, param(w.o));
    reduce_rows(a.x_mid, o);
    add_norm_forward(a.x_mid, a.x_in, a.ln2, a.rstd2, w.post_norm);
    Tensor next = l + 1 < s.layers.size() ? s.layers[l + 1].x_in : s.x_out;
    Tensor down = sp_ ? partial_ : next;
    if (w.moe >= 0) {
      moe_forward(s, a, w, slot, down);
    } else {
      be_.linear_forward(a.gate, a.ln2, param(w.gate));
      be_.linear_forward(a.up, a.ln2, param(w.up));
      be_.swiglu_forward(a.h, a.gate, a.up);
      be_.linear_forward(down, a.h, param(w.down));
    }
    reduce_rows(next, down);
    if (l + 1 < s.layers.size()) {
      LayerActs& n = s.layers[l + 1];
      add_norm_forward(next, a.x_mid, n.ln1, n.rstd1, layer_idx_[ch.first_local + l + 1].in_norm);
      normed = true;
    } else if (head) {
      add_norm_forward(next, a.x_mid, s.lnf, s.rstdf, norm_idx_);
      normed = true;
    } else {
      be_.add_inplace(next, a.x_mid);
    }
  }
  if (!head) return 0.0;
  if (!normed) norm_forward(s.lnf, s.rstdf, s.x_out, norm_idx_);
  be_.linear_forward(s.logits, s.lnf, param(head_idx_));
  if (capture_logits_) logits_host_ = read_host(s.logits);
  loss_forward(s, n_valid ? grad_scale / double(n_valid) : 0.0);

  double sum = 0;
  if (mdt_ == DType::F64) {
    std::vector<double> l(static_cast<size_t>(N));
    be_.to_host(l.data(), s.losses.data, size_t(N) * 8);
    for (double x : l) sum += x;
  } else {
    std::vector<float> l(static_cast<size_t>(N));
    be_.to_host(l.data(), s.losses.data, size_t(N) * 4);
    for (float x : l) sum += x;
  }
  return n_valid ? sum / double(n_valid) : 0.0;
}

void Model::backward_chunk(int chunk, int slot, const Tensor& d_out, bool split,
                           const std::function<void(int64_t, int64_t)>& on_ready,
                           bool last_micro_batch) {
  Chunk& ch = chunks_[size_t(chunk)];
  Slot& s = ch.slots[size_t(slot)];
  const bool emb = chunk_has_embedding(chunk), head = chunk_has_head(chunk);
  if (split) make_split_buffers(s, chunk);
  // The units of grad_units(), reported in their order as they complete.
  const std::vector<GradUnit> units = chunk_units(chunk);
  size_t next_unit = 0;
  auto ready = [&] {
    ADGT_CHECK(next_unit < units.size(), "Model::backward_chunk: more gradient units than "
                                             << units.size() << " in chunk " << chunk);
    const GradUnit& u = units[next_unit++];
    if (on_ready && !split) on_ready(u.begin, u.end);
  };
  // With SP a norm weight's gradient is a partial sum over this rank's rows;
  // partials accumulate over micro-batches and are summed over tp once.
  auto finish_norm_grad = [&](size_t idx) {
    if (sp_ && last_micro_batch) tp_->all_reduce(grad(idx));
  };
  // dW and dX of one linear layer: fused (one call, as the backend likes it),
  // or the input gradient now and dy kept for backward_weight.
  auto linear_bwd = [&](Tensor dx, size_t w, const Tensor& dy, const Tensor& x, Tensor saved,
                        bool acc) {
    if (split) {
      be_.linear_backward(dx, Tensor(), dy, x, param(w), acc);
      be_.copy(saved, dy);
    } else {
      be_.linear_backward(dx, grad(w), dy, x, param(w), acc);
    }
  };
  if (head) {
    // logits now hold dloss/dlogits (scaled). The head's input gradient is a
    // partial sum over vocabulary shards. The split backward keeps them in the
    // slot for the head's weight gradient.
    if (split)
      be_.linear_backward(d_tmp_, Tensor(), s.logits, s.lnf, param(head_idx_), false);
    else
      be_.linear_backward(d_tmp_, grad(head_idx_), s.logits, s.lnf, param(head_idx_), false);
    reduce_rows(d_tmp_local_, d_tmp_);
    be_.zero(d_resid_);
    be_.rmsnorm_backward(d_resid_, grad(norm_idx_), d_tmp_local_, s.x_out, param(norm_idx_),
                         s.rstdf);
    finish_norm_grad(norm_idx_);
    ready();
  } else {
    ADGT_CHECK(d_out.numel() == d_resid_.numel(),
               "Model::backward_chunk: output gradient " << d_out.shape_str() << ", expected "
                                                         << d_resid_.shape_str());
    be_.copy(d_resid_, d_out);
  }
  for (size_t l = s.layers.size(); l-- > 0;) {
    LayerActs& a = s.layers[l];
    const LayerIdx& w = layer_idx_[ch.first_local + l];
    // d_resid = dL/d(layer output). MLP branch: out = x_mid + down(h).
    gather_rows(d_full_, d_resid_);
    if (w.moe >= 0) {  // weight gradients inside (a split backward does them here too)
      moe_backward(s, a, w, slot);
    } else {
      linear_bwd(dh_, w.down, d_full_, a.h, a.d_down, false);
      be_.swiglu_backward(dgate_, dup_, dh_, a.gate, a.up);
      linear_bwd(d_tmp_, w.gate, dgate_, a.ln2, a.d_gate, false);
      linear_bwd(d_tmp_, w.up, dup_, a.ln2, a.d_up, true);
    }
    reduce_rows(d_tmp_local_, d_tmp_);
    be_.rmsnorm_backward(d_resid_, grad(w.post_norm), d_tmp_local_, a.x_mid, param(w.post_norm),
                         a.rstd2);
    // d_resid = dL/dx_mid. Attention branch: x_mid = x_in + o(att).
    gather_rows(d_full_, d_resid_);
    linear_bwd(d_att_, w.o, d_full_, a.att, a.d_o, false);
    be_.attention_backward(dq_, dk_, dv_, d_att_, a.q, a.k, a.v, a.att, a.att_saved,
                           att_shape_);
    be_.rope_backward(dq_, rope_cos_, rope_sin_, T_);
    be_.rope_backward(dk_, rope_cos_, rope_sin_, T_);
    linear_bwd(d_tmp_, w.q, dq_, a.ln1, a.d_q, false);
    linear_bwd(d_tmp_, w.k, dk_, a.ln1, a.d_k, true);
    linear_bwd(d_tmp_, w.v, dv_, a.ln1, a.d_v, true);
    reduce_rows(d_tmp_local_, d_tmp_);
    be_.rmsnorm_backward(d_resid_, grad(w.in_norm), d_tmp_local_, a.x_in, param(w.in_norm),
                         a.rstd1);
    finish_norm_grad(w.post_norm);
    finish_norm_grad(w.in_norm);
    if (w.moe >= 0 && last_micro_batch && tp_->size() > 1) tp_->all_reduce(grad(w.router));
    ready();
  }
  if (emb) {
    gather_rows(d_full_, d_resid_);
    if (split) {
      be_.copy(s.d_emb, d_full_);
    } else {
      be_.embedding_backward(grad(emb_idx_), d_full_, s.in_tok, vocab_start_);
    }
    ready();
  }
  ADGT_CHECK(next_unit == units.size(), "Model::backward_chunk: chunk " << chunk << " completed "
                                                                          << next_unit << " of "
                                                                          << units.size()
                                                                          << " gradient units");
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
    add(w.in_norm, w.moe >= 0 ? w.w3.back() : w.down);
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
  Chunk& ch = chunks_[size_t(chunk)];
  Slot& s = ch.slots[size_t(slot)];
  // The same weight-gradient products as the fused backward, in the same order.
  if (chunk_has_head(chunk))
    be_.linear_backward(Tensor(), grad(head_idx_), s.logits, s.lnf, param(head_idx_), false);
  for (size_t l = s.layers.size(); l-- > 0;) {
    LayerActs& a = s.layers[l];
    const LayerIdx& w = layer_idx_[ch.first_local + l];
    ADGT_CHECK(a.d_q.data, "Model::backward_weight: chunk " << chunk << " slot " << slot
                                                            << " had no split backward");
    if (w.moe < 0) {
      be_.linear_backward(Tensor(), grad(w.down), a.d_down, a.h, param(w.down), false);
      be_.linear_backward(Tensor(), grad(w.gate), a.d_gate, a.ln2, param(w.gate), false);
      be_.linear_backward(Tensor(), grad(w.up), a.d_up, a.ln2, param(w.up), false);
    }
    be_.linear_backward(Tensor(), grad(w.o), a.d_o, a.att, param(w.o), false);
    be_.linear_backward(Tensor(), grad(w.q), a.d_q, a.ln1, param(w.q), false);
    be_.linear_backward(Tensor(), grad(w.k), a.d_k, a.ln1, param(w.k), false);
    be_.linear_backward(Tensor(), grad(w.v), a.d_v, a.ln1, param(w.v), false);
  }
  if (chunk_has_embedding(chunk))
    be_.embedding_backward(grad(emb_idx_), s.d_emb, s.in_tok, vocab_start_);
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
}

void Model::moe_backward(Slot& s, LayerActs& a, const LayerIdx& w, int slot) {
  (void)a;
  MoeLayer& m = *moe_[size_t(w.moe)];
  // d_tmp_ gets dL/d(ln2) (partial over tp, like the dense gate/up backward).
  // The aux-loss term is the same on every tp rank; scaled by 1/tp it is
  // counted once when the partial sums are reduced.
  be_.zero(d_tmp_);
  m.backward(slot, d_tmp_, moe_params(w, false), moe_params(w, true), d_full_,
             s.grad_scale / double(tp_->size()));
  const MoeStats& st = m.stats(slot);
  MoeLayerStep& acc = moe_step_[size_t(w.moe)];
  acc.a2a_bytes += st.a2a_bytes_bwd;
  acc.a2a_seconds += st.a2a_seconds_bwd;
}

std::vector<double> Model::moe_bias_table() const {
  const size_t E = size_t(std::max<int64_t>(cfg_.n_experts, 0));
  std::vector<double> t(size_t(cfg_.n_layers) * E, 0.0);
  for (size_t i = 0; i < moe_.size(); ++i) {
    const auto& b = moe_[i]->bias();
    std::copy(b.begin(), b.end(), t.begin() + std::ptrdiff_t(size_t(moe_step_[i].layer) * E));
  }
  return t;
}

void Model::set_moe_bias_table(const std::vector<double>& t) {
  const size_t E = size_t(std::max<int64_t>(cfg_.n_experts, 0));
  ADGT_CHECK(t.size() == size_t(cfg_.n_layers) * E,
             "MoE bias table: " << t.size() << " values, expected n_layers x n_experts = "
                                << size_t(cfg_.n_layers) * E);
  for (size_t i = 0; i < moe_.size(); ++i) {
    const auto* b = t.data() + size_t(moe_step_[i].layer) * E;
    moe_[i]->set_bias(std::vector<double>(b, b + E));
  }
}

void Model::reset_moe_stats() {
  for (MoeLayerStep& m : moe_step_) {
    std::fill(m.load.begin(), m.load.end(), 0);
    m.tokens = m.dropped = m.calls = m.a2a_bytes = 0;
    m.aux = m.a2a_seconds = 0;
  }
}

void Model::update_moe_bias(Comm* replicas) {
  for (size_t i = 0; i < moe_.size(); ++i) {
    if (!moe_[i]->options().aux_free) continue;
    std::vector<int64_t> load = moe_step_[i].load;
    if (replicas && replicas->size() > 1) {
      std::vector<double> d(load.begin(), load.end());
      replicas->all_reduce(Tensor(d.data(), DType::F64, {int64_t(d.size())}));
      for (size_t e = 0; e < load.size(); ++e) load[e] = int64_t(std::llround(d[e]));
    }
    moe_[i]->update_bias(load);
  }
}

}  // namespace adgt

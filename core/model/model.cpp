#include "core/model/model.hpp"

#include <algorithm>
#include <numeric>
#include <chrono>
#include <cmath>
#include <memory>

#include "core/model/init_weights.hpp"
#include "kernels/common/bf16.hpp"
#include "kernels/check.hpp"

namespace adgt {

Model::Model(const ModelConfig& cfg, Backend& be, DType dtype, int64_t B, int64_t T,
             TensorParallel tpc, const StageSlice* stage, ExpertParallel epc,
             RecomputePolicy recompute, bool fused, ContextAttention* context)
    : cfg_(cfg),
      stage_(stage ? *stage : whole_model(cfg)),
      be_(be),
      dtype_(dtype),
      mdt_(dtype == DType::BF16 ? DType::F32 : dtype),
      B_(B),
      T_(T),
      N_(B * T),
      tp_(tpc.comm),
      self_("tp"),
      recompute_(recompute),
      fused_(fused) {
  context_ = context;
  if (!tp_) tp_ = &self_;
  const int64_t tp = tp_->size();
  sp_ = tpc.sequence_parallel && tp > 1;
  check_arguments();
  Nl_ = sp_ ? N_ / tp : N_;
  Hl_ = cfg.n_heads / tp;
  KVl_ = cfg.n_kv_heads / tp;
  Fl_ = cfg.ffn_hidden / tp;
  att_shape_ = {B, T, Hl_, KVl_, cfg.head_dim()};
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
  table_ = build_param_table(cfg, tp, tp_->rank(), &stage_,
                             cfg.n_experts > 0 ? &local_experts : nullptr);
  index_params(local_experts.size());
  moe_aux_group_ = epc.aux_group;
  if (placement) make_moe_layers(*placement, epc.comm);
  make_flat_buffers(tpc.flat_multiple);
  plan_recompute();
  for (int c = 0; c < num_chunks(); ++c) add_slot(c);
  make_scratch();
  build_rope_tables();
}

void Model::check_arguments() const {
  const int64_t tp = tp_->size();
  ADGT_CHECK(dtype_ == DType::F32 || dtype_ == DType::F64 || dtype_ == DType::BF16,
             "Model: dtype " << dtype_name(dtype_) << " not supported (f32, f64 or bf16)");
  ADGT_CHECK(T_ <= cfg_.seq_len, "Model: micro-batch length " << T_ << " exceeds model.seq_len="
                                                              << cfg_.seq_len);
  ADGT_CHECK(cfg_.n_heads % tp == 0 && cfg_.n_kv_heads % tp == 0 && cfg_.ffn_hidden % tp == 0,
             "Model: tp=" << tp << " must divide n_heads, n_kv_heads and ffn_hidden");
  ADGT_CHECK(!sp_ || N_ % tp == 0, "Model: sequence parallelism needs B*T=" << N_
                                                                             << " divisible by tp=" << tp);
  ADGT_CHECK(!stage_.chunks.empty(), "Model: a pipeline stage slice with no chunks");
  ADGT_CHECK(!cfg_.tie_embeddings || (stage_.embedding && stage_.head),
             "Model: model.tie_embeddings needs the embedding and the head on one rank "
             "(parallel.pp: 1)");
}

void Model::index_params(size_t n_local_experts) {
  // The vocabulary shard of the embedding or the head (the head's wins).
  auto take_vocab = [&](size_t idx) {
    vocab_start_ = table_[idx].shard_dim == 0 ? table_[idx].shard_start : 0;
    vocab_valid_ = table_[idx].shard_valid;
    Vl_ = table_[idx].shape[0];
  };
  size_t i = 0;
  if (stage_.embedding) {
    emb_idx_ = i++;
    take_vocab(emb_idx_);
  }
  int n_moe = 0;
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
      if (cfg_.is_moe_layer(l)) {
        li.gate = li.up = li.down = kNone;
        li.router = i++;
        for (size_t e = 0; e < n_local_experts; ++e) {
          li.w1.push_back(i++);
          li.w3.push_back(i++);
          li.w2.push_back(i++);
        }
        li.moe = n_moe++;
      } else {
        li.gate = i++; li.up = i++; li.down = i++;
      }
      layer_idx_.push_back(std::move(li));
    }
  }
  if (stage_.head) {
    norm_idx_ = i++;
    head_idx_ = cfg_.tie_embeddings ? emb_idx_ : i++;
    take_vocab(head_idx_);
  }
  ADGT_CHECK(i == table_.size(), "Model: parameter table has unexpected layout");
}

void Model::make_moe_layers(const ExpertPlacement& placement, Comm* ep) {
  const MoeOptions o{.n_experts = cfg_.n_experts,
                     .top_k = cfg_.moe_top_k,
                     .aux_loss_coef = cfg_.moe_aux_loss_coef,
                     .aux_free = cfg_.moe_aux_free,
                     .bias_rate = cfg_.moe_bias_rate,
                     .capacity_factor = cfg_.moe_capacity_factor,
                     .capacity_segment = cfg_.moe_capacity_segment,
                     // per rank's micro-batch: a layout-independent objective
                     .aux_over_ep_group = false};
  for (const Chunk& ch : chunks_)
    for (int64_t l = 0; l < ch.n_layers; ++l) {
      const LayerIdx& w = layer_idx_[ch.first_local + size_t(l)];
      if (w.moe < 0) continue;
      ADGT_CHECK(w.moe == int(moe_.size()), "Model: MoE layers out of layer order");
      moe_.push_back(std::make_unique<MoeLayer>(be_, dtype_, N_, cfg_.d_model,
                                                cfg_.expert_ffn() / tp_->size(), o,
                                                placement.table(), ep, moe_aux_group_));
      // Context parallelism: capacity groups that span the cp ranks' chunks.
      if (context_ && moe_aux_group_)
        moe_.back()->set_sequence_split(
            {moe_aux_group_, context_->positions(T_), T_ * int64_t(moe_aux_group_->size()), T_ / 2});
      if (cfg_.moe_aux_free && cfg_.moe_bias_init_zipf > 0)
        moe_.back()->set_bias(zipf_selection_bias(cfg_.n_experts, cfg_.d_model, cfg_.init_std,
                                                  cfg_.moe_bias_init_zipf));
      MoeLayerStep st;
      st.layer = ch.first_layer + l;
      st.load.assign(size_t(cfg_.n_experts), 0);
      moe_step_.push_back(st);
      moe_spans_.emplace_back();
    }
}

void Model::make_flat_buffers(int64_t flat_multiple) {
  const int64_t mult = std::max<int64_t>(16, flat_multiple);
  flat_n_ = (total_numel(table_) + mult - 1) / mult * mult;
  // The buffers themselves are made at their first use (flat()).
}

Recompute parse_recompute(const std::string& s) {
  if (s == "none") return Recompute::None;
  if (s == "selective") return Recompute::Selective;
  if (s == "full") return Recompute::Full;
  ADGT_CHECK(false, "train.recompute='" << s << "': use none, selective or full");
}

void Model::plan_recompute() {
  ADGT_CHECK(recompute_.layers >= 0, "Model: recompute layers " << recompute_.layers << " < 0");
  layer_rc_.assign(layer_idx_.size(), Recompute::None);
  bool any = false;
  for (const Chunk& ch : chunks_)
    for (int64_t l = 0; l < ch.n_layers; ++l) {
      Recompute m = recompute_.mode;
      if (m == Recompute::Full && recompute_.layers > 0 && l >= recompute_.layers)
        m = Recompute::None;
      layer_rc_[ch.first_local + size_t(l)] = m;
      any = any || m != Recompute::None;
    }
  if (!any) return;
  // One layer's worth of what the recomputing layers share (a whole layer's
  // for full; its x_in goes unused).
  if (recompute_.mode == Recompute::Full)
    rc_ = layer_acts(Recompute::None);
  else
    alloc_core(rc_);
}

void Model::alloc_core(LayerActs& a, bool moe) {
  a.att_saved = act(context_ ? context_->saved_elems(att_shape_) : be_.attention_saved_elems(att_shape_),
                    1, mdt_);
  a.att = act(N_, Hl_ * cfg_.head_dim(), dtype_);
  if (!moe) a.h = act(N_, Fl_, dtype_);
}

Model::LayerActs Model::layer_acts(Recompute shared, bool moe) {
  const int64_t C = cfg_.d_model, hd = cfg_.head_dim(), N = N_, Nl = Nl_;
  const DType dt = dtype_, sdt = mdt_;
  LayerActs a;
  if (shared == Recompute::Full) {  // only the input is the layer's own
    a = rc_;
    a.x_in = act(Nl, C, dt);
    return a;
  }
  if (shared == Recompute::Selective) {  // the attention core and the SwiGLU product are shared
    a.att_saved = rc_.att_saved;
    a.att = rc_.att;
    a.h = rc_.h;
  } else {
    alloc_core(a, moe);
  }
  a.x_in = act(Nl, C, dt);
  a.ln1 = act(N, C, dt);
  a.rstd1 = act(Nl, 1, sdt);
  a.q = act(N, Hl_ * hd, dt);
  a.k = act(N, KVl_ * hd, dt);
  a.v = act(N, KVl_ * hd, dt);
  a.x_mid = act(Nl, C, dt);
  a.ln2 = act(N, C, dt);
  a.rstd2 = act(Nl, 1, sdt);
  if (moe) return a;  // no dense FFN: the MoE block's buffers are its layer's (MoeLayer slots)
  if (fused_) {
    a.gu = act(N, 2 * Fl_, dt);
  } else {
    a.gate = act(N, Fl_, dt);
    a.up = act(N, Fl_, dt);
  }
  return a;
}

void Model::add_slot(int chunk) {
  Chunk& ch = chunks_[size_t(chunk)];
  const int64_t C = cfg_.d_model, N = N_, Nl = Nl_;
  const DType dt = dtype_, sdt = mdt_;
  Slot s;
  for (int64_t l = 0; l < ch.n_layers; ++l)
    s.layers.push_back(layer_acts(layer_rc_[ch.first_local + size_t(l)],
                                  layer_idx_[ch.first_local + size_t(l)].moe >= 0));
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

void Model::make_scratch() {
  const int64_t C = cfg_.d_model, hd = cfg_.head_dim(), N = N_, Nl = Nl_, tp = tp_->size();
  const DType dt = dtype_, sdt = mdt_;  // statistics (ce stats) in the master dtype
  d_resid_ = act(Nl, C, dt);
  d_tmp_ = act(N, C, dt);
  if (sp_) {
    ln_local_ = act(Nl, C, dt);
    partial_ = act(N, C, dt);
    d_full_ = act(N, C, dt);
    d_tmp_local_ = act(Nl, C, dt);
  } else {  // without SP the local and full row sets coincide
    d_full_ = d_resid_;
    d_tmp_local_ = d_tmp_;
  }
  dq_ = act(N, Hl_ * hd, dt);
  dk_ = act(N, KVl_ * hd, dt);
  dv_ = act(N, KVl_ * hd, dt);
  d_att_ = act(N, Hl_ * hd, dt);
  if (fused_) {
    qkv_ = act(N, (Hl_ + 2 * KVl_) * hd, dt);
    dgu_ = act(N, 2 * Fl_, dt);
  } else {
    dgate_ = act(N, Fl_, dt);
    dup_ = act(N, Fl_, dt);
  }
  dh_ = act(N, Fl_, dt);
  if (tp > 1 && stage_.head) {
    ce_stats_ = act(N, 3, sdt);
    ce_gathered_ = act(tp * N, 3, sdt);
    ce_combined_ = act(N, 3, sdt);
  }
}

void Model::build_rope_tables() {
  // HF: inv_freq[i] = theta^(-2i/hd); angle(t, i) = t * inv_freq[i]; computed in double.
  const int64_t half = cfg_.head_dim() / 2, hd = cfg_.head_dim();
  // Row t: the position of local token t (its own index, or under context
  // parallelism where the rank's chunks sit in the sequence).
  std::vector<int64_t> pos(static_cast<size_t>(T_));
  if (context_)
    pos = context_->positions(T_);
  else
    std::iota(pos.begin(), pos.end(), int64_t(0));
  ADGT_CHECK(int64_t(pos.size()) == T_, "Model: " << pos.size() << " rotary positions for " << T_ << " tokens");
  if (context_ && docs_.rope_reset) {
    // Per-document positions under cp: load_documents looks rows up by a
    // token's position in its document, which runs up to this rank's last
    // global position: row p is position p (set_documents rebuilds it).
    const int64_t n = *std::max_element(pos.begin(), pos.end()) + 1;
    pos.resize(size_t(n));
    std::iota(pos.begin(), pos.end(), int64_t(0));
  }
  const int64_t rows = int64_t(pos.size());
  if (!rope_cos_.data || rope_cos_.dim(0) != rows) {
    rope_cos_ = act(rows, half, mdt_);
    rope_sin_ = act(rows, half, mdt_);
  }
  std::vector<double> c(size_t(rows * half)), s(size_t(rows * half));
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double inv = std::pow(cfg_.rope_theta, -double(2 * i) / double(hd));
      const double a = double(pos[size_t(t)]) * inv;
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

void Model::make_split_buffers(Slot& s, int chunk) {
  if (!s.layers.empty() && s.layers[0].d_o.data) return;
  if (s.layers.empty() && (s.d_emb.data || !chunk_has_embedding(chunk))) return;
  const int64_t C = cfg_.d_model, hd = cfg_.head_dim(), N = N_;
  for (auto& a : s.layers) {
    a.d_down = act(N, C, dtype_);
    a.d_o = act(N, C, dtype_);
    if (fused_) {
      a.d_gu = act(N, 2 * Fl_, dtype_);
      a.d_qkv = act(N, (Hl_ + 2 * KVl_) * hd, dtype_);
    } else {
      a.d_gate = act(N, Fl_, dtype_);
      a.d_up = act(N, Fl_, dtype_);
      a.d_q = act(N, Hl_ * hd, dtype_);
      a.d_k = act(N, KVl_ * hd, dtype_);
      a.d_v = act(N, KVl_ * hd, dtype_);
    }
  }
  if (chunk_has_embedding(chunk)) s.d_emb = act(N, C, dtype_);
}

Tensor Model::stage_input(int chunk, int slot) { return slot_of(chunk, slot).layers[0].x_in; }

Tensor Model::stage_output(int chunk, int slot) { return slot_of(chunk, slot).x_out; }

Tensor Model::act(int64_t rows, int64_t cols, DType dt) {
  owned_.emplace_back(be_, size_t(rows * cols) * dtype_size(dt));
  return Tensor(owned_.back().data(), dt, {rows, cols});
}

Tensor Model::flat(const Buffer& b, DType dt) const {
  if (!b.data()) {
    // Made zeroed at the first use; what a unit storage holds never is.
    const bool held = store_ && (&b != &params_ || store_->holds_weights());
    ADGT_CHECK(!held, "Model: the flat "
                          << (&b == &grads_ ? "gradient" : &b == &master_ ? "master weight" : "weight")
                          << " buffer is not kept under ZeRO-2/3 (the unit storage holds it; "
                             "parallel/dp/zero_store.hpp)");
    Buffer& m = &b == &params_ ? params_ : &b == &grads_ ? grads_ : master_;
    m = Buffer(be_, size_t(flat_n_) * dtype_size(dt));
    be_.zero(Tensor(m.data(), dt, {flat_n_}));
  }
  return Tensor(b.data(), dt, {flat_n_});
}

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
  char* base;
  if (store_ && store_->holds_weights()) {
    const int u = unit_of_param_[i];
    base = store_->weights(u, p.offset);
  } else {
    base = static_cast<char*>(params().data) + size_t(p.offset) * dtype_size(dtype_);
  }
  Tensor t(base, dtype_, {});
  for (int64_t s : p.shape) t.shape[t.ndim++] = s;
  return t;
}

Tensor Model::grad(size_t i) const {
  Tensor t = param(i);
  t.dtype = mdt_;
  const ParamSpec& p = table_[i];
  if (store_ && store_->holds_grads()) {
    const int u = unit_of_param_[i];
    t.data = store_->grads(u, p.offset);
  } else {
    t.data = static_cast<char*>(grads().data) + size_t(p.offset) * dtype_size(mdt_);
  }
  return t;
}

void Model::set_unit_storage(UnitStorage* s) {
  store_ = nullptr;
  unit_of_param_.clear();
  if (!s) return;
  const std::vector<GradUnit> units = grad_units();
  unit_of_param_.assign(table_.size(), -1);
  for (size_t u = 0; u < units.size(); ++u) {
    for (size_t i = 0; i < table_.size(); ++i)
      if (table_[i].offset >= units[u].begin && table_[i].offset < units[u].end)
        unit_of_param_[i] = int(u);
  }
  for (size_t i = 0; i < table_.size(); ++i)
    ADGT_CHECK(unit_of_param_[i] >= 0, "Model::set_unit_storage: " << table_[i].name
                                                                   << " is in no gradient unit");
  store_ = s;
  // The store keeps the master weights (and at ZeRO-3 the compute weights).
  master_.reset();
  if (s->holds_weights()) params_.reset();
  if (s->holds_grads()) grads_.reset();
}

int Model::unit_index(int chunk, int64_t layer) const {
  // grad_units()' order: chunk by chunk, each the head, the layers from the
  // last, the embedding (`layer` is the chunk's local index; n_layers: the
  // head, -1: the embedding).
  int first = 0;
  for (int c = 0; c < chunk; ++c)
    first += int(chunks_[size_t(c)].n_layers) + (chunk_has_head(c) ? 1 : 0) +
             (chunk_has_embedding(c) ? 1 : 0);
  const Chunk& ch = chunks_[size_t(chunk)];
  const int head = chunk_has_head(chunk) ? 1 : 0;
  if (layer >= ch.n_layers) return first;
  if (layer < 0) return first + head + int(ch.n_layers);
  return first + head + int(ch.n_layers - 1 - layer);
}

void Model::store_forward(int chunk, int64_t layer) {
  if (!store_) return;
  const Chunk& ch = chunks_[size_t(chunk)];
  const int u = unit_index(chunk, layer);
  std::vector<int> reads = {u};
  if (layer >= 0 && layer < ch.n_layers) {
    // A layer's last add computes the next layer's first norm (or the head's final norm).
    if (layer + 1 < ch.n_layers || chunk_has_head(chunk)) reads.push_back(unit_index(chunk, layer + 1));
  } else if (layer >= ch.n_layers && head_idx_ == emb_idx_) {
    reads.push_back(unit_index(chunk, -1));  // the tied head reads the embedding
  }
  store_->begin_unit(UnitStorage::Pass::Forward, u, reads);
}

void Model::store_backward(int chunk, int64_t layer) {
  if (!store_) return;
  const int u = unit_index(chunk, layer);
  std::vector<int> reads = {u};
  if (layer >= chunks_[size_t(chunk)].n_layers && head_idx_ == emb_idx_)
    reads.push_back(unit_index(chunk, -1));
  store_->begin_unit(UnitStorage::Pass::Backward, u, reads);
}

Tensor Model::weights(size_t first, size_t last) const {
  Tensor t = param(first);
  int64_t rows = 0;
  for (size_t i = first; i <= last; ++i) {
    const ParamSpec& p = table_[i];
    ADGT_CHECK(p.shape.size() == 2 && p.shape[1] == t.shape[1] &&
                   p.offset == table_[first].offset + rows * t.shape[1],
               "Model: " << p.name << " is not adjacent to " << table_[first].name
                         << " in the flat buffer (fused projections)");
    rows += p.shape[0];
  }
  t.shape[0] = rows;
  return t;
}

Tensor Model::weight_grads(size_t first, size_t last) const {
  Tensor t = weights(first, last);
  t.dtype = mdt_;
  t.data = grad(first).data;
  return t;
}

std::pair<int64_t, int64_t> Model::range(size_t first, size_t last) const {
  return {table_[first].offset, table_[last].offset + (table_[last].numel + 15) / 16 * 16};
}

void Model::init_weights(uint64_t seed) {
  // Uninitialised: draw_init_weights writes every element, each tensor's
  // region by the thread that draws it (a 7B model's 27 GB were zero-filled
  // on one thread before, and each tensor drawn into a copy of its own).
  const size_t n = size_t(flat_n_);
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  std::unique_ptr<float[]> host(new float[n]);
  draw_init_weights(table_, cfg_.init_std, seed, host.get(), flat_n_);
  const auto t1 = clock::now();
  params_from_host(host.get(), n);
  init_times_.draw_s = std::chrono::duration<double>(t1 - t0).count();
  init_times_.to_device_s = std::chrono::duration<double>(clock::now() - t1).count();
}

std::vector<float> Model::params_to_host() const {
  std::vector<float> out;
  params_to_host(out);
  return out;
}

void Model::params_to_host(std::vector<float>& out) const {
  const size_t n = size_t(flat_n_);
  out.resize(n);
  if (mdt_ == DType::F32) {
    be_.to_host(out.data(), master().data, n * 4);
  } else {
    std::vector<double> d(n);
    be_.to_host(d.data(), master().data, n * 8);
    for (size_t i = 0; i < n; ++i) out[i] = float(d[i]);
  }
}

void Model::params_from_host(const std::vector<float>& flat_host) {
  params_from_host(flat_host.data(), flat_host.size());
}

void Model::params_from_host(const float* flat_host, size_t count) {
  const size_t n = size_t(flat_n_);
  ADGT_CHECK(count == n, "params_from_host: got " << count << " values, expected " << n);
  if (mdt_ == DType::F32) {
    be_.to_device(master().data, flat_host, n * 4);
  } else {
    std::vector<double> d(flat_host, flat_host + n);
    be_.to_device(master().data, d.data(), n * 8);
  }
  sync_params();
}

std::vector<double> Model::grads_to_host_f64() const {
  return read_host(grads());
}

void Model::zero_grads() {
  if (store_ && store_->holds_grads()) return;  // the storage's unit buffers start at zero
  be_.zero(grads());
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

void Model::set_expert_placement(const std::vector<int>& owner, Comm* ep) {
  ADGT_CHECK(!moe_.empty(), "Model: set_expert_placement on a stage without MoE layers");
  const ExpertPlacement pl(cfg_.n_experts, ep ? ep->size() : 1, owner);
  const std::vector<int64_t> local = pl.local_experts(ep ? ep->rank() : 0);
  std::vector<ParamSpec> t = build_param_table(cfg_, tp_->size(), tp_->rank(), &stage_, &local);
  ADGT_CHECK(t.size() == table_.size(), "Model: a new expert placement changes the parameter table");
  for (size_t i = 0; i < t.size(); ++i)
    ADGT_CHECK(t[i].offset == table_[i].offset && t[i].shape == table_[i].shape,
               "Model: a new expert placement moves " << t[i].name << " in the flat buffers");
  table_ = std::move(t);
  // The MoE layers anew, with as many slots as their chunks hold.
  moe_.clear();
  moe_step_.clear();
  moe_spans_.clear();
  make_moe_layers(pl, ep);
  for (const Chunk& ch : chunks_)
    for (int64_t l = 0; l < ch.n_layers; ++l) {
      const LayerIdx& w = layer_idx_[ch.first_local + size_t(l)];
      if (w.moe < 0) continue;
      for (size_t k = 0; k < ch.slots.size(); ++k) moe_[size_t(w.moe)]->add_slot();
    }
}

int64_t Model::expert_block() const { return 3 * (cfg_.expert_ffn() / tp_->size()) * cfg_.d_model; }

int64_t Model::expert_offset(int moe, size_t i) const {
  for (const LayerIdx& w : layer_idx_) {
    if (w.moe != moe) continue;
    ADGT_CHECK(i < w.w1.size(), "Model: MoE layer " << moe << " has no local expert " << i);
    const int64_t o = table_[w.w1[i]].offset, FC = expert_block() / 3;
    ADGT_CHECK(table_[w.w3[i]].offset == o + FC && table_[w.w2[i]].offset == o + 2 * FC,
               "Model: expert " << i << " of MoE layer " << moe << " is not one block");
    return o;
  }
  ADGT_CHECK(false, "Model: no MoE layer " << moe);
}

void Model::set_expert_replicas(const ExpertReplicas& r) {
  for (auto& m : moe_) m->set_replicas(r);
  sync_expert_replicas();
}

void Model::sync_expert_replicas() {
  if (moe_.empty() || !moe_.front()->replicas().any()) return;
  for (const LayerIdx& w : layer_idx_)
    if (w.moe >= 0) moe_[size_t(w.moe)]->sync_replicas(moe_params(w, false));
}

void Model::reset_moe_stats() {
  for (MoeLayerStep& m : moe_step_) {
    std::fill(m.load.begin(), m.load.end(), 0);
    m.tokens = m.dropped = m.calls = m.a2a_bytes = m.expert_rows = m.shadow_rows = 0;
    m.aux = m.a2a_seconds = 0;
  }
  for (MoeSpans& s : moe_spans_) s.expert.clear(), s.layer.clear(), s.block.clear();
  be_.clear_spans();
}

std::vector<MoeLayerTimes> Model::moe_times() const {
  std::vector<MoeLayerTimes> out(moe_spans_.size());
  // The sum of the spans' seconds; -1 if one was not measured.
  const auto sum = [&](const std::vector<int>& ids) {
    double t = 0;
    for (int id : ids) {
      const double s = be_.span_seconds(id);
      if (s < 0) return -1.0;
      t += s;
    }
    return t;
  };
  for (size_t i = 0; i < out.size(); ++i) {
    const MoeSpans& s = moe_spans_[i];
    out[i].expert_s = sum(s.expert);
    const double layers = sum(s.layer), blocks = sum(s.block);
    out[i].dense_s = layers < 0 || blocks < 0 ? -1 : layers - blocks;
  }
  return out;
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

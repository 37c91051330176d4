// The parameter table: every parameter's global (HuggingFace LlamaForCausalLM)
// name and global shape, the shape and position of this tensor-parallel rank's
// shard, its offset in the flat parameter buffer, and whether weight decay
// applies. Checkpoints, export and the memory estimator speak in these terms.
//
// Tensor-parallel shards (Megatron): q/k/v, gate and up are split by rows
// (column-parallel: whole heads / FFN columns per rank), o and down by columns
// (row-parallel), embed_tokens and lm_head by vocabulary rows, padded to a
// multiple of tp (padding rows are zero and never reach the loss or a
// checkpoint); norm weights are replicated.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/model/stage_slice.hpp"

namespace adgt {

struct ParamSpec {
  std::string name;                   // e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;         // this rank's shard, HF layout (out, in) for linears
  std::vector<int64_t> global_shape;  // the whole tensor
  int shard_dim = -1;                 // -1: replicated over tp; 0: rows; 1: columns
  int64_t shard_start = 0;            // first global index along shard_dim
  int64_t shard_valid = 0;            // indices of the shard inside the global tensor (vocab padding)
  int64_t numel = 0;                  // elements of the shard
  int64_t offset = 0;                 // elements from the start of the flat buffer
  bool is_matrix = false;             // linear weight (decayed); norms/embeddings are not
  bool is_embedding = false;
  int64_t expert = -1;                // MoE expert weights: the global expert id; else -1
  bool is_router = false;             // MoE router (block_sparse_moe.gate.weight)
};

// In HF order: embed, per layer (input_layernorm, q, k, v, o, post_attention_layernorm,
// gate, up, down), norm, lm_head (absent when tied). Offsets are 16-element aligned,
// except that k follows q and v follows k, and up follows gate, with no padding:
// this rank's q/k/v shards are one ((Hl + 2 KVl) hd, C) matrix and gate/up one
// (2 Fl, C) matrix in the flat buffer (the fused projections' weights; with
// tensor parallelism each rank's fused matrix holds whole heads and whole FFN
// columns). When C is a multiple of 16 nothing moves.
// With tp > 1 the shapes are those of rank tp_rank's shard.
// With a stage slice (pipeline parallelism, core/model/stage_slice.hpp) only that
// slice's parameters: the embedding if it holds it, its layers in ascending
// order, model.norm and lm_head if it holds the head; offsets are recomputed.
//
// Mixture-of-experts layers (ModelConfig::is_moe_layer) hold, after the
// post-attention norm, block_sparse_moe.gate.weight (E, C) (replicated over tp)
// and for each expert e of `experts` (this expert-parallel rank's, ascending;
// nullptr: all) block_sparse_moe.experts.e.w1 (F, C), w3 (F, C), w2 (C, F)
// (HF Mixtral names; w1 = gate, w3 = up: column-parallel, w2 = down:
// row-parallel, like the dense FFN; w1 and w3 adjacent, the expert's fused
// gate/up).
std::vector<ParamSpec> build_param_table(const ModelConfig& m, int64_t tp = 1,
                                         int64_t tp_rank = 0, const StageSlice* slice = nullptr,
                                         const std::vector<int64_t>* experts = nullptr);
int64_t padded_vocab(const ModelConfig& m, int64_t tp);    // vocab rounded up to a multiple of tp
int64_t total_numel(const std::vector<ParamSpec>& table);  // flat buffer length incl. padding
int64_t param_count(const std::vector<ParamSpec>& table);  // sum of numel
// Whether AdamW's weight decay applies to this parameter under `t`.
bool decays(const ParamSpec& p, const TrainConfig& t);

}  // namespace adgt

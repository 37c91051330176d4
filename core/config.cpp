// The run configuration: one schema table (kSchema below) drives parsing,
// per-key checks, to_yaml(), the key reference in docs/config.md and every
// error message. Cross-field rules live in validate().
//
// Error messages have the shape
//   <where>: <section.key>: <what is wrong>; <what is allowed or how to fix it>
// where <where> is "file:line" for a value read from YAML (yaml-cpp marks are
// 0-based; we print line+1), "--set section.key=value" for an override, and
// the bare file name for cross-field rules.
#include "core/config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>
#include <type_traits>
#include <variant>

#include "core/config_blend.hpp"
#include "core/layout.hpp"
#include "core/model/moe_replicas.hpp"

namespace adgt {
namespace {

// ---------------------------------------------------------------- the schema

enum class Type { Int, UInt, Real, Bool, Str, IntList };

// What values a key accepts beyond its type.
enum class Allow {
  Any,          // every value of the type
  Positive,     // int >= 1, or real > 0, or every entry of an int list >= 1
  NonNegative,  // int >= 0, or real >= 0
  UnitHalfOpen, // real in [0, 1)
  NonEmpty,     // non-empty string
  Choices,      // string in Key::choices
  RankFactors,  // "rank:factor,..." (emulate.slow_ranks), factor >= 1, ranks distinct
  StepFactors,  // "factor@step,..." (emulate.link_bandwidth), factor > 0, steps ascending
  LinkFactors,  // "a-b:factor[@step],..." (emulate.slow_links), factor >= 1, pairs distinct
  StepRange,    // "" or "N" or "A-B" (log.trace), 1 <= A <= B
  Blend,        // data.train/val: a token file, "0.7 A 0.3 B", or (YAML) a list of {path, weight}
};

using FieldRef =
    std::variant<int64_t*, uint64_t*, double*, bool*, std::string*, std::vector<int64_t>*>;

struct Key {
  const char* section;
  const char* name;
  Type type;
  Allow allow;
  std::vector<std::string> choices;
  std::function<FieldRef(RunConfig&)> bind;  // the field this key sets
  const char* doc;
  std::string full() const { return std::string(section) + "." + name; }
};

template <class T> constexpr Type type_of();
template <> constexpr Type type_of<int64_t>() { return Type::Int; }
template <> constexpr Type type_of<uint64_t>() { return Type::UInt; }
template <> constexpr Type type_of<double>() { return Type::Real; }
template <> constexpr Type type_of<bool>() { return Type::Bool; }
template <> constexpr Type type_of<std::string>() { return Type::Str; }
template <> constexpr Type type_of<std::vector<int64_t>>() { return Type::IntList; }

template <class S, class T>
Key key(const char* section, S RunConfig::*sec, const char* name, T S::*field, Allow allow,
        const char* doc, std::vector<std::string> choices = {}) {
  return Key{section, name, type_of<T>(), allow, std::move(choices),
             [sec, field](RunConfig& r) -> FieldRef { return &((r.*sec).*field); }, doc};
}

const std::vector<Key>& schema() {
  using A = Allow;
  using R = RunConfig;
  static const std::vector<Key> k = {
      // model
      key("model", &R::model, "vocab_size", &ModelConfig::vocab_size, A::Positive,
          "tokenizer vocabulary size V (rows of embed_tokens and lm_head)"),
      key("model", &R::model, "d_model", &ModelConfig::d_model, A::Positive,
          "hidden size C; divisible by n_heads"),
      key("model", &R::model, "n_layers", &ModelConfig::n_layers, A::Positive,
          "transformer blocks L"),
      key("model", &R::model, "n_heads", &ModelConfig::n_heads, A::Positive,
          "query heads H; head_dim = d_model/n_heads must be even (rotary)"),
      key("model", &R::model, "n_kv_heads", &ModelConfig::n_kv_heads, A::Positive,
          "key/value heads (grouped-query attention); divides n_heads"),
      key("model", &R::model, "ffn_hidden", &ModelConfig::ffn_hidden, A::Positive,
          "SwiGLU intermediate size F"),
      key("model", &R::model, "seq_len", &ModelConfig::seq_len, A::Positive,
          "training context length T (tokens per sequence)"),
      key("model", &R::model, "rope_theta", &ModelConfig::rope_theta, A::Positive,
          "rotary embedding base frequency"),
      key("model", &R::model, "norm_eps", &ModelConfig::norm_eps, A::Positive,
          "RMSNorm epsilon"),
      key("model", &R::model, "tie_embeddings", &ModelConfig::tie_embeddings, A::Any,
          "lm_head shares model.embed_tokens.weight"),
      key("model", &R::model, "rope_reset_per_document", &ModelConfig::rope_reset_per_document,
          A::Any,
          "rotary positions restart at 0 after each end-of-document token (data.eos_id), so "
          "each packed document sees the positions it would have alone; usually with "
          "train.document_mask"),
      key("model", &R::model, "init_std", &ModelConfig::init_std, A::Positive,
          "standard deviation of the normal weight initialisation"),
      key("model", &R::model, "n_experts", &ModelConfig::n_experts, A::NonNegative,
          "experts per MoE layer (Mixtral); 0 = dense FFN everywhere"),
      key("model", &R::model, "moe_top_k", &ModelConfig::moe_top_k, A::Positive,
          "experts each token is routed to (<= n_experts); weights renormalised over them"),
      key("model", &R::model, "moe_every", &ModelConfig::moe_every, A::Positive,
          "MoE FFN in layers l with (l + 1) % moe_every == 0 (1: every layer)"),
      key("model", &R::model, "expert_ffn_hidden", &ModelConfig::expert_ffn_hidden,
          A::NonNegative, "SwiGLU size of each expert; 0 = ffn_hidden"),
      key("model", &R::model, "moe_aux_loss_coef", &ModelConfig::moe_aux_loss_coef,
          A::NonNegative, "load-balancing loss coefficient (Switch; per micro-batch, 0 = off)"),
      key("model", &R::model, "moe_aux_free", &ModelConfig::moe_aux_free, A::Any,
          "auxiliary-loss-free balancing (DeepSeek-V3): a per-expert selection bias"),
      key("model", &R::model, "moe_bias_rate", &ModelConfig::moe_bias_rate, A::NonNegative,
          "bias step per optimizer step with moe_aux_free"),
      key("model", &R::model, "moe_bias_init_zipf", &ModelConfig::moe_bias_init_zipf,
          A::NonNegative,
          "skewed routing for experiments, with moe_aux_free: expert e's selection bias starts "
          "at -s beta ln(e+1), beta the Gumbel scale of the router's initial probabilities "
          "(init_std sqrt(d_model) sqrt(6)/(pi n_experts)), so first choices fall off about as "
          "Zipf(s); "
          "moe_bias_rate 0 keeps it (docs/adaptation.md, \"Skewed routing in training\"); 0 = off"),
      key("model", &R::model, "moe_capacity_factor", &ModelConfig::moe_capacity_factor,
          A::NonNegative, "expert capacity = factor x tokens x top_k / n_experts per rank; 0 = dropless"),
      key("model", &R::model, "moe_capacity_segment", &ModelConfig::moe_capacity_segment,
          A::NonNegative,
          "tokens per expert-capacity group, in token order: a divisor of seq_len (the capacity "
          "is factor x segment x top_k / n_experts per group); 0 = a micro-batch (its whole "
          "sequences, under context parallelism too)"),
      // train
      key("train", &R::train, "steps", &TrainConfig::steps, A::Positive,
          "optimizer steps to train for"),
      key("train", &R::train, "device", &TrainConfig::device, A::Choices,
          "backend; auto picks cuda when a GPU is visible and built, else cpu; emulated = the "
          "CPU backend behind the device boundary (tests the CUDA code paths)",
          {"auto", "cpu", "cuda", "emulated"}),
      key("train", &R::train, "micro_batch", &TrainConfig::micro_batch, A::Positive,
          "sequences per micro-batch per rank"),
      key("train", &R::train, "global_batch", &TrainConfig::global_batch, A::Positive,
          "sequences per optimizer step over all ranks; a multiple of micro_batch x dp"),
      key("train", &R::train, "lr", &TrainConfig::lr, A::Positive, "peak learning rate"),
      key("train", &R::train, "min_lr", &TrainConfig::min_lr, A::NonNegative,
          "learning rate at the end of the cosine decay; <= lr"),
      key("train", &R::train, "warmup_steps", &TrainConfig::warmup_steps, A::NonNegative,
          "linear warm-up steps; <= steps"),
      key("train", &R::train, "weight_decay", &TrainConfig::weight_decay, A::NonNegative,
          "AdamW decoupled weight decay"),
      key("train", &R::train, "decay_norms_and_embeddings",
          &TrainConfig::decay_norms_and_embeddings, A::Any,
          "also decay norm weights and embeddings (default: only linear weights)"),
      key("train", &R::train, "beta1", &TrainConfig::beta1, A::UnitHalfOpen, "AdamW beta1"),
      key("train", &R::train, "beta2", &TrainConfig::beta2, A::UnitHalfOpen, "AdamW beta2"),
      key("train", &R::train, "eps", &TrainConfig::eps, A::Positive, "AdamW epsilon"),
      key("train", &R::train, "grad_clip", &TrainConfig::grad_clip, A::NonNegative,
          "global gradient-norm clip; 0 disables"),
      key("train", &R::train, "seed", &TrainConfig::seed, A::Any,
          "seed for initialisation and data order"),
      key("train", &R::train, "eval_interval", &TrainConfig::eval_interval, A::NonNegative,
          "steps between validation evals; 0 disables"),
      key("train", &R::train, "eval_batches", &TrainConfig::eval_batches, A::NonNegative,
          "micro-batches per eval (of each data.val source); 0 = the whole validation split"),
      key("train", &R::train, "max_skipped_steps", &TrainConfig::max_skipped_steps,
          A::NonNegative, "consecutive non-finite steps tolerated before aborting"),
      key("train", &R::train, "dtype", &TrainConfig::dtype, A::Choices,
          "precision: f32; bf16 = mixed precision (bf16 weights and activations, fp32 master "
          "weights, gradients, optimizer state and loss); fp8 = bf16 mixed precision with the "
          "layers' linear GEMMs in FP8 (train.fp8_*, docs/fp8.md); f64 for reference checks",
          {"f32", "bf16", "fp8", "f64"}),
      key("train", &R::train, "fp8_format", &TrainConfig::fp8_format, A::Choices,
          "with dtype fp8: hybrid = E4M3 weights and activations, E5M2 output gradients; "
          "e4m3 = E4M3 for all three",
          {"hybrid", "e4m3"}),
      key("train", &R::train, "fp8_recipe", &TrainConfig::fp8_recipe, A::Choices,
          "with dtype fp8, how activations and gradients are scaled: tensorwise = from this "
          "tensor's amax now (current scaling); delayed = from the largest amax of the last "
          "fp8_amax_history steps (weights are scaled from their amax in both)",
          {"tensorwise", "delayed"}),
      key("train", &R::train, "fp8_amax_history", &TrainConfig::fp8_amax_history, A::Positive,
          "with fp8_recipe delayed: steps of amax history a scale is taken from"),
      key("train", &R::train, "fp8_margin", &TrainConfig::fp8_margin, A::NonNegative,
          "with dtype fp8: binades of headroom below the format's largest value a scale keeps "
          "(scales are powers of two)"),
      key("train", &R::train, "fp8_weight_cache", &TrainConfig::fp8_weight_cache, A::Choices,
          "with dtype fp8: on = the weights' FP8 codes cast once a step and kept (1 byte a "
          "weight, 2 on CUDA); off = cast at each use (forward and input gradient of every "
          "micro-batch); auto = off at ZeRO-3 freeing the gathered weights "
          "(zero3_reshard_after_forward), else on. The same numbers either way",
          {"auto", "on", "off"}),
      key("train", &R::train, "recompute", &TrainConfig::recompute, A::Choices,
          "activation recompute: none; selective = the attention core and the SwiGLU product "
          "are recomputed in the backward; full = the chosen layers keep only their input "
          "(bitwise the same numbers; docs/memory.md)",
          {"none", "selective", "full"}),
      key("train", &R::train, "recompute_layers", &TrainConfig::recompute_layers, A::NonNegative,
          "with recompute: full, the layers per model chunk (pipeline stage) that recompute, "
          "from the first; 0 = all"),
      key("train", &R::train, "fused_projections", &TrainConfig::fused_projections, A::Any,
          "one GEMM for q/k/v and one for gate/up per layer (weights adjacent in memory, "
          "checkpoints unchanged; docs/cuda.md); false = five separate GEMMs"),
      key("train", &R::train, "document_mask", &TrainConfig::document_mask, A::Any,
          "attention does not cross document boundaries inside a packed sequence: a new "
          "document starts after each end-of-document token (data.eos_id); CPU, emulated and "
          "the CUDA flash and exact kernels (cuDNN: auto takes flash); false = plain causal"),
      key("train", &R::train, "attention", &TrainConfig::attention, A::Choices,
          "attention kernels: auto = time the candidates on the run's shapes at start-up and "
          "keep the faster (CUDA: flash and cuDNN SDPA); flash = the handwritten kernels; "
          "cudnn = cuDNN SDPA; exact = the reference kernel (the CPU backend's only one)",
          {"auto", "flash", "cudnn", "exact"}),
      key("train", &R::train, "flush_denormals", &TrainConfig::flush_denormals, A::Any,
          "CPU backends (cpu, emulated): flush denormal floats to zero (x86 FTZ+DAZ, Arm FZ) in "
          "the training thread and its OpenMP threads: a trained model's attention "
          "probabilities and gradients underflow, and each denormal costs the core 100+ cycles "
          "(steps 2.5-3.5x slower after 1000 steps; docs/precision.md); false = IEEE gradual "
          "underflow. No effect on CUDA"),
      // data
      key("train", &R::train, "collective_timeout_s", &TrainConfig::collective_timeout_s,
          A::NonNegative,
          "watchdog deadline in seconds of every collective and point-to-point operation: a "
          "rank that stops progressing is named by every other rank, which exits non-zero "
          "(docs/reliability.md); 0 = auto: max(30 s, 5 x the slowest step); start-up, "
          "checkpoint save/load and evaluation wait up to max(300 s, the deadline) on a live peer"),
      key("data", &R::data, "train", &DataConfig::train, A::Blend,
          "training token file (adgt-data output, a Megatron dataset or an llm.c shard), or a "
          "blend: \"0.7 A 0.3 B\" (weights and files in turn) or a YAML list of {path, weight} "
          "(weights > 0, all or none, normalised; a directory stands for its train.bin); "
          "checked when the trainer opens it"),
      key("data", &R::data, "val", &DataConfig::val, A::Blend,
          "validation token file, or a blend in the forms of data.train (a directory stands "
          "for its val.bin): each source is evaluated alone (val_loss_by_source) and val_loss "
          "is their weighted mean (docs/config.md, \"Data blends\")"),
      key("data", &R::data, "tokenizer", &DataConfig::tokenizer, A::NonEmpty,
          "SentencePiece model file, or \"byte\""),
      key("data", &R::data, "eos_id", &DataConfig::eos_id, A::Any,
          "end-of-document token id for train.document_mask and model.rope_reset_per_document; "
          "-1 = from the training data's meta.json (adgt-data prepare's documents.eos_id), else "
          "from data.tokenizer"),
      // parallel
      key("parallel", &R::parallel, "tp", &ParallelConfig::tp, A::Positive,
          "tensor-parallel degree; divides n_heads, n_kv_heads and ffn_hidden"),
      key("parallel", &R::parallel, "pp", &ParallelConfig::pp, A::Positive,
          "pipeline-parallel degree; the layers are cut into pp x virtual_stages stages"),
      key("parallel", &R::parallel, "schedule", &ParallelConfig::schedule, A::Choices,
          "pipeline schedule (docs/pipeline-schedules.md)",
          {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "greedy"}),
      key("parallel", &R::parallel, "microbatches", &ParallelConfig::microbatches,
          A::NonNegative,
          "pipeline micro-batches per step; 0 = derived: global_batch / (micro_batch x dp), "
          "the accumulation steps; if set, must equal that"),
      key("parallel", &R::parallel, "virtual_stages", &ParallelConfig::virtual_stages,
          A::Positive, "model chunks per pipeline rank; > 1 only with schedule interleaved or greedy, "
          "exactly 2 with zb-v"),
      key("parallel", &R::parallel, "stage_layers", &ParallelConfig::stage_layers, A::Positive,
          "layers per pipeline stage, pp x virtual_stages entries summing to n_layers; "
          "[] = balanced by cost"),
      key("parallel", &R::parallel, "dp", &ParallelConfig::dp, A::Positive,
          "data-parallel degree; tp x cp x pp x dp = number of ranks"),
      key("parallel", &R::parallel, "cp", &ParallelConfig::cp, A::Positive,
          "context-parallel degree: each sequence split over cp ranks (2 x cp chunks, two a "
          "rank; seq_len divisible by 2 x cp; docs/context-parallel.md)"),
      key("parallel", &R::parallel, "cp_mode", &ParallelConfig::cp_mode, A::Choices,
          "context-parallel attention: ring (K/V blocks around the cp ring) or all-to-all "
          "(heads scattered, sequence gathered; heads / tp divisible by cp)",
          {"ring", "all-to-all"}),
      key("parallel", &R::parallel, "ep", &ParallelConfig::ep, A::Positive,
          "expert-parallel degree: experts split over ep ranks carved out of dp; divides dp and n_experts"),
      key("parallel", &R::parallel, "expert_placement", &ParallelConfig::expert_placement,
          A::NonNegative, "owner ep rank of each expert (n_experts entries, n_experts/ep per "
                          "rank); [] = contiguous blocks"),
      key("parallel", &R::parallel, "zero", &ParallelConfig::zero, A::NonNegative,
          "ZeRO stage over dp (x cp): 0 none; 1 AdamW state sharded; 2 also the gradients "
          "(reduce-scattered as each layer's backward ends); 3 also the weights (gathered layer "
          "by layer, freed after use; docs/zero.md)"),
      key("parallel", &R::parallel, "zero3_prefetch", &ParallelConfig::zero3_prefetch,
          A::NonNegative,
          "zero: 3: how many units (layers, the embedding, the head) ahead a unit's gather "
          "starts while the current one computes; 0 gathers each when it is needed"),
      key("parallel", &R::parallel, "zero3_reshard_after_forward",
          &ParallelConfig::zero3_reshard_after_forward, A::Any,
          "zero: 3: free a unit's gathered weights after its forward and gather it again "
          "for its backward (true); false keeps them from the forward to the backward "
          "(less traffic, the whole model's weights held at the end of the forward)"),
      key("parallel", &R::parallel, "sequence_parallel", &ParallelConfig::sequence_parallel,
          A::Any, "shard the norm and residual regions along the sequence over tp"),
      key("parallel", &R::parallel, "fp8_allgather", &ParallelConfig::fp8_allgather, A::Any,
          "with train.dtype fp8 and sequence parallelism: all-gather the FP8 codes of the "
          "q/k/v and (dense) gate/up GEMMs' input, one byte an element instead of two; the "
          "same numbers (docs/fp8.md); without sequence parallelism nothing is gathered"),
      key("parallel", &R::parallel, "bucket_mb", &ParallelConfig::bucket_mb, A::Positive,
          "gradient all-reduce bucket size in MiB (started as buckets complete)"),
      key("parallel", &R::parallel, "overlap", &ParallelConfig::overlap, A::Any,
          "start each gradient bucket's reduction as soon as its gradients are complete, "
          "during the backward; false starts them all after it (to measure what overlap hides)"),
      key("parallel", &R::parallel, "auto", &ParallelConfig::auto_plan, A::Any,
          "plan the layout at launch (docs/planner.md): tp, pp, dp, ep, ZeRO, sequence "
          "parallelism, schedule, virtual stages, micro_batch and recompute chosen by the "
          "simulator for the cluster found; keys set in the run file or by --set are kept"),
      key("parallel", &R::parallel, "replan", &ParallelConfig::replan, A::Any,
          "with parallel.auto: re-plan while training when the ranks' measured compute speeds "
          "change by more than 25% (a straggler appears or recovers), and switch the layout in "
          "memory when the plan for the measured cluster is predicted at least 5% faster "
          "(docs/planner.md, \"Re-planning\"); false: the launch's plan stays"),
      key("parallel", &R::parallel, "auto_trials", &ParallelConfig::auto_trials, A::NonNegative,
          "with parallel.auto: after warm-up, run the planner's best N plans a few steps each "
          "(switching the layout in memory) and keep the fastest measured; the simulator's "
          "ranking decides what is tried, the clock what is kept (docs/planner.md, \"Trials\"); "
          "0: the launch's plan stays"),
      key("parallel", &R::parallel, "auto_objective", &ParallelConfig::auto_objective, A::Choices,
          "what parallel.auto (and --dry-run's plan) ranks layouts by: time = step time; energy = "
          "energy per token from the cluster device's power model (docs/power.md; every layout "
          "simulated; emulate.power_cap_w caps the devices it plans for)",
          {"time", "energy"}),
      key("parallel", &R::parallel, "adapt", &ParallelConfig::adapt, A::Choices,
          "run-time adaptation (docs/adaptation.md): off = parallel.schedule throughout; "
          "schedule = with pp > 1, re-plan the pipeline schedule from the measured stage and "
          "link times once warmed up (step 10) and on every sustained change (a straggler, a "
          "slow link), within the activations parallel.schedule holds on its busiest rank "
          "and, on a GPU, 90% of its memory (--dry-run prints what a re-plan may hold); "
          "schedule+layers = "
          "also move layers between pipeline stages in memory when the stages' measured speeds "
          "make that pay (one chunk per rank); the losses stay the plain run's",
          {"off", "schedule", "schedule+layers"}),
      key("parallel", &R::parallel, "adapt_threshold", &ParallelConfig::adapt_threshold,
          A::Positive,
          "the relative change of a measured stage time, link time or rank speed that counts "
          "when it holds for 5 steps (parallel.adapt's detectors, parallel.auto's re-plan); "
          "0.25 keeps a clean run on a shared CPU host quiet (docs/adaptation.md)"),
      key("parallel", &R::parallel, "link_times", &ParallelConfig::link_times, A::Choices,
          "where parallel.adapt's pipeline link times come from: auto = the emulation's "
          "stamps under emulate.cluster, else a ping-pong probe of each link between steps; "
          "messages = the step's own pipeline messages (send and arrival times, both "
          "directions of a link, so the ranks' clocks need not agree; sees a link slowed by "
          "the step's own traffic; needs receives that block the host, else the probe; "
          "noisy where ranks share cores); probe = the probe (docs/adaptation.md)",
          {"auto", "messages", "probe"}),
      key("parallel", &R::parallel, "adapt_jitter_samples", &ParallelConfig::adapt_jitter_samples,
          A::NonNegative,
          "parallel.adapt's schedule re-plan: each candidate schedule's step time is the mean of "
          "this many simulations with the measured spread of single instructions' times drawn "
          "in (a schedule that leaves slack where a late instruction would stall the pipeline "
          "wins); 0 = one simulation with each stage's median times (docs/adaptation.md)"),
      key("parallel", &R::parallel, "expert_replace_interval",
          &ParallelConfig::expert_replace_interval, A::NonNegative,
          "MoE with ep > 1: every this many steps, re-place the experts over the ep ranks by "
          "their measured load (tokens routed) and each rank's measured expert throughput, "
          "switching parallel.expert_placement in memory when that evens the ranks' expected "
          "expert time by at least 5% (docs/adaptation.md); 0 = off"),
      key("parallel", &R::parallel, "expert_replace_dry_run",
          &ParallelConfig::expert_replace_dry_run, A::Any,
          "with expert_replace_interval: measure, decide and log every re-placement as usual "
          "but apply none, so the logged decisions measure the static placement (a benchmark's "
          "baseline)"),
      key("parallel", &R::parallel, "expert_slots", &ParallelConfig::expert_slots,
          A::NonNegative,
          "MoE: experts each ep rank may hold, its own n_experts/ep plus replicas of hot experts "
          "that take a share of their tokens (weights synced from the owner each step, gradients "
          "returned to it); with expert_replace_interval the re-placement fills the spare slots "
          "(docs/adaptation.md, \"Expert replicas\"); 0 = n_experts/ep, no replicas"),
      key("parallel", &R::parallel, "expert_replicas", &ParallelConfig::expert_replicas,
          A::Any,
          "MoE: the expert replicas in use, \"e:rank=share,rank=share;...\" (owner first, "
          "shares sum to 1; replicated experts only); written by the re-placement, kept by "
          "switches and checkpoints; \"\" = none"),
      key("parallel", &R::parallel, "placement", &ParallelConfig::placement, A::Choices,
          "rank placement (docs/placement.md): topology = rank order rebuilt from the sites and "
          "nodes (sites one after another, tp groups inside a node, then dp, pipeline stages "
          "outermost); nodes = the same with the sites ignored; launcher = the launcher's order "
          "as it comes",
          {"topology", "nodes", "launcher"}),
      key("parallel", &R::parallel, "site_reduce", &ParallelConfig::site_reduce, A::Choices,
          "the data-parallel reduction of a group spanning sites (docs/sites.md): hierarchical "
          "= reduce-scatter inside each site, one exchange of each member's shard across the "
          "wide-area link, all-gather inside the site; flat = one ring over the whole group",
          {"hierarchical", "flat"}),
      key("parallel", &R::parallel, "grad_compression", &ParallelConfig::grad_compression,
          A::Choices,
          "data-parallel gradient compression with error feedback (docs/compression.md): off; "
          "bf16; int8 or int4 = blocks of 256 with an fp32 scale; int3 or int2 = 3 or 2 bits per "
          "element, blocks of 256 with a bf16 step from the block's rms; powersgd = rank "
          "parallel.powersgd_rank factors of each 2-D weight; auto = chosen per bucket at run "
          "time by a controller from the measured link, compute and gradient noise. A no-op "
          "at dp=1",
          {"off", "bf16", "int8", "int4", "int3", "int2", "powersgd", "auto"}),
      key("parallel", &R::parallel, "powersgd_rank", &ParallelConfig::powersgd_rank, A::Positive,
          "rank r of PowerSGD's factors (grad_compression powersgd)"),
      key("parallel", &R::parallel, "compress_min_elems", &ParallelConfig::compress_min_elems,
          A::NonNegative,
          "tensors with fewer elements, and every 1-D tensor, are reduced uncompressed (fp32; "
          "at int3 and int2 as bf16 with error feedback, docs/compression.md)"),
      key("parallel", &R::parallel, "compress_interval", &ParallelConfig::compress_interval,
          A::Positive, "grad_compression auto: steps between the controller's decisions"),
      key("parallel", &R::parallel, "compress_error_budget", &ParallelConfig::compress_error_budget,
          A::Positive,
          "grad_compression auto: a level is allowed when its relative squared error is at "
          "most this times the noise share of the reduced gradient (docs/compression.md)"),
      key("parallel", &R::parallel, "compress_hysteresis", &ParallelConfig::compress_hysteresis,
          A::NonNegative,
          "grad_compression auto: a bucket keeps its level while it is within 5% plus this "
          "share of the fastest level's time"),
      // checkpoint
      key("checkpoint", &R::checkpoint, "dir", &CheckpointConfig::dir, A::NonEmpty,
          "directory for checkpoints"),
      key("checkpoint", &R::checkpoint, "interval", &CheckpointConfig::interval,
          A::NonNegative, "steps between saves; 0 = only at the end"),
      key("checkpoint", &R::checkpoint, "keep", &CheckpointConfig::keep, A::NonNegative,
          "newest complete checkpoints kept; 0 keeps all"),
      key("checkpoint", &R::checkpoint, "at_end", &CheckpointConfig::at_end, A::Any,
          "save after the last step (a stop on a signal saves regardless); false for "
          "benchmarks"),
      key("checkpoint", &R::checkpoint, "async", &CheckpointConfig::async_save, A::Any,
          "copy the state to host memory at the step boundary and write the files in a "
          "background thread while training continues; committed (COMPLETE) once every rank "
          "has written; at most one save in flight (docs/reliability.md)"),
      // log
      key("log", &R::log, "dir", &LogConfig::dir, A::NonEmpty,
          "directory for the metrics log and the recorded config"),
      key("log", &R::log, "interval", &LogConfig::interval, A::Positive,
          "steps between log lines"),
      key("log", &R::log, "peak_tflops", &LogConfig::peak_tflops, A::NonNegative,
          "MFU denominator in TFLOP/s; 0 = measure the CPU GEMM peak at start"),
      key("log", &R::log, "trace", &LogConfig::trace, A::StepRange,
          "steps whose timeline goes to <log.dir>/trace.json (Chrome trace for Perfetto or "
          "chrome://tracing, one track per rank: pipeline instructions, collectives, waits, "
          "optimizer, checkpoint phases, decisions; docs/trace.md): \"12\" or \"10-12\"; \"\" = off"),
      key("log", &R::log, "telemetry_interval_s", &LogConfig::telemetry_interval_s, A::NonNegative,
          "seconds between each rank's telemetry readings (GPU power, energy, clocks, "
          "temperatures, throttle reasons through NVML; CPU energy through RAPL where readable; "
          "docs/telemetry.md); 0 = off"),
      key("log", &R::log, "telemetry_source", &LogConfig::telemetry_source, A::Choices,
          "what each rank reads: auto = NVML on a CUDA rank (its GPU), the host's RAPL counters "
          "on a CPU rank; nvml = NVML on every rank (a CPU rank reads the GPU of its local rank's "
          "index: a host's GPUs watched while the CPU backend runs, or a fake NVML in tests); "
          "rapl = RAPL on every rank's host (docs/telemetry.md)",
          {"auto", "nvml", "rapl"}),
      // emulate
      key("emulate", &R::emulate, "cluster", &EmulateConfig::cluster, A::Any,
          "link and compute emulation on CPU ranks (docs/emulation.md): a cluster preset "
          "(cpu-here, dgx-h100, ...) or cluster file; launcher rank r is a device of the node "
          "emulate.rank_order gives (block: r / devices_per_node) and every message and "
          "collective takes at least the cluster model's time; \"\" = off. All ranks on one host"),
      key("emulate", &R::emulate, "slow_ranks", &EmulateConfig::slow_ranks, A::RankFactors,
          "injected stragglers: \"3:2.0,5:1.5@100\" = launcher (MPI) rank 3 computes 2x slower, rank 5 "
          "1.5x from step 100 on (on top of the cluster's node_speed); needs emulate.cluster"),
      key("emulate", &R::emulate, "rank_order", &EmulateConfig::rank_order, A::Choices,
          "how the emulated launcher hands ranks to nodes: block = rank r on node "
          "r / devices_per_node; round-robin = node r % nodes (mpirun --map-by node); "
          "interleave-sites = block, with the nodes taken from the cluster's sites in turn "
          "(a host list that alternates datacenters)",
          {"block", "round-robin", "interleave-sites"}),
      key("emulate", &R::emulate, "link_bandwidth", &EmulateConfig::link_bandwidth,
          A::StepFactors,
          "a bandwidth schedule of every emulated link: \"0.0005@200,1@400\" = from step 200 "
          "every link carries 0.0005x the cluster's bandwidth, from step 400 1x again "
          "(latencies unchanged); \"\" = the cluster's throughout; needs emulate.cluster"),
      key("emulate", &R::emulate, "slow_links", &EmulateConfig::slow_links, A::LinkFactors,
          "injected slow links: \"1-2:4@100\" = from step 100 every point-to-point message "
          "between launcher ranks 1 and 2 (either way: the pipeline's activations and "
          "gradients) takes 4x the cluster model's time; collectives keep the cluster's links; "
          "needs emulate.cluster"),
      key("emulate", &R::emulate, "power_cap_w", &EmulateConfig::power_cap_w, A::NonNegative,
          "every emulated device capped at this many watts: each rank computes as much slower "
          "as the cluster device's power model (device.power, docs/cluster.md) says the capped "
          "device would at the run's micro-batch; its ranks report throttling "
          "(docs/power.md); 0 = none; needs emulate.cluster"),
      key("emulate", &R::emulate, "clock", &EmulateConfig::clock, A::Choices,
          "the emulation's clock: wall = CLOCK_MONOTONIC, waits sleep; virtual = per rank its "
          "training thread's CPU time plus the emulated waits, nothing sleeps (ranks sharing "
          "cores time their steps as if each had a core; step times and tokens/s are "
          "virtual); model = the same with each rank's compute the matmul FLOPs it executes "
          "at emulate.model_flops (times, and so every adaptive decision, are the same on any "
          "machine under any load); virtual and model need emulate.cluster and a host backend "
          "(train.device cpu or emulated), virtual also one thread per rank",
          {"wall", "virtual", "model"}),
      key("emulate", &R::emulate, "model_flops", &EmulateConfig::model_flops, A::Positive,
          "the model clock's compute rate in FLOP/s per rank (emulate.clock: model); the "
          "default 1e10 is of the order of one CPU core's matmul rate"),
  };
  return k;
}

const std::vector<std::string>& sections() {
  static const std::vector<std::string> s = {"model", "train", "data",
                                             "parallel", "checkpoint", "log", "emulate"};
  return s;
}

// ------------------------------------------------------------ small helpers

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

std::string fmt_int(int64_t x) { return std::to_string(x); }

// An int list as YAML flow: [3, 3, 2], or [].
std::string list_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}


// fmt_real, but always recognisably a float to other YAML readers
// (10000 -> 10000.0, 1e-05 -> 1.0e-05).
std::string yaml_real(double x) {
  std::string s = fmt_real(x);
  if (!std::isfinite(x)) return s == "inf" ? ".inf" : s == "-inf" ? "-.inf" : ".nan";
  const size_t e = s.find('e');
  if (s.find('.') == std::string::npos) {
    if (e == std::string::npos) s += ".0";
    else s.insert(e, ".0");
  }
  return s;
}

std::string yaml_quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The closest candidate if it is close enough to be a plausible typo.
std::optional<std::string> closest(const std::string& word,
                                   const std::vector<std::string>& candidates) {
  std::optional<std::string> best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

std::vector<std::string> keys_in(const std::string& section) {
  std::vector<std::string> out;
  for (const auto& k : schema())
    if (section == k.section) out.push_back(k.name);
  return out;
}

const Key* find_key(const std::string& section, const std::string& name) {
  for (const auto& k : schema())
    if (section == k.section && name == k.name) return &k;
  return nullptr;
}

bool is_section(const std::string& s) {
  return std::find(sections().begin(), sections().end(), s) != sections().end();
}

// `children`: the keys written under the unknown section, if any; when the
// name itself is no near miss, the section that owns those keys is suggested.
std::string unknown_section_msg(const std::string& s,
                                const std::vector<std::string>& children = {}) {
  std::string m = "unknown section \"" + s + "\"";
  std::string hint;
  for (const auto& k : schema())
    if (s == k.name) { hint = k.full() + " (keys go inside their section)"; break; }
  if (hint.empty())
    if (auto c = closest(s, sections())) hint = *c;
  if (hint.empty() && !children.empty()) {
    for (const auto& sec : sections()) {
      const auto keys = keys_in(sec);
      const bool all_known = std::all_of(children.begin(), children.end(), [&](const auto& c) {
        return std::find(keys.begin(), keys.end(), c) != keys.end();
      });
      if (all_known) { hint = sec + " (it has " + join(children) + ")"; break; }
    }
  }
  if (!hint.empty()) m += "; did you mean " + hint + "?";
  return m + " (sections: " + join(sections()) + ")";
}

std::string unknown_key_msg(const std::string& section, const std::string& name) {
  std::string m = section + "." + name + ": unknown key";
  // A one-letter slip in this section first, then the same name in another
  // section (train.seq_len -> model.seq_len), then any near miss here.
  std::optional<std::string> hint;
  const auto near = closest(name, keys_in(section));
  if (near && edit_distance(name, *near) <= 1) hint = section + "." + *near;
  if (!hint)
    for (const auto& k : schema())
      if (name == k.name) { hint = k.full(); break; }
  if (!hint && near) hint = section + "." + *near;
  if (hint) m += "; did you mean " + *hint + "?";
  return m + " (allowed keys in " + section + ": " + join(keys_in(section)) + ")";
}

std::string type_name(Type t) {
  switch (t) {
    case Type::Int: return "int";
    case Type::UInt: return "uint64";
    case Type::Real: return "float";
    case Type::Bool: return "bool";
    case Type::Str: return "string";
    case Type::IntList: return "int list";
  }
  return "?";
}

// "a positive integer", "a number in [0, 1)", "one of {auto, cpu, cuda}", ...
std::string allowed_text(const Key& k) {
  switch (k.type) {
    case Type::Int:
      return k.allow == Allow::Positive      ? "a positive integer"
             : k.allow == Allow::NonNegative ? "a non-negative integer"
                                             : "an integer";
    case Type::UInt: return "an integer in [0, 2^64)";
    case Type::Real:
      return k.allow == Allow::Positive       ? "a number > 0"
             : k.allow == Allow::NonNegative  ? "a number >= 0"
             : k.allow == Allow::UnitHalfOpen ? "a number in [0, 1)"
                                              : "a finite number";
    case Type::Bool: return "true or false";
    case Type::Str:
      if (k.allow == Allow::Choices) {
        std::string s = "one of {";
        for (size_t i = 0; i < k.choices.size(); ++i) s += (i ? ", " : "") + k.choices[i];
        return s + "}";
      }
      if (k.allow == Allow::RankFactors)
        return "\"rank:factor,...\" with distinct ranks >= 0 and factors >= 1, or \"\"";
      if (k.allow == Allow::StepFactors)
        return "\"factor@step,...\" with factors > 0 and ascending steps, or \"\"";
      if (k.allow == Allow::LinkFactors)
        return "\"a-b:factor[@step],...\" with distinct rank pairs and factors >= 1, or \"\"";
      if (k.allow == Allow::StepRange)
        return "a step \"N\" or a range \"A-B\" of steps >= 1, or \"\"";
      if (k.allow == Allow::Blend)
        return "a token file, a blend \"W1 FILE1 W2 FILE2 ...\", or a list of {path: FILE, weight: W}";
      return k.allow == Allow::NonEmpty ? "a non-empty string" : "a string";
    case Type::IntList:
      return k.allow == Allow::Positive ? "a list of positive integers" : "a list of integers";
  }
  return "?";
}

std::string expected(const Key& k, const std::string& got) {
  return k.full() + ": expected " + allowed_text(k) + ", got " + got;
}

// The per-key rule on a value already of the right type; nullopt when it holds.
std::optional<std::string> check_range(const Key& k, RunConfig& cfg) {
  return std::visit(
      [&](auto* field) -> std::optional<std::string> {
        using T = std::remove_pointer_t<decltype(field)>;
        const T& v = *field;
        if constexpr (std::is_same_v<T, int64_t>) {
          const bool ok = k.allow == Allow::Positive      ? v >= 1
                          : k.allow == Allow::NonNegative ? v >= 0
                                                          : true;
          if (!ok) return expected(k, fmt_int(v));
        } else if constexpr (std::is_same_v<T, double>) {
          bool ok = std::isfinite(v);
          if (k.allow == Allow::Positive) ok = ok && v > 0;
          if (k.allow == Allow::NonNegative) ok = ok && v >= 0;
          if (k.allow == Allow::UnitHalfOpen) ok = ok && v >= 0 && v < 1;
          if (!ok) return expected(k, fmt_real(v));
        } else if constexpr (std::is_same_v<T, std::string>) {
          if ((k.allow == Allow::NonEmpty || k.allow == Allow::Blend) && v.empty())
            return expected(k, "an empty string");
          if (k.allow == Allow::Choices &&
              std::find(k.choices.begin(), k.choices.end(), v) == k.choices.end())
            return expected(k, yaml_quote(v));
          if (k.allow == Allow::RankFactors) {
            try {
              (void)parse_slow_ranks(v);
            } catch (const ConfigError& e) {
              return std::string(e.what());
            }
          }
          if (k.allow == Allow::StepFactors) {
            try {
              (void)parse_link_bandwidth(v);
            } catch (const ConfigError& e) {
              return std::string(e.what());
            }
          }
          if (k.allow == Allow::StepRange) {
            try {
              (void)parse_step_range(v);
            } catch (const ConfigError& e) {
              return std::string(e.what());
            }
          }
          if (k.allow == Allow::LinkFactors) {
            try {
              (void)parse_slow_links(v);
            } catch (const ConfigError& e) {
              return std::string(e.what());
            }
          }
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          for (size_t i = 0; i < v.size(); ++i)
            if (k.allow == Allow::Positive && v[i] < 1)
              return expected(k, fmt_int(v[i]) + " at entry " + fmt_int(int64_t(i) + 1) + " of " +
                                     list_text(v));
        }
        return std::nullopt;  // bool and uint64: every value is allowed
      },
      k.bind(cfg));
}

std::string node_kind(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Sequence: return "a sequence";
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Null: return "nothing (null)";
    default: return "something that is not a value";
  }
}

bool all_of_chars(const std::string& s, const char* allowed) {
  return !s.empty() && s.find_first_not_of(allowed) == std::string::npos;
}

// A plain decimal integer (an optional '+', no '8.0' or '1e3'); on failure
// what was found, as an error message shows it.
std::optional<std::string> read_int(const std::string& s, int64_t& x) {
  const char* b = s.data() + (s.size() > 1 && s[0] == '+' && s[1] != '-');
  auto [ptr, ec] = std::from_chars(b, s.data() + s.size(), x);
  if (ec == std::errc::result_out_of_range) return s + " (too large for a 64-bit integer)";
  if (ec != std::errc() || ptr != s.data() + s.size()) return yaml_quote(s);
  return std::nullopt;
}

// A finite number in decimal notation (no hex floats, inf or nan), the
// whole of s; nullopt otherwise. The list keys' factors (emulate.*).
std::optional<double> read_real(const std::string& s) {
  if (!all_of_chars(s, "0123456789+-.eE")) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(x)) return std::nullopt;
  return x;
}

// A non-negative integer of an emulate.* list entry (a rank, the step after '@').
bool read_count(const std::string& s, int64_t& x) {
  return all_of_chars(s, "0123456789") && !read_int(s, x);
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// An int list from a YAML sequence ([3, 3, 2], or a block of "- 3" lines) or
// from one comma-separated scalar (3,3,2: the handy form for --set). Each
// entry is read and range-checked as an int key's value; an error names the
// entry (1-based) and, for a sequence, sets *mark to that entry's position.
std::optional<std::string> assign_list(const Key& k, const YAML::Node& v, RunConfig& cfg,
                                       YAML::Mark* mark) {
  std::vector<std::string> items;
  std::vector<YAML::Node> nodes;  // the entries' nodes, for a sequence
  if (v.IsSequence()) {
    for (auto it = v.begin(); it != v.end(); ++it) nodes.push_back(*it);
  } else if (v.IsScalar()) {
    if (v.Tag() == "!")
      return expected(k, yaml_quote(v.Scalar()) + " (a quoted string; remove the quotes)");
    std::istringstream in(v.Scalar());
    for (std::string item; std::getline(in, item, ',');) items.push_back(trim(item));
    if (!v.Scalar().empty() && v.Scalar().back() == ',') items.push_back("");
  } else {
    return expected(k, node_kind(v));
  }
  std::vector<int64_t> out;
  const size_t n = v.IsSequence() ? nodes.size() : items.size();
  for (size_t i = 0; i < n; ++i) {
    const std::string entry = " at entry " + fmt_int(int64_t(i) + 1);
    std::string s;
    if (v.IsSequence()) {
      const YAML::Node& e = nodes[i];
      if (mark && !e.Mark().is_null()) *mark = e.Mark();
      if (!e.IsScalar()) return expected(k, node_kind(e) + entry);
      s = e.Scalar();
      if (e.Tag() == "!")
        return expected(k, yaml_quote(s) + entry + " (a quoted string; remove the quotes)");
    } else {
      s = items[i];
    }
    int64_t x = 0;
    if (auto bad = read_int(s, x)) return expected(k, *bad + entry);
    if (k.allow == Allow::Positive && x < 1) return expected(k, s + entry);
    out.push_back(x);
  }
  *std::get<std::vector<int64_t>*>(k.bind(cfg)) = std::move(out);
  return std::nullopt;
}

// Parses a YAML node into the key's field and checks its range. Returns the
// error (without location) or nullopt; `mark`, when given, starts at the
// value's position and is moved to the offending entry of a list.
std::optional<std::string> assign(const Key& k, const YAML::Node& v, RunConfig& cfg,
                                  YAML::Mark* mark = nullptr) {
  if (k.type == Type::IntList) return assign_list(k, v, cfg, mark);
  if (k.allow == Allow::Blend && v.IsSequence())
    return blend_list_text(v, k.full(), std::get<std::string*>(k.bind(cfg)), mark);
  if (!v.IsScalar()) return expected(k, node_kind(v));
  const std::string s = v.Scalar();
  // A quoted scalar ("8") is a string in YAML; only string keys take one.
  const bool is_quoted = v.Tag() == "!";
  if (is_quoted && k.type != Type::Str)
    return expected(k, yaml_quote(s) + " (a quoted string; remove the quotes)");
  FieldRef f = k.bind(cfg);
  const std::string got = yaml_quote(s);
  switch (k.type) {
    case Type::Int: {
      int64_t x = 0;
      if (auto bad = read_int(s, x)) return expected(k, *bad);
      *std::get<int64_t*>(f) = x;
      break;
    }
    case Type::UInt: {
      uint64_t x = 0;
      if (!all_of_chars(s, "0123456789")) return expected(k, got);
      auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
      if (ec == std::errc::result_out_of_range) return expected(k, s + " (too large)");
      if (ec != std::errc() || ptr != s.data() + s.size()) return expected(k, got);
      *std::get<uint64_t*>(f) = x;
      break;
    }
    case Type::Real: {
      // Decimal notation only (no hex floats, inf or nan).
      if (!all_of_chars(s, "0123456789+-.eE")) return expected(k, got);
      char* end = nullptr;
      errno = 0;
      const double x = std::strtod(s.c_str(), &end);
      if (end != s.c_str() + s.size()) return expected(k, got);
      if (errno == ERANGE || !std::isfinite(x)) return expected(k, s + " (out of range)");
      *std::get<double*>(f) = x;
      break;
    }
    case Type::Bool: {
      if (s == "true" || s == "True" || s == "TRUE") *std::get<bool*>(f) = true;
      else if (s == "false" || s == "False" || s == "FALSE") *std::get<bool*>(f) = false;
      else return expected(k, got);
      break;
    }
    case Type::Str: *std::get<std::string*>(f) = s; break;
    case Type::IntList: break;  // assign_list above
  }
  // Numbers that parsed but are out of range are reported as written.
  if (auto err = check_range(k, cfg)) {
    if (k.type == Type::Int || k.type == Type::Real) return expected(k, s);
    return err;
  }
  return std::nullopt;
}

// A quoted scalar must close on the line it opens: yaml-cpp 0.7 accepts a
// double- or single-quoted scalar left open to the end of the file, and one
// left open to a later quote, silently folding the lines between (the rest
// of the run file) into the value. `pos` is the node's mark (its anchor or
// tag, if any, then the opening quote). Returns the 1-based line count the
// scalar spans when it runs past its line or is never closed (0: fine).
int quoted_scalar_lines(const std::string& text, size_t pos, bool* closed) {
  *closed = true;
  size_t i = pos;
  while (i < text.size() && (text[i] == '&' || text[i] == '!')) {  // anchor, tag
    while (i < text.size() && text[i] != ' ' && text[i] != '\t' && text[i] != '\n') ++i;
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
  }
  if (i >= text.size() || (text[i] != '"' && text[i] != '\'')) return 0;
  const char q = text[i];
  int lines = 1;
  for (++i; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') ++lines;
    if (q == '"' && c == '\\') { ++i; continue; }
    if (c == q) {
      if (q == '\'' && i + 1 < text.size() && text[i + 1] == '\'') { ++i; continue; }
      return lines > 1 ? lines : 0;
    }
  }
  *closed = false;
  return lines;
}

std::optional<std::string> check_quoted(const Key& k, const std::string& text, size_t pos) {
  bool closed = true;
  const int lines = quoted_scalar_lines(text, pos, &closed);
  if (!closed)
    return k.full() + ": the quoted string is never closed (it would take the rest of the " +
           "file as its value); add the closing quote on this line";
  if (lines > 1)
    return k.full() + ": the quoted string runs over " + std::to_string(lines) +
           " lines (an unclosed quote takes the following lines as its value); close it on " +
           "this line";
  return std::nullopt;
}

std::string at(const std::string& name, const YAML::Mark& m) {
  if (m.is_null()) return name;
  return name + ":" + std::to_string(m.line + 1);
}

// Applies the YAML document (already parsed) to cfg.
void apply_document(const YAML::Node& root, const std::string& name, const std::string& text,
                    RunConfig& cfg) {
  if (root.IsNull()) return;  // empty file: all defaults
  if (!root.IsMap())
    throw ConfigError(at(name, root.Mark()) + ": expected a mapping of sections (" +
                      join(sections()) + "), got " +
                      (root.IsScalar() ? yaml_quote(root.Scalar()) : node_kind(root)));
  std::map<std::string, int> seen_sections;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const YAML::Node sk = it->first, sv = it->second;
    if (!sk.IsScalar())
      throw ConfigError(at(name, sk.Mark()) + ": section names must be plain words, got " +
                        node_kind(sk));
    const std::string sec = sk.Scalar();
    if (!is_section(sec)) {
      std::vector<std::string> children;
      if (sv.IsMap())
        for (auto c = sv.begin(); c != sv.end(); ++c)
          if (c->first.IsScalar()) children.push_back(c->first.Scalar());
      throw ConfigError(at(name, sk.Mark()) + ": " + unknown_section_msg(sec, children));
    }
    if (auto [p, fresh] = seen_sections.emplace(sec, sk.Mark().line + 1); !fresh)
      throw ConfigError(at(name, sk.Mark()) + ": section " + sec +
                        " appears twice (first at line " + std::to_string(p->second) +
                        "); merge them");
    if (sv.IsNull()) continue;  // "model:" with nothing under it
    if (!sv.IsMap())
      throw ConfigError(at(name, sv.Mark()) + ": " + sec + ": expected a mapping of keys (" +
                        join(keys_in(sec)) + "), got " +
                        (sv.IsScalar() ? yaml_quote(sv.Scalar()) : node_kind(sv)));
    std::map<std::string, int> seen_keys;
    for (auto kt = sv.begin(); kt != sv.end(); ++kt) {
      const YAML::Node kk = kt->first, kv = kt->second;
      if (!kk.IsScalar())
        throw ConfigError(at(name, kk.Mark()) + ": " + sec + ": keys must be plain words, got " +
                          node_kind(kk));
      const std::string kname = kk.Scalar();
      const Key* k = find_key(sec, kname);
      if (!k) throw ConfigError(at(name, kk.Mark()) + ": " + unknown_key_msg(sec, kname));
      if (auto [p, fresh] = seen_keys.emplace(kname, kk.Mark().line + 1); !fresh)
        throw ConfigError(at(name, kk.Mark()) + ": " + k->full() +
                          " appears twice (first at line " + std::to_string(p->second) +
                          "); keep one");
      YAML::Mark where = kv.IsNull() || kv.Mark().is_null() ? kk.Mark() : kv.Mark();
      if (kv.IsScalar() && kv.Tag() == "!" && !kv.Mark().is_null() && kv.Mark().pos >= 0)
        if (auto err = check_quoted(*k, text, size_t(kv.Mark().pos)))
          throw ConfigError(at(name, where) + ": " + *err);
      if (auto err = assign(*k, kv, cfg, &where)) throw ConfigError(at(name, where) + ": " + *err);
    }
  }
}

// One --set override: "section.key=value".
void apply_override(const std::string& ov, RunConfig& cfg) {
  const std::string where = "--set " + ov;
  const size_t eq = ov.find('=');
  const size_t dot = ov.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq)
    throw ConfigError(where + ": expected section.key=value, e.g. --set train.steps=100");
  const std::string sec = ov.substr(0, dot), kname = ov.substr(dot + 1, eq - dot - 1),
                    text = ov.substr(eq + 1);
  if (!is_section(sec)) throw ConfigError(where + ": " + unknown_section_msg(sec));
  const Key* k = find_key(sec, kname);
  if (!k) throw ConfigError(where + ": " + unknown_key_msg(sec, kname));
  YAML::Node v;
  const bool blend_list = k->allow == Allow::Blend && !text.empty() && text[0] == '[';
  if (k->type == Type::Str && !blend_list && (text.empty() || (text[0] != '"' && text[0] != '\''))) {
    // Strings are taken literally unless quoted (then YAML decodes the quotes),
    // so paths with ':' or '#' need no escaping; a blend's list is YAML flow
    // ([{path: A, weight: 0.7}, ...]).
    v = YAML::Node(text);
  } else {
    if (auto err = check_quoted(*k, text, 0)) throw ConfigError(where + ": " + *err);
    try {
      v = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      throw ConfigError(where + ": " + k->full() + ": cannot read the value as YAML (" + e.msg +
                        "); expected " + allowed_text(*k));
    }
  }
  if (auto err = assign(*k, v, cfg)) throw ConfigError(where + ": " + *err);
}

std::string prefix(const RunConfig& cfg) { return cfg.source.empty() ? "config" : cfg.source; }


// Divisors of n, the ones nearest `near` first, at most `max_n`, then sorted.
// Only the divisor pairs (i, n/i) with i <= 2^20 are searched: the loop stays
// short (and i*i cannot overflow) for any n a run file can give (up to 2^63-1,
// which would otherwise take ~3e9 steps); every n up to 2^40 is searched fully.
std::vector<int64_t> divisors_near(int64_t n, int64_t near, size_t max_n,
                                   const std::function<bool(int64_t)>& keep) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= (int64_t(1) << 20) && i <= n / i; ++i)
    if (n % i == 0) {
      if (keep(i)) d.push_back(i);
      if (i != n / i && keep(n / i)) d.push_back(n / i);
    }
  std::sort(d.begin(), d.end(), [&](int64_t a, int64_t b) {
    return std::llabs(a - near) < std::llabs(b - near) || (std::llabs(a - near) == std::llabs(b - near) && a < b);
  });
  if (d.size() > max_n) d.resize(max_n);
  std::sort(d.begin(), d.end());
  return d;
}

std::string set_text(const std::vector<int64_t>& v) {
  std::string s = "{";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "}";
}

// n_heads values that divide d_model with an even head_dim (and are a multiple
// of n_kv_heads when possible).
std::string head_choices(const ModelConfig& m) {
  auto even_hd = [&](int64_t h) { return (m.d_model / h) % 2 == 0; };
  auto with_kv = divisors_near(m.d_model, m.n_heads, 12,
                               [&](int64_t h) { return even_hd(h) && h % m.n_kv_heads == 0; });
  if (!with_kv.empty()) return set_text(with_kv);
  const auto any = divisors_near(m.d_model, m.n_heads, 12, even_hd);
  if (any.empty())  // an odd d_model: every head_dim is odd
    return "{} (none: model.d_model=" + fmt_int(m.d_model) +
           " is odd, so every head_dim is odd; use an even d_model such as " +
           fmt_int(m.d_model + 1) + ")";
  return set_text(any);
}

}  // namespace

// A cross-field rule's message names the run file ("configs/tiny.yaml: ...");
// where a key it names was given by --set, the --set joins the attribution:
// "configs/tiny.yaml, --set train.steps=1: train.warmup_steps=20 exceeds
// train.steps=1; ...". The last --set of a key is the one in force.
std::string attribute_overrides(const std::string& msg, const std::string& name,
                                const std::vector<std::string>& overrides) {
  const std::string head = (name.empty() ? std::string("config") : name) + ": ";
  if (msg.rfind(head, 0) != 0) return msg;
  const std::string body = msg.substr(head.size());
  std::map<std::string, std::string> last;  // key -> its last --set
  for (const auto& ov : overrides)
    if (const size_t eq = ov.find('='); eq != std::string::npos) last[ov.substr(0, eq)] = ov;
  std::string from;
  for (const auto& [key, ov] : last) {
    // The key as a whole word of the message: "train.steps" in "train.steps=1" or
    // "train.steps;", not in "train.steps_per_eval".
    for (size_t at = body.find(key); at != std::string::npos; at = body.find(key, at + 1)) {
      const size_t end = at + key.size();
      const auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
      if ((at == 0 || !word(body[at - 1])) && (end == body.size() || !word(body[end]))) {
        from += ", --set " + ov;
        break;
      }
    }
  }
  if (from.empty()) return msg;
  return head.substr(0, head.size() - 2) + from + ": " + body;
}

// ------------------------------------------------------------------- public

namespace {

// The emulate.* schedules ("...,...,..."): f(item, entry) for each
// ','-separated item, `entry` naming it for errors ("entry 2 \"1:3\""); a
// trailing ',' is bad("a trailing ','"). Nothing for an empty spec.
template <class Bad, class F>
void for_entries(const std::string& spec, Bad&& bad, F&& f) {
  if (trim(spec).empty()) return;
  std::istringstream in(spec);
  int64_t n = 0;
  for (std::string item; std::getline(in, item, ',');) {
    ++n;
    f(item, "entry " + fmt_int(n) + " " + yaml_quote(trim(item)));
  }
  if (trim(spec).back() == ',') throw bad("a trailing ','");
}

// "key:factor[@step]" (emulate.slow_ranks, emulate.slow_links): the key's
// text, a factor >= 1 (`one`: what factor 1 means) and the step (0 without '@').
struct FactorAt {
  std::string key;
  double factor = 1;
  int64_t from_step = 0;
};
template <class Bad>
FactorAt factor_at(const std::string& item, const std::string& entry, Bad&& bad, const char* one) {
  const size_t colon = item.find(':');
  if (colon == std::string::npos) throw bad(entry + " has no ':'");
  FactorAt out;
  out.key = trim(item.substr(0, colon));
  std::string f = trim(item.substr(colon + 1)), at;
  const size_t a = f.find('@');
  if (a != std::string::npos) {
    at = trim(f.substr(a + 1));
    f = trim(f.substr(0, a));
  }
  const std::optional<double> fac = read_real(f);
  if (!fac) throw bad(entry + ": the factor is not a number");
  out.factor = *fac;
  if (!(out.factor >= 1)) throw bad(entry + ": factor " + f + " < 1 (a slowdown; 1 = " + one + ")");
  if (a != std::string::npos && !read_count(at, out.from_step))
    throw bad(entry + ": the step after '@' is not a non-negative integer");
  return out;
}

}  // namespace

std::vector<SlowRank> parse_slow_rank_entries(const std::string& spec) {
  std::vector<SlowRank> out;
  auto bad = [&](const std::string& what) {
    return ConfigError("emulate.slow_ranks: " + what + " in " + yaml_quote(spec) +
                       "; expected \"rank:factor[@step],...\" such as \"3:2.0,5:1.5@100\" "
                       "(launcher rank 3 computes 2x slower; rank 5 1.5x from step 100 on), "
                       "factors >= 1");
  };
  for_entries(spec, bad, [&](const std::string& item, const std::string& entry) {
    const FactorAt e = factor_at(item, entry, bad, "normal speed");
    int64_t rank = 0;
    if (!read_count(e.key, rank)) throw bad(entry + ": the rank is not a non-negative integer");
    for (const SlowRank& s : out)
      if (s.rank == rank) throw bad(entry + ": rank " + e.key + " is given twice");
    out.push_back({rank, e.factor, e.from_step});
  });
  return out;
}

std::vector<std::pair<int64_t, double>> parse_link_bandwidth(const std::string& spec) {
  std::vector<std::pair<int64_t, double>> out;
  auto bad = [&](const std::string& what) {
    return ConfigError("emulate.link_bandwidth: " + what + " in " + yaml_quote(spec) +
                       "; expected \"factor@step,...\" such as \"0.0005@200,1@400\" (every link "
                       "at 0.0005x its bandwidth from step 200, 1x from step 400), factors > 0, "
                       "steps ascending");
  };
  for_entries(spec, bad, [&](const std::string& item, const std::string& entry) {
    const size_t a = item.find('@');
    if (a == std::string::npos) throw bad(entry + " has no '@step'");
    const std::string f = trim(item.substr(0, a)), at = trim(item.substr(a + 1));
    const std::optional<double> fac = read_real(f);
    if (!fac) throw bad(entry + ": the factor is not a number");
    const double factor = *fac;
    if (factor <= 0) throw bad(entry + ": factor " + f + " is not > 0");
    int64_t step = 0;
    if (!read_count(at, step))
      throw bad(entry + ": the step after '@' is not a non-negative integer");
    if (!out.empty() && step <= out.back().first)
      throw bad(entry + ": step " + at + " does not come after step " + fmt_int(out.back().first));
    out.emplace_back(step, factor);
  });
  return out;
}

std::optional<std::pair<int64_t, int64_t>> parse_step_range(const std::string& spec) {
  const std::string t = trim(spec);
  if (t.empty()) return std::nullopt;
  auto bad = [&](const std::string& what) {
    return ConfigError("log.trace: " + what + " in " + yaml_quote(spec) +
                       "; expected a step \"12\" or a range \"10-12\" of steps >= 1 (as the "
                       "step lines number them), or \"\" for no trace");
  };
  const size_t d = t.find('-');
  const std::string a = trim(t.substr(0, d)), b = d == std::string::npos ? a : trim(t.substr(d + 1));
  int64_t first = 0, last = 0;
  if (!read_count(a, first) || !read_count(b, last)) throw bad("a step is not a non-negative integer");
  if (first < 1) throw bad("step " + a + " is before step 1");
  if (last < first) throw bad("the range ends (" + b + ") before it starts (" + a + ")");
  return std::make_pair(first, last);
}

std::vector<SlowLink> parse_slow_links(const std::string& spec) {
  std::vector<SlowLink> out;
  auto bad = [&](const std::string& what) {
    return ConfigError("emulate.slow_links: " + what + " in " + yaml_quote(spec) +
                       "; expected \"a-b:factor[@step],...\" such as \"1-2:4@100\" (every "
                       "message between launcher ranks 1 and 2 takes 4x its time from step 100 "
                       "on), factors >= 1");
  };
  for_entries(spec, bad, [&](const std::string& item, const std::string& entry) {
    const size_t colon = item.find(':');
    const size_t dash = item.find('-');
    if (colon != std::string::npos && (dash == std::string::npos || dash > colon))
      throw bad(entry + ": the link is not \"a-b\"");
    const FactorAt e = factor_at(item, entry, bad, "the cluster's link");
    const size_t d = e.key.find('-');
    const std::string ra = trim(e.key.substr(0, d)), rb = trim(e.key.substr(d + 1));
    SlowLink l;
    if (!read_count(ra, l.a) || !read_count(rb, l.b))
      throw bad(entry + ": a rank of the link is not a non-negative integer");
    if (l.a == l.b) throw bad(entry + ": rank " + ra + " is linked to itself");
    if (l.a > l.b) std::swap(l.a, l.b);
    l.factor = e.factor;
    l.from_step = e.from_step;
    for (const SlowLink& o : out)
      if (o.a == l.a && o.b == l.b) throw bad(entry + ": link " + e.key + " is given twice");
    out.push_back(l);
  });
  return out;
}

std::vector<std::pair<int64_t, double>> parse_slow_ranks(const std::string& spec) {
  std::vector<std::pair<int64_t, double>> out;
  for (const SlowRank& s : parse_slow_rank_entries(spec)) out.emplace_back(s.rank, s.factor);
  return out;
}

namespace {

// Sizes beyond these make the 64-bit shape, memory and FLOP arithmetic
// overflow and the parameter table or the simulator loop for ages (found by
// scripts/reliability/fuzz_configs.py: model.d_model=2^63-1 or
// model.n_layers=2^63-1 passed the per-key checks). Each is far above any real
// run (a 405B model has 126 layers, d_model 16384, ffn 53248, vocab 128256).
std::optional<std::string> size_error(const RunConfig& c) {
  const struct { const char* key; int64_t value, max; } limits[] = {
      {"model.vocab_size", c.model.vocab_size, int64_t(1) << 31},
      {"model.d_model", c.model.d_model, int64_t(1) << 20},
      {"model.n_layers", c.model.n_layers, int64_t(1) << 16},
      {"model.n_heads", c.model.n_heads, int64_t(1) << 16},
      {"model.n_kv_heads", c.model.n_kv_heads, int64_t(1) << 16},
      {"model.ffn_hidden", c.model.ffn_hidden, int64_t(1) << 24},
      {"model.expert_ffn_hidden", c.model.expert_ffn_hidden, int64_t(1) << 24},
      {"model.seq_len", c.model.seq_len, int64_t(1) << 26},
      {"model.n_experts", c.model.n_experts, int64_t(1) << 16},
      {"model.moe_top_k", c.model.moe_top_k, int64_t(1) << 16},
      {"model.moe_every", c.model.moe_every, int64_t(1) << 16},
      {"train.micro_batch", c.train.micro_batch, int64_t(1) << 24},
      {"train.global_batch", c.train.global_batch, int64_t(1) << 40},
      {"parallel.tp", c.parallel.tp, int64_t(1) << 20},
      {"parallel.pp", c.parallel.pp, int64_t(1) << 20},
      {"parallel.dp", c.parallel.dp, int64_t(1) << 20},
      {"parallel.ep", c.parallel.ep, int64_t(1) << 20},
      {"parallel.cp", c.parallel.cp, int64_t(1) << 20},
      {"parallel.virtual_stages", c.parallel.virtual_stages, int64_t(1) << 16},
      {"parallel.microbatches", c.parallel.microbatches, int64_t(1) << 40},
      {"parallel.powersgd_rank", c.parallel.powersgd_rank, int64_t(1) << 20},
  };
  for (const auto& l : limits)
    if (l.value > l.max)
      return std::string(l.key) + "=" + fmt_int(l.value) + " is larger than adgt supports (at most " +
             fmt_int(l.max) + " = 2^" + fmt_int(int64_t(std::log2(double(l.max)))) +
             "); check the value";
  // Products: tokens per micro-batch, ranks, and the parameter count (in
  // double: each factor is bounded above, so nothing overflows here).
  const ModelConfig& m = c.model;
  const double tokens = double(c.train.micro_batch) * double(m.seq_len);
  if (tokens > std::ldexp(1.0, 36))
    return "train.micro_batch=" + fmt_int(c.train.micro_batch) + " x model.seq_len=" +
           fmt_int(m.seq_len) + " = " + fmt_real(tokens) +
           " tokens per micro-batch is more than adgt supports (2^36); lower one of them";
  const double ranks =
      double(c.parallel.tp) * double(c.parallel.cp) * double(c.parallel.pp) * double(c.parallel.dp);
  if (ranks > std::ldexp(1.0, 24))
    return "parallel.tp=" + fmt_int(c.parallel.tp) +
           (c.parallel.cp > 1 ? " x parallel.cp=" + fmt_int(c.parallel.cp) : std::string()) +
           " x parallel.pp=" + fmt_int(c.parallel.pp) + " x parallel.dp=" + fmt_int(c.parallel.dp) +
           " = " + fmt_real(ranks) + " ranks is more than adgt supports (2^24)";
  const double d = double(m.d_model), hd = d / double(m.n_heads);
  const double attn = d * hd * (2.0 * double(m.n_heads) + 2.0 * double(m.n_kv_heads));
  const double dense = 3.0 * d * double(m.ffn_hidden);
  const double moe = double(m.n_experts) * (3.0 * d * double(m.expert_ffn()) + d);
  double params = double(m.vocab_size) * d * (m.tie_embeddings ? 1 : 2) + d;
  for (int64_t l = 0; l < m.n_layers; ++l)
    params += attn + 2 * d + (m.is_moe_layer(l) ? moe : dense);
  if (params > std::ldexp(1.0, 48))
    return "the model has about " + fmt_real(std::round(params / 1e12)) +
           " trillion parameters (model.vocab_size, d_model, n_layers, ffn_hidden, n_experts), more "
           "than adgt supports (2^48 = 2.8e14); check the model sizes";
  return std::nullopt;
}

}  // namespace

bool fp8_weight_cache_on(const RunConfig& cfg) {
  const std::string& c = cfg.train.fp8_weight_cache;
  if (c != "auto") return c == "on";
  const ParallelConfig& p = cfg.parallel;
  return !(p.zero >= 3 && p.dp * std::max<int64_t>(1, p.cp) > 1 && p.zero3_reshard_after_forward);
}

void validate(const RunConfig& cfg_in) {
  RunConfig cfg = cfg_in;  // the binders take a mutable config
  const std::string src = prefix(cfg);
  for (const auto& k : schema())
    if (auto err = check_range(k, cfg)) throw ConfigError(src + ": " + *err);
  if (auto err = size_error(cfg)) throw ConfigError(src + ": " + *err);

  const ModelConfig& m = cfg.model;
  if (m.d_model % m.n_heads != 0)
    throw ConfigError(src + ": model.d_model=" + fmt_int(m.d_model) +
                      " is not divisible by model.n_heads=" + fmt_int(m.n_heads) +
                      "; choose n_heads in " + head_choices(m));
  if (m.head_dim() % 2 != 0)
    throw ConfigError(src + ": model.d_model=" + fmt_int(m.d_model) + " / model.n_heads=" +
                      fmt_int(m.n_heads) + " gives head_dim=" + fmt_int(m.head_dim()) +
                      ", but rotary embeddings need an even head_dim; choose n_heads in " +
                      head_choices(m));
  if (m.n_heads % m.n_kv_heads != 0)
    throw ConfigError(src + ": model.n_heads=" + fmt_int(m.n_heads) +
                      " is not divisible by model.n_kv_heads=" + fmt_int(m.n_kv_heads) +
                      "; choose n_kv_heads in " +
                      set_text(divisors_near(m.n_heads, m.n_kv_heads, 16,
                                             [](int64_t) { return true; })));

  if (m.moe_capacity_segment > 0 && m.seq_len % m.moe_capacity_segment != 0)
    throw ConfigError(src + ": model.moe_capacity_segment=" + fmt_int(m.moe_capacity_segment) +
                      " does not divide model.seq_len=" + fmt_int(m.seq_len) +
                      " (a capacity group never spans two sequences); use a divisor of " +
                      fmt_int(m.seq_len) + ", or 0 for a rank's micro-batch");

  const TrainConfig& t = cfg.train;
  if (cfg.parallel.fp8_allgather && t.dtype != "fp8")
    throw ConfigError(src + ": parallel.fp8_allgather gathers FP8 codes, but train.dtype is " + t.dtype +
                      "; set train.dtype: fp8 or parallel.fp8_allgather: false");
  if (const auto tr = parse_step_range(cfg.log.trace); tr && tr->first > t.steps)
    throw ConfigError(src + ": log.trace=" + yaml_quote(cfg.log.trace) + " starts after the run's last step (train.steps=" +
                      fmt_int(t.steps) + "); trace steps in 1.." + fmt_int(t.steps));
  if (t.min_lr > t.lr)
    throw ConfigError(src + ": train.min_lr=" + fmt_real(t.min_lr) + " is greater than train.lr=" +
                      fmt_real(t.lr) + "; use min_lr <= lr (e.g. lr/10 = " +
                      fmt_real(t.lr / 10) + ")");
  if (t.warmup_steps > t.steps)
    throw ConfigError(src + ": train.warmup_steps=" + fmt_int(t.warmup_steps) +
                      " exceeds train.steps=" + fmt_int(t.steps) + "; use warmup_steps <= " +
                      fmt_int(t.steps));
  // The parallel layout rules (core/layout.cpp), batch arithmetic first.
  // With parallel.auto the layout keys given are constraints on a plan that
  // is checked against the same rules once chosen (parallel/plan/).
  if (!cfg.parallel.auto_plan)
    if (auto err = layout_error(m, t, layout_of(cfg))) throw ConfigError(src + ": " + *err);
  if (!cfg.parallel.auto_plan)
    if (auto err = expert_replicas_error(cfg)) throw ConfigError(src + ": " + *err);
  if (cfg.parallel.zero >= 2 && cfg.parallel.grad_compression != "off")
    throw ConfigError(src + ": parallel.grad_compression=" + cfg.parallel.grad_compression +
                      " with parallel.zero=" + fmt_int(cfg.parallel.zero) +
                      " is not supported yet (compression acts on the bucketed all-reduce and "
                      "ZeRO-1's reduce-scatter; docs/zero.md); use grad_compression: off or zero: 1");

  const EmulateConfig& e = cfg.emulate;
  const auto slow = parse_slow_ranks(e.slow_ranks);
  if (!slow.empty() && trim(e.cluster).empty())
    throw ConfigError(src + ": emulate.slow_ranks=" + yaml_quote(e.slow_ranks) +
                      " needs emulate.cluster (the emulation it is part of); set "
                      "emulate.cluster=cpu-here for this machine's links");
  if (e.power_cap_w > 0 && trim(e.cluster).empty())
    throw ConfigError(src + ": emulate.power_cap_w=" + fmt_real(e.power_cap_w) +
                      " needs emulate.cluster (a cluster whose device has a power model, "
                      "docs/cluster.md); set emulate.cluster=dgx-h100 for example");
  if (e.clock != "wall" && trim(e.cluster).empty())
    throw ConfigError(src + ": emulate.clock=" + e.clock + " needs emulate.cluster (the emulation it "
                            "times); set emulate.cluster=cpu-here for this machine's links");
  if (e.clock == "virtual" && cfg.train.device != "cpu" && cfg.train.device != "auto")
    throw ConfigError(src + ": emulate.clock=virtual needs train.device=cpu (it counts the "
                            "training thread's CPU time as compute), not train.device=" +
                      yaml_quote(cfg.train.device));
  if (e.clock == "model" && cfg.train.device != "cpu" && cfg.train.device != "auto" &&
      cfg.train.device != "emulated")
    throw ConfigError(src + ": emulate.clock=model needs train.device=cpu or emulated (it counts "
                            "the CPU kernels' matmul FLOPs as compute), not train.device=" +
                      yaml_quote(cfg.train.device));
  const std::vector<SlowLink> slow_links = parse_slow_links(e.slow_links);
  if (!slow_links.empty() && trim(e.cluster).empty())
    throw ConfigError(src + ": emulate.slow_links=" + yaml_quote(e.slow_links) +
                      " needs emulate.cluster (the links it slows); set "
                      "emulate.cluster=cpu-here for this machine's links");
  if (!parse_link_bandwidth(e.link_bandwidth).empty() && trim(e.cluster).empty())
    throw ConfigError(src + ": emulate.link_bandwidth=" + yaml_quote(e.link_bandwidth) +
                      " needs emulate.cluster (the links it schedules); set "
                      "emulate.cluster=cpu-here for this machine's links");
  const int64_t world = layout_of(cfg).world();
  for (const auto& [rank, factor] : slow)
    if (rank >= world && !cfg.parallel.auto_plan)  // with auto the world is the launch's
      throw ConfigError(src + ": emulate.slow_ranks=" + yaml_quote(e.slow_ranks) + ": rank " +
                        fmt_int(rank) + " is outside the run's " + fmt_int(world) +
                        " ranks (tp x pp x dp); world ranks are 0.." + fmt_int(world - 1));
}

std::optional<std::string> expert_replicas_error(const RunConfig& cfg) {
  const ParallelConfig& p = cfg.parallel;
  const int64_t E = cfg.model.n_experts, ep = p.ep;
  if (p.expert_replicas.empty() && p.expert_slots == 0) return std::nullopt;
  if (E <= 0)
    return std::string(p.expert_replicas.empty() ? "parallel.expert_slots" : "parallel.expert_replicas") +
           " is set but model.n_experts=0; remove it or set model.n_experts";
  if (ep < 1 || E % ep != 0) return std::nullopt;  // the layout rules name it
  if (p.zero >= 2 && p.dp * p.cp > 1)
    return std::string(p.expert_replicas.empty() ? "parallel.expert_slots" : "parallel.expert_replicas") +
           " with parallel.zero=" + fmt_int(p.zero) +
           " is not supported yet (replicas shadow their owners' whole weights; docs/zero.md); "
           "remove it or use zero: 0";
  if (p.expert_slots > 0 && p.expert_slots < E / ep)
    return "parallel.expert_slots=" + fmt_int(p.expert_slots) + " is less than the " + fmt_int(E / ep) +
           " experts each ep rank owns (n_experts/ep); use 0 (no replicas) or at least " + fmt_int(E / ep);
  try {
    const std::vector<int> owner(p.expert_placement.begin(), p.expert_placement.end());
    const ExpertPlacement pl(E, int(ep), owner);
    ExpertReplicas::parse(pl, p.expert_replicas, int(p.expert_slots > 0 ? p.expert_slots : E / ep));
  } catch (const std::exception& e) {
    std::string m = e.what();
    if (const auto at = m.find(" [check "); at != std::string::npos) m.erase(at);  // the source line
    return "parallel.expert_replicas=" + yaml_quote(p.expert_replicas) + ": " + m;
  }
  return std::nullopt;
}

// A layout for `launch` ranks that passes every rule of this run, printed as
// the fix of the world-size error; "" when none is near. The run's cp kept
// (world = launch / cp below), tried in order: the run's tp and pp with dp =
// world/(tp*pp); other splits of the world (tp
// first, then pp, within the model's rules); the run's tp and pp with the
// global batch raised to the next multiple of micro_batch x dp.
static std::string world_suggestion(const RunConfig& cfg, int64_t launch) {
  const Layout l = layout_of(cfg);
  // The run's cp stays: the splits are of the ranks per cp group.
  if (launch % l.cp != 0) return "";
  const int64_t world = launch / l.cp;
  const auto valid = [&](int64_t tp, int64_t pp, int64_t dp, int64_t gb) {
    RunConfig c = cfg;
    c.parallel.tp = tp, c.parallel.pp = pp, c.parallel.dp = dp, c.train.global_batch = gb;
    if (c.parallel.ep > 1 && dp % c.parallel.ep != 0) return false;
    try {
      validate(c);
      return true;
    } catch (const ConfigError&) {
      return false;
    }
  };
  const int64_t gb = cfg.train.global_batch;
  std::vector<std::pair<int64_t, int64_t>> splits;  // (tp, pp): the run's first
  if (world % (l.tp * l.pp) == 0) splits.push_back({l.tp, l.pp});
  for (int64_t tp = 1; tp <= world; ++tp)
    for (int64_t pp = 1; tp * pp <= world; ++pp)
      if (world % (tp * pp) == 0 && (tp != l.tp || pp != l.pp)) splits.push_back({tp, pp});
  const auto name = [&](int64_t tp, int64_t pp) {
    return tp == l.tp && pp == l.pp
               ? "with tp=" + fmt_int(tp) + " pp=" + fmt_int(pp) + " use parallel.dp=" +
                     fmt_int(world / (tp * pp))
               : "use parallel.tp=" + fmt_int(tp) + " parallel.pp=" + fmt_int(pp) +
                     " parallel.dp=" + fmt_int(world / (tp * pp));
  };
  for (const auto& [tp, pp] : splits)
    if (valid(tp, pp, world / (tp * pp), gb)) return "; " + name(tp, pp);
  // The batch does not split over any of them: the next multiple of micro_batch x dp.
  for (const auto& [tp, pp] : splits) {
    const int64_t dp = world / (tp * pp), unit = cfg.train.micro_batch * dp;
    const int64_t gb2 = unit > 0 ? (gb + unit - 1) / unit * unit : gb;
    if (gb2 != gb && valid(tp, pp, dp, gb2))
      return "; " + name(tp, pp) + " and train.global_batch=" + fmt_int(gb2) +
             " (a multiple of micro_batch x dp)";
  }
  return "";
}

void validate_world(const RunConfig& cfg, int world_size) {
  const Layout l = layout_of(cfg);
  if (l.world() == world_size) return;
  // world_error's text without its unchecked hint ("; with tp=.. use dp=..").
  std::string err = *world_error(l, world_size);
  if (const size_t at = err.find("; with tp="); at != std::string::npos) err.erase(at);
  std::string hint = world_suggestion(cfg, world_size);
  if (hint.empty())
    hint = "; no layout of " + fmt_int(world_size) + " ranks fits this model and batch: launch " +
           fmt_int(l.world()) + " ranks";
  throw ConfigError(prefix(cfg) + ": " + err + hint);
}

RunConfig load_config_text(const std::string& yaml, const std::string& name,
                           const std::vector<std::string>& overrides) {
  RunConfig cfg;
  cfg.source = name;
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    throw ConfigError(at(name, e.mark) + ": YAML syntax error: " + e.msg +
                      (e.mark.is_null() ? "" : " (column " + std::to_string(e.mark.column + 1) + ")"));
  }
  apply_document(root, name, yaml, cfg);
  for (const auto& ov : overrides) apply_override(ov, cfg);
  try {
    validate(cfg);
  } catch (const ConfigError& e) {
    throw ConfigError(attribute_overrides(e.what(), name, overrides));
  }
  return cfg;
}

std::vector<std::string> explicit_keys_text(const std::string& yaml, const std::string& name,
                                            const std::vector<std::string>& overrides) {
  (void)load_config_text(yaml, name, overrides);  // the same errors as loading it
  std::set<std::string> keys;
  const YAML::Node root = YAML::Load(yaml);
  if (root.IsMap())
    for (auto it = root.begin(); it != root.end(); ++it)
      if (it->second.IsMap())
        for (auto kt = it->second.begin(); kt != it->second.end(); ++kt)
          keys.insert(it->first.Scalar() + "." + kt->first.Scalar());
  for (const auto& ov : overrides) keys.insert(ov.substr(0, ov.find('=')));
  return {keys.begin(), keys.end()};
}

std::vector<std::string> explicit_keys(const std::string& path,
                                       const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) (void)load_config(path, overrides);  // throws the named error
  std::ostringstream ss;
  ss << in.rdbuf();
  return explicit_keys_text(ss.str(), path, overrides);
}

RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (!fs::exists(st))
    throw ConfigError(path + ": cannot open config file: no such file (working directory " +
                      fs::current_path(ec).string() + ")");
  if (!fs::is_regular_file(st)) throw ConfigError(path + ": cannot open config file: not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot open config file: permission denied or unreadable");
  std::ostringstream ss;
  ss << in.rdbuf();
  return load_config_text(ss.str(), path, overrides);
}

std::string to_yaml(const RunConfig& cfg_in) {
  RunConfig cfg = cfg_in;
  std::string out;
  std::string section;
  for (const auto& k : schema()) {
    if (section != k.section) {
      section = k.section;
      out += section + ":\n";
    }
    const std::string v = std::visit(
        [](auto* field) -> std::string {
          using T = std::remove_pointer_t<decltype(field)>;
          if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>)
            return std::to_string(*field);
          else if constexpr (std::is_same_v<T, double>) return yaml_real(*field);
          else if constexpr (std::is_same_v<T, bool>) return *field ? "true" : "false";
          else if constexpr (std::is_same_v<T, std::vector<int64_t>>) return list_text(*field);
          else return yaml_quote(*field);
        },
        k.bind(cfg));
    if (k.allow == Allow::Blend)  // a blend of two or more as its list (config_blend.hpp)
      if (auto list = blend_list_of(*std::get<std::string*>(k.bind(cfg)))) {
        out += "  " + std::string(k.name) + ":\n";
        for (const BlendSource& b : *list)
          out += "    - path: " + yaml_quote(b.path) + "\n      weight: " + yaml_real(b.weight) + "\n";
        continue;
      }
    out += "  " + std::string(k.name) + ": " + v + "\n";
  }
  return out;
}

const std::vector<ConfigKeyInfo>& config_keys() {
  static const std::vector<ConfigKeyInfo> info = [] {
    std::vector<ConfigKeyInfo> out;
    // Defaults as to_yaml writes them: one line per key after the section header.
    const std::string y = to_yaml(RunConfig{});
    std::map<std::string, std::string> defaults;
    std::istringstream in(y);
    std::string line, section;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      if (line[0] != ' ') { section = line.substr(0, line.size() - 1); continue; }
      const size_t c = line.find(": ");
      defaults[section + "." + line.substr(2, c - 2)] = line.substr(c + 2);
    }
    for (const auto& k : schema())
      out.push_back({k.section, k.name, k.allow == Allow::Blend ? "string or list" : type_name(k.type),
                     defaults.at(k.full()),
                     allowed_text(k), k.doc});
    return out;
  }();
  return info;
}

std::string config_reference_markdown() {
  std::string out;
  std::string section;
  for (const auto& k : config_keys()) {
    if (section != k.section) {
      section = k.section;
      out += (out.empty() ? "" : "\n");
      out += "### " + section + "\n\n";
      out += "| key | type | default | allowed | meaning |\n";
      out += "|---|---|---|---|---|\n";
    }
    auto esc = [](std::string s) {
      std::string r;
      for (char c : s) r += c == '|' ? std::string("\\|") : std::string(1, c);
      return r;
    };
    out += "| `" + k.section + "." + k.key + "` | " + k.type + " | `" + k.default_value + "` | " +
           esc(k.allowed) + " | " + esc(k.doc) + " |\n";
  }
  return out;
}

std::string fmt_real(double x) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

}  // namespace adgt

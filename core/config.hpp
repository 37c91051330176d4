// The run configuration: one YAML file with sections model, train, data,
// parallel, checkpoint, log, emulate; any key overridable with --set section.key=value.
// load_config() validates everything before anything is allocated and throws
// ConfigError naming the file, line, key and what is allowed.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace adgt {

struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct ModelConfig {
  int64_t vocab_size = 4096;
  int64_t d_model = 256;
  int64_t n_layers = 4;
  int64_t n_heads = 8;
  int64_t n_kv_heads = 4;       // grouped-query attention; divides n_heads
  int64_t ffn_hidden = 688;     // SwiGLU intermediate size
  int64_t seq_len = 256;        // training context length (max positions)
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  bool tie_embeddings = false;  // lm_head shares model.embed_tokens.weight
  // Rotary positions restart at 0 after each EOS (each packed document's
  // tokens at the positions of a run of that document alone).
  bool rope_reset_per_document = false;
  double init_std = 0.02;
  // Mixture of experts (Mixtral): n_experts > 0 turns the FFN of every
  // moe_every-th layer (layers l with (l + 1) % moe_every == 0) into
  // n_experts SwiGLU experts of expert_ffn_hidden behind a top-k router.
  int64_t n_experts = 0;
  int64_t moe_top_k = 2;
  int64_t moe_every = 1;
  int64_t expert_ffn_hidden = 0;      // 0: ffn_hidden
  double moe_aux_loss_coef = 0.01;    // load-balancing loss coefficient (0: off)
  bool moe_aux_free = false;          // DeepSeek-V3 bias balancing
  double moe_bias_rate = 1e-3;        // bias step per optimizer step (moe_aux_free)
  // Skewed routing for experiments (moe_aux_free): the selection bias starts
  // at -s beta ln(e + 1) for expert e (moe_router_bias_init_zipf()); 0 = 0.
  double moe_bias_init_zipf = 0;
  double moe_capacity_factor = 0;     // 0: dropless
  // Tokens per expert-capacity group, in token order (a divisor of seq_len;
  // 0: a rank's micro-batch). Groups inside a chunk keep cp's drops the
  // single process's (docs/moe.md, "Capacity").
  int64_t moe_capacity_segment = 0;
  int64_t head_dim() const { return d_model / n_heads; }
  bool is_moe_layer(int64_t l) const { return n_experts > 0 && (l + 1) % moe_every == 0; }
  int64_t expert_ffn() const { return expert_ffn_hidden > 0 ? expert_ffn_hidden : ffn_hidden; }
  bool operator==(const ModelConfig&) const = default;
};

struct TrainConfig {
  int64_t steps = 300;
  std::string device = "auto";  // auto | cpu | cuda | emulated
  int64_t micro_batch = 8;      // sequences per micro-batch per rank
  int64_t global_batch = 8;     // sequences per optimizer step (all ranks)
  double lr = 3e-3;             // peak learning rate
  double min_lr = 3e-4;         // end of the cosine decay
  int64_t warmup_steps = 20;    // linear warm-up from lr/warmup_steps
  double weight_decay = 0.1;
  bool decay_norms_and_embeddings = false;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;       // global-norm clip; 0 disables
  uint64_t seed = 1234;
  int64_t eval_interval = 100;  // steps between validation evals; 0 disables
  int64_t eval_batches = 0;     // micro-batches per eval; 0 = the whole split
  int64_t max_skipped_steps = 20;  // consecutive non-finite steps before aborting
  std::string dtype = "f32";    // f32 | bf16 (mixed precision) | fp8 | f64 (reference checks)
  // dtype fp8 (docs/fp8.md): the formats (hybrid: E4M3 forward, E5M2 output
  // gradients | e4m3), the scaling recipe (tensorwise | delayed), its amax
  // history length and the headroom in binades.
  std::string fp8_format = "hybrid";
  std::string fp8_recipe = "tensorwise";
  int64_t fp8_amax_history = 16;
  int64_t fp8_margin = 0;
  // FP8 weight codes: on = cast once a step and kept; off = cast at each use;
  // auto = off at ZeRO-3 with zero3_reshard_after_forward, else on.
  std::string fp8_weight_cache = "auto";
  std::string recompute = "none";  // none | selective | full (core/model/model.hpp)
  int64_t recompute_layers = 0;    // full: layers per chunk that recompute; 0 = all
  // One GEMM for q/k/v and one for gate/up (weights adjacent in the flat
  // buffer; checkpoints keep the HF names). false: five GEMMs.
  bool fused_projections = true;
  // Attention does not cross document boundaries (a new document starts after
  // each data.eos_id token) inside a packed sequence.
  bool document_mask = false;
  // Attention kernels: auto (time the candidates on the run's shapes at
  // start-up, keep the faster) | flash (handwritten) | cudnn (cuDNN SDPA) |
  // exact (the reference kernel). The CPU backend has one kernel (exact).
  std::string attention = "auto";
  // CPU backends (cpu, emulated): flush denormal floats to zero in the
  // training thread and its OpenMP pool (kernels/cpu/float_env.hpp); false =
  // IEEE gradual underflow. No effect on CUDA.
  bool flush_denormals = true;
  // Watchdog deadline of every collective and point-to-point operation
  // (parallel/fault/, docs/reliability.md); 0 = auto: max(30 s, 5 x the
  // slowest step), and max(300 s, that) in start-up, checkpoints and evaluation.
  double collective_timeout_s = 0;
  bool operator==(const TrainConfig&) const = default;
};

// Whether a run keeps bf16 weights and activations (train.dtype bf16, or fp8:
// bf16 with FP8 GEMMs).
inline bool bf16_compute(const TrainConfig& t) { return t.dtype == "bf16" || t.dtype == "fp8"; }

struct DataConfig {
  std::string train = "data/kjv/train.bin";  // token shard (adgt-data output)
  std::string val = "data/kjv/val.bin";
  std::string tokenizer = "data/kjv/tokenizer.model";  // or "byte"
  // The end-of-document token for train.document_mask and
  // model.rope_reset_per_document; -1: the training data's meta.json
  // (documents.eos_id), else data.tokenizer's EOS.
  int64_t eos_id = -1;
  bool operator==(const DataConfig&) const = default;
};

struct ParallelConfig {
  int64_t tp = 1, pp = 1, dp = 1, ep = 1;
  // Context parallelism (docs/context-parallel.md): each sequence split over
  // cp ranks; cp_mode ring | all-to-all.
  int64_t cp = 1;
  std::string cp_mode = "ring";
  // Pipeline (pp > 1). The model is cut into S = pp x virtual_stages stages;
  // chunk c of pipeline rank r is stage c*pp + r, or with zb-v stage r (c = 0)
  // and 2pp-1-r (c = 1) (core/model/stage_map.hpp).
  std::string schedule = "1f1b";     // gpipe | 1f1b | interleaved | zb-h1 | zb-v | greedy
  int64_t microbatches = 0;          // 0 = derived (accum_steps()); if set, must equal it
  int64_t virtual_stages = 1;        // chunks per pipeline rank; > 1 for interleaved, greedy, zb-v (2)
  std::vector<int64_t> stage_layers; // layers per stage (S entries); empty = balanced by cost
  // ZeRO over dp x cp (docs/zero.md): 1 AdamW state, 2 also gradients, 3 also weights.
  int64_t zero = 0;
  int64_t zero3_prefetch = 1;             // zero 3: units gathered ahead of the one computing
  bool zero3_reshard_after_forward = true;  // zero 3: free after the forward, gather again for the backward
  bool sequence_parallel = false;  // shard norm/residual regions along the sequence over tp
  // train.dtype fp8 with sequence parallelism: all-gather the FP8 codes of
  // the sequence-sharded input of the q/k/v and gate/up GEMMs (one byte an
  // element) instead of its bf16 values (docs/fp8.md)
  bool fp8_allgather = false;
  double bucket_mb = 4;            // gradient all-reduce bucket size (MiB)
  bool overlap = true;             // start each bucket's reduction once its gradients are complete
  // Owner ep rank of each expert (model.n_experts entries); empty: contiguous blocks.
  std::vector<int64_t> expert_placement;
  // Plan the layout at launch (parallel/plan/; docs/planner.md): the keys of
  // this section and train.micro_batch/recompute that the run file or --set
  // gives are constraints; the rest are chosen by the simulator.
  bool auto_plan = false;  // YAML key: parallel.auto
  // With auto_plan: re-plan at run time when the measured compute speeds of
  // the ranks change, and switch the layout in memory when that pays
  // (parallel/control/replan_controller.hpp; docs/planner.md "Re-planning").
  bool replan = true;
  // With auto_plan: after warm-up, run the planner's best `auto_trials` plans
  // a few steps each (switching in memory), then keep the fastest measured
  // (parallel/control/trial_controller.hpp; docs/planner.md "Trials"). 0: off.
  int64_t auto_trials = 0;
  // Run-time adaptation (parallel/adapt/; docs/adaptation.md): off, or
  // schedule (the default) = re-plan the pipeline schedule from measured
  // stage and link times at warm-up and on every sustained change;
  // schedule+layers = also move layers between stages (an in-memory layout
  // switch) when that pays. parallel.schedule is the schedule a run starts
  // with; off keeps it.
  std::string adapt = "schedule";
  // The relative change of a measured stage, link or rank speed that counts
  // as sustained (held 5 steps): parallel.adapt's detectors and parallel.auto's
  // re-plan (docs/adaptation.md, "Sustained-change detection").
  double adapt_threshold = 0.25;
  // Where parallel.adapt's link times come from (docs/adaptation.md, "Link
  // times from the step's own messages"): auto = the emulation's stamps under
  // emulate.cluster, else a ping-pong probe between steps; messages = the
  // step's own pipeline messages (send and arrival times) where receives
  // block the host (else the probe); probe = the probe, emulated or not.
  std::string link_times = "auto";
  // parallel.adapt's schedule re-plan: each candidate's makespan is the mean
  // over this many simulations with single instructions' measured spread
  // drawn in (pp::expected_makespan); 0 = one simulation with the medians.
  int64_t adapt_jitter_samples = 32;
  // MoE: every this many steps re-place the experts over the ep ranks by
  // their measured load and each rank's measured expert throughput (an
  // in-memory layout switch of expert_placement; docs/adaptation.md). 0: off.
  int64_t expert_replace_interval = 0;
  // With expert_replace_interval: decide and log, apply nothing (the static
  // placement measured, as a benchmark's baseline).
  bool expert_replace_dry_run = false;
  // MoE: experts each ep rank may hold, its own plus replicas of hot experts
  // (core/model/moe_replicas.hpp); 0: n_experts / ep, no replicas. With
  // expert_replace_interval, the re-placement fills the spare slots.
  int64_t expert_slots = 0;
  // MoE: the replicas in use ("e:rank=share,...;..."; "" none), for
  // expert_placement's owners. Set by the re-placement (and switched in place).
  std::string expert_replicas;
  // Rank placement (docs/placement.md): topology = rank order rebuilt from
  // the sites and nodes (sites in turn, tp groups inside a node, then dp,
  // pipeline stages outermost); nodes = the same ignoring sites; launcher =
  // the launcher's rank order as it comes.
  std::string placement = "topology";
  // The data-parallel reduction of a group whose ranks span sites
  // (docs/sites.md): hierarchical (inside each site, then one cross-site
  // exchange of each member's shard) or flat (one ring over the group).
  std::string site_reduce = "hierarchical";
  // Gradient compression of the data-parallel reduce (parallel/compress/,
  // docs/compression.md): off | bf16 | int8 | int4 | int3 | int2 | powersgd | auto (auto:
  // a controller sets each bucket's level; without one it runs as off).
  std::string grad_compression = "off";
  int64_t powersgd_rank = 4;           // PowerSGD's rank r
  int64_t compress_min_elems = 4096;   // tensors with fewer elements (and 1-D ones) go uncompressed
  // grad_compression auto (parallel/control/compress_controller.hpp): steps between
  // decisions, the error budget (compression error <= budget x the gradient
  // noise share) and the hysteresis band (a share of the step, over the 5%).
  int64_t compress_interval = 20;
  double compress_error_budget = 1.0;
  double compress_hysteresis = 0.1;
  // parallel.auto ranks its candidates by step time or by energy per token
  // (the cluster's power model, docs/power.md).
  std::string auto_objective = "time";
  bool operator==(const ParallelConfig&) const = default;
};

struct CheckpointConfig {
  std::string dir = "runs/tiny/checkpoints";
  int64_t interval = 0;  // steps between saves; 0 = only at the end
  int64_t keep = 3;      // newest complete checkpoints kept; 0 keeps all
  bool at_end = true;    // save after the last step
  // YAML checkpoint.async: copy the state to host memory at the step boundary
  // and write it in a background thread while training continues (docs/reliability.md).
  bool async_save = false;
  bool operator==(const CheckpointConfig&) const = default;
};

struct LogConfig {
  std::string dir = "runs/tiny";
  int64_t interval = 10;
  double peak_tflops = 0;  // MFU denominator; 0 = measure the CPU GEMM peak at start
  // Steps whose timeline is written to <dir>/trace.json (Chrome trace, every
  // rank a track; docs/trace.md): "12" or "10-12" (steps as the step lines
  // number them, from 1); "" = off.
  std::string trace;
  // Seconds between the telemetry sampler's readings (power, clocks,
  // temperatures, throttling; docs/telemetry.md); 0 = off.
  double telemetry_interval_s = 1;
  // What each rank reads: auto (NVML on CUDA ranks, RAPL on CPU ranks), nvml
  // or rapl on every rank (docs/telemetry.md).
  std::string telemetry_source = "auto";
  bool operator==(const LogConfig&) const = default;
};

// Link and compute emulation on CPU ranks (docs/emulation.md): never on by default.
struct EmulateConfig {
  // A cluster preset (cpu-here, dgx-h100, ...) or a cluster file
  // (docs/cluster.md; relative paths as written); "" = off. Launcher rank r
  // runs as a device of the node emulate.rank_order gives it (block: r /
  // devices_per_node), and every message and collective takes at least the
  // cluster model's time.
  std::string cluster;
  // "rank:factor[@step],..." ("3:2.0,5:1.5@100"; @step: from that step on): launcher rank 3 computes 2x slower, rank
  // 5 1.5x (factor >= 1); "" = none. Needs emulate.cluster.
  std::string slow_ranks;
  // How the emulated launcher hands out ranks to the cluster's nodes: block =
  // rank r on node r / devices_per_node; round-robin = node r % nodes (as
  // mpirun --map-by node does); interleave-sites = block over the nodes taken
  // from the cluster's sites in turn (site 0's first node, site 1's first, ...).
  std::string rank_order = "block";
  // A bandwidth schedule of every link: "factor@step,..." ("0.0005@200,1@400":
  // from step 200 every link of the cluster carries 0.0005x its bandwidth,
  // from step 400 1x again); factors > 0, steps ascending; "" = the cluster's
  // bandwidths throughout. Needs emulate.cluster.
  std::string link_bandwidth;
  // Slow links between two ranks: "a-b:factor[@step],..." ("1-2:4@100": from
  // step 100 every message between launcher ranks 1 and 2, either way, takes
  // 4x the cluster model's time); factors >= 1; "" = none. Point-to-point
  // messages only (the pipeline's); collectives keep the cluster's links.
  // Needs emulate.cluster.
  std::string slow_links;
  // Which clock the emulation times with: wall = CLOCK_MONOTONIC (waits
  // sleep); virtual = per rank, its training thread's CPU time plus the
  // emulated waits (nothing sleeps; ranks sharing cores time their steps as
  // if each had its own). Needs emulate.cluster; virtual needs train.device
  // cpu with one thread per rank. model = virtual with each rank's compute
  // its executed matmul FLOPs at model_flops FLOP/s (deterministic); needs a
  // host backend (cpu or emulated).
  std::string clock = "wall";
  double model_flops = 1e10;  // the model clock's compute rate, FLOP/s per rank
  // Every emulated device capped at this many watts (0: none): each rank
  // computes as much slower as the cluster device's power model says that
  // device would at the run's micro-batch (docs/power.md).
  double power_cap_w = 0;
  // Whether the run is on the model clock: then its compute is counted matmul
  // FLOPs at model_flops, which is also the peak its MFU, its launch plan and
  // adgt-sim's profile use.
  bool model_clock() const { return clock == "model" && !cluster.empty(); }
  bool operator==(const EmulateConfig&) const = default;
};

// emulate.slow_ranks as (world rank, factor) pairs in the order written;
// throws ConfigError "emulate.slow_ranks: ..." on bad syntax, a factor < 1
// or a rank given twice.
std::vector<std::pair<int64_t, double>> parse_slow_ranks(const std::string& spec);
// The same with each entry's onset: "rank:factor@step" slows the rank from
// step `step` on (the run's steps count from 0; no '@': from the start).
struct SlowRank {
  int64_t rank = 0;
  double factor = 1;
  int64_t from_step = 0;
};
std::vector<SlowRank> parse_slow_rank_entries(const std::string& spec);
// emulate.slow_links: the link between launcher ranks a and b (a != b)
// slowed `factor` times from step `from_step` on (0: from the start).
struct SlowLink {
  int64_t a = 0, b = 0;
  double factor = 1;
  int64_t from_step = 0;
};
// Throws ConfigError "emulate.slow_links: ..." on bad syntax, a factor < 1,
// a rank linked to itself or a pair given twice.
std::vector<SlowLink> parse_slow_links(const std::string& spec);
// emulate.link_bandwidth as (from step, factor) pairs, steps strictly
// ascending, factors > 0; throws ConfigError "emulate.link_bandwidth: ...".
std::vector<std::pair<int64_t, double>> parse_link_bandwidth(const std::string& spec);
// log.trace: the first and last step traced ("12" -> {12, 12}, "10-12" ->
// {10, 12}, steps >= 1); nullopt for "" (off). Throws ConfigError
// "log.trace: ..." on anything else.
std::optional<std::pair<int64_t, int64_t>> parse_step_range(const std::string& spec);

struct RunConfig {
  ModelConfig model;
  TrainConfig train;
  DataConfig data;
  ParallelConfig parallel;
  CheckpointConfig checkpoint;
  LogConfig log;
  EmulateConfig emulate;
  std::string source;  // the YAML file it came from
  // Gradient-accumulation steps = global_batch / (micro_batch * dp).
  int64_t accum_steps() const { return train.global_batch / (train.micro_batch * parallel.dp); }
  // Micro-batches one pipeline step runs: with pp > 1 the gradient-accumulation
  // micro-batches are the pipeline's micro-batches, so this is accum_steps()
  // (parallel.microbatches, when set, is checked to equal it).
  int64_t pipeline_microbatches() const { return accum_steps(); }
  bool operator==(const RunConfig&) const = default;
};

// train.fp8_weight_cache resolved: whether the FP8 weight codes are cached
// for the step (auto: not at ZeRO-3 over dp x cp > 1 freeing each unit's
// gathered weights after use, whose cache would keep a whole model of codes).
bool fp8_weight_cache_on(const RunConfig& cfg);

// Parses `path` (YAML), applies `overrides` ("section.key=value", in order),
// validates, and returns the result. Relative data paths stay as written.
RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Shortest text that reads back to the same double (1.2, not 1.200000): how
// config messages print a real.
std::string fmt_real(double x);
// The same from YAML text (for tests); `name` stands in for the file name.
RunConfig load_config_text(const std::string& yaml, const std::string& name,
                           const std::vector<std::string>& overrides = {});
// Checks cross-field rules (heads divisible, batch arithmetic, ...); throws
// ConfigError with the first broken rule. The parallel-layout rules are
// layout_errors() of core/layout.hpp, which lists every broken one.
void validate(const RunConfig& cfg);
// The launch-dependent rule (world_error() of core/layout.hpp): tp * cp * pp *
// dp must equal the number of ranks.
void validate_world(const RunConfig& cfg, int world_size);
// A ConfigError message "<name>: ..." of a run loaded from `name` with
// `overrides`: where a key it names was given by --set, the --set joins the
// attribution ("configs/tiny.yaml, --set train.steps=1: train.warmup_steps=20
// exceeds train.steps=1; ..."). Other messages come back unchanged.
std::string attribute_overrides(const std::string& msg, const std::string& name,
                                const std::vector<std::string>& overrides);
// parallel.expert_slots and parallel.expert_replicas against the model and
// the layout's placement (core/model/moe_replicas.hpp); the error naming
// the key, or nothing. validate() and the engine (a switch's new text) ask.
std::optional<std::string> expert_replicas_error(const RunConfig& cfg);
// The "section.key" names the run file sets and `overrides` name, sorted (the
// planner keeps them as constraints). Throws ConfigError like load_config.
std::vector<std::string> explicit_keys(const std::string& path,
                                       const std::vector<std::string>& overrides = {});
std::vector<std::string> explicit_keys_text(const std::string& yaml, const std::string& name,
                                            const std::vector<std::string>& overrides = {});
// The whole configuration as YAML (recorded in checkpoints).
std::string to_yaml(const RunConfig& cfg);

// One row of the schema that load_config, validate, to_yaml and docs/config.md
// all come from (core/config.cpp holds the table).
struct ConfigKeyInfo {
  std::string section;        // "model"
  std::string key;            // "n_heads"
  std::string type;           // "int", "uint64", "float", "bool", "string", "int list"
  std::string default_value;  // as to_yaml writes it
  std::string allowed;        // "a positive integer", "one of {auto, cpu, cuda}", ...
  std::string doc;            // one line
};
const std::vector<ConfigKeyInfo>& config_keys();
// The key reference as a Markdown table (docs/config.md embeds it verbatim;
// a unit test keeps the two in step).
std::string config_reference_markdown();

}  // namespace adgt

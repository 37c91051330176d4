// cuDNN SDPA through cudnn-frontend's graph API (contract in
// cudnn_attention.hpp). The one translation unit that includes
// cudnn_frontend.h: a host C++ file (cudnn-frontend needs no nvcc), compiled
// only when CMake found the headers (scripts/install_deps.sh) and libcudnn.
#include "kernels/cuda/cudnn_attention.hpp"

#include <cuda_runtime.h>
#include <cudnn.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include <cudnn_frontend.h>

#include "kernels/check.hpp"

namespace adgt::cuda {

namespace fe = cudnn_frontend;

namespace {

[[noreturn]] void cudnn_failed(const char* call, const char* op, const std::string& err,
                               const char* file, int line) {
  std::ostringstream os;
  os << "cuda backend: " << op << ": " << call << " failed: " << err << " [" << file << ":" << line
     << "]";
  throw std::runtime_error(os.str());
}

// Every cuDNN call: names the statement and the op it served.
#define ADGT_CUDNN_OP(call, op)                                                          \
  do {                                                                                   \
    cudnnStatus_t adgt_st_ = (call);                                                     \
    if (adgt_st_ != CUDNN_STATUS_SUCCESS)                                                \
      cudnn_failed(#call, (op), cudnnGetErrorString(adgt_st_), __FILE__, __LINE__);      \
  } while (0)

// Every cudnn-frontend call that returns an error_t, while building (returns
// the message: a shape cuDNN has no engine for is an answer, not a failure).
#define ADGT_FE_TRY(call, what)                                                          \
  do {                                                                                   \
    fe::error_t adgt_fe_ = (call);                                                       \
    if (!adgt_fe_.is_good()) return std::string(what) + ": " + adgt_fe_.get_message();   \
  } while (0)

// Tensor uids in the variant packs.
enum : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

std::string shape_str(const AttentionShape& s) {
  std::ostringstream os;
  os << "B=" << s.B << " T=" << s.T << " H=" << s.n_heads << " KV=" << s.n_kv_heads
     << " head_dim=" << s.head_dim;
  return os.str();
}

}  // namespace

struct CudnnAttention::Impl {
  struct Key {
    int64_t B, T, H, KV, hd;
    int device;
    bool backward;
    bool operator<(const Key& o) const {
      return std::tie(B, T, H, KV, hd, device, backward) <
             std::tie(o.B, o.T, o.H, o.KV, o.hd, o.device, o.backward);
    }
  };
  struct Plan {
    std::shared_ptr<fe::graph::Graph> graph;  // null when cuDNN has no engine
    int64_t workspace = 0;
    bool deterministic = false;
    std::string error;  // why there is no graph
  };

  int device = 0;
  cudaStream_t stream = nullptr;
  cudnnHandle_t handle = nullptr;
  Workspace workspace;
  std::map<Key, Plan> plans;  // dtype: bf16 only

  // Layouts: q/o (B,T,H,hd) seen as cuDNN's (b,h,s,d); k/v (B,T,KV,hd).
  static std::vector<int64_t> qo_dim(const AttentionShape& s) {
    return {s.B, s.n_heads, s.T, s.head_dim};
  }
  static std::vector<int64_t> qo_stride(const AttentionShape& s) {
    return {s.T * s.n_heads * s.head_dim, s.head_dim, s.n_heads * s.head_dim, 1};
  }
  static std::vector<int64_t> kv_dim(const AttentionShape& s) {
    return {s.B, s.n_kv_heads, s.T, s.head_dim};
  }
  static std::vector<int64_t> kv_stride(const AttentionShape& s) {
    return {s.T * s.n_kv_heads * s.head_dim, s.head_dim, s.n_kv_heads * s.head_dim, 1};
  }
  static std::vector<int64_t> stats_dim(const AttentionShape& s) { return {s.B, s.n_heads, s.T, 1}; }
  static std::vector<int64_t> stats_stride(const AttentionShape& s) {
    return {s.n_heads * s.T, s.T, 1, 1};
  }

  static std::shared_ptr<fe::graph::Graph> new_graph() {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
  }
  static std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name,
                                                             int64_t uid, std::vector<int64_t> dim,
                                                             std::vector<int64_t> stride) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim(std::move(dim))
                        .set_stride(std::move(stride)));
  }

  // validate .. build_plans; "" or the first failure's message.
  std::string finish(Plan& p) {
    fe::graph::Graph& g = *p.graph;
    ADGT_FE_TRY(g.validate(), "validate");
    ADGT_FE_TRY(g.build_operation_graph(handle), "build_operation_graph");
    ADGT_FE_TRY(g.create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
    ADGT_FE_TRY(g.check_support(handle), "check_support");
    ADGT_FE_TRY(g.build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans");
    ADGT_FE_TRY(g.get_workspace_size(p.workspace), "get_workspace_size");
    return "";
  }

  Plan build_forward(const AttentionShape& s) {
    Plan p;
    p.graph = new_graph();
    fe::graph::Graph& g = *p.graph;
    auto q = input(g, "q", kQ, qo_dim(s), qo_stride(s));
    auto k = input(g, "k", kK, kv_dim(s), kv_stride(s));
    auto v = input(g, "v", kV, kv_dim(s), kv_stride(s));
    auto opt = fe::graph::SDPA_attributes()
                   .set_name("adgt_sdpa_forward")
                   .set_generate_stats(true)
                   .set_causal_mask(true)
                   .set_attn_scale(float(1.0 / std::sqrt(double(s.head_dim))));
    auto [o, stats] = g.sdpa(q, k, v, opt);
    o->set_output(true).set_uid(kO).set_dim(qo_dim(s)).set_stride(qo_stride(s));
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(stats_dim(s))
        .set_stride(stats_stride(s));
    p.error = finish(p);
    if (!p.error.empty()) p.graph.reset();
    return p;
  }

  Plan build_backward(const AttentionShape& s, bool deterministic) {
    Plan p;
    p.deterministic = deterministic;
    p.graph = new_graph();
    fe::graph::Graph& g = *p.graph;
    auto q = input(g, "q", kQ, qo_dim(s), qo_stride(s));
    auto k = input(g, "k", kK, kv_dim(s), kv_stride(s));
    auto v = input(g, "v", kV, kv_dim(s), kv_stride(s));
    auto o = input(g, "o", kO, qo_dim(s), qo_stride(s));
    auto dout = input(g, "dout", kDO, qo_dim(s), qo_stride(s));
    auto stats = g.tensor(fe::graph::Tensor_attributes()
                              .set_name("stats")
                              .set_uid(kStats)
                              .set_dim(stats_dim(s))
                              .set_stride(stats_stride(s))
                              .set_data_type(fe::DataType_t::FLOAT));
    auto opt = fe::graph::SDPA_backward_attributes()
                   .set_name("adgt_sdpa_backward")
                   .set_causal_mask(true)
                   .set_deterministic_algorithm(deterministic)
                   .set_attn_scale(float(1.0 / std::sqrt(double(s.head_dim))));
    auto [dq, dk, dv] = g.sdpa_backward(q, k, v, o, dout, stats, opt);
    dq->set_output(true).set_uid(kDQ).set_dim(qo_dim(s)).set_stride(qo_stride(s));
    dk->set_output(true).set_uid(kDK).set_dim(kv_dim(s)).set_stride(kv_stride(s));
    dv->set_output(true).set_uid(kDV).set_dim(kv_dim(s)).set_stride(kv_stride(s));
    p.error = finish(p);
    if (!p.error.empty()) p.graph.reset();
    return p;
  }

  Plan& plan(const AttentionShape& s, bool backward) {
    const Key key{s.B, s.T, s.n_heads, s.n_kv_heads, s.head_dim, device, backward};
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
    Plan p;
    if (!backward) {
      p = build_forward(s);
    } else {
      p = build_backward(s, /*deterministic=*/true);
      if (!p.graph) {
        const std::string why = p.error;
        Plan nd = build_backward(s, false);
        if (nd.graph) {
          std::fprintf(stderr,
                       "warning: cuda attention (cudnn): cuDNN %s has no deterministic SDPA "
                       "backward for %s (%s); using its non-deterministic one (bitwise "
                       "reproducibility lost; train.attention=flash keeps it)\n",
                       version_string().c_str(), shape_str(s).c_str(), why.c_str());
          p = std::move(nd);
        }
      }
    }
    return plans.emplace(key, std::move(p)).first->second;
  }

  static std::string version_string() {
    const size_t v = cudnnGetVersion();  // 91900 = 9.19.0
    std::ostringstream os;
    os << v / 10000 << "." << (v % 10000) / 100 << "." << v % 100;
    return os.str();
  }

  void execute(Plan& p, std::unordered_map<int64_t, void*>& pack, const char* op,
               const AttentionShape& s) {
    ADGT_CHECK(!s.doc_start, "cuda attention (cudnn): " << op << " " << shape_str(s)
                                 << ": document masking (train.document_mask) is not supported "
                                    "by the cuDNN path; use train.attention=flash or auto");
    ADGT_CHECK(p.graph, "cuda attention (cudnn): " << op << " " << shape_str(s)
                                                   << ": cuDNN " << version_string()
                                                   << " has no engine: " << p.error
                                                   << "; use train.attention=flash");
    void* ws = p.workspace > 0 ? workspace(size_t(p.workspace)) : nullptr;
    ADGT_CUDNN_OP(cudnnSetStream(handle, stream), op);
    fe::error_t e = p.graph->execute(handle, pack, ws);
    if (!e.is_good()) cudnn_failed("graph->execute(handle, pack, workspace)", op, e.get_message(),
                                   __FILE__, __LINE__);
  }
};

CudnnAttention::CudnnAttention(int device, CUstream_st* stream, Workspace workspace)
    : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  impl_->stream = stream;
  impl_->workspace = std::move(workspace);
  ADGT_CUDNN_OP(cudnnCreate(&impl_->handle), "cudnn attention setup");
  ADGT_CUDNN_OP(cudnnSetStream(impl_->handle, impl_->stream), "cudnn attention setup");
}

CudnnAttention::~CudnnAttention() {
  impl_->plans.clear();  // graphs before the handle
  if (impl_->handle) cudnnDestroy(impl_->handle);
}

std::string CudnnAttention::version() const { return Impl::version_string(); }

std::string CudnnAttention::support(const AttentionShape& s) {
  if (s.doc_start)
    return "document masking (train.document_mask) is not supported by the cuDNN path";
  if (s.n_kv_heads <= 0 || s.n_heads % s.n_kv_heads != 0)
    return "n_heads " + std::to_string(s.n_heads) + " not a multiple of n_kv_heads " +
           std::to_string(s.n_kv_heads);
  for (bool bwd : {false, true}) {
    const Impl::Plan& p = impl_->plan(s, bwd);
    if (!p.graph)
      return "cuDNN " + version() + " has no SDPA " + (bwd ? "backward" : "forward") +
             " engine for " + shape_str(s) + " (" + p.error + ")";
  }
  return "";
}

bool CudnnAttention::deterministic(const AttentionShape& s) { return impl_->plan(s, true).deterministic; }

void CudnnAttention::forward(uint16_t* out, float* stats, const uint16_t* q, const uint16_t* k,
                             const uint16_t* v, const AttentionShape& s) {
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<uint16_t*>(q)},
                                             {kK, const_cast<uint16_t*>(k)},
                                             {kV, const_cast<uint16_t*>(v)},
                                             {kO, out},
                                             {kStats, stats}};
  impl_->execute(impl_->plan(s, false), pack, "attention_forward (cudnn)", s);
}

void CudnnAttention::backward(uint16_t* dq, uint16_t* dk, uint16_t* dv, const uint16_t* dout,
                              const uint16_t* q, const uint16_t* k, const uint16_t* v,
                              const uint16_t* out, const float* stats, const AttentionShape& s) {
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<uint16_t*>(q)},
                                             {kK, const_cast<uint16_t*>(k)},
                                             {kV, const_cast<uint16_t*>(v)},
                                             {kO, const_cast<uint16_t*>(out)},
                                             {kDO, const_cast<uint16_t*>(dout)},
                                             {kStats, const_cast<float*>(stats)},
                                             {kDQ, dq},
                                             {kDK, dk},
                                             {kDV, dv}};
  impl_->execute(impl_->plan(s, true), pack, "attention_backward (cudnn)", s);
}

}  // namespace adgt::cuda

// The CUDA backend's attention methods and its choice of kernel (train.attention,
// kernels/attention_choice.hpp). bf16 runs one of three kernels:
//   flash  the FlashAttention-2 style kernels of flash_attention.cu, where they
//          apply (flash_path; otherwise the exact kernel, logged once per reason)
//   cudnn  cuDNN SDPA (cudnn_attention.hpp), when built
//   exact  the exact kernels of attention_kernels.cuh through fp32 copies
// and under `auto` the one choose_attention measured fastest on the shape's
// first call (the decision kept per shape for this backend). f32 and f64 run
// the exact kernels. All three write the same `saved`: the natural-log
// log-sum-exp of each row's scaled scores, fp32 (B, H, T).
//
// Document masking (AttentionShape::doc_start): flash and exact take it;
// cuDNN does not (CudnnAttention::support says why), so `auto` decides masked
// shapes apart from unmasked ones (the mask is part of the decision's key)
// among flash and exact, logging cudnn's reason, and `cudnn` is an error
// naming flash and auto.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>

#include "kernels/attention_choice.hpp"
#include "kernels/attention_path.hpp"
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/cudnn_attention.hpp"
#include "kernels/cuda/flash_attention.cuh"

namespace adgt {

struct CudaBackend::AttentionState {
  AttentionSetting setting = AttentionSetting::Flash;  // unset: flash (tests, tools)
  // B, T, H, KV, hd, document-masked
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool>;
  std::map<Key, AttnKernel> decided;  // auto's choice per shape and masking (bf16)
#ifdef ADGT_HAVE_CUDNN_ATTENTION
  std::unique_ptr<cuda::CudnnAttention> cudnn;
#endif
  static Key key(const AttentionShape& s) {
    return {s.B, s.T, s.n_heads, s.n_kv_heads, s.head_dim, s.doc_start != nullptr};
  }
};

namespace {

// The setting in force and where it came from: ADGT_ATTENTION (read on every
// call, so tests and benchmarks can switch) over train.attention.
struct Effective {
  AttentionSetting setting;
  const char* source;
};

Effective effective_setting(AttentionSetting configured) {
  const char* e = std::getenv("ADGT_ATTENTION");
  if (!e || !*e) return {configured, "train.attention"};
  return {parse_attention_setting(e, "ADGT_ATTENTION"), "ADGT_ATTENTION"};
}

const char* kernel_name(int k) {
  static const char* names[] = {"flash", "cudnn", "exact"};
  return names[k];
}

std::string shape_str(const AttentionShape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " H=" +
         std::to_string(s.n_heads) + " KV=" + std::to_string(s.n_kv_heads) +
         " head_dim=" + std::to_string(s.head_dim) + (s.doc_start ? " document-masked" : "");
}

const char* kNoCudnn =
    "this binary was built without cuDNN attention (CMake found no cudnn-frontend headers or "
    "libcudnn: run scripts/install_deps.sh, then configure again)";

// Device memory of the auto probe: plain cudaMalloc, freed on scope exit
// (start-up only; not in peak_allocated_bytes, like the backend's scratch).
struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes) {
    ADGT_CUDA_OP(cudaMalloc(&p, std::max<size_t>(bytes, 256)), "attention (auto probe)");
  }
  ~DevBuf() {
    if (p) (void)cudaFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

}  // namespace

void CudaBackend::set_attention(const std::string& setting) {
  const AttentionSetting s = parse_attention_setting(setting, "train.attention");
  ADGT_CHECK(s != AttentionSetting::Cudnn || cuda::cudnn_attention_built(),
             "train.attention=cudnn: " << kNoCudnn << "; use train.attention=flash or auto");
  if (!attn_) attn_ = std::make_shared<AttentionState>();
  if (attn_->setting != s) attn_->decided.clear();
  attn_->setting = s;
}

void CudaBackend::attention_release() noexcept {
  attn_.reset();  // cuDNN's handle and graphs, before the stream goes
}

std::string CudaBackend::attention_kernel(const AttentionShape& s) {
  if (!attn_) attn_ = std::make_shared<AttentionState>();
  const Effective e = effective_setting(attn_->setting);
  if (e.setting != AttentionSetting::Auto) return attention_setting_name(e.setting);
  auto it = attn_->decided.find(AttentionState::key(s));
  return it == attn_->decided.end() ? "" : kernel_name(int(it->second));
}

int64_t CudaBackend::attention_saved_elems(const AttentionShape& s) const {
  return cuda::attention_lse_elems(s);
}

bool CudaBackend::flash_path(const AttentionShape& s, std::initializer_list<const void*> tensors) {
  // The one rule (kernels/attention_path.hpp); a fallback is logged the first
  // time each reason takes it.
  bool aligned = true;
  for (const void* t : tensors) aligned = aligned && cuda::aligned16(t);
  const bool exact =
      effective_setting(attn_ ? attn_->setting : AttentionSetting::Flash).setting ==
      AttentionSetting::Exact;
  const AttentionPath p = cuda_attention_path(
      s, exact, cuda::flash_attention_device_ok(device_, s.head_dim), aligned);
  if (p.flash) return true;
  if (!attention_fallbacks_.insert(p.reason).second) return false;
  std::fprintf(stderr,
               "warning: cuda attention: bf16 B=%ld T=%ld H=%ld KV=%ld head_dim=%ld runs the exact "
               "fp32 kernel instead of the flash kernels (%s): %.2f GiB of fp32 scratch and a "
               "slower kernel; head_dim 64 or 128 takes the flash path\n",
               long(s.B), long(s.T), long(s.n_heads), long(s.n_kv_heads), long(s.head_dim),
               p.reason.c_str(), double(p.fallback_bytes) / double(1 << 30));
  return false;
}

CudaBackend::AttnKernel CudaBackend::attention_kernel_for(const AttentionShape& s, const Tensor& q,
                                                          const Tensor& k, const Tensor& v,
                                                          std::initializer_list<const void*> tensors) {
  if (!attn_) attn_ = std::make_shared<AttentionState>();
  const Effective e = effective_setting(attn_->setting);
  switch (e.setting) {
    case AttentionSetting::Exact:
      (void)flash_path(s, tensors);  // logs "exact chosen" once
      return AttnKernel::Exact;
    case AttentionSetting::Flash:
      return flash_path(s, tensors) ? AttnKernel::Flash : AttnKernel::Exact;
    case AttentionSetting::Cudnn: {
#ifdef ADGT_HAVE_CUDNN_ATTENTION
      if (!attn_->cudnn)
        attn_->cudnn = std::make_unique<cuda::CudnnAttention>(
            device_, stream_, [this](size_t b) { return scratch(kScratchCudnn, b); });
      const std::string why = attn_->cudnn->support(s);
      ADGT_CHECK(why.empty(), e.source << "=cudnn: bf16 " << shape_str(s) << ": " << why
                                       << "; use train.attention=flash or auto");
      return AttnKernel::Cudnn;
#else
      ADGT_CHECK(false, e.source << "=cudnn: " << kNoCudnn << "; use train.attention=flash or auto");
#endif
    }
    case AttentionSetting::Auto: break;
  }
  auto it = attn_->decided.find(AttentionState::key(s));
  if (it != attn_->decided.end()) return it->second;
  bool aligned = true;
  for (const void* t : tensors) aligned = aligned && cuda::aligned16(t);
  const bool flash_ok =
      cuda_attention_path(s, false, cuda::flash_attention_device_ok(device_, s.head_dim), aligned).flash;
  const AttnKernel kern = decide_attention(s, q, k, v, flash_ok);
  attn_->decided[AttentionState::key(s)] = kern;
  return kern;
}

// auto, the first bf16 call of shape s: the candidates run forward and
// backward on this call's q, k, v and a drawn dout into buffers of their own,
// are checked against each other and the exact kernel, then timed
// (choose_attention); the table goes to stderr.
CudaBackend::AttnKernel CudaBackend::decide_attention(const AttentionShape& s, const Tensor& q,
                                                      const Tensor& k, const Tensor& v,
                                                      bool flash_ok) {
  std::vector<AttnKernel> kinds;
  std::string notes;
  if (flash_ok)
    kinds.push_back(AttnKernel::Flash);
  else
    notes += "flash: not applicable (" + cuda_attention_path(s).reason + ")\n";
#ifdef ADGT_HAVE_CUDNN_ATTENTION
  {
    std::string why;
    try {
      if (!attn_->cudnn)
        attn_->cudnn = std::make_unique<cuda::CudnnAttention>(
            device_, stream_, [this](size_t b) { return scratch(kScratchCudnn, b); });
      why = attn_->cudnn->support(s);
    } catch (const std::exception& ex) {
      why = ex.what();
    }
    if (why.empty())
      kinds.push_back(AttnKernel::Cudnn);
    else
      notes += "cudnn: not a candidate (" + why + ")\n";
  }
#else
  notes += std::string("cudnn: not a candidate (") + kNoCudnn + ")\n";
#endif
  if (kinds.empty()) {
    std::fprintf(stderr, "cuda attention: train.attention=auto, bf16 %s: exact (no other kernel takes it)\n%s",
                 shape_str(s).c_str(), notes.c_str());
    (void)flash_path(s, {q.data, k.data, v.data});  // logs the fallback's cost once
    return AttnKernel::Exact;
  }
  // The exact kernel checks the others when its fp32 scratch is moderate.
  const int64_t exact_bytes = cuda_attention_path(s, true).fallback_bytes;
  const bool with_reference = exact_bytes <= (int64_t(1) << 30);
  if (with_reference) kinds.push_back(AttnKernel::Exact);
  else notes += "exact: not run as the reference (" + std::to_string(exact_bytes >> 20) + " MiB of fp32 scratch)\n";

  const int64_t nq = s.B * s.T * s.n_heads * s.head_dim, nk = s.B * s.T * s.n_kv_heads * s.head_dim;
  const int64_t nl = cuda::attention_lse_elems(s);
  DevBuf dout(size_t(nq) * 2);
  {
    std::vector<uint16_t> h(static_cast<size_t>(nq));
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (auto& b : h) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      b = float_to_bf16(float(x >> 40) / float(1 << 24) * 2.f - 1.f);
    }
    to_device(dout.p, h.data(), h.size() * 2);
  }
  struct Bufs {
    DevBuf out, saved, dq, dk, dv;
    Bufs(int64_t nq, int64_t nk, int64_t nl)
        : out(size_t(nq) * 2), saved(size_t(nl) * 4), dq(size_t(nq) * 2), dk(size_t(nk) * 2),
          dv(size_t(nk) * 2) {}
  };
  std::vector<std::unique_ptr<Bufs>> bufs;
  std::vector<AttentionCandidate> cands;
  const Tensor tdo(dout.p, DType::BF16, {nq});
  for (AttnKernel kind : kinds) {
    bufs.push_back(std::make_unique<Bufs>(nq, nk, nl));
    Bufs& b = *bufs.back();
    const Tensor to(b.out.p, DType::BF16, {nq}), ts(b.saved.p, DType::F32, {nl}),
        tdq(b.dq.p, DType::BF16, {nq}), tdk(b.dk.p, DType::BF16, {nk}), tdv(b.dv.p, DType::BF16, {nk});
    AttentionCandidate c;
    c.name = kernel_name(int(kind));
    c.reference = kind == AttnKernel::Exact;
    c.run = [this, kind, to, ts, tdq, tdk, tdv, tdo, &q, &k, &v, s] {
      run_attention_forward(kind, to, ts, q, k, v, s);
      run_attention_backward(kind, tdq, tdk, tdv, tdo, q, k, v, to, ts, s);
    };
    c.output = [this, to, tdq, tdk, tdv](int i) {
      const Tensor& t = i == 0 ? to : i == 1 ? tdq : i == 2 ? tdk : tdv;
      std::vector<uint16_t> h(static_cast<size_t>(t.numel()));
      to_host(h.data(), t.data, h.size() * 2);
      std::vector<float> f(h.size());
      for (size_t j = 0; j < h.size(); ++j) f[j] = bf16_to_float(h[j]);
      return f;
    };
    cands.push_back(std::move(c));
  }
  AttentionChoiceOptions opt;
  opt.rel_bound = attention_rel_bound(DType::BF16);
  opt.what = "bf16 " + shape_str(s);
  AttentionTimer timer = [this](const std::function<void()>& f) {
    synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const AttentionChoice ch = choose_attention(cands, timer, opt);
  std::fprintf(stderr, "cuda attention: train.attention=auto, %s (forward + backward per run): %s\n%s%s",
               opt.what.c_str(), ch.chosen.c_str(), ch.table().c_str(), notes.c_str());
  synchronize();  // the probe's buffers are freed on return
  for (AttnKernel kind : kinds)
    if (ch.chosen == kernel_name(int(kind))) return kind;
  return AttnKernel::Exact;
}

// One kernel's forward and backward: the ops below and auto's probe
// (decide_attention) run the same code. Exact: f32/f64, or bf16 through fp32.
void CudaBackend::run_attention_forward(AttnKernel kind, Tensor out, Tensor saved, const Tensor& q,
                                        const Tensor& k, const Tensor& v, const AttentionShape& s) {
  switch (kind) {
    case AttnKernel::Flash:
      cuda::flash_attention_forward(stream_, out.ptr<uint16_t>(), saved.ptr<float>(),
                                    q.ptr<uint16_t>(), k.ptr<uint16_t>(), v.ptr<uint16_t>(), s);
      return;
    case AttnKernel::Cudnn:
#ifdef ADGT_HAVE_CUDNN_ATTENTION
      attn_->cudnn->forward(out.ptr<uint16_t>(), saved.ptr<float>(), q.ptr<uint16_t>(),
                            k.ptr<uint16_t>(), v.ptr<uint16_t>(), s);
      return;
#endif
    case AttnKernel::Exact:
      break;
  }
  cuda::attention_forward_exact(cuda::op_ctx(*this), out, saved, q, k, v, s);
}

void CudaBackend::run_attention_backward(AttnKernel kind, Tensor dq, Tensor dk, Tensor dv,
                                         const Tensor& dout, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& out, const Tensor& saved,
                                         const AttentionShape& s) {
  switch (kind) {
    case AttnKernel::Flash: {
      float* D = static_cast<float*>(scratch(kScratchFlash, cuda::flash_attention_scratch_bytes(s)));
      cuda::flash_attention_backward(stream_, dq.ptr<uint16_t>(), dk.ptr<uint16_t>(),
                                     dv.ptr<uint16_t>(), dout.ptr<uint16_t>(), q.ptr<uint16_t>(),
                                     k.ptr<uint16_t>(), v.ptr<uint16_t>(), out.ptr<uint16_t>(),
                                     saved.ptr<float>(), D, s);
      return;
    }
    case AttnKernel::Cudnn:
#ifdef ADGT_HAVE_CUDNN_ATTENTION
      attn_->cudnn->backward(dq.ptr<uint16_t>(), dk.ptr<uint16_t>(), dv.ptr<uint16_t>(),
                             dout.ptr<uint16_t>(), q.ptr<uint16_t>(), k.ptr<uint16_t>(),
                             v.ptr<uint16_t>(), out.ptr<uint16_t>(), saved.ptr<float>(), s);
      return;
#endif
    case AttnKernel::Exact:
      break;
  }
  cuda::attention_backward_exact(cuda::op_ctx(*this), dq, dk, dv, dout, q, k, v, out, saved, s);
}

void CudaBackend::attention_forward(Tensor out, Tensor saved, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const AttentionShape& s) {
  if (!cuda::attention_forward_checks(out, saved, q, k, v, s)) return;
  const AttnKernel kind = q.dtype == DType::BF16
                              ? attention_kernel_for(s, q, k, v, {out.data, q.data, k.data, v.data})
                              : AttnKernel::Exact;
  run_attention_forward(kind, out, saved, q, k, v, s);
}

void CudaBackend::attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                                     const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& out, const Tensor& saved,
                                     const AttentionShape& s) {
  if (!cuda::attention_backward_checks(dq, dk, dv, dout, q, k, v, out, saved, s)) return;
  const AttnKernel kind =
      q.dtype == DType::BF16
          ? attention_kernel_for(s, q, k, v,
                                 {dq.data, dk.data, dv.data, dout.data, q.data, k.data, v.data, out.data})
          : AttnKernel::Exact;
  run_attention_backward(kind, dq, dk, dv, dout, q, k, v, out, saved, s);
}

}  // namespace adgt

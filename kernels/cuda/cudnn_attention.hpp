// cuDNN's fused attention (SDPA) through cudnn-frontend's graph API: causal
// grouped-query attention forward and backward in bf16 on the backend's own
// layouts, one of the CUDA backend's attention kernels (train.attention;
// docs/cuda.md, "Attention kernels").
//
//   q, out, dq, dout   bf16 (B, T, H, hd)   contiguous
//   k, v, dk, dv       bf16 (B, T, KV, hd)  contiguous, H % KV == 0
//   stats              fp32 (B, H, T)       per query row, the natural-log
//                      log-sum-exp of its scaled, masked scores: the flash
//                      kernels' `saved`, so attention_saved_elems (B*H*T) and
//                      the memory estimates hold for either kernel
//   scale              1/sqrt(hd); causal with the diagonal at top left (T_q == T_kv)
//   no document masking (AttentionShape::doc_start): support() refuses it
//
// Graphs are built once per (shape, dtype, device, direction) and cached; the
// workspace comes from the backend (the callback given at construction). The
// backward asks cuDNN for its deterministic algorithm; where cuDNN has none for
// a shape, it builds the non-deterministic one and says so once on stderr
// (deterministic() tells which one a shape got).
//
// This header needs no cuDNN or CUDA headers; cudnn-frontend (heavy,
// header-only) is confined to cudnn_attention.cpp, compiled only when CMake
// found its headers and libcudnn (ADGT_HAVE_CUDNN_ATTENTION).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kernels/backend.hpp"

struct CUstream_st;

namespace adgt::cuda {

// Whether this binary has cuDNN attention.
inline constexpr bool cudnn_attention_built() {
#ifdef ADGT_HAVE_CUDNN_ATTENTION
  return true;
#else
  return false;
#endif
}

#ifdef ADGT_HAVE_CUDNN_ATTENTION
class CudnnAttention {
 public:
  // bytes -> device memory valid until the next call (the backend's scratch).
  using Workspace = std::function<void*(size_t)>;
  // One cuDNN handle on `stream` of CUDA device `device`. Throws, naming the
  // call, when cuDNN cannot start (libcudnn's sub-libraries missing, a driver
  // it does not support).
  CudnnAttention(int device, CUstream_st* stream, Workspace workspace);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // "" when cuDNN has engines for s's forward and backward (building and
  // caching both graphs), else why not ("cuDNN 9.13: no engine for ...");
  // document masking (s.doc_start) is never supported: its reason says so
  // (train.attention=auto then takes flash; cudnn names the fix).
  std::string support(const AttentionShape& s);
  // Whether s's backward graph is cuDNN's deterministic algorithm (builds it).
  bool deterministic(const AttentionShape& s);
  // The linked cuDNN's version, "9.19.0".
  std::string version() const;

  void forward(uint16_t* out, float* stats, const uint16_t* q, const uint16_t* k,
               const uint16_t* v, const AttentionShape& s);
  // dq, dk, dv overwritten.
  void backward(uint16_t* dq, uint16_t* dk, uint16_t* dv, const uint16_t* dout,
                const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* out,
                const float* stats, const AttentionShape& s);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
#endif

}  // namespace adgt::cuda

// Which path the CUDA backend's bf16 attention takes for a shape, and what its
// exact-kernel fallback costs: a pure rule, so the CPU tests it and
// `--dry-run` counts it (docs/cuda.md, "Silent slow paths").
//
// The FlashAttention-2-style kernels take head_dim 64 or 128 with H % KV == 0,
// B and H <= 65535 and T below INT_MAX minus a tile, on a device that gives
// their shared memory, with 16-byte aligned tensors. Anything else in bf16
// (or train.attention / ADGT_ATTENTION=exact) runs the exact fp32 kernels on fp32 copies of the
// tensors: slower, and fallback_bytes of scratch (the larger of the forward's
// q, k, v, out and the backward's dout, q, dq, k, v, dk, dv copies plus one
// fp32 per row).
#pragma once
#include <cstdint>
#include <string>

#include "kernels/backend.hpp"

namespace adgt {

struct AttentionPath {
  bool flash = false;
  std::string reason;          // why not flash ("" when flash): "head_dim 96 (flash takes 64 or 128)"
  int64_t fallback_bytes = 0;  // fp32 scratch of the exact fallback for this shape
};

// device_ok: the device gives the flash kernels' shared memory (sm_80+);
// aligned: every tensor of the call is 16-byte aligned.
AttentionPath cuda_attention_path(const AttentionShape& s, bool force_exact = false,
                                  bool device_ok = true, bool aligned = true);

}  // namespace adgt

// Host launchers of the FlashAttention-2-style bf16 attention kernels
// (flash_attention.cu); used by attention.cu. CUDA translation units only.
//
// Layout as Backend::attention_*: q, out, dout, dq (B,T,H,hd); k, v, dk, dv
// (B,T,KV,hd), all bf16 (raw bits, uint16_t), 16-byte aligned; lse (B,H,T)
// fp32, the natural-log log-sum-exp of the scaled scores of each row (the
// exact kernel's `saved`); causal, scale 1/sqrt(hd), head h reads kv head
// h / (H/KV). With s.doc_start (device int32 (B*T), each token's document
// start) row i attends keys [doc_start_i, i] only (document masking).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/backend.hpp"

namespace adgt::cuda {

// The device part of whether the flash kernels run: sm_80+ and the shared
// memory of head_dim's kernels (~105 KB at 128). The shape part and the
// alignment are kernels/attention_path.hpp's cuda_attention_path, which takes
// this as its device_ok.
bool flash_attention_device_ok(int device, int64_t head_dim);

// out (B,T,H,hd) and lse (B,H,T) overwritten.
void flash_attention_forward(cudaStream_t stream, uint16_t* out, float* lse, const uint16_t* q,
                             const uint16_t* k, const uint16_t* v, const AttentionShape& s);

// Bytes of fp32 scratch flash_attention_backward needs (D = rowsum(dO * O)).
size_t flash_attention_scratch_bytes(const AttentionShape& s);

// dq, dk, dv overwritten; deterministic (no atomics). `scratch` holds
// flash_attention_scratch_bytes(s) bytes.
void flash_attention_backward(cudaStream_t stream, uint16_t* dq, uint16_t* dk, uint16_t* dv,
                              const uint16_t* dout, const uint16_t* q, const uint16_t* k,
                              const uint16_t* v, const uint16_t* out, const float* lse,
                              float* scratch, const AttentionShape& s);

// Ring attention's blocks (Backend::attention_block_forward/backward): q,
// out, dout, dq (B,Tq,H,hd); k, v, dk, dv (B,Tk,KV,hd); lse (B,H,Tq). Full
// blocks see every key; causal ones are the diagonal (Tq == Tk); with
// b.q_doc_start (packed documents) a row sees the keys from its document's
// start on (a row seeing none: out 0, lse -inf). The backward takes the FINAL out and lse of the rows (D from them) and
// overwrites dk, dv; dq is overwritten or, with accumulate_dq, added to (its
// bf16 value plus the block's, rounded once). `scratch`:
// flash_attention_block_scratch_bytes(b).
void flash_attention_block_forward(cudaStream_t stream, uint16_t* out, float* lse,
                                   const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                   const AttentionBlock& b);
size_t flash_attention_block_scratch_bytes(const AttentionBlock& b);
void flash_attention_block_backward(cudaStream_t stream, uint16_t* dq, uint16_t* dk, uint16_t* dv,
                                    const uint16_t* dout, const uint16_t* q, const uint16_t* k,
                                    const uint16_t* v, const uint16_t* out, const float* lse,
                                    float* scratch, const AttentionBlock& b, bool accumulate_dq);

}  // namespace adgt::cuda

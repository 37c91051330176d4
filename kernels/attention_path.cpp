#include "kernels/attention_path.hpp"

#include <algorithm>
#include <climits>

namespace adgt {

AttentionPath cuda_attention_path(const AttentionShape& s, bool force_exact, bool device_ok,
                                  bool aligned) {
  constexpr int64_t kTile = 64;  // flash_attention_kernels.cuh kBlock: rows and keys per tile
  AttentionPath p;
  const int64_t nq = s.B * s.T * s.n_heads * s.head_dim, nk = s.B * s.T * s.n_kv_heads * s.head_dim;
  p.fallback_bytes = 4 * std::max(2 * nq + 2 * nk, 3 * nq + 4 * nk + s.B * s.n_heads * s.T);
  if (force_exact)
    p.reason = "exact chosen: train.attention=exact or ADGT_ATTENTION=exact";
  else if (s.head_dim != 64 && s.head_dim != 128)
    p.reason = "head_dim " + std::to_string(s.head_dim) + " (flash takes 64 or 128)";
  else if (s.n_kv_heads <= 0 || s.n_heads % s.n_kv_heads != 0)
    p.reason = "n_heads " + std::to_string(s.n_heads) + " not a multiple of n_kv_heads " +
               std::to_string(s.n_kv_heads);
  else if (s.B < 1 || s.B > 65535 || s.n_heads < 1 || s.n_heads > 65535)
    p.reason = "batch " + std::to_string(s.B) + " or heads " + std::to_string(s.n_heads) +
               " outside the grid (1..65535)";
  else if (s.T < 1 || s.T > INT_MAX - kTile)
    p.reason = "sequence length " + std::to_string(s.T) + " outside 1..INT_MAX-" + std::to_string(kTile);
  else if (!device_ok)
    p.reason = "the device lacks the flash kernels' shared memory or is older than sm_80";
  else if (!aligned)
    p.reason = "a tensor not 16-byte aligned";
  p.flash = p.reason.empty();
  if (p.flash) p.fallback_bytes = 0;
  return p;
}

}  // namespace adgt

// Test-only: a deliberate device fault, to prove that a fault on the GPU is
// reported naming the op that caused it (tests/unit/cuda_fault_test.cpp).
// Never called by the trainer.
#pragma once

namespace adgt {
class CudaBackend;

// The op name the fault is reported under.
inline constexpr const char* kFaultProbeOp = "fault_probe (test-only out-of-bounds write)";

// Launches, on be's stream, a kernel that writes 1 TiB past a small device
// allocation: an illegal address. With ADGT_CUDA_SYNC=1 the launch check
// throws naming kFaultProbeOp; otherwise the next synchronisation throws.
void cuda_fault_probe(CudaBackend& be);
}  // namespace adgt

// The GPUs of a host as `nvidia-smi topo -m` shows them: which are joined by
// NVLink (entries NV1, NV2, ..., NV18) and which only by PCIe or the CPU
// (PIX, PXB, PHB, NODE, SYS). The planner keeps tensor parallelism inside an
// NVLink domain; a host whose GPUs are not all in one domain gets its intra
// link costed as PCIe (launch_plan.cpp).
#pragma once
#include <string>

namespace adgt::plan {

struct GpuTopology {
  int gpus = 0;          // GPU rows of the matrix
  int nvlink_domain = 0;  // the smallest set of GPUs joined by NVLink paths (1: none)
};

// Parses the matrix; gpus = 0 when `text` holds none (nvidia-smi missing or
// an error message).
GpuTopology parse_nvidia_topology(const std::string& text);

// `nvidia-smi topo -m` on this host ("" when it cannot run).
std::string read_nvidia_topology();

}  // namespace adgt::plan

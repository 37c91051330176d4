// Which device a run trains on, agreed over the world, and per rank which
// GPU and which transport its groups' collectives use (docs/parallel.md,
// "Devices of a run").
//
//   train.device  every rank sees a GPU    some rank sees none
//   auto          cuda                     cpu (every rank)
//   cuda          cuda                     an error on every rank, naming the rank
//   cpu/emulated  as asked                 as asked
//
// A cuda rank's GPU is pick_local_device (one per local rank, or shared in
// the test mode ADGT_SHARED_GPU_TEST=1); no two ranks may hold one GPU
// otherwise (verify_device_assignment, on the GPUs' UUIDs). Transports:
//   cpu                         "mpi"
//   emulated                    "mpi (host-staged)"
//   cuda, one process or a shared GPU, or no NCCL in the build
//                               "mpi (host-staged)"
//   cuda, one GPU per rank      "nccl" (the pipeline group too: its schedule
//                               runs as pp::for_rendezvous, docs/parallel.md)
#pragma once
#include <string>

#include "parallel/mesh/process_groups.hpp"

namespace adgt {

struct DevicePlan {
  std::string device = "cpu";  // "cpu", "cuda" or "emulated": the same on every rank
  int cuda_device = -1;        // this rank's GPU index (cuda only)
  std::string device_id = "cpu";  // the rank table's device: "cpu", "emulated", a GPU UUID
  bool shared = false;            // ADGT_SHARED_GPU_TEST=1
  std::string transport = "mpi";  // see above
  std::string warning;            // auto fell back to the CPU because of a CUDA error ("" if not)
  bool nccl() const { return transport == "nccl"; }
};

// The pure rule for one rank, given what every rank chose on its own
// (choose_device): "cuda" only when all did. Throws for cuda when a rank has
// no GPU, naming it.
std::string agreed_device(const std::string& requested, const std::vector<std::string>& chosen);
std::string collective_transport(const std::string& device, int world, bool shared, bool nccl_built);

// Collective over the world: every rank queries CUDA, the choice is agreed,
// the GPU picked and the assignment verified. Throws CollectiveError on every
// rank when any rank fails.
DevicePlan plan_devices(const ProcessGroups& pg, const std::string& requested);

}  // namespace adgt

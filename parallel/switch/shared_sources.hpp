// The running layout's state of every process on a node, readable by the
// node's other processes, so that a layout switch's receivers copy their
// pieces straight from their sources: one copy per element instead of a
// pack, a message through the transport's shared-memory fragments and an
// unpack (docs/reliability.md, "In-memory layout switch"). Processes on
// other nodes still get their pieces as messages (reshard's all_to_allv).
//
// Two ways, the first that works on every process:
//   - "cross-memory": the sources' own host copies, read with
//     process_vm_readv (Linux; needs the ptrace rights over processes of the
//     same user that containers sometimes withhold). Nothing is copied
//     before the reads.
//   - "shared window": each process copies its state into its segment of an
//     MPI-3 shared-memory window (MPI_Win_allocate_shared) that the node's
//     processes map.
// ADGT_SWITCH_SHARED=window skips the first, =0 both (every piece a message).
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "parallel/switch/reshard.hpp"

namespace adgt {

class SharedSources {
 public:
  enum class Mode { Messages, CrossMemory, Window };

  // Collective over MPI_COMM_WORLD. `src` must stay unchanged (and not be
  // moved) until the destructor in CrossMemory mode; in the other modes it
  // may be reused once this returns.
  explicit SharedSources(const RankState& src);
  // Collective over the node: waits until every process of the node is done
  // reading, then frees the window.
  ~SharedSources();
  SharedSources(const SharedSources&) = delete;
  SharedSources& operator=(const SharedSources&) = delete;

  // Indexed by MPI_COMM_WORLD rank: the source buffers of the processes on
  // this node (this one included), absent for the others (and for all in
  // Messages mode). Valid until the destructor.
  const std::vector<StateView>& views() const { return views_; }
  Mode mode() const { return mode_; }
  bool shared() const { return mode_ != Mode::Messages; }
  // How the pieces travel, for the switch's log line.
  std::string describe() const;
  int node_size() const { return node_size_; }

 private:
  bool try_cross_memory(const RankState& src, int me);
  bool try_window(const RankState& src);

  Mode mode_ = Mode::Messages;
  MPI_Comm node_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  int node_size_ = 1;
  std::vector<int> world_of_;  // node rank -> MPI_COMM_WORLD rank
  std::vector<StateView> views_;
  std::string why_;  // why the faster ways were not taken
};

}  // namespace adgt

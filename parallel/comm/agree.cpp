#include "parallel/comm/agree.hpp"

#include <mpi.h>

#include "parallel/comm/mpi_comm.hpp"
#include "parallel/comm/mpi_env.hpp"

namespace adgt {

int agree_max(int value) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return value;
  int out = value;
  MPI_Request req;
  ADGT_MPI(MPI_Iallreduce(&value, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &req));
  mpi_wait_politely(req);
  return out;
}

}  // namespace adgt

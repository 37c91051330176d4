#include "parallel/comm/agree.hpp"

#include <mpi.h>

#include "parallel/comm/mpi_env.hpp"

namespace adgt {

int agree_max(int value) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return value;
  int out = value;
  ADGT_MPI(MPI_Allreduce(&value, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  return out;
}

}  // namespace adgt

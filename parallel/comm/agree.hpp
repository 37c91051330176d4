// Agreement across every rank before the process groups exist (e.g. on a
// configuration error): the maximum of one int over MPI_COMM_WORLD.
#pragma once

namespace adgt {
// Returns `value` unchanged when MPI is not initialised (a single process).
int agree_max(int value);
}  // namespace adgt

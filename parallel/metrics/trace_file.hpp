// log.trace's file (docs/trace.md): every rank's recorded spans
// (core/trace.hpp) gathered on world rank 0 and written as one Chrome trace,
// <log.dir>/trace.json, one process track per rank named by its layout
// coordinates.
#pragma once
#include <string>

#include "core/comm.hpp"
#include "core/layout.hpp"

namespace adgt {

// Stops the recorder, gathers each rank's events on world rank 0 (one
// point-to-point message pair per rank) and writes `path` there (atomically:
// a temporary file renamed). `coords`/`lay`: this rank's place, for its
// track's name; `about`: a JSON object's text for the file's otherData.
// Collective over `world`. Throws naming the file if it cannot be written.
void write_trace_file(Comm& world, int world_rank, const Layout& lay, const RankCoords& coords,
                      const std::string& path, const std::string& about);

}  // namespace adgt

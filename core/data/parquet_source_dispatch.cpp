// The Parquet reader of this program (parquet_source.hpp): the Arrow one
// registers itself where a program links it (adgt-data, in a build that
// found Arrow); elsewhere every .parquet input is refused by name, with the
// way to a program that reads them. Only adgt-data loads libarrow and
// libparquet, so the other programs (adgt-train, the tests, the GPU check's
// bundle) carry none of their ~60 MB.
#include <stdexcept>

#include "core/data/parquet_source.hpp"

namespace adgt::data {
namespace {
ParquetReadFn g_reader = nullptr;
}  // namespace

void register_parquet_reader(ParquetReadFn f) { g_reader = f; }

void require_parquet(const std::string& path) {
  if (g_reader) return;
#ifdef ADGT_HAVE_PARQUET
  throw std::runtime_error(path +
                           ": this build reads no Parquet in this program (only adgt-data links "
                           "Apache Arrow's reader); prepare it with adgt-data prepare");
#else
  throw std::runtime_error(
      path +
      ": this build reads no Parquet (Apache Arrow's C++ library was not found when it was "
      "configured); run scripts/install_deps.sh (it unpacks the pyarrow wheel into "
      ".deps/pyarrow) and configure again, or pass -DADGT_ARROW_ROOT=DIR, or convert the "
      "file to JSON lines (.jsonl)");
#endif
}

void read_parquet(const std::string& path, const std::vector<std::string>& field,
                  const ParquetRows& rows) {
  require_parquet(path);
  g_reader(path, field, rows);
}

}  // namespace adgt::data

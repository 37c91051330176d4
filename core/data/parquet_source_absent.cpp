// Parquet inputs in a build configured without Apache Arrow (parquet_source.hpp):
// every .parquet input is refused by name, with the way to a build that reads them.
#include <stdexcept>

#include "core/data/parquet_source.hpp"

namespace adgt::data {

void require_parquet(const std::string& path) {
  throw std::runtime_error(
      path +
      ": this build reads no Parquet (Apache Arrow's C++ library was not found when it was "
      "configured); run scripts/install_deps.sh (it unpacks the pyarrow wheel into "
      ".deps/pyarrow) and configure again, or pass -DADGT_ARROW_ROOT=DIR, or convert the "
      "file to JSON lines (.jsonl)");
}

void read_parquet(const std::string& path, const std::vector<std::string>&, const ParquetRows&) {
  require_parquet(path);
}

}  // namespace adgt::data

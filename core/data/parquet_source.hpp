// Parquet files as documents (docs/data-format.md, "Inputs"): one string
// column, each row a document, read with Apache Arrow's own C++ library (the
// libarrow/libparquet and headers of the pyarrow wheel that
// scripts/install_deps.sh unpacks into .deps/pyarrow). Row groups are read
// one at a time, page by page, in batches of rows: a file of any size, and a
// row group of any size, takes bounded memory.
//
// The Arrow reader (parquet_source.cpp, the object library
// adgt_parquet_reader) registers itself in the programs that link it:
// adgt-data, in a build that found Arrow. In every other program, and in a
// build without Arrow, require_parquet refuses every .parquet input, naming
// the fix (parquet_source_dispatch.cpp).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace adgt::data {

// Throws a std::runtime_error naming `path` and the fix when this build
// reads no Parquet (Arrow was not found when it was configured).
void require_parquet(const std::string& path);

struct ParquetRows {
  // A non-null value of the column; `row` is 1-based within the file.
  std::function<void(int64_t row, std::string_view text)> text;
  // A row that gives no text (a null), or the unread rest of a row group or
  // file that cannot be decoded; `row` is the first row lost (1-based), `why`
  // names the row group and the reason.
  std::function<void(int64_t row, const std::string& why)> bad;
};

// Reads the column `field` (one name, or the names of nested struct fields:
// {"meta", "text"} for --text-field meta.text) of the Parquet file `path`,
// row group by row group, in row order. A damaged row group (a page that
// does not decode or fails its checksum) is one bad record and the next row
// group is read; a file whose footer does not parse is one bad record.
// Throws a std::runtime_error naming the file when it has no such column or
// the column is not a string column (string, large_string or string_view).
void read_parquet(const std::string& path, const std::vector<std::string>& field,
                  const ParquetRows& rows);

// The reader read_parquet calls (the Arrow reader's static registration).
using ParquetReadFn = void (*)(const std::string& path, const std::vector<std::string>& field,
                               const ParquetRows& rows);
void register_parquet_reader(ParquetReadFn f);

}  // namespace adgt::data

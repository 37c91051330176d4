// Parquet files as documents, with Apache Arrow's C++ library (parquet_source.hpp).
#include "core/data/parquet_source.hpp"

#include <arrow/api.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/exception.h>
#include <parquet/properties.h>

#include <stdexcept>

namespace adgt::data {
namespace {

// Rows decoded at a time: with documents of a few KB, a few MB of text.
constexpr int64_t kBatchRows = 1024;

std::string dotted(const std::vector<std::string>& field, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += (i ? "." : "") + field[i];
  return s;
}

// Arrow's message on one line (some span several), for bad_records.txt.
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

// A string column of any width, or a dictionary of strings (pandas'
// categoricals, written with their Arrow schema, read back as one).
bool text_type(const arrow::DataType& t) {
  if (t.id() == arrow::Type::DICTIONARY)
    return text_type(*static_cast<const arrow::DictionaryType&>(t).value_type());
  return t.id() == arrow::Type::STRING || t.id() == arrow::Type::LARGE_STRING ||
         t.id() == arrow::Type::STRING_VIEW;
}

// The leaf column named by `field` in the file's schema, or an error naming
// the file, the column and what is there instead.
const parquet::arrow::SchemaField& column_of(const std::string& path,
                                             const parquet::arrow::SchemaManifest& m,
                                             const std::vector<std::string>& field) {
  const std::vector<parquet::arrow::SchemaField>* level = &m.schema_fields;
  const parquet::arrow::SchemaField* found = nullptr;
  for (size_t i = 0; i < field.size(); ++i) {
    const std::string at = dotted(field, i + 1);
    if (found && found->field->type()->id() != arrow::Type::STRUCT)
      throw std::runtime_error(
          path + ": column '" + dotted(field, i) + "' is " + found->field->type()->ToString() +
          ", not a struct, so it has no field '" + at + "'; check --text-field");
    found = nullptr;
    std::string names;
    for (const parquet::arrow::SchemaField& f : *level) {
      if (f.field->name() == field[i]) found = &f;
      names += (names.empty() ? "" : ", ") + f.field->name();
    }
    if (!found)
      throw std::runtime_error(path + ": no column '" + at + "' (" +
                               (i ? "'" + dotted(field, i) + "' has " : "the file has ") + names +
                               "); name the text column with --text-field");
    level = &found->children;
  }
  if (!text_type(*found->field->type()) || !found->is_leaf())
    throw std::runtime_error(
        path + ": column '" + dotted(field, field.size()) + "' is " +
        found->field->type()->ToString() +
        ", not a string column (string, large_string, string_view or a dictionary of them); "
        "name the text column "
        "with --text-field");
  return *found;
}

// The value of row i of a string array of any width (a dictionary's: its
// entry's), and whether it is null (a dictionary's entry may be).
bool text_null(const arrow::Array& a, int64_t i) {
  if (a.IsNull(i)) return true;
  if (a.type_id() != arrow::Type::DICTIONARY) return false;
  const auto& d = static_cast<const arrow::DictionaryArray&>(a);
  return d.dictionary()->IsNull(d.GetValueIndex(i));
}
std::string_view text_at(const arrow::Array& a, int64_t i) {
  switch (a.type_id()) {
    case arrow::Type::DICTIONARY: {
      const auto& d = static_cast<const arrow::DictionaryArray&>(a);
      return text_at(*d.dictionary(), d.GetValueIndex(i));
    }
    case arrow::Type::STRING:
      return static_cast<const arrow::StringArray&>(a).GetView(i);
    case arrow::Type::LARGE_STRING:
      return static_cast<const arrow::LargeStringArray&>(a).GetView(i);
    default:
      return static_cast<const arrow::StringViewArray&>(a).GetView(i);
  }
}

// Hands on each row of a batch (its one column: the text, or the struct
// holding it); a row null at any level of nesting is a bad record.
void batch_rows(const arrow::RecordBatch& b, const std::vector<std::string>& field, int rg,
                int64_t first_row, const ParquetRows& rows) {
  std::vector<std::shared_ptr<arrow::Array>> levels{b.column(0)};
  for (size_t i = 1; i < field.size(); ++i) {
    auto child = static_cast<const arrow::StructArray&>(*levels.back()).GetFieldByName(field[i]);
    if (!child)
      throw std::runtime_error("Parquet reader: no struct field '" + field[i] + "' in a batch");
    levels.push_back(std::move(child));
  }
  const arrow::Array& leaf = *levels.back();
  for (int64_t i = 0; i < b.num_rows(); ++i) {
    bool null = false;
    for (const auto& l : levels) null = null || (l == levels.back() ? text_null(*l, i) : l->IsNull(i));
    if (null)
      rows.bad(first_row + i, "row group " + std::to_string(rg) + ": '" +
                                  dotted(field, field.size()) + "' is null");
    else
      rows.text(first_row + i, text_at(leaf, i));
  }
}

// Reads row group `rg` (rows first_row.. of the file) in batches. A batch
// that does not decode makes the rest of the row group one bad record.
void read_row_group(parquet::arrow::FileReader& r, int rg, int leaf, int64_t first_row,
                    const std::vector<std::string>& field, const ParquetRows& rows) {
  const int64_t n = r.parquet_reader()->metadata()->RowGroup(rg)->num_rows();
  int64_t done = 0;
  std::string failed;
  try {
    arrow::Result<std::unique_ptr<arrow::RecordBatchReader>> batches =
        r.GetRecordBatchReader({rg}, {leaf});
    if (!batches.ok()) {
      failed = batches.status().ToString();
    } else {
      for (;;) {
        std::shared_ptr<arrow::RecordBatch> b;
        if (arrow::Status st = (*batches)->ReadNext(&b); !st.ok()) {
          failed = st.ToString();
          break;
        }
        if (!b) break;
        batch_rows(*b, field, rg, first_row + done, rows);
        done += b->num_rows();
      }
    }
  } catch (const parquet::ParquetException&
               e) {  // (the Arrow API returns Status; this is belt and braces)
    failed = e.what();
  }
  if (failed.empty() && done != n)
    failed = "decoded " + std::to_string(done) + " rows of " + std::to_string(n);
  if (!failed.empty())
    rows.bad(first_row + done, "row group " + std::to_string(rg) + " (rows " +
                                   std::to_string(first_row) + "-" +
                                   std::to_string(first_row + n - 1) + "): " + one_line(failed) +
                                   "; the rest of the row group is lost");
}

void read_parquet_arrow(const std::string& path, const std::vector<std::string>& field,
                        const ParquetRows& rows) {
  parquet::ReaderProperties props = parquet::default_reader_properties();
  // A damaged page that has a checksum is an error, not odd text. Pages are
  // read through a buffered stream, not a whole column chunk at once (nor
  // pre-buffered): memory is a page and a batch whatever the row groups'
  // size (300k rows of 1.1 KB in one row group: 39 MB resident, as in 15).
  props.set_page_checksum_verification(true);
  props.enable_buffered_stream();
  parquet::ArrowReaderProperties arrow_props;
  arrow_props.set_batch_size(kBatchRows);
  arrow_props.set_pre_buffer(false);
  parquet::arrow::FileReaderBuilder builder;
  std::unique_ptr<parquet::arrow::FileReader> reader;
  arrow::Status st;
  try {
    st = builder.OpenFile(path, /*memory_map=*/false, props);
    if (st.ok()) st = builder.properties(arrow_props)->Build(&reader);
  } catch (const parquet::ParquetException& e) {
    st = arrow::Status::IOError(e.what());
  }
  if (!st.ok())
    return rows.bad(
        1, "not a readable Parquet file (" + one_line(st.ToString()) + "); the whole file is lost");
  const int leaf = column_of(path, reader->manifest(), field).column_index;
  const auto meta = reader->parquet_reader()->metadata();
  int64_t first_row = 1;
  for (int rg = 0; rg < meta->num_row_groups(); ++rg) {
    read_row_group(*reader, rg, leaf, first_row, field, rows);
    first_row += meta->RowGroup(rg)->num_rows();
  }
}

// Linked into a program, this reader is the one read_parquet calls.
[[maybe_unused]] const bool kRegistered = (register_parquet_reader(&read_parquet_arrow), true);

}  // namespace

}  // namespace adgt::data

// The safetensors file format (HuggingFace): read and write, with no Python
// and no vendored library.
//
//   bytes [0, 8)        N, the header length, uint64 little-endian
//   bytes [8, 8+N)      JSON: {"<name>": {"dtype": "F32", "shape": [..],
//                       "data_offsets": [begin, end]}, ..., "__metadata__": {..}}
//                       (the writer pads it with spaces to a multiple of 8)
//   bytes [8+N, EOF)    the data; offsets count from here; raw little-endian,
//                       C order
//
// The reader checks everything a corrupted or hand-made file can get wrong
// before any data is read: the header length against the file size, the JSON,
// each entry's dtype, shape and offsets (inside the data region, end - begin =
// numel x element size, no two tensors overlapping). Every error is a
// SafetensorsError naming the file (and tensor).
#pragma once
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace adgt {

struct SafetensorsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The element types of the format. Import converts F32, BF16 and F16 to fp32;
// the others are recognised (so their sizes are checked) but not converted.
enum class StDType { F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL, F8_E4M3, F8_E5M2 };
const char* st_dtype_name(StDType t);
int64_t st_dtype_size(StDType t);  // bytes per element
// "F32" -> F32; false for anything the format does not define.
bool parse_st_dtype(const std::string& s, StDType& out);

struct StTensor {
  std::string name;
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // data_offsets, relative to the data region
  int64_t numel() const;
};

struct StFile {
  std::string path;
  int64_t file_size = 0;
  int64_t data_start = 0;  // 8 + header length
  std::map<std::string, StTensor> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__" (string values)
  const StTensor* find(const std::string& name) const;
};

// Reads and validates the header of `path` (the data is not read).
StFile read_safetensors_header(const std::string& path);
// Reads tensor `t` of `f` into fp32 (F32 as is; BF16 and F16 exactly widened).
// Throws naming the file and tensor for any other dtype or a short read.
std::vector<float> read_safetensors_f32(const StFile& f, const StTensor& t);

// One tensor to write: fp32 values in C order, stored as `dtype` (F32, or BF16
// rounded to nearest even).
struct StWriteTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // numel(shape) values
};
// Writes a whole file in the given order (offsets ascending, no gaps) and
// fsyncs it; `metadata` goes to "__metadata__". Returns the bytes of tensor
// data written.
int64_t write_safetensors(const std::string& path, const std::vector<StWriteTensor>& tensors,
                          StDType dtype, const std::map<std::string, std::string>& metadata);

// fp32 <-> 16-bit conversions. to_bf16: round to nearest, ties to even (as
// torch's .to(torch.bfloat16)); NaN stays NaN (quiet, sign kept), overflow
// rounds to infinity. The widenings are exact.
uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t h);
float f16_to_f32(uint16_t h);

}  // namespace adgt

#include "core/hf/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

namespace adgt {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; add byte swapping before building on a "
              "big-endian host");

namespace {

// The reference implementation's limit; a larger "header" is a corrupted file.
constexpr int64_t kMaxHeaderBytes = 100'000'000;

struct DTypeRow {
  StDType t;
  const char* name;
  int64_t size;
};
constexpr DTypeRow kDTypes[] = {
    {StDType::F64, "F64", 8},   {StDType::F32, "F32", 4},   {StDType::F16, "F16", 2},
    {StDType::BF16, "BF16", 2}, {StDType::I64, "I64", 8},   {StDType::I32, "I32", 4},
    {StDType::I16, "I16", 2},   {StDType::I8, "I8", 1},     {StDType::U64, "U64", 8},
    {StDType::U32, "U32", 4},   {StDType::U16, "U16", 2},   {StDType::U8, "U8", 1},
    {StDType::BOOL, "BOOL", 1}, {StDType::F8_E4M3, "F8_E4M3", 1},
    {StDType::F8_E5M2, "F8_E5M2", 1}};

std::string errno_text() { return std::strerror(errno); }

// An owned file descriptor.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads exactly n bytes at `off`; false on a short read (EOF).
bool pread_all(int fd, void* buf, int64_t n, int64_t off, const std::string& path) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, size_t(std::min<int64_t>(n, int64_t(1) << 30)), off);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw SafetensorsError(path + ": read failed: " + errno_text());
    }
    if (r == 0) return false;
    p += r;
    n -= r;
    off += r;
  }
  return true;
}

void write_all(int fd, const void* buf, size_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t r = ::write(fd, p, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw SafetensorsError(path + ": write failed: " + errno_text());
    }
    p += r;
    n -= size_t(r);
  }
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + ")";
}

// A non-negative JSON integer that fits int64, or throws `what`.
int64_t json_index(const nlohmann::json& v, const std::string& what) {
  if (!v.is_number_unsigned() || v.get<uint64_t>() > uint64_t(INT64_MAX))
    throw SafetensorsError(what + " must be a non-negative integer, got " + v.dump());
  return int64_t(v.get<uint64_t>());
}

StTensor parse_entry(const std::string& name, const nlohmann::json& e, const std::string& where) {
  const std::string at = where + ": tensor " + name;
  if (!e.is_object()) throw SafetensorsError(at + ": header entry is not a JSON object");
  for (const char* k : {"dtype", "shape", "data_offsets"})
    if (!e.contains(k)) throw SafetensorsError(at + ": header entry has no \"" + k + "\"");
  StTensor t;
  t.name = name;
  if (!e["dtype"].is_string() || !parse_st_dtype(e["dtype"].get<std::string>(), t.dtype)) {
    std::string known;
    for (const auto& r : kDTypes) known += std::string(known.empty() ? "" : ", ") + r.name;
    throw SafetensorsError(at + ": unknown dtype " + e["dtype"].dump() + " (the format defines " +
                           known + ")");
  }
  if (!e["shape"].is_array()) throw SafetensorsError(at + ": \"shape\" is not an array");
  for (const auto& d : e["shape"]) t.shape.push_back(json_index(d, at + ": a shape entry"));
  const auto& off = e["data_offsets"];
  if (!off.is_array() || off.size() != 2)
    throw SafetensorsError(at + ": \"data_offsets\" must be [begin, end], got " + off.dump());
  t.begin = json_index(off[0], at + ": data_offsets[0]");
  t.end = json_index(off[1], at + ": data_offsets[1]");
  if (t.end < t.begin)
    throw SafetensorsError(at + ": data_offsets [" + std::to_string(t.begin) + ", " +
                           std::to_string(t.end) + "] end before begin");
  int64_t bytes = st_dtype_size(t.dtype);
  for (int64_t d : t.shape)
    if (__builtin_mul_overflow(bytes, d, &bytes))
      throw SafetensorsError(at + ": shape " + shape_str(t.shape) + " is too large");
  if (t.end - t.begin != bytes)
    throw SafetensorsError(at + ": data_offsets [" + std::to_string(t.begin) + ", " +
                           std::to_string(t.end) + "] hold " + std::to_string(t.end - t.begin) +
                           " bytes, but " + st_dtype_name(t.dtype) + " " + shape_str(t.shape) +
                           " needs " + std::to_string(bytes));
  return t;
}

}  // namespace

const char* st_dtype_name(StDType t) {
  for (const auto& r : kDTypes)
    if (r.t == t) return r.name;
  return "?";
}

int64_t st_dtype_size(StDType t) {
  for (const auto& r : kDTypes)
    if (r.t == t) return r.size;
  return 0;
}

bool parse_st_dtype(const std::string& s, StDType& out) {
  for (const auto& r : kDTypes)
    if (s == r.name) {
      out = r.t;
      return true;
    }
  return false;
}

int64_t StTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const StTensor* StFile::find(const std::string& name) const {
  auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

StFile read_safetensors_header(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.fd < 0) throw SafetensorsError(path + ": cannot open: " + errno_text());
  struct stat sb {};
  if (::fstat(fd.fd, &sb) != 0) throw SafetensorsError(path + ": cannot stat: " + errno_text());
  StFile f;
  f.path = path;
  f.file_size = int64_t(sb.st_size);
  uint64_t n = 0;
  if (f.file_size < 8 || !pread_all(fd.fd, &n, 8, 0, path))
    throw SafetensorsError(path + ": not a safetensors file: " + std::to_string(f.file_size) +
                           " bytes, shorter than the 8-byte header length");
  if (n > uint64_t(f.file_size - 8))
    throw SafetensorsError(path + ": malformed header: its length field says " +
                           std::to_string(n) + " bytes, but the file has only " +
                           std::to_string(f.file_size - 8) +
                           " after it (truncated or not a safetensors file)");
  if (int64_t(n) > kMaxHeaderBytes)
    throw SafetensorsError(path + ": malformed header: length " + std::to_string(n) +
                           " exceeds the format's limit of " + std::to_string(kMaxHeaderBytes));
  std::string text(size_t(n), '\0');
  if (!pread_all(fd.fd, text.data(), int64_t(n), 8, path))
    throw SafetensorsError(path + ": header ends early");
  f.data_start = 8 + int64_t(n);
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw SafetensorsError(path + ": malformed header: not valid JSON (" + e.what() + ")");
  }
  if (!h.is_object()) throw SafetensorsError(path + ": malformed header: not a JSON object");
  const int64_t data_len = f.file_size - f.data_start;
  std::vector<const StTensor*> by_offset;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object())
        throw SafetensorsError(path + ": malformed header: __metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m)
        f.metadata[m.key()] = m->is_string() ? m->get<std::string>() : m->dump();
      continue;
    }
    StTensor t = parse_entry(it.key(), *it, path + ": malformed header");
    if (t.end > data_len)
      throw SafetensorsError(path + ": malformed header: tensor " + t.name + ": data_offsets [" +
                             std::to_string(t.begin) + ", " + std::to_string(t.end) +
                             "] run past the data region of " + std::to_string(data_len) +
                             " bytes (truncated file?)");
    f.tensors[t.name] = std::move(t);
  }
  for (const auto& [name, t] : f.tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const StTensor* a, const StTensor* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const StTensor &a = *by_offset[i - 1], &b = *by_offset[i];
    if (b.begin < a.end)
      throw SafetensorsError(path + ": malformed header: tensors " + a.name + " [" +
                             std::to_string(a.begin) + ", " + std::to_string(a.end) + ") and " +
                             b.name + " [" + std::to_string(b.begin) + ", " +
                             std::to_string(b.end) + ") overlap");
  }
  return f;
}

std::vector<float> read_safetensors_f32(const StFile& f, const StTensor& t) {
  const std::string at = f.path + ": tensor " + t.name;
  if (t.dtype != StDType::F32 && t.dtype != StDType::BF16 && t.dtype != StDType::F16)
    throw SafetensorsError(at + ": dtype " + st_dtype_name(t.dtype) +
                           " cannot be imported (F32, BF16 and F16 can)");
  Fd fd(::open(f.path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.fd < 0) throw SafetensorsError(f.path + ": cannot open: " + errno_text());
  const int64_t n = t.numel();
  std::vector<float> out(static_cast<size_t>(n));
  const int64_t off = f.data_start + t.begin;
  if (t.dtype == StDType::F32) {
    if (!pread_all(fd.fd, out.data(), n * 4, off, f.path))
      throw SafetensorsError(at + ": file ends inside the tensor's data (truncated?)");
    return out;
  }
  std::vector<uint16_t> raw(static_cast<size_t>(n));
  if (!pread_all(fd.fd, raw.data(), n * 2, off, f.path))
    throw SafetensorsError(at + ": file ends inside the tensor's data (truncated?)");
  if (t.dtype == StDType::BF16)
    for (int64_t i = 0; i < n; ++i) out[size_t(i)] = bf16_to_f32(raw[size_t(i)]);
  else
    for (int64_t i = 0; i < n; ++i) out[size_t(i)] = f16_to_f32(raw[size_t(i)]);
  return out;
}

int64_t write_safetensors(const std::string& path, const std::vector<StWriteTensor>& tensors,
                          StDType dtype, const std::map<std::string, std::string>& metadata) {
  if (dtype != StDType::F32 && dtype != StDType::BF16)
    throw SafetensorsError(path + ": can write F32 or BF16, not " + st_dtype_name(dtype));
  const int64_t esize = st_dtype_size(dtype);
  nlohmann::ordered_json h;
  h["__metadata__"] = metadata;
  int64_t off = 0;
  for (const auto& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    h[t.name] = {{"dtype", st_dtype_name(dtype)},
                 {"shape", t.shape},
                 {"data_offsets", {off, off + n * esize}}};
    off += n * esize;
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.fd < 0) throw SafetensorsError(path + ": cannot create: " + errno_text());
  const uint64_t n_le = text.size();
  write_all(fd.fd, &n_le, 8, path);
  write_all(fd.fd, text.data(), text.size(), path);
  std::vector<uint16_t> buf;
  constexpr int64_t kChunk = int64_t(1) << 20;
  for (const auto& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    if (dtype == StDType::F32) {
      write_all(fd.fd, t.data, size_t(n) * 4, path);
      continue;
    }
    for (int64_t b = 0; b < n; b += kChunk) {
      const int64_t e = std::min(n, b + kChunk);
      buf.resize(size_t(e - b));
      for (int64_t i = b; i < e; ++i) buf[size_t(i - b)] = f32_to_bf16(t.data[i]);
      write_all(fd.fd, buf.data(), buf.size() * 2, path);
    }
  }
  if (::fsync(fd.fd) != 0) throw SafetensorsError(path + ": fsync failed: " + errno_text());
  const int fdv = fd.fd;
  fd.fd = -1;
  if (::close(fdv) != 0) throw SafetensorsError(path + ": close failed: " + errno_text());
  return off;
}

uint16_t f32_to_bf16(float x) {
  const uint32_t b = std::bit_cast<uint32_t>(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return uint16_t(((b >> 16) & 0x8000u) | 0x7fc0u);  // NaN
  return uint16_t((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);  // ties to even; overflow -> inf
}

float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant x 2^-24, exact in fp32
    const float v = float(mant) * 0x1p-24f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(v) | sign);
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace adgt

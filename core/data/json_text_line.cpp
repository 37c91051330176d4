// {"text": "..."} read directly (json_text_line.hpp).
#include "core/data/json_text_line.hpp"

#include <cstdint>

namespace adgt::data {
namespace {

bool json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

void skip_space(std::string_view s, size_t& i) {
  while (i < s.size() && json_space(s[i])) ++i;
}

// Four hex digits at s[i..]: their value, or -1.
int32_t hex4(std::string_view s, size_t i) {
  if (i + 4 > s.size()) return -1;
  int32_t v = 0;
  for (size_t k = i; k < i + 4; ++k) {
    const char c = s[k];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// The escape at s[i] (after the backslash) appended to out, i moved past
// it; false where nlohmann refuses it.
bool escape(std::string_view s, size_t& i, std::string& out) {
  if (i >= s.size()) return false;
  const char c = s[i++];
  switch (c) {
    case '"': out += '"'; return true;
    case '\\': out += '\\'; return true;
    case '/': out += '/'; return true;
    case 'b': out += '\b'; return true;
    case 'f': out += '\f'; return true;
    case 'n': out += '\n'; return true;
    case 'r': out += '\r'; return true;
    case 't': out += '\t'; return true;
    case 'u': break;
    default: return false;
  }
  const int32_t u = hex4(s, i);
  if (u < 0 || (u >= 0xDC00 && u <= 0xDFFF)) return false;  // a low surrogate alone
  i += 4;
  if (u < 0xD800 || u > 0xDBFF) return append_utf8(uint32_t(u), out), true;
  if (i + 2 > s.size() || s[i] != '\\' || s[i + 1] != 'u') return false;  // a high surrogate alone
  const int32_t lo = hex4(s, i + 2);
  if (lo < 0xDC00 || lo > 0xDFFF) return false;
  i += 6;
  append_utf8(0x10000 + ((uint32_t(u) - 0xD800) << 10) + (uint32_t(lo) - 0xDC00), out);
  return true;
}

// The string starting after the quote at s[i]: decoded into out, i moved
// past its closing quote.
bool string_body(std::string_view s, size_t& i, std::string& out) {
  for (;;) {
    size_t run = i;  // plain bytes, copied at once
    while (run < s.size() && s[run] != '"' && s[run] != '\\' && static_cast<unsigned char>(s[run]) >= 0x20) ++run;
    out.append(s.data() + i, run - i);
    i = run;
    if (i >= s.size() || static_cast<unsigned char>(s[i]) < 0x20) return false;
    if (s[i++] == '"') return true;
    if (!escape(s, i, out)) return false;
  }
}

}  // namespace

bool json_text_line(std::string_view line, std::string_view field, std::string& text) {
  size_t i = 0;
  skip_space(line, i);
  if (i >= line.size() || line[i++] != '{') return false;
  skip_space(line, i);
  if (i >= line.size() || line[i++] != '"') return false;
  if (line.compare(i, field.size(), field) != 0 || i + field.size() >= line.size() || line[i + field.size()] != '"')
    return false;
  for (char c : field)  // a name nlohmann would read differently
    if (c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20) return false;
  i += field.size() + 1;
  skip_space(line, i);
  if (i >= line.size() || line[i++] != ':') return false;
  skip_space(line, i);
  if (i >= line.size() || line[i++] != '"') return false;
  text.clear();
  if (!string_body(line, i, text)) return false;
  skip_space(line, i);
  if (i >= line.size() || line[i++] != '}') return false;
  skip_space(line, i);
  return i == line.size();
}

}  // namespace adgt::data

// The common JSON line of a corpus, {"text": "..."}, read without building
// a JSON value (text_sources.cpp): the reading of JSON lines is one thread's
// work ahead of the encoders, and nlohmann's parse was most of it.
#pragma once
#include <string>
#include <string_view>

namespace adgt::data {

// When `line` is an object of the one field `field` (written without
// escapes) holding a string that nlohmann::json would read, sets `text` to
// that string and returns true. Returns false for anything else -- other or
// more fields, an escape nlohmann refuses (a lone surrogate), a control
// character, trailing bytes -- and the caller reads the line with nlohmann,
// which says what is wrong. Bytes of 0x80 and up are copied as they are:
// the caller checks the text is UTF-8 (nlohmann would refuse it otherwise).
bool json_text_line(std::string_view line, std::string_view field, std::string& text);

}  // namespace adgt::data

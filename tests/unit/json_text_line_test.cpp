// The direct reader of {"text": "..."} lines (core/data/json_text_line.hpp)
// against nlohmann::json, the reader it stands in for: on lines built from
// escapes, surrogates (paired and lone), control characters, ill-formed
// UTF-8 and other fields, whatever it accepts nlohmann reads as the same
// text (or refuses, where the bytes are not UTF-8, as the caller then says).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/data/json_text_line.hpp"
#include "core/data/text_sources.hpp"

using adgt::data::json_text_line;

namespace {

// nlohmann's reading: the text field's string, or false.
bool nlohmann_text(const std::string& line, std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.size() != 1 || !j.contains("text") || !j["text"].is_string()) return false;
  text = j["text"].get<std::string>();
  return true;
}

}  // namespace

TEST_CASE("json_text_line reads what nlohmann reads, and declines the rest", "[data]") {
  const std::vector<std::string> pieces = {
      "a", " ", "\\\"", "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t", "\\u0041", "\\u00e9", "\\u20AC",
      "\\ud83d\\ude00", "\\uD83D\\uDE00", "\\ud83d", "\\ude00", "\\ud83dx", "\\ud83d\\u0041", "\\u12", "\\x",
      "\\uZZZZ", "\\u0000", "\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "\xff", "\xc0\xaf", "\xed\xa0\x80",
      "\x01", "\x1f", "\x7f", "\t", "\"", "\\", "\xf4\x90\x80\x80", "<|endoftext|>"};
  const std::vector<std::string> heads = {"{\"text\": \"", "{\"text\":\"", " {\"text\" : \"", "{\t\"text\"\t:\t\"",
                                          "\xef\xbb\xbf{\"text\": \"", "{\"tex\": \"", "{\"te\\u0078t\": \"",
                                          "[\"text\", \""};
  const std::vector<std::string> tails = {"\"}", "\" }", "\"}  ", "\"}\r", "\", \"id\": 1}", "\"}x", "\"", "\"}}"};
  std::mt19937 rng(7);
  const auto pick = [&](const std::vector<std::string>& v) { return v[rng() % v.size()]; };
  int accepted = 0, agreed_refusals = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string body;
    for (int k = int(rng() % 9); k > 0; --k) body += pick(pieces);
    const std::string line = pick(heads) + body + pick(tails);
    std::string fast, slow;
    const bool ours = json_text_line(line, "text", fast);
    const bool theirs = nlohmann_text(line, slow);
    INFO("line: " << line);
    if (!ours) continue;  // nlohmann reads the line and says what it is
    ++accepted;
    if (adgt::data::valid_utf8(fast)) {
      CHECK(theirs);
      CHECK(fast == slow);
    } else {
      CHECK_FALSE(theirs);  // both end as "not valid UTF-8"
      ++agreed_refusals;
    }
  }
  CHECK(accepted > 1000);  // the common line does take the direct path
  CHECK(agreed_refusals > 0);
  std::string t;
  CHECK(json_text_line("{\"text\": \"a\\u00e9\\ud83d\\ude00\\n\"}", "text", t));
  CHECK(t == "a\xc3\xa9\xf0\x9f\x98\x80\n");
  CHECK(json_text_line("{\"content\": \"x\"}", "content", t));
  CHECK_FALSE(json_text_line("{\"content\": \"x\"}", "text", t));
  CHECK_FALSE(json_text_line("{\"text\": \"x\", \"text\": \"y\"}", "text", t));  // nlohmann keeps the last
  CHECK_FALSE(json_text_line("{\"text\": 5}", "text", t));
}

#include "core/data/document_eos.hpp"

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "core/data/tokenizer.hpp"

namespace adgt {
namespace fs = std::filesystem;

namespace {

// meta.json's documents.eos_id beside `file` (-1: prepared without one);
// nullopt when there is no meta.json or it has no documents entry.
std::optional<int64_t> meta_eos(const std::string& file) {
  const fs::path meta = fs::path(file).parent_path() / "meta.json";
  std::ifstream in(meta);
  if (!in) return std::nullopt;
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    throw std::runtime_error(meta.string() + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.contains("documents") || !j["documents"].is_object() ||
      !j["documents"].contains("eos_id"))
    return std::nullopt;
  const nlohmann::json& e = j["documents"]["eos_id"];
  if (!e.is_number_integer())
    throw std::runtime_error(meta.string() + ": documents.eos_id is not an integer");
  return e.get<int64_t>();
}

int64_t eos_from_files(const std::vector<std::string>& files) {
  std::optional<int64_t> found;
  std::string from;
  for (const std::string& f : files) {
    const std::optional<int64_t> e = meta_eos(f);
    if (!e) continue;
    if (*e < 0)
      throw std::runtime_error(
          "data.train " + f + " was prepared without an end-of-document token (its meta.json "
          "has documents.eos_id -1: the tokenizer has none, or --no-eos), so train.document_mask "
          "/ model.rope_reset_per_document cannot find document boundaries; prepare it with a "
          "tokenizer that has an EOS token, or set data.eos_id");
    if (found && *found != *e)
      throw std::runtime_error("data.train: the blend's files end documents with different "
                               "tokens (" + from + ": " + std::to_string(*found) + ", " + f +
                               ": " + std::to_string(*e) + "); set data.eos_id");
    found = e;
    from = f;
  }
  return found ? *found : -1;
}

}  // namespace

int32_t resolve_document_eos(int64_t configured, const std::vector<std::string>& train_files,
                             const std::string& tokenizer, int64_t vocab_size) {
  int64_t eos = configured;
  std::string source = "data.eos_id";
  if (eos < 0) {
    eos = eos_from_files(train_files);
    source = "the meta.json of data.train";
  }
  if (eos < 0 && tokenizer != "byte") {
    std::unique_ptr<Tokenizer> tok;
    try {
      tok = Tokenizer::load(tokenizer);
    } catch (const std::exception& e) {
      throw std::runtime_error("train.document_mask / model.rope_reset_per_document: no "
                               "data.eos_id, no meta.json with documents.eos_id beside data.train, "
                               "and data.tokenizer " + tokenizer + " could not be read (" +
                               e.what() + "); set data.eos_id");
    }
    eos = tok->eos_id();
    source = "data.tokenizer " + tokenizer;
  }
  if (eos < 0)
    throw std::runtime_error(
        "train.document_mask / model.rope_reset_per_document need the end-of-document token: "
        "set data.eos_id (no meta.json with documents.eos_id beside data.train, and data.tokenizer " +
        tokenizer + " has no EOS token)");
  if (eos >= vocab_size) {
    std::ostringstream m;
    m << "end-of-document token " << eos << " (from " << source << ") is outside the model's "
      << "vocabulary [0, " << vocab_size << ")";
    throw std::runtime_error(m.str());
  }
  return int32_t(eos);
}

}  // namespace adgt

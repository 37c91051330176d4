// data.train and data.val written as a YAML list (docs/config.md, "Data
// blends"):
//
//   data:
//     train:
//       - path: data/web        # a token file, or a directory (its train.bin)
//         weight: 0.7           # > 0; normalised over the list
//       - path: data/code/train.bin
//         weight: 0.3
//
// The list is the shorthand "0.7 data/web 0.3 data/code/train.bin" written
// out (core/data/blend.hpp): the config keeps that text, so --set, the
// trainer and the checks read one form, and to_yaml writes a blend of two or
// more sources back as the list. Weights are all given or all left out (then
// equal); a lone entry is its path.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "core/data/blend.hpp"

namespace adgt {

// The list's shorthand text in *text, or the error without location
// ("data.train[1].weight: ..."), *mark then moved to the offending entry.
// `key` is the setting ("data.train").
std::optional<std::string> blend_list_text(const YAML::Node& list, const std::string& key,
                                           std::string* text, YAML::Mark* mark);

// The sources to_yaml writes as a list (weights as written): those of a
// blend of two or more; nullopt for one path or a value that is no blend
// (written as the plain string it is).
std::optional<std::vector<BlendSource>> blend_list_of(const std::string& value);

}  // namespace adgt

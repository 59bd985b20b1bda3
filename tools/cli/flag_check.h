// What the command line says about flags it does not take: the flags of diffusers'
// train_dreambooth_lora_sana.py that cannot apply here (the hub, pushing) or are not built, each
// refused with one line saying why, and unknown flags named all at once with the nearest known
// spelling:
//
//     sanaflow: --push_to_hub: sanaflow does not upload; it writes OUTPUT_DIR only ...
//     sanaflow: unknown flags: --learning_rat (did you mean --learning_rate?), --foo
//
// Torch-free: only the command line uses it.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace sf::tools {

// Where a flag came from when not typed: "--key" -> "FILE line N" (tools/cli/yaml_config.h).
using FlagOrigins = std::map<std::string, std::string>;

// One line per flag in `args` ("--name" or "--name=value") that upstream's script has and this
// tool refuses, in order; empty when none.
std::vector<std::string> refused_flags(const std::vector<std::string>& args,
                                       const FlagOrigins& origins = {});

// The flags among `extras` (CLI11's leftovers: flags and the values after them), without the
// values, each with the nearest of `known` (long names without dashes) when one is close and
// the file and line it came from. Empty when `extras` holds no flag.
std::string unknown_flags_message(const std::vector<std::string>& extras,
                                  const std::vector<std::string>& known,
                                  const FlagOrigins& origins = {});

// Levenshtein distance, for the suggestions.
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace sf::tools

// `--config FILE` for the sanaflow commands: a YAML file of the command's own flags, one per line,
//
//   # train.yaml
//   learning_rate: 1e-4
//   gradient_checkpointing: true
//   lora_target_modules: "to_q,to_k,to_v"
//
// The file's keys become flags (`--learning_rate=1e-4`) in place of `--config FILE`, except keys
// also given on the command line, which wins; CLI11 then parses them like typed flags, so an
// unknown key is an error naming it. Only this flat subset of YAML is read (scalars, comments,
// quotes, a leading "---"); a nested mapping or a list is refused naming its line.
#pragma once

#include <string>
#include <vector>

namespace sf::tools {

// argv[1..] with every `--config FILE` (or `--config=FILE`) replaced by the file's flags.
// sf::Error kNotFound / kInvalidArgument naming the file and line.
std::vector<std::string> expand_yaml_config(int argc, const char* const* argv);

}  // namespace sf::tools

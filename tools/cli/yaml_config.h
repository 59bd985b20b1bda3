// `--config FILE` for the sanaflow commands: a YAML file (read with yaml-cpp) of the command's own
// flags,
//
//   # train.yaml
//   learning_rate: 1e-4      # it's upstream's default
//   gradient_checkpointing: true
//   lora:                    # sections group keys; their names are not part of the flag
//     rank: 16
//     lora_layers: [to_q, to_k, to_v]   # a list is the flag's comma-separated value
//   resume_from_checkpoint: null        # null: the flag's default
//
// The file's keys become flags (`--learning_rate=1e-4`) in place of `--config FILE`, except keys
// also given on the command line, which wins; CLI11 then parses them like typed flags, and a key
// that is no flag of the command (a SimpleTuner or accelerate file's) is refused naming the file,
// its line and the key (ConfigOrigins).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace sf::tools {

// "--key" -> "FILE line N", for messages about flags that came from a file.
using ConfigOrigins = std::map<std::string, std::string>;

// argv[1..] with every `--config FILE` (or `--config=FILE`) replaced by the file's flags, each
// flag's file and line in `origins` when given. sf::Error kNotFound (no such file) or
// kInvalidArgument (not YAML, not a mapping, a key twice, a list of mappings, nesting deeper than
// a few sections) naming the file and line.
std::vector<std::string> expand_yaml_config(int argc, const char* const* argv,
                                            ConfigOrigins* origins = nullptr);

}  // namespace sf::tools

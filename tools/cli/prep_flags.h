// The flags of `sanaflow prep`: what to read and how to cut it into samples (data flags, which
// `sanaflow train` takes too), and the encoders to use (model flags).
#pragma once

#include <CLI/CLI.hpp>

#include "pipelines/prep/prep.h"

namespace sf::tools {

// --instance_data_dir, --manifest, --resolution, the video windows, batches, --offload, ...
void add_prep_data_flags(CLI::App* cmd, pipelines::PrepOptions& o);

// --pretrained_model_name_or_path, --model, --seed, --device, --mixed_precision: `sanaflow train`
// has its own of these names and hands them to prep.
void add_prep_model_flags(CLI::App* cmd, pipelines::PrepOptions& o);

}  // namespace sf::tools

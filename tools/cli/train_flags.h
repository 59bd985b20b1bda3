// The flags of `sanaflow train`, spelled as diffusers' Sana training scripts spell them, with
// their defaults (TrainOptions'); prep's data flags join them for the one-command form.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "pipelines/prep/prep.h"
#include "pipelines/train/class_images.h"
#include "pipelines/train/train.h"

namespace sf::tools {

// What `sanaflow train` takes besides TrainOptions: flags that set several options, flags kept for
// upstream's spelling, and prep's data flags for the one-command form (--instance_data_dir).
struct TrainCommand {
    bool checkpointing = false;
    int64_t checkpointing_every = 1;
    bool full_finetune = false;
    bool cache_latents = false;
    bool upcast_before_saving = false;
    pipelines::PrepOptions prep;
    // Prior preservation: the class images generated where missing, prepped into
    // OUTPUT_DIR/class_cache (pipelines/train/class_images.h), trained beside the instances.
    bool with_prior_preservation = false;
    pipelines::ClassImageOptions classes;
};

// Every flag of `sanaflow train` but prep's data flags (add_prep_data_flags) and --config.
void add_train_flags(CLI::App* cmd, pipelines::TrainOptions& o, TrainCommand& c);

// SANA-Video's trainer options, for caches of video windows (--vae wan).
void add_video_train_flags(CLI::App* cmd, pipelines::TrainOptions& o);

}  // namespace sf::tools

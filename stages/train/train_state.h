// Training checkpoints: everything a run needs to continue exactly where it stopped.
//
//   <output_dir>/checkpoint-<step>/
//     trainable.safetensors   the trained tensors by name (adapters for LoRA, else all weights)
//     optimizer.safetensors   AdamW moments and steps by parameter name, and the RNG states
//     state.json              step, sampler position, loss-scaler state, the run's settings
//     manifest.json           the size and XXH3-128 of each file above, written last
//
// A checkpoint is built in a temporary directory next to its final name, every file fsynced,
// then renamed into place and the parent directory fsynced: a crash leaves either the whole
// checkpoint or none (a leftover temporary directory is ignored and removed by the next save).
// A checkpoint is used only once verified whole: every file against the manifest and every field
// of state.json checked (checkpoints of earlier versions, without a manifest, are verified by
// their files' own safetensors checksums).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "stages/train/state_json.h"

namespace sf::train {

// The JSON part (step, sampler position, scaler, settings, losses: state_json.h) and the tensors.
struct TrainState : StateFields {
    std::vector<std::pair<std::string, at::Tensor>> trainable;
    std::map<std::string, at::Tensor> optimizer;  // AdamW::state()
    std::map<std::string, at::Tensor> rng;        // generator name -> state bytes (uint8)
};

// <output_dir>/checkpoint-<step>.
std::string checkpoint_dir(const std::string& output_dir, int64_t step);

// Writes more files into a checkpoint being written (its temporary directory) and returns their
// names: they are listed in its manifest and verified with it (the LoRA file a pipeline loads).
using CheckpointExtras = std::function<std::vector<std::string>(const std::string& dir)>;

// Writes checkpoint-<state.step> under `output_dir` and returns its path. Then keeps only the
// newest `total_limit` checkpoints (0 = keep all).
std::string save_checkpoint(const std::string& output_dir, const TrainState& state,
                            int64_t total_limit, const CheckpointExtras& extras = nullptr);

// The newest checkpoint under `output_dir` that verifies; a newer damaged or incomplete one is
// skipped with a warning naming what is wrong. nullopt when there is no checkpoint at all;
// kCorruption when there are some but none verifies (starting from step 0 would bury them).
std::optional<std::string> latest_checkpoint(const std::string& output_dir);

// Verifies a checkpoint directory whole; kNotFound / kCorruption naming the file and field.
void verify_checkpoint(const std::string& dir);

// Reads a checkpoint directory (verify it first); kNotFound / kCorruption naming the file and
// field at fault.
TrainState load_checkpoint(const std::string& dir);

}  // namespace sf::train

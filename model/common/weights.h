// Weights by name. A module's parameters and buffers are registered under the exact state-dict
// keys of the upstream diffusers / transformers model, so loading a checkpoint is a lookup:
// every key of the module must be in the checkpoint with the same shape, and every key of the
// checkpoint must be in the module. All offending names are reported in one error.
//
// Buffers that upstream does not save (persistent=False, like rotary inv_freq) must not be
// registered: LibTorch has no non-persistent buffers, so keep them as plain members.
#pragma once

#include <torch/nn/module.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace sf::model {

struct LoadOptions {
    // Converts the module (and so every weight) to this dtype, e.g. bf16 for a frozen encoder.
    std::optional<at::ScalarType> dtype;
    // Checkpoint keys to skip, e.g. a head the module does not have. Exact names.
    std::vector<std::string> ignore;
    // Checkpoint keys to skip by prefix, e.g. "decoder." for a VAE built without its decoder.
    std::vector<std::string> ignore_prefixes;
};

struct LoadReport {
    int64_t tensors = 0;
    int64_t bytes = 0;  // as stored in the checkpoint
};

// Loads `module` from `path`: a .safetensors file, a *.index.json of shards, or a directory
// holding one of those. Throws sf::Error kInvalidArgument listing every missing, unexpected and
// misshaped tensor (names and shapes), kNotFound / kCorruption from the files themselves.
LoadReport load_weights(torch::nn::Module& module, const std::string& path,
                        const LoadOptions& options = {});

// The module's state dict (parameters and buffers) by name, as diffusers' state_dict() keys.
std::vector<std::pair<std::string, at::Tensor>> state_dict(const torch::nn::Module& module);

// Writes the state dict to one safetensors file, atomically. Tensors are saved as they are
// (dtype included), moved to the CPU.
void save_weights(const torch::nn::Module& module, const std::string& file,
                  const std::map<std::string, std::string>& metadata = {});

// Number of parameter elements (buffers not counted), as sum(p.numel() for p in m.parameters()).
int64_t parameter_count(const torch::nn::Module& module);

}  // namespace sf::model

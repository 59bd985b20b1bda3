// LoRA (low-rank adapters) for any module built from torch::nn::Linear, laid out as peft lays it
// out inside a diffusers model, so that a file written by save_lora loads with diffusers'
// `SanaPipeline.load_lora_weights(dir)` and a diffusers LoRA loads with load_lora:
//
//   add_lora(*model, LoRAConfig{.rank = 16, .alpha = 16});  // freezes everything else
//   cast_frozen(*model, at::kBFloat16);                      // optional: bf16 base, fp32 adapters
//   sf::AdamW opt(trainable_parameters(*model), ...);
//   ... train ...
//   save_lora(*model, output_dir + "/" + kLoraWeightName);
//
// An adapted Linear `L` gets two children, `L.lora_A` = Linear(in, rank, bias=false) and
// `L.lora_B` = Linear(rank, out, bias=false), so its state-dict keys are `<path>.lora_A.weight`
// and `<path>.lora_B.weight`: peft's keys with the adapter name dropped, which is what
// get_peft_model_state_dict returns. The forward of an adapted layer is
//   y = L(x) + (alpha / rank) * lora_B(lora_A(dropout(x)))
// and is computed only where the model calls apply_linear(L, x) instead of L(x). In sanaflow those
// are the attention projections of the Sana transformer (to_q, to_k, to_v, to_out.0). Pitfall: a
// Linear that the model calls directly (proj_out, time_embed.linear, ...) can be adapted, but its
// adapter is never used and never trained; route it through apply_linear first.
//
// Module::clone() of an adapted model fails (LibTorch's Linear does not clone extra children).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace sf::model {

// diffusers' file name for LoRA weights: load_lora_weights(dir) looks for it in `dir`.
constexpr const char* kLoraWeightName = "pytorch_lora_weights.safetensors";

struct LoRAConfig {
    int64_t rank = 4;
    // The update is scaled by alpha / rank (peft's default, not rsLoRA's alpha / sqrt(rank)).
    double alpha = 4;
    // peft's target_modules as a list: a Linear is adapted when its module path equals a target
    // or ends with "." + target ("to_q" matches attn1.to_q and attn2.to_q; "attn1.to_q" only
    // the first; "to_out.0" the output projections).
    std::vector<std::string> targets = {"to_q", "to_k", "to_v"};
    // Dropout on the adapter's input, in training mode only.
    double dropout = 0;

    // sf::Error kInvalidArgument naming `where` and the bad field.
    void validate(const std::string& where = "LoRAConfig") const;
};

// Adds an adapter to every Linear of `root` that a target matches, sets requires_grad = false on
// every other parameter of `root`, and returns the number of adapted layers. Adapters are created
// on the device and in the dtype of the layer's weight; lora_A is initialised as peft does
// (kaiming_uniform, a = sqrt(5)), lora_B with zeros, so the model's output is unchanged.
// kInvalidArgument: a bad config; a target that matches nothing, or matches a module that is not
// a Linear (named, with the Linear names that are available); a model that already has adapters.
int64_t add_lora(torch::nn::Module& root, const LoRAConfig& config);

// x through `layer` as Python's F.linear computes it (at::linear). LibTorch's C++
// Linear::forward, layer(x), differs for inputs of more than 2 dimensions: it multiplies and then
// adds the bias itself, outside autocast's casts, so under autocast a bf16 product gets an fp32
// bias in a slow mixed-dtype add, rounded otherwise than upstream's.
at::Tensor linear(const torch::nn::Linear& layer, const at::Tensor& x);

// linear(layer, x), plus the adapter's update when add_lora adapted `layer`. Without an adapter
// the result is linear(layer, x) itself, bit for bit. As in peft, the adapter's input is cast to
// the adapter's dtype and the sum to the dtype of linear(layer, x), so fp32 adapters on a bf16
// base work under autocast.
at::Tensor apply_linear(const torch::nn::Linear& layer, const at::Tensor& x);

// True when add_lora adapted `layer`.
bool has_lora(const torch::nn::Linear& layer);

// The adapter tensors only, named `prefix` + the model's own state-dict key: with the default
// prefix, the keys of diffusers' SanaPipeline.save_lora_weights files, e.g.
// "transformer.transformer_blocks.0.attn1.to_q.lora_A.weight". In module order, A before B.
// The tensors are the live parameters (not copies).
std::vector<std::pair<std::string, at::Tensor>> lora_state_dict(
    const torch::nn::Module& root, const std::string& prefix = "transformer.");

// Writes lora_state_dict(root) to one safetensors file atomically, tensors as they are (dtype
// included), moved to the CPU. The file's metadata holds "format": "pt" and diffusers'
// "lora_adapter_metadata" (rank, alpha, dropout, targets as peft LoraConfig fields prefixed with
// "transformer."), so diffusers scales the update by alpha / rank as here, plus `metadata`.
// kInvalidArgument when `root` has no adapters or `metadata` uses one of those keys.
//
// bake_scale: lora_B is written multiplied by alpha / rank and the metadata says alpha = rank
// (the trained alpha kept as "sanaflow.trained_lora_alpha"), so every loader applies the same
// update W + B A: diffusers v0.33.1 ignores lora_adapter_metadata and would otherwise scale by 1.
// Such a file loads back (load_lora) into adapters with alpha = rank, or with the trained alpha
// (lora_B divided again). Training's final file and its checkpoints' are written this way.
void save_lora(const torch::nn::Module& root, const std::string& path,
               const std::map<std::string, std::string>& metadata = {}, bool bake_scale = false);

// Loads adapter weights into a model that add_lora has already adapted. `path`: a safetensors
// file or a directory holding one (diffusers' output_dir). Keys with the "transformer." prefix
// (pipeline files) or without it (diffusers' model.save_lora_adapter) are accepted. Strict: one
// kInvalidArgument listing every missing, misshaped and unexpected tensor, or a rank / alpha in
// the file's lora_adapter_metadata that differs from the model's; kNotFound / kCorruption from
// the file itself.
void load_lora(torch::nn::Module& root, const std::string& path);

// Casts the parameters with requires_grad == false (after add_lora: the frozen base) to `dtype`,
// leaving trainable ones (the adapters) and buffers as they are. The base's Linear layers then
// want inputs of `dtype`: run the forward under autocast to `dtype` (or feed `dtype` inputs),
// otherwise the first matmul fails on mixed dtypes.
void cast_frozen(torch::nn::Module& root, c10::ScalarType dtype);

// The parameters with requires_grad == true, by name, in named_parameters() order: what the
// optimizer should see (after add_lora, the adapters; without, every weight).
std::vector<std::pair<std::string, at::Tensor>> trainable_parameters(const torch::nn::Module& root);

}  // namespace sf::model

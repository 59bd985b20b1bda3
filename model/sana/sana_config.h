// The configuration of diffusers' SanaTransformer2DModel (v0.33.1): the fields of its
// `transformer/config.json`, read and written with the same keys, defaults as upstream's
// constructor, named configurations, and the parameter count computed from the numbers alone.
//
// Torch-free: the planner and `sanaflow models` use it without building a model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sf::model {

struct SanaTransformerConfig {
    // Defaults are upstream's constructor defaults, so a config.json that omits a key means what
    // it means to diffusers.
    int64_t in_channels = 32;
    int64_t out_channels = 32;  // null in config.json -> in_channels
    int64_t num_attention_heads = 70;
    int64_t attention_head_dim = 32;
    int64_t num_layers = 20;
    int64_t num_cross_attention_heads = 20;
    int64_t cross_attention_head_dim = 112;
    // The width of the caption tokens seen by the cross-attention: they are projected to the
    // model width first, so it must equal inner_dim().
    int64_t cross_attention_dim = 2240;
    int64_t caption_channels = 2304;
    double mlp_ratio = 2.5;
    double dropout = 0.0;
    bool attention_bias = false;  // bias of the self-attention's to_q/to_k/to_v
    // Latent size the model was trained at; sets the base grid of the sin-cos position embedding.
    int64_t sample_size = 32;
    int64_t patch_size = 1;
    bool norm_elementwise_affine = false;  // affine weights of the feed-forward's LayerNorm
    double norm_eps = 1e-6;
    // Set (2K/4K models): a sin-cos position embedding is added to the patch tokens.
    std::optional<double> interpolation_scale;
    // Sana-Sprint's guidance embedder: not implemented, refused by validate().
    bool guidance_embeds = false;
    double guidance_embeds_scale = 0.1;  // read by Sprint samplers only
    // Sana-1.5 / Sprint q-k normalisation: not implemented, only null is accepted.
    std::optional<std::string> qk_norm;
    // Sprint samplers multiply the timestep by this before calling the model; upstream's model
    // itself ignores it, and so does ours.
    double timestep_scale = 1.0;

    int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
    int64_t cross_inner_dim() const { return num_cross_attention_heads * cross_attention_head_dim; }
    // Mix-FFN hidden width: int(mlp_ratio * inner_dim), truncated as Python's int() does.
    int64_t ff_hidden_dim() const { return static_cast<int64_t>(mlp_ratio * inner_dim()); }

    // Throws sf::Error kInvalidArgument naming `where`, the first bad field and why.
    void validate(const std::string& where = "SanaTransformerConfig") const;

    // Parses a diffusers config.json. Unknown keys are ignored; a wrong type or a bad value is
    // kInvalidArgument naming the key and `where`. The result is validated.
    static SanaTransformerConfig from_json(const std::string& text,
                                           const std::string& where = "config JSON");
    // A file path, or a directory holding config.json. kNotFound when it is missing.
    static SanaTransformerConfig from_json_file(const std::string& path);
    // config.json text with upstream's keys (and _class_name), readable by diffusers.
    std::string to_json() const;

    // "sana-600m", "sana-1600m" (the 1024 px models), "sana-tiny" (tests and the demo).
    // kInvalidArgument listing the known names for any other.
    static SanaTransformerConfig named(const std::string& name);
    static std::vector<std::string> names();
};

// Number of parameter elements of SanaTransformer built from `config`, from the numbers alone:
// equals parameter_count() of the module, and sum(p.numel() for p in model.parameters()) upstream.
int64_t sana_parameter_count(const SanaTransformerConfig& config);

}  // namespace sf::model

// The configuration of diffusers' SanaVideoTransformer3DModel (v0.36.0,
// models/transformers/transformer_sana_video.py): the fields of its `transformer/config.json`,
// read and written with the same keys, upstream's constructor defaults, the named SANA-Video
// configurations and the parameter count computed from the numbers alone.
//
// Torch-free: the planner and `sanaflow models` use it without building a model.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sf::model {

struct SanaVideoTransformerConfig {
    // Defaults are upstream's constructor defaults, so a config.json that omits a key means what
    // it means to diffusers.
    int64_t in_channels = 16;
    int64_t out_channels = 16;  // null in config.json -> in_channels
    int64_t num_attention_heads = 20;
    int64_t attention_head_dim = 112;
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
    int64_t sample_size = 30;     // recorded only: the model has no position table of that size
    std::array<int64_t, 3> patch_size{1, 2, 2};  // frames, height, width
    bool norm_elementwise_affine = false;        // affine weights of the feed-forward's LayerNorm
    double norm_eps = 1e-6;
    std::optional<double> interpolation_scale;  // recorded only: upstream's model ignores it
    // SanaCombinedTimestepGuidanceEmbeddings: a guidance value embedded beside the timestep.
    bool guidance_embeds = false;
    double guidance_embeds_scale = 0.1;  // read by samplers only
    // "rms_norm_across_heads" (RMSNorm of q and k over all heads) or null (none).
    std::optional<std::string> qk_norm = std::string("rms_norm_across_heads");
    // Rows of the rotary tables: the most frames, rows or columns of patches a latent may have.
    int64_t rope_max_seq_len = 1024;

    int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
    int64_t cross_inner_dim() const { return num_cross_attention_heads * cross_attention_head_dim; }
    // GLUMBTempConv hidden width: int(mlp_ratio * inner_dim), truncated as Python's int() does.
    int64_t ff_hidden_dim() const { return static_cast<int64_t>(mlp_ratio * inner_dim()); }
    int64_t patch_volume() const { return patch_size[0] * patch_size[1] * patch_size[2]; }

    // Throws sf::Error kInvalidArgument naming `where`, the first bad field and why.
    void validate(const std::string& where = "SanaVideoTransformerConfig") const;

    // Parses a diffusers config.json. Unknown keys are ignored; a wrong type or a bad value is
    // kInvalidArgument naming the key and `where`. The result is validated.
    static SanaVideoTransformerConfig from_json(const std::string& text,
                                                const std::string& where = "config JSON");
    // A file path, or a directory holding config.json. kNotFound when it is missing.
    static SanaVideoTransformerConfig from_json_file(const std::string& path);
    // config.json text with upstream's keys (and _class_name), readable by diffusers.
    std::string to_json() const;

    // "sana-video-2b-480p" (patch 1x2x2 over Wan2.1 latents), "sana-video-2b-720p" (patch
    // 1x1x1), as diffusers' scripts/convert_sana_video_to_diffusers.py builds them, and
    // "sana-video-tiny" (tests and the demo). kInvalidArgument listing the names for any other.
    static SanaVideoTransformerConfig named(const std::string& name);
    static std::vector<std::string> names();
};

// Number of parameter elements of SanaVideoTransformer built from `config`, from the numbers
// alone: equals parameter_count() of the module, and sum(p.numel() for p in
// model.parameters()) upstream.
int64_t sana_video_parameter_count(const SanaVideoTransformerConfig& config);

}  // namespace sf::model

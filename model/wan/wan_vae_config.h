// The configuration of Wan2.1's video VAE, diffusers `AutoencoderKLWan` (v0.33.1; the keys v0.36.0
// added are read too): every field of its config.json, read and validated without LibTorch (so
// the CLI and the memory planner can size the model without building it). The module is in
// model/wan/autoencoder_kl_wan.h.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

namespace sf::model {

// Upstream's config keys with upstream's constructor defaults, which are Wan2.1's own VAE (the one
// SANA-Video uses): named("wan2.1-vae") is the same.
struct WanVAEConfig {
    int64_t base_dim = 96;
    std::optional<int64_t> decoder_base_dim;  // null: base_dim
    int64_t z_dim = 16;
    std::vector<int64_t> dim_mult = {1, 2, 4, 4};
    int64_t num_res_blocks = 2;
    // Upstream's encoder fails at its first forward with any scale here and its decoder ignores
    // them, so only an empty list is a model that runs.
    std::vector<double> attn_scales;
    // One entry per downsampling stage (len(dim_mult) - 1). Upstream's spelling, kept in the
    // key; the decoder upsamples in the reverse order.
    std::vector<bool> temperal_downsample = {false, true, true};
    double dropout = 0.0;  // training only; encoding runs in eval mode
    // Per-channel statistics the pipelines normalise the posterior mean with (z_dim each).
    std::vector<double> latents_mean = {-0.7571, -0.7089, -0.9113, 0.1075,  -0.1745, 0.9653,
                                        -0.1517, 1.5508,  0.4134,  -0.0715, 0.5517,  -0.3632,
                                        -0.1922, -0.9497, 0.2503,  -0.2921};
    std::vector<double> latents_std = {2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708,
                                       2.6052, 2.0743, 3.2687, 2.1526, 2.8652, 1.5579,
                                       1.6382, 1.1253, 2.8251, 1.9160};
    // v0.36.0 keys: Wan2.2's residual blocks and patchified input are not Wan2.1 and are refused.
    bool is_residual = false;
    int64_t in_channels = 3;
    int64_t out_channels = 3;
    std::optional<int64_t> patch_size;
    int64_t scale_factor_temporal = 4;
    int64_t scale_factor_spatial = 8;

    int64_t decoder_dim() const { return decoder_base_dim.value_or(base_dim); }
    // 2^(downsampling stages): frame side / latent side.
    int64_t spatial_compression_ratio() const;
    // 2^(temporal downsampling stages): T = 1 + ratio k frames give 1 + k latent frames.
    int64_t temporal_compression_ratio() const;
    // Latent frames of `frames` pixel frames; kInvalidArgument unless frames = 1 + ratio k.
    int64_t latent_frames(int64_t frames) const;

    // Throws sf::Error kInvalidArgument naming `source` and the field at fault.
    void validate(const std::string& source = "WanVAEConfig") const;

    // From a diffusers config.json object: unknown keys are ignored; another `_class_name`, a key
    // with the wrong type or an invalid value is kInvalidArgument naming the key and `source`.
    static WanVAEConfig from_json(const nlohmann::json& json,
                                  const std::string& source = "config.json");
    static WanVAEConfig from_json_text(const std::string& text,
                                       const std::string& source = "config.json");
    // `path` is a config.json file or a directory holding one (a `vae/`). kNotFound when missing.
    static WanVAEConfig from_json_file(const std::string& path);
    // A diffusers-layout config.json text with every field.
    std::string to_json_text() const;

    // "wan2.1-vae" (Wan-AI/Wan2.1-T2V-1.3B-Diffusers vae/, as SANA-Video uses it) or
    // "wan-vae-tiny" (tests and the demo: the golden tiny model's structure, base_dim 4, z_dim 8).
    static WanVAEConfig named(const std::string& name);
    static std::vector<std::string> names();
};

bool operator==(const WanVAEConfig& a, const WanVAEConfig& b);
inline bool operator!=(const WanVAEConfig& a, const WanVAEConfig& b) { return !(a == b); }

// Exactly the module's parameter count, computed from the structure without allocating: the
// whole VAE, or (with_decoder = false) the encoder and quant_conv that caching latents needs.
int64_t wan_vae_parameter_count(const WanVAEConfig& config, bool with_decoder = true);

}  // namespace sf::model

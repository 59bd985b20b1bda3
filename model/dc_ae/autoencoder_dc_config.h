// The configuration of DC-AE, diffusers v0.33.1 `AutoencoderDC`: every field of its config.json,
// read and validated without LibTorch (so the CLI and the memory planner can size a model
// without building it). The module itself is in model/autoencoder_dc.h.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace sf::model {

// Upstream's config keys; list-or-string keys are stored expanded to one entry per stage, as
// upstream expands them. Defaults are upstream's constructor defaults (which are NOT the f32c32
// model: use named("dc-ae-f32c32") for that).
struct AutoencoderDCConfig {
    int64_t in_channels = 3;
    int64_t latent_channels = 32;
    int64_t attention_head_dim = 32;
    // "ResBlock" or "EfficientViTBlock", one per stage.
    std::vector<std::string> encoder_block_types = std::vector<std::string>(6, "ResBlock");
    std::vector<std::string> decoder_block_types = std::vector<std::string>(6, "ResBlock");
    std::vector<int64_t> encoder_block_out_channels = {128, 256, 512, 512, 1024, 1024};
    std::vector<int64_t> decoder_block_out_channels = {128, 256, 512, 512, 1024, 1024};
    std::vector<int64_t> encoder_layers_per_block = {2, 2, 2, 3, 3, 3};
    std::vector<int64_t> decoder_layers_per_block = {3, 3, 3, 3, 3, 3};
    // Kernel sizes of the multi-scale q/k/v aggregation per stage (EfficientViT stages only).
    std::vector<std::vector<int64_t>> encoder_qkv_multiscales = {{}, {}, {}, {5}, {5}, {5}};
    std::vector<std::vector<int64_t>> decoder_qkv_multiscales = {{}, {}, {}, {5}, {5}, {5}};
    // "interpolate" (nearest 2x then conv) or "pixel_shuffle" (conv to 4x channels, shuffle).
    std::string upsample_block_type = "pixel_shuffle";
    // "pixel_unshuffle" (conv to C/4, unshuffle) or "conv" (stride-2 conv). Real configs spell
    // the latter "Conv": upstream only tests for "pixel_unshuffle", so any case of "conv" is it.
    std::string downsample_block_type = "pixel_unshuffle";
    // "rms_norm" or "batch_norm" per decoder stage; the encoder always uses rms_norm.
    std::vector<std::string> decoder_norm_types = std::vector<std::string>(6, "rms_norm");
    // "silu" (= "swish"), "relu", "gelu", "mish" per decoder stage; the encoder always uses silu.
    std::vector<std::string> decoder_act_fns = std::vector<std::string>(6, "silu");
    // Keys of later diffusers versions (v0.33.1 writes none of them); their defaults are what
    // v0.33.1 always does.
    bool encoder_out_shortcut = true;
    bool decoder_in_shortcut = true;
    std::string decoder_conv_act_fn = "relu";
    // Latents for the diffusion model are encoder output * scaling_factor.
    double scaling_factor = 1.0;

    // 2^(stages - 1): image side / latent side, as upstream's spatial_compression_ratio.
    int64_t spatial_compression_ratio() const;
    bool downsample_is_pixel_unshuffle() const {
        return downsample_block_type == "pixel_unshuffle";
    }
    bool upsample_is_interpolate() const { return upsample_block_type == "interpolate"; }

    // Throws sf::Error kInvalidArgument naming `source` and the field (and the stage) at fault.
    void validate(const std::string& source = "AutoencoderDCConfig") const;

    // From a diffusers config.json object: unknown keys are ignored; another `_class_name`, a key
    // with the wrong type or an invalid value is kInvalidArgument naming the key and `source`.
    // Validated.
    static AutoencoderDCConfig from_json(const nlohmann::json& json,
                                         const std::string& source = "config.json");
    // The same from JSON text.
    static AutoencoderDCConfig from_json_text(const std::string& text,
                                              const std::string& source = "config.json");
    // `path` is a config.json file or a directory holding one (e.g. `vae/`). kNotFound when it
    // is missing.
    static AutoencoderDCConfig from_json_file(const std::string& path);
    // A diffusers-layout config.json text with every field (lists written out per stage).
    std::string to_json_text() const;

    // "dc-ae-f32c32" (mit-han-lab/dc-ae-f32c32-sana-1.0-diffusers, Sana's VAE) or "dc-ae-tiny"
    // (tests and the demo: tests/data/golden/vae, 8x compression, 8 latent channels).
    static AutoencoderDCConfig named(const std::string& name);
    static std::vector<std::string> names();
};

bool operator==(const AutoencoderDCConfig& a, const AutoencoderDCConfig& b);
inline bool operator!=(const AutoencoderDCConfig& a, const AutoencoderDCConfig& b) {
    return !(a == b);
}

// sum(p.numel() for p in AutoencoderDC(config).parameters()) (buffers not counted), computed
// without building the model. Without the decoder: the encoder's parameters only.
int64_t dc_ae_parameter_count(const AutoencoderDCConfig& config, bool with_decoder = true);

}  // namespace sf::model

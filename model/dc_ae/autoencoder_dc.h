// DC-AE, diffusers v0.33.1 `AutoencoderDC` (Sana's f32c32 VAE), in LibTorch. Parameter and buffer
// names equal diffusers' state-dict keys (`encoder.conv_in.weight`,
// `encoder.down_blocks.3.0.attn.to_qkv_multiscale.0.proj_in.weight`, `decoder.up_blocks.0.0.conv
// .weight`, `decoder.norm_out.bias`, ...), so a diffusers `vae/` directory loads by name.
//
// Caching latents needs only the encoder: build with `with_decoder = false` (and load with
// load_autoencoder_dc(dir, false), which skips the checkpoint's decoder.* tensors) to hold about
// a third of the weights.
//
// Run it in eval mode (load_autoencoder_dc sets it): configurations with batch_norm decoder
// stages normalise with batch statistics in training mode, as upstream does.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>

#include "model/common/weights.h"
#include "model/dc_ae/autoencoder_dc_config.h"
#include "model/dc_ae/dc_ae_blocks.h"

namespace sf::model {

// diffusers' autoencoder_dc.Encoder: conv_in, down_blocks.N (Sequential: the stage's blocks, then
// its DCDownBlock2d), conv_out, and the averaging out-shortcut.
class DCEncoderImpl : public torch::nn::Module {
public:
    explicit DCEncoderImpl(const AutoencoderDCConfig& config,
                           std::shared_ptr<dc_ae::AttentionCalls> calls = nullptr);
    torch::Tensor forward(const torch::Tensor& x);

    // How many times the encoder halves H and W (its DCDownBlock2d count).
    int64_t downsample_factor() const { return downsample_factor_; }

    torch::nn::AnyModule conv_in;  // Conv2d, or DCDownBlock2d when stage 0 has no layers
    torch::nn::ModuleList down_blocks{nullptr};
    torch::nn::Conv2d conv_out{nullptr};

private:
    bool out_shortcut_;
    int64_t out_group_size_;
    int64_t downsample_factor_ = 1;
};
TORCH_MODULE(DCEncoder);

// diffusers' autoencoder_dc.Decoder: conv_in with the repeating in-shortcut, up_blocks.N
// (Sequential: the stage's DCUpBlock2d, then its blocks; run from the last stage to the first),
// norm_out (RMSNorm with bias), conv_act, conv_out.
class DCDecoderImpl : public torch::nn::Module {
public:
    explicit DCDecoderImpl(const AutoencoderDCConfig& config,
                           std::shared_ptr<dc_ae::AttentionCalls> calls = nullptr);
    torch::Tensor forward(const torch::Tensor& z);

    torch::nn::Conv2d conv_in{nullptr};
    torch::nn::ModuleList up_blocks{nullptr};
    dc_ae::ChannelRMSNorm norm_out{nullptr};
    torch::nn::AnyModule conv_out;  // Conv2d, or DCUpBlock2d when stage 0 has no layers

private:
    bool in_shortcut_;
    int64_t in_repeats_;
    dc_ae::Activation conv_act_;
};
TORCH_MODULE(DCDecoder);

// Tiles for encode_tiled / decode_tiled, in image pixels as upstream's tile_sample_min_* and
// tile_sample_stride_* (upstream's defaults: 512 and 448, an overlap of 64 px, 2 latent px).
struct DCAETiling {
    int64_t tile_height = 512;
    int64_t tile_width = 512;
    int64_t stride_height = 448;
    int64_t stride_width = 448;
};

class AutoencoderDCImpl : public torch::nn::Module {
public:
    explicit AutoencoderDCImpl(const AutoencoderDCConfig& config, bool with_decoder = true);

    // image [B, in_channels, H, W] in [-1, 1], H and W multiples of the compression ratio ->
    // the raw latent [B, latent_channels, H / r, W / r] (not multiplied by scaling_factor).
    torch::Tensor encode(const torch::Tensor& image);
    // latent [B, latent_channels, h, w] (raw) -> image [B, in_channels, h r, w r].
    torch::Tensor decode(const torch::Tensor& latent);

    // Upstream's tiled_encode: the image cut into tiles at `stride` steps (edge tiles smaller and
    // zero-padded to a multiple of the compression ratio), each encoded alone, each tile's first
    // rows and columns blended linearly with its upper and left neighbours over the overlap, then
    // cropped to H / r x W / r. Memory follows the tile, not the image. Any H, W (a partial last
    // latent row is dropped, as upstream). `tiles`, when given, receives the tile count.
    torch::Tensor encode_tiled(const torch::Tensor& image, int64_t tile = 512, int64_t stride = 448,
                               int64_t* tiles = nullptr);
    torch::Tensor encode_tiled(const torch::Tensor& image, const DCAETiling& tiling,
                               int64_t* tiles = nullptr);
    // Upstream's tiled_decode: latent tiles of tile / r at stride / r, blended over
    // (tile - stride) image pixels.
    torch::Tensor decode_tiled(const torch::Tensor& latent, const DCAETiling& tiling = {},
                               int64_t* tiles = nullptr);

    // The latents the diffusion model sees, and back (Sana's pipeline divides on the way back).
    torch::Tensor scale_latent(const torch::Tensor& latent) const {
        return latent * config_.scaling_factor;
    }
    torch::Tensor unscale_latent(const torch::Tensor& latent) const {
        return latent / config_.scaling_factor;
    }

    const AutoencoderDCConfig& config() const { return config_; }
    bool has_decoder() const { return !decoder.is_empty(); }
    int64_t spatial_compression_ratio() const { return config_.spatial_compression_ratio(); }
    // Attention calls since construction (linear vs upstream's quadratic small-map path).
    const dc_ae::AttentionCalls& attention_calls() const { return *calls_; }

    DCEncoder encoder{nullptr};
    DCDecoder decoder{nullptr};  // empty when built without the decoder

private:
    AutoencoderDCConfig config_;
    std::shared_ptr<dc_ae::AttentionCalls> calls_;
};
TORCH_MODULE(AutoencoderDC);

// Loads weights into `model` (a .safetensors file, an index, or a directory, as load_weights).
// A model built without its decoder skips the checkpoint's decoder.* tensors; every encoder
// tensor must still be there with its shape.
LoadReport load_autoencoder_dc_weights(AutoencoderDC& model, const std::string& path,
                                       const LoadOptions& options = {});

// Builds the model from `dir`/config.json, loads `dir`'s weights and sets eval mode.
AutoencoderDC load_autoencoder_dc(const std::string& dir, bool with_decoder = true,
                                  const LoadOptions& options = {});

}  // namespace sf::model

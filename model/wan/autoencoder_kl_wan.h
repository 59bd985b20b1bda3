// Wan2.1's causal video VAE, diffusers `AutoencoderKLWan` (v0.33.1; v0.36.0 computes the same), in
// LibTorch, as SANA-Video uses it: 8x spatial and 4x temporal compression, z_dim latent channels.
// Parameter names are upstream's state-dict keys (`encoder.down_blocks.5.time_conv.weight`,
// `decoder.up_blocks.0.upsamplers.0.resample.1.weight`, `quant_conv.weight`, ...), so a diffusers
// `vae/` directory of Wan2.1 loads by name.
//
// Encoding is causal and chunked exactly as upstream: frame 0 alone, then 4-frame chunks, each
// causal convolution carrying the end of its input to the next chunk (wan_vae_blocks.h). There is
// no cache-free whole-clip path (upstream's has no temporal downsampling). T = 1 + 4k frames give
// 1 + k latent frames, and the latents of a prefix are a prefix of the latents. WanEncodeSession
// takes the frames as they come, so pixel memory is one chunk whatever the clip's length.
//
// The VAE has no scaling factor: pipelines normalise the posterior mean per channel with the
// config's latents_mean / latents_std (normalize_latent), and decoding inverts that first.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/common/weights.h"
#include "model/wan/wan_vae_blocks.h"
#include "model/wan/wan_vae_config.h"

namespace sf::model {

// WanEncoder3d: conv_in, down_blocks.N (a flat list: each stage's residual blocks, then its
// downsampler), mid_block, norm_out, conv_out to 2 z_dim channels (mean and log-variance).
class WanEncoder3dImpl : public torch::nn::Module {
public:
    explicit WanEncoder3dImpl(const WanVAEConfig& config);
    // One chunk [B, C, T, H, W] (T = 1 for a clip's first frame, else the temporal ratio) ->
    // [B, 2 z, 1, H / 8, W / 8], advancing `cache`.
    torch::Tensor forward(const torch::Tensor& x, wan::CausalCache& cache);

    wan::CausalConv3d conv_in{nullptr}, conv_out{nullptr};
    torch::nn::ModuleList down_blocks{nullptr};
    wan::MidBlock mid_block{nullptr};
    wan::RMSNorm norm_out{nullptr};

private:
    // down_blocks in order, each a residual block or a downsampler (the other one null).
    std::vector<std::pair<wan::ResidualBlock, wan::Resample>> layers_;
};
TORCH_MODULE(WanEncoder3d);

// WanDecoder3d: conv_in, mid_block, up_blocks.N (resnets.M, upsamplers.0), norm_out, conv_out.
class WanDecoder3dImpl : public torch::nn::Module {
public:
    explicit WanDecoder3dImpl(const WanVAEConfig& config);
    // One latent frame [B, z, 1, h, w] -> [B, out, 1 (the first) or 4, 8 h, 8 w], unclamped.
    torch::Tensor forward(const torch::Tensor& z, wan::CausalCache& cache);

    wan::CausalConv3d conv_in{nullptr}, conv_out{nullptr};
    wan::MidBlock mid_block{nullptr};
    torch::nn::ModuleList up_blocks{nullptr};
    wan::RMSNorm norm_out{nullptr};

private:
    struct Stage {
        std::vector<wan::ResidualBlock> resnets;
        wan::Resample upsampler{nullptr};  // null in the last stage
    };
    std::vector<Stage> stages_;
};
TORCH_MODULE(WanDecoder3d);

// Spatial tiles, in frame pixels (upstream's tile_sample_min_* and tile_sample_stride_*: 256 and
// 192, an overlap of 64 px = 8 latent px blended).
struct WanTiling {
    int64_t tile_height = 256;
    int64_t tile_width = 256;
    int64_t stride_height = 192;
    int64_t stride_width = 192;
};

class AutoencoderKLWanImpl : public torch::nn::Module {
public:
    explicit AutoencoderKLWanImpl(const WanVAEConfig& config, bool with_decoder = true);

    // video [B, 3, T, H, W] in [-1, 1], T = 1 + 4k, H and W multiples of 8 -> the posterior's
    // parameters [B, 2 z, 1 + k, H / 8, W / 8] (mean, then log-variance unclamped). With a tiling,
    // upstream's tiled_encode (frames wider or taller than a tile only).
    torch::Tensor encode(const torch::Tensor& video, const WanTiling* tiling = nullptr);
    // latent [B, z, t, h, w] (raw, not normalised) -> video [B, 3, 1 + 4 (t - 1), 8 h, 8 w],
    // clamped to [-1, 1] as upstream returns it unless `clamp` is false. With a tiling, upstream's
    // tiled_decode (latents wider or taller than a tile only): each tile of latents decoded over
    // every frame with its own causal cache, the tiles blended in pixel space over their overlap,
    // so the decoder's activations are a tile's.
    torch::Tensor decode(const torch::Tensor& latent, bool clamp = true,
                         const WanTiling* tiling = nullptr);

    // Posterior parameters -> mean [B, z, ...] and log-variance clamped to [-30, 20] (upstream's
    // DiagonalGaussianDistribution).
    torch::Tensor posterior_mean(const torch::Tensor& params) const;
    torch::Tensor posterior_logvar(const torch::Tensor& params) const;
    // The pipelines' per-channel normalisation of the mean: (mean - latents_mean) / latents_std
    // (computed as upstream's pipelines do, times 1 / std); denormalize_latent inverts it.
    torch::Tensor normalize_latent(const torch::Tensor& mean) const;
    torch::Tensor denormalize_latent(const torch::Tensor& latent) const;

    const WanVAEConfig& config() const { return config_; }
    bool has_decoder() const { return !decoder.is_empty(); }

    WanEncoder3d encoder{nullptr};
    wan::CausalConv3d quant_conv{nullptr};
    wan::CausalConv3d post_quant_conv{nullptr};  // with the decoder only
    WanDecoder3d decoder{nullptr};               // empty when built without it

private:
    torch::Tensor channel_stats(const std::vector<double>& v, const torch::Tensor& like) const;
    // Every latent frame through post_quant_conv and the decoder with one causal cache, unclamped.
    torch::Tensor decode_frames(const torch::Tensor& latent);

    WanVAEConfig config_;
};
TORCH_MODULE(AutoencoderKLWan);

// Encodes a clip as its frames arrive: push() any number of frames [B, 3, n, H, W]; the frames
// are held only until a chunk is complete (the first frame alone, then every 4), so memory is one
// chunk and the causal cache, not the clip. Each complete chunk gives one latent frame (posterior
// parameters, [B, 2 z, 1, h, w]). Pushing the whole clip at once or frame by frame gives the same
// latents. With a tiling, every tile keeps its own causal cache and each chunk's tiles are
// blended as upstream's tiled_encode blends them.
class WanEncodeSession {
public:
    // `vae` must outlive the session.
    explicit WanEncodeSession(AutoencoderKLWanImpl& vae, const WanTiling* tiling = nullptr);

    // The latent frames the new frames completed, concatenated in time ([B, 2 z, k, h, w], k >= 0;
    // undefined when none). kInvalidArgument on a frame of another shape than the first one's.
    torch::Tensor push(const torch::Tensor& frames);
    int64_t frames_pushed() const { return frames_pushed_; }
    int64_t latent_frames() const { return latent_frames_; }
    // No frame waits for the rest of its chunk: frames_pushed() = 1 + 4 k.
    bool complete() const { return pending_.empty() && frames_pushed_ > 0; }
    // Bytes held between chunks: the causal caches and the waiting frames.
    int64_t held_bytes() const;

private:
    torch::Tensor encode_chunk(const torch::Tensor& chunk);

    AutoencoderKLWanImpl* vae_;
    bool tiled_ = false;
    WanTiling tiling_;
    std::vector<wan::CausalCache> caches_;  // one per tile (one when not tiled), row by row
    std::vector<torch::Tensor> pending_;    // frames of the chunk being filled, [B, 3, 1, H, W]
    std::vector<int64_t> frame_shape_;
    int64_t frames_pushed_ = 0, latent_frames_ = 0;
};

// Loads weights into `model` (a .safetensors file, an index, or a directory, as load_weights). A
// model built without its decoder skips the checkpoint's decoder.* and post_quant_conv.* tensors.
LoadReport load_autoencoder_kl_wan_weights(AutoencoderKLWan& model, const std::string& path,
                                           const LoadOptions& options = {});

// Builds the model from `dir`/config.json, loads `dir`'s weights and sets eval mode.
AutoencoderKLWan load_autoencoder_kl_wan(const std::string& dir, bool with_decoder = true,
                                         const LoadOptions& options = {});

}  // namespace sf::model

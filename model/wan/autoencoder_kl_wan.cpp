#include "model/wan/autoencoder_kl_wan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <array>
#include <tuple>

#include "core/check.h"
#include "core/error.h"
#include "core/shape.h"
#include "model/common/tile_blend.h"

namespace sf::model {
namespace {

using wan::CausalConv3d;
using wan::ResampleMode;

constexpr std::array<int64_t, 3> k333{3, 3, 3}, k111{1, 1, 1}, pad111{1, 1, 1};

CausalConv3d conv3(int64_t in, int64_t out) { return CausalConv3d(in, out, k333, k111, pad111); }

void check_video(const torch::Tensor& x, int64_t channels, int64_t multiple, const char* what) {
    if (x.dim() != 5 || x.size(1) != channels || x.size(3) % multiple != 0 ||
        x.size(4) % multiple != 0 || x.size(2) < 1) {
        throw Error::InvalidArgument(fmt::format(
            "AutoencoderKLWan {}: expected [B, {}, T, H, W] with H and W multiples of {}, got {}",
            what, channels, multiple, shape_string(x)));
    }
}

void check_tiling(const WanTiling& t, int64_t ratio) {
    for (auto [tile, stride, name] : {std::tuple{t.tile_height, t.stride_height, "height"},
                                      std::tuple{t.tile_width, t.stride_width, "width"}}) {
        if (tile <= 0 || stride <= 0 || stride > tile || tile % ratio != 0 || stride % ratio != 0) {
            throw Error::InvalidArgument(
                fmt::format("AutoencoderKLWan tiling {}: tile {} and stride {} must be positive "
                            "multiples of the compression ratio {}, stride <= tile",
                            name, tile, stride, ratio));
        }
    }
}

}  // namespace

WanEncoder3dImpl::WanEncoder3dImpl(const WanVAEConfig& c) {
    c.validate();
    conv_in = register_module("conv_in", conv3(c.in_channels, c.base_dim));
    down_blocks = register_module("down_blocks", torch::nn::ModuleList());
    int64_t in = c.base_dim;
    const size_t stages = c.dim_mult.size();
    for (size_t i = 0; i < stages; ++i) {
        const int64_t out = c.base_dim * c.dim_mult[i];
        for (int64_t b = 0; b < c.num_res_blocks; ++b) {
            wan::ResidualBlock block(in, out);
            down_blocks->push_back(block);
            layers_.emplace_back(block, nullptr);
            in = out;
        }
        if (i + 1 < stages) {
            wan::Resample down(out,
                               c.temperal_downsample[i] ? ResampleMode::kDownsample3d
                                                        : ResampleMode::kDownsample2d,
                               out);
            down_blocks->push_back(down);
            layers_.emplace_back(nullptr, down);
        }
    }
    mid_block = register_module("mid_block", wan::MidBlock(in));
    norm_out = register_module("norm_out", wan::RMSNorm(in, false));
    conv_out = register_module("conv_out", conv3(in, 2 * c.z_dim));
}

torch::Tensor WanEncoder3dImpl::forward(const torch::Tensor& x, wan::CausalCache& cache) {
    cache.begin_chunk();
    torch::Tensor y = conv_in->forward_cached(x, cache.next_slot());
    for (auto& [block, resample] : layers_) {
        y = block ? block->forward(y, &cache) : resample->forward(y, &cache);
    }
    y = mid_block->forward(y, &cache);
    y = torch::silu(norm_out(y));
    return conv_out->forward_cached(y, cache.next_slot());
}

WanDecoder3dImpl::WanDecoder3dImpl(const WanVAEConfig& c) {
    c.validate();
    const size_t stages = c.dim_mult.size();
    const int64_t top = c.decoder_dim() * c.dim_mult.back();
    conv_in = register_module("conv_in", conv3(c.z_dim, top));
    mid_block = register_module("mid_block", wan::MidBlock(top));
    up_blocks = register_module("up_blocks", torch::nn::ModuleList());
    int64_t in = top;
    for (size_t i = 0; i < stages; ++i) {
        const int64_t out = c.decoder_dim() * c.dim_mult[stages - 1 - i];
        if (i > 0) in /= 2;  // Wan2.1's upsamplers halve the width
        auto block = std::make_shared<torch::nn::Module>();
        torch::nn::ModuleList resnets;
        Stage stage;
        for (int64_t b = 0; b <= c.num_res_blocks; ++b) {
            stage.resnets.emplace_back(in, out);
            resnets->push_back(stage.resnets.back());
            in = out;
        }
        block->register_module("resnets", resnets);
        if (i + 1 < stages) {
            // temperal_upsample = temperal_downsample reversed
            const bool temporal = c.temperal_downsample[stages - 2 - i];
            stage.upsampler = wan::Resample(
                out, temporal ? ResampleMode::kUpsample3d : ResampleMode::kUpsample2d, out / 2);
            torch::nn::ModuleList upsamplers;
            upsamplers->push_back(stage.upsampler);
            block->register_module("upsamplers", upsamplers);
        }
        up_blocks->push_back(block);
        stages_.push_back(std::move(stage));
    }
    norm_out = register_module("norm_out", wan::RMSNorm(in, false));
    conv_out = register_module("conv_out", conv3(in, c.out_channels));
}

torch::Tensor WanDecoder3dImpl::forward(const torch::Tensor& z, wan::CausalCache& cache) {
    cache.begin_chunk();
    torch::Tensor y = conv_in->forward_cached(z, cache.next_slot());
    y = mid_block->forward(y, &cache);
    for (Stage& stage : stages_) {
        for (auto& resnet : stage.resnets) y = resnet->forward(y, &cache);
        if (stage.upsampler) y = stage.upsampler->forward(y, &cache);
    }
    y = torch::silu(norm_out(y));
    return conv_out->forward_cached(y, cache.next_slot());
}

AutoencoderKLWanImpl::AutoencoderKLWanImpl(const WanVAEConfig& config, bool with_decoder)
    : config_(config) {
    config_.validate();
    const int64_t z = config_.z_dim;
    encoder = register_module("encoder", WanEncoder3d(config_));
    quant_conv = register_module("quant_conv", CausalConv3d(2 * z, 2 * z, k111));
    if (with_decoder) {
        post_quant_conv = register_module("post_quant_conv", CausalConv3d(z, z, k111));
        decoder = register_module("decoder", WanDecoder3d(config_));
    }
}

torch::Tensor AutoencoderKLWanImpl::encode(const torch::Tensor& video, const WanTiling* tiling) {
    check_video(video, config_.in_channels, config_.spatial_compression_ratio(), "encode input");
    config_.latent_frames(video.size(2));  // refuses T != 1 + 4k
    WanEncodeSession session(*this, tiling);
    return session.push(video);
}

torch::Tensor AutoencoderKLWanImpl::decode_frames(const torch::Tensor& latent) {
    const torch::Tensor x = post_quant_conv(latent);
    wan::CausalCache cache;
    std::vector<torch::Tensor> frames;
    for (int64_t i = 0; i < x.size(2); ++i) {
        frames.push_back(decoder->forward(x.slice(2, i, i + 1), cache));  // one latent frame
    }
    return torch::cat(frames, 2);
}

torch::Tensor AutoencoderKLWanImpl::decode(const torch::Tensor& latent, bool clamp,
                                           const WanTiling* tiling) {
    if (!has_decoder()) {
        throw Error::InvalidArgument(
            "AutoencoderKLWan decode: this model was built without its decoder");
    }
    check_video(latent, config_.z_dim, 1, "decode input");
    const int64_t r = config_.spatial_compression_ratio();
    if (tiling != nullptr) check_tiling(*tiling, r);
    const int64_t height = latent.size(3), width = latent.size(4);
    torch::Tensor out;
    if (tiling == nullptr ||
        (height <= tiling->tile_height / r && width <= tiling->tile_width / r)) {
        out = decode_frames(latent);
    } else {
        // Upstream's tiled_decode: tiles of tile / r latent cells at stride / r steps, each
        // decoded alone (post_quant_conv is 1x1x1: per tile as per frame), blended over
        // tile - stride pixels and cropped to the stride.
        std::vector<std::vector<torch::Tensor>> grid;
        for (int64_t i = 0; i < height; i += tiling->stride_height / r) {
            auto& row = grid.emplace_back();
            for (int64_t j = 0; j < width; j += tiling->stride_width / r) {
                row.push_back(decode_frames(latent.slice(3, i, i + tiling->tile_height / r)
                                                .slice(4, j, j + tiling->tile_width / r)));
            }
        }
        out = assemble_tiles(grid, tiling->tile_height - tiling->stride_height,
                             tiling->tile_width - tiling->stride_width, tiling->stride_height,
                             tiling->stride_width)
                  .slice(3, 0, height * r)
                  .slice(4, 0, width * r);
    }
    return clamp ? out.clamp(-1.0, 1.0) : out;
}

torch::Tensor AutoencoderKLWanImpl::posterior_mean(const torch::Tensor& params) const {
    return params.slice(1, 0, config_.z_dim);
}

torch::Tensor AutoencoderKLWanImpl::posterior_logvar(const torch::Tensor& params) const {
    return params.slice(1, config_.z_dim, 2 * config_.z_dim).clamp(-30.0, 20.0);
}

torch::Tensor AutoencoderKLWanImpl::channel_stats(const std::vector<double>& v,
                                                  const torch::Tensor& like) const {
    std::vector<float> f(v.begin(), v.end());
    // [z] -> [1, z, 1, 1, 1]
    return torch::tensor(f, torch::kFloat).view({1, -1, 1, 1, 1}).to(like.options());
}

torch::Tensor AutoencoderKLWanImpl::normalize_latent(const torch::Tensor& mean) const {
    const torch::Tensor inv_std = 1.0 / channel_stats(config_.latents_std, mean);
    return (mean - channel_stats(config_.latents_mean, mean)) * inv_std;
}

torch::Tensor AutoencoderKLWanImpl::denormalize_latent(const torch::Tensor& latent) const {
    const torch::Tensor inv_std = 1.0 / channel_stats(config_.latents_std, latent);
    return latent / inv_std + channel_stats(config_.latents_mean, latent);
}

WanEncodeSession::WanEncodeSession(AutoencoderKLWanImpl& vae, const WanTiling* tiling)
    : vae_(&vae) {
    if (tiling != nullptr) {
        check_tiling(*tiling, vae_->config().spatial_compression_ratio());
        tiled_ = true;
        tiling_ = *tiling;
    }
}

int64_t WanEncodeSession::held_bytes() const {
    int64_t n = 0;
    for (const auto& c : caches_) n += c.bytes();
    for (const auto& f : pending_) n += static_cast<int64_t>(f.nbytes());
    return n;
}

torch::Tensor WanEncodeSession::push(const torch::Tensor& frames) {
    const WanVAEConfig& c = vae_->config();
    check_video(frames, c.in_channels, c.spatial_compression_ratio(), "encode input");
    std::vector<int64_t> shape = {frames.size(0), frames.size(3), frames.size(4)};
    if (frame_shape_.empty()) frame_shape_ = shape;
    if (shape != frame_shape_) {
        throw Error::InvalidArgument(
            fmt::format("AutoencoderKLWan encode: a frame of {} after frames of [B, C, T] {}",
                        shape_string(frames), fmt::join(frame_shape_, " x ")));
    }
    std::vector<torch::Tensor> out;
    for (int64_t t = 0; t < frames.size(2); ++t) {
        pending_.push_back(frames.slice(2, t, t + 1));
        ++frames_pushed_;
        // Chunks as upstream cuts them: frame 0 alone, then temporal-ratio frames each.
        const auto want =
            static_cast<size_t>(latent_frames_ == 0 ? 1 : c.temporal_compression_ratio());
        if (pending_.size() < want) continue;
        torch::Tensor chunk = torch::cat(pending_, 2);  // [B, C, want, H, W]
        pending_.clear();
        out.push_back(encode_chunk(chunk));
        ++latent_frames_;
    }
    return out.empty() ? torch::Tensor() : torch::cat(out, 2);
}

torch::Tensor WanEncodeSession::encode_chunk(const torch::Tensor& chunk) {
    const int64_t r = vae_->config().spatial_compression_ratio();
    const int64_t height = chunk.size(3), width = chunk.size(4);
    if (!tiled_ || (height <= tiling_.tile_height && width <= tiling_.tile_width)) {
        if (caches_.empty()) caches_.resize(1);
        return vae_->quant_conv(vae_->encoder->forward(chunk, caches_[0]));
    }
    // Upstream's tiled_encode: the grid of tiles at stride steps, each with its own causal cache
    // across chunks, blended in latent space over the overlap.
    std::vector<std::vector<torch::Tensor>> grid;
    size_t tile = 0;
    for (int64_t i = 0; i < height; i += tiling_.stride_height) {
        auto& row = grid.emplace_back();
        for (int64_t j = 0; j < width; j += tiling_.stride_width, ++tile) {
            if (caches_.size() <= tile) caches_.resize(tile + 1);
            // [B, C, T, H, W] -> [B, C, T, <= tile_height, <= tile_width]
            const torch::Tensor x =
                chunk.slice(3, i, i + tiling_.tile_height).slice(4, j, j + tiling_.tile_width);
            row.push_back(vae_->quant_conv(vae_->encoder->forward(x, caches_[tile])));
        }
    }
    const int64_t keep_h = tiling_.stride_height / r, keep_w = tiling_.stride_width / r;
    const torch::Tensor latent = assemble_tiles(grid, tiling_.tile_height / r - keep_h,
                                                tiling_.tile_width / r - keep_w, keep_h, keep_w);
    return latent.slice(3, 0, height / r).slice(4, 0, width / r);  // [B, 2 z, 1, H / r, W / r]
}

LoadReport load_autoencoder_kl_wan_weights(AutoencoderKLWan& model, const std::string& path,
                                           const LoadOptions& options) {
    LoadOptions opts = options;
    if (!model->has_decoder()) {
        opts.ignore_prefixes.push_back("decoder.");
        opts.ignore_prefixes.push_back("post_quant_conv.");
    }
    return load_weights(*model, path, opts);
}

AutoencoderKLWan load_autoencoder_kl_wan(const std::string& dir, bool with_decoder,
                                         const LoadOptions& options) {
    AutoencoderKLWan model(WanVAEConfig::from_json_file(dir), with_decoder);
    load_autoencoder_kl_wan_weights(model, dir, options);
    model->eval();
    return model;
}

}  // namespace sf::model

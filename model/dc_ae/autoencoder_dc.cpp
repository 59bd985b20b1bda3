#include "model/dc_ae/autoencoder_dc.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <tuple>

#include "core/check.h"
#include "core/error.h"
#include "core/shape.h"
#include "model/common/tile_blend.h"

namespace sf::model {
namespace {

using dc_ae::Activation;

torch::nn::Conv2d conv3x3(int64_t in, int64_t out) {
    return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1));
}

torch::nn::AnyModule make_block(const std::string& type, int64_t channels, int64_t head_dim,
                                const std::string& norm_type, Activation act,
                                const std::vector<int64_t>& kernel_sizes,
                                const std::shared_ptr<dc_ae::AttentionCalls>& calls) {
    if (type == "ResBlock") return torch::nn::AnyModule(dc_ae::ResBlock(channels, norm_type, act));
    return torch::nn::AnyModule(
        dc_ae::EfficientViTBlock(channels, head_dim, kernel_sizes, norm_type, calls));
}

// nn.Sequential() with no children returns its input; LibTorch's refuses to run.
torch::Tensor run_stage(const std::shared_ptr<torch::nn::Module>& stage, const torch::Tensor& x) {
    auto* seq = stage->as<torch::nn::Sequential>();
    return seq->is_empty() ? x : seq->forward(x);
}

void check_nchw(const torch::Tensor& x, int64_t channels, int64_t multiple, const char* what) {
    if (x.dim() != 4 || x.size(1) != channels || x.size(2) % multiple != 0 ||
        x.size(3) % multiple != 0) {
        throw Error::InvalidArgument(fmt::format(
            "AutoencoderDC {}: expected [B, {}, H, W] with H and W multiples of {}, got {}", what,
            channels, multiple, shape_string(x)));
    }
}

void check_tiling(const DCAETiling& t, int64_t ratio) {
    for (auto [tile, stride, name] : {std::tuple{t.tile_height, t.stride_height, "height"},
                                      std::tuple{t.tile_width, t.stride_width, "width"}}) {
        if (tile <= 0 || stride <= 0 || stride > tile || tile % ratio != 0 || stride % ratio != 0) {
            throw Error::InvalidArgument(
                fmt::format("AutoencoderDC tiling {}: tile {} and stride {} must be positive "
                            "multiples of the compression "
                            "ratio {}, stride <= tile",
                            name, tile, stride, ratio));
        }
    }
}

}  // namespace

DCEncoderImpl::DCEncoderImpl(const AutoencoderDCConfig& c,
                             std::shared_ptr<dc_ae::AttentionCalls> calls) {
    const auto& channels = c.encoder_block_out_channels;
    const auto& layers = c.encoder_layers_per_block;
    const size_t n = channels.size();
    const bool unshuffle = c.downsample_is_pixel_unshuffle();
    if (layers[0] > 0) {
        conv_in = torch::nn::AnyModule(conv3x3(c.in_channels, channels[0]));
    } else {
        conv_in = torch::nn::AnyModule(
            dc_ae::DownBlock(c.in_channels, channels[1], unshuffle, /*shortcut=*/false));
        downsample_factor_ *= 2;
    }
    register_module("conv_in", conv_in.ptr());

    down_blocks = register_module("down_blocks", torch::nn::ModuleList());
    for (size_t i = 0; i < n; ++i) {
        torch::nn::Sequential stage;
        for (int64_t l = 0; l < layers[i]; ++l) {
            // The encoder's blocks are always rms_norm + silu, whatever the decoder uses.
            stage->push_back(make_block(c.encoder_block_types[i], channels[i], c.attention_head_dim,
                                        "rms_norm", Activation::kSiLU, c.encoder_qkv_multiscales[i],
                                        calls));
        }
        if (i + 1 < n && layers[i] > 0) {
            stage->push_back(
                dc_ae::DownBlock(channels[i], channels[i + 1], unshuffle, /*shortcut=*/true));
            downsample_factor_ *= 2;
        }
        down_blocks->push_back(stage);
    }
    conv_out = register_module("conv_out", conv3x3(channels.back(), c.latent_channels));
    out_shortcut_ = c.encoder_out_shortcut;
    out_group_size_ = channels.back() / c.latent_channels;
}

torch::Tensor DCEncoderImpl::forward(const torch::Tensor& x) {
    auto h = conv_in.forward<torch::Tensor>(x);
    for (const auto& stage : *down_blocks) h = run_stage(stage, h);
    if (!out_shortcut_) return conv_out(h);
    // Residual autoencoding: the latent is learned on top of channel-group averages.
    const auto shortcut =
        h.reshape({h.size(0), -1, out_group_size_, h.size(2), h.size(3)})  // -> [B, L, g, h, w]
            .mean(2);                                                      // -> [B, L, h, w]
    return conv_out(h) + shortcut;
}

DCDecoderImpl::DCDecoderImpl(const AutoencoderDCConfig& c,
                             std::shared_ptr<dc_ae::AttentionCalls> calls) {
    const auto& channels = c.decoder_block_out_channels;
    const auto& layers = c.decoder_layers_per_block;
    const size_t n = channels.size();
    const bool interpolate = c.upsample_is_interpolate();
    conv_in = register_module("conv_in", conv3x3(c.latent_channels, channels.back()));
    in_shortcut_ = c.decoder_in_shortcut;
    in_repeats_ = channels.back() / c.latent_channels;

    // up_blocks.i is stage i (upstream builds them last to first and inserts at the front).
    up_blocks = register_module("up_blocks", torch::nn::ModuleList());
    for (size_t i = 0; i < n; ++i) {
        torch::nn::Sequential stage;
        if (i + 1 < n && layers[i] > 0) {
            stage->push_back(
                dc_ae::UpBlock(channels[i + 1], channels[i], interpolate, /*shortcut=*/true));
        }
        const Activation act = dc_ae::activation_from_name(c.decoder_act_fns[i]);
        for (int64_t l = 0; l < layers[i]; ++l) {
            stage->push_back(make_block(c.decoder_block_types[i], channels[i], c.attention_head_dim,
                                        c.decoder_norm_types[i], act, c.decoder_qkv_multiscales[i],
                                        calls));
        }
        up_blocks->push_back(stage);
    }

    const int64_t out_channels = layers[0] > 0 ? channels[0] : channels[1];
    norm_out = register_module("norm_out", dc_ae::ChannelRMSNorm(out_channels, 1e-5));
    conv_act_ = dc_ae::activation_from_name(c.decoder_conv_act_fn);
    if (layers[0] > 0) {
        conv_out = torch::nn::AnyModule(conv3x3(out_channels, c.in_channels));
    } else {
        conv_out = torch::nn::AnyModule(
            dc_ae::UpBlock(out_channels, c.in_channels, interpolate, /*shortcut=*/false));
    }
    register_module("conv_out", conv_out.ptr());
}

torch::Tensor DCDecoderImpl::forward(const torch::Tensor& z) {
    auto h = conv_in(z);
    if (in_shortcut_) h = h + z.repeat_interleave(in_repeats_, 1);  // [B, L, h, w] -> [B, C, h, w]
    for (size_t i = up_blocks->size(); i-- > 0;)
        h = run_stage(up_blocks->ptr(i), h);  // last stage first
    h = dc_ae::activate(norm_out(h), conv_act_);
    return conv_out.forward<torch::Tensor>(h);
}

AutoencoderDCImpl::AutoencoderDCImpl(const AutoencoderDCConfig& config, bool with_decoder)
    : config_(config), calls_(std::make_shared<dc_ae::AttentionCalls>()) {
    config_.validate();
    encoder = register_module("encoder", DCEncoder(config_, calls_));
    if (with_decoder) decoder = register_module("decoder", DCDecoder(config_, calls_));
    SF_CHECK(encoder->downsample_factor() == config_.spatial_compression_ratio(),
             "a validated config downsamples once per stage but the last");
}

torch::Tensor AutoencoderDCImpl::encode(const torch::Tensor& image) {
    check_nchw(image, config_.in_channels, spatial_compression_ratio(), "encode input");
    return encoder(image);
}

torch::Tensor AutoencoderDCImpl::decode(const torch::Tensor& latent) {
    if (!has_decoder())
        throw Error::InvalidArgument(
            "AutoencoderDC decode: this model was built without its decoder");
    check_nchw(latent, config_.latent_channels, 1, "decode input");
    return decoder(latent);
}

torch::Tensor AutoencoderDCImpl::encode_tiled(const torch::Tensor& image, int64_t tile,
                                              int64_t stride, int64_t* tiles) {
    return encode_tiled(image, DCAETiling{tile, tile, stride, stride}, tiles);
}

torch::Tensor AutoencoderDCImpl::encode_tiled(const torch::Tensor& image, const DCAETiling& t,
                                              int64_t* tiles) {
    const int64_t r = spatial_compression_ratio();
    check_tiling(t, r);
    check_nchw(image, config_.in_channels, 1, "encode_tiled input");
    const int64_t height = image.size(2), width = image.size(3);

    std::vector<std::vector<torch::Tensor>> grid;
    int64_t count = 0;
    for (int64_t i = 0; i < height; i += t.stride_height) {
        auto& row = grid.emplace_back();
        for (int64_t j = 0; j < width; j += t.stride_width) {
            // [B, 3, H, W] -> [B, 3, <= tile_height, <= tile_width]
            auto x = image.slice(2, i, i + t.tile_height).slice(3, j, j + t.tile_width);
            const int64_t pad_h = (r - x.size(2) % r) % r, pad_w = (r - x.size(3) % r) % r;
            if (pad_h != 0 || pad_w != 0) x = torch::constant_pad_nd(x, {0, pad_w, 0, pad_h}, 0.0);
            row.push_back(encoder(x));  // [B, 3, th, tw] -> [B, L, th / r, tw / r]
            ++count;
        }
    }
    if (tiles != nullptr) *tiles = count;
    const int64_t keep_h = t.stride_height / r, keep_w = t.stride_width / r;
    auto latent =
        assemble_tiles(grid, t.tile_height / r - keep_h, t.tile_width / r - keep_w, keep_h, keep_w);
    return latent.slice(2, 0, height / r).slice(3, 0, width / r);  // -> [B, L, H / r, W / r]
}

torch::Tensor AutoencoderDCImpl::decode_tiled(const torch::Tensor& latent, const DCAETiling& t,
                                              int64_t* tiles) {
    if (!has_decoder())
        throw Error::InvalidArgument(
            "AutoencoderDC decode_tiled: this model was built without its decoder");
    const int64_t r = spatial_compression_ratio();
    check_tiling(t, r);
    check_nchw(latent, config_.latent_channels, 1, "decode_tiled input");
    const int64_t tile_h = t.tile_height / r, tile_w = t.tile_width / r;
    const int64_t step_h = t.stride_height / r, step_w = t.stride_width / r;

    std::vector<std::vector<torch::Tensor>> grid;
    int64_t count = 0;
    for (int64_t i = 0; i < latent.size(2); i += step_h) {
        auto& row = grid.emplace_back();
        for (int64_t j = 0; j < latent.size(3); j += step_w) {
            // [B, L, h, w] -> [B, L, <= tile_h, <= tile_w] -> [B, 3, <= tile_h r, <= tile_w r]
            row.push_back(decoder(latent.slice(2, i, i + tile_h).slice(3, j, j + tile_w)));
            ++count;
        }
    }
    if (tiles != nullptr) *tiles = count;
    return assemble_tiles(grid, t.tile_height - t.stride_height, t.tile_width - t.stride_width,
                          t.stride_height, t.stride_width);
}

LoadReport load_autoencoder_dc_weights(AutoencoderDC& model, const std::string& path,
                                       const LoadOptions& options) {
    LoadOptions opts = options;
    if (!model->has_decoder()) opts.ignore_prefixes.push_back("decoder.");
    return load_weights(*model, path, opts);
}

AutoencoderDC load_autoencoder_dc(const std::string& dir, bool with_decoder,
                                  const LoadOptions& options) {
    AutoencoderDC model(AutoencoderDCConfig::from_json_file(dir), with_decoder);
    load_autoencoder_dc_weights(model, dir, options);
    model->eval();
    return model;
}

}  // namespace sf::model

// The blocks of Wan2.1's causal video VAE (diffusers autoencoder_kl_wan.py): WanCausalConv3d,
// WanRMS_norm, WanResample, WanResidualBlock, WanAttentionBlock, WanMidBlock. Parameter names are
// upstream's state-dict keys.
//
// Causality across chunks: upstream encodes frame 0 alone and then 4-frame chunks (decodes one
// latent frame at a time), each causal convolution keeping the last kCacheFrames frames of its
// input in a list indexed by call order (`feat_cache`, `feat_idx`). Here that state is an explicit
// CausalCache the caller owns and passes down, one slot per cached layer in call order, so an
// encoder can be fed chunk by chunk (and several tiles can each have their own).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/pimpl.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace sf::model::wan {

// Frames of its input a causal 3x3x3 convolution keeps for the next chunk (upstream's CACHE_T).
constexpr int64_t kCacheFrames = 2;

class CausalCache {
public:
    struct Slot {
        // The layer has run on a chunk before (upstream marks a time upsampler's first chunk
        // "Rep": it passes that chunk through without its time convolution).
        bool seen = false;
        at::Tensor frames;  // [B, C, <= kCacheFrames, H, W] of the layer's last input, or none
    };

    // Rewinds to the first slot: call before each chunk.
    void begin_chunk() { next_ = 0; }
    // The slot of the next cached layer of this chunk (created on the first chunk).
    Slot& next_slot();
    // Drops every slot: the next chunk is a new clip's first.
    void clear();
    int64_t slots() const { return static_cast<int64_t>(slots_.size()); }
    int64_t bytes() const;  // of the frames held

private:
    std::vector<Slot> slots_;
    size_t next_ = 0;
};

// WanCausalConv3d: a Conv3d (parameters `weight`, `bias` on the module itself, as upstream
// subclasses nn.Conv3d) padded causally in time: all 2 p_t padding frames in front, none behind.
class CausalConv3dImpl : public torch::nn::Module {
public:
    CausalConv3dImpl(int64_t in, int64_t out, std::array<int64_t, 3> kernel,
                     std::array<int64_t, 3> stride = {1, 1, 1},
                     std::array<int64_t, 3> padding = {0, 0, 0});

    // x [B, C, T, H, W]; `past` (the end of the previous chunk's input) replaces as many of the
    // front zero frames. A kernel with no time padding ignores it, as upstream does.
    torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& past = {});
    // Upstream's cached call: runs with the slot's frames as `past`, then keeps the last
    // kCacheFrames frames of x (topped up with the previous chunk's last frame when x has one).
    torch::Tensor forward_cached(const torch::Tensor& x, CausalCache::Slot& slot);

    torch::Tensor weight, bias;

    // In channels x time taps up to which a CPU convolution runs as one conv2d over the taps
    // stacked as channels (exact up to rounding): see time_taps_as_channels().
    static constexpr int64_t kMaxStackedChannels = 64;

private:
    bool time_taps_as_channels(const torch::Tensor& input) const;

    std::array<int64_t, 3> stride_;
    int64_t pad_t_, pad_h_, pad_w_;  // front time padding 2 p_t; spatial p on both sides
};
TORCH_MODULE(CausalConv3d);

// WanRMS_norm: x / ||x|| over channels * sqrt(C) * gamma (no bias in the Wan2.1 VAE). gamma is
// [C, 1, 1, 1] for 5-D inputs, [C, 1, 1] for the attention's per-frame 4-D input.
class RMSNormImpl : public torch::nn::Module {
public:
    RMSNormImpl(int64_t dim, bool images);
    torch::Tensor forward(const torch::Tensor& x);
    torch::Tensor gamma;

private:
    double scale_;
};
TORCH_MODULE(RMSNorm);

// WanResidualBlock: shortcut (a 1x1x1 conv when the width changes) + conv2(silu(norm2(conv1(
// silu(norm1(x)))))). Dropout is a no-op: the VAE runs in eval mode.
class ResidualBlockImpl : public torch::nn::Module {
public:
    ResidualBlockImpl(int64_t in, int64_t out);
    // cache null: plain causal padding (no chunk before).
    torch::Tensor forward(const torch::Tensor& x, CausalCache* cache);

    RMSNorm norm1{nullptr}, norm2{nullptr};
    CausalConv3d conv1{nullptr}, conv2{nullptr}, conv_shortcut{nullptr};  // shortcut may be null
};
TORCH_MODULE(ResidualBlock);

// WanAttentionBlock: single-head softmax attention within each frame over its H x W positions.
class AttentionBlockImpl : public torch::nn::Module {
public:
    explicit AttentionBlockImpl(int64_t dim);
    torch::Tensor forward(const torch::Tensor& x);

    RMSNorm norm{nullptr};
    torch::nn::Conv2d to_qkv{nullptr}, proj{nullptr};
};
TORCH_MODULE(AttentionBlock);

// WanMidBlock with one attention layer: resnets.0, attentions.0, resnets.1.
class MidBlockImpl : public torch::nn::Module {
public:
    explicit MidBlockImpl(int64_t dim);
    torch::Tensor forward(const torch::Tensor& x, CausalCache* cache);

    torch::nn::ModuleList resnets{nullptr}, attentions{nullptr};

private:
    std::vector<ResidualBlock> resnet_list_;
    AttentionBlock attention_{nullptr};
};
TORCH_MODULE(MidBlock);

enum class ResampleMode { kUpsample2d, kUpsample3d, kDownsample2d, kDownsample3d };

// WanResample: a per-frame 2x spatial resampling (`resample.1`, a Conv2d after nearest-2x
// upsampling or right/bottom zero padding), and in the 3-D modes a time convolution (`time_conv`):
// downsampling passes a clip's first frame through and halves the rest with a stride-2 3-tap
// conv over (previous chunk's last frame, this chunk); upsampling passes the first chunk through
// and doubles later ones by a conv to twice the channels, interleaved into twice the frames.
// The 3-D modes need the cache: without it upstream skips the time convolution entirely.
class ResampleImpl : public torch::nn::Module {
public:
    // Upsamplers go to out_dim (Wan2.1: dim / 2) channels.
    ResampleImpl(int64_t dim, ResampleMode mode, int64_t out_dim);
    torch::Tensor forward(const torch::Tensor& x, CausalCache* cache);

    ResampleMode mode() const { return mode_; }
    torch::nn::ModuleList resample{nullptr};  // [0] padding / upsampling (no parameters), [1] conv
    CausalConv3d time_conv{nullptr};          // 3-D modes only

private:
    torch::Tensor spatial(const torch::Tensor& x);  // [B, C, T, H, W] -> [B, C', T, H', W']
    torch::Tensor time_up(const torch::Tensor& x, CausalCache::Slot& slot);
    torch::Tensor time_down(const torch::Tensor& x, CausalCache::Slot& slot);

    ResampleMode mode_;
    torch::nn::Conv2d conv_{nullptr};
};
TORCH_MODULE(Resample);

}  // namespace sf::model::wan

#include "model/wan/wan_vae_blocks.h"

#include <torch/torch.h>

#include <cmath>

#include "core/check.h"
#include "model/common/chunked_attention.h"

namespace sf::model::wan {
namespace {

// Query rows per attention chunk: the middle block attends over a frame's latent positions
// (60 x 104 at 480p), whose full score matrix would be 156 MB a frame in fp32.
constexpr int64_t kAttentionChunk = 2048;

// The last `n` frames (or all, when fewer) as a tensor of their own, not a view keeping x alive.
torch::Tensor last_frames(const torch::Tensor& x, int64_t n) {
    return x.slice(2, std::max<int64_t>(0, x.size(2) - n)).clone();
}

// [B, C, T, H, W] <-> [B T, C, H, W]: the per-frame 2-D layers.
torch::Tensor frames_as_batch(const torch::Tensor& x) {
    return x.permute({0, 2, 1, 3, 4})
        .reshape({x.size(0) * x.size(2), x.size(1), x.size(3), x.size(4)});
}
torch::Tensor batch_as_frames(const torch::Tensor& x, int64_t b) {
    return x.view({b, x.size(0) / b, x.size(1), x.size(2), x.size(3)}).permute({0, 2, 1, 3, 4});
}

}  // namespace

CausalCache::Slot& CausalCache::next_slot() {
    if (next_ == slots_.size()) slots_.emplace_back();
    return slots_[next_++];
}

void CausalCache::clear() {
    slots_.clear();
    next_ = 0;
}

int64_t CausalCache::bytes() const {
    int64_t n = 0;
    for (const Slot& s : slots_) {
        if (s.frames.defined()) n += static_cast<int64_t>(s.frames.nbytes());
    }
    return n;
}

CausalConv3dImpl::CausalConv3dImpl(int64_t in, int64_t out, std::array<int64_t, 3> kernel,
                                   std::array<int64_t, 3> stride, std::array<int64_t, 3> padding)
    : stride_(stride), pad_t_(2 * padding[0]), pad_h_(padding[1]), pad_w_(padding[2]) {
    // Initialised as nn.Conv3d is (kaiming-uniform, a = sqrt(5)); real weights replace it.
    torch::nn::Conv3d init(
        torch::nn::Conv3dOptions(in, out, {kernel[0], kernel[1], kernel[2]}).stride(stride));
    weight = register_parameter("weight", init->weight.detach().clone());
    bias = register_parameter("bias", init->bias.detach().clone());
}

torch::Tensor CausalConv3dImpl::forward(const torch::Tensor& x, const torch::Tensor& past) {
    torch::Tensor input = x;
    int64_t front = pad_t_;
    if (past.defined() && pad_t_ > 0) {
        input = torch::cat({past.to(x.device()), x}, 2);  // [B, C, p + T, H, W]
        front -= past.size(2);
    }
    if (front > 0 || pad_h_ > 0 || pad_w_ > 0) {
        input = torch::constant_pad_nd(input, {pad_w_, pad_w_, pad_h_, pad_h_, front, 0}, 0.0);
    }
    if (time_taps_as_channels(input)) {
        // [B, C, T + k - 1, H, W] -> [B, C, T, H, W, k] -> [B T, C k, H, W]: each output frame's
        // k input frames side by side as channels, one 2-D convolution over all of them.
        const int64_t b = input.size(0), c = input.size(1), k = weight.size(2);
        const int64_t t = input.size(2) - k + 1, h = input.size(3), w = input.size(4);
        const torch::Tensor taps =
            input.unfold(2, k, 1).permute({0, 2, 1, 5, 3, 4}).reshape({b * t, c * k, h, w});
        // [O, C, k, kh, kw] -> [O, C k, kh, kw], channels in the same (c, tap) order
        const torch::Tensor w2 =
            weight.reshape({weight.size(0), c * k, weight.size(3), weight.size(4)});
        const torch::Tensor y = torch::conv2d(taps, w2, bias);  // [B T, O, H', W']
        return y.view({b, t, y.size(1), y.size(2), y.size(3)}).permute({0, 2, 1, 3, 4});
    }
    return torch::conv3d(input, weight, bias, {stride_[0], stride_[1], stride_[2]});
}

bool CausalConv3dImpl::time_taps_as_channels(const torch::Tensor& input) const {
    // LibTorch's CPU conv3d has no fast kernel for narrow layers (its oneDNN path starts at wider
    // inputs): measured 0.28 s for 4 -> 4 channels over 4 frames of 384 x 512 px, 0.10 s as one
    // conv2d over the time taps stacked as channels, and 8x at 16 channels. The stacked input is
    // k times the layer's input, so only narrow layers (the first one of every Wan VAE, all of
    // the tiny one) take it; on a GPU cuDNN's conv3d is the better kernel.
    return input.device().is_cpu() && stride_[0] == 1 && stride_[1] == 1 && stride_[2] == 1 &&
           weight.size(2) > 1 && weight.size(1) * weight.size(2) <= kMaxStackedChannels;
}

torch::Tensor CausalConv3dImpl::forward_cached(const torch::Tensor& x, CausalCache::Slot& slot) {
    torch::Tensor keep = last_frames(x, kCacheFrames);
    if (keep.size(2) < kCacheFrames && slot.frames.defined()) {
        // A one-frame chunk: the frame before it comes from the previous chunk.
        keep = torch::cat({last_frames(slot.frames, 1), keep}, 2);
    }
    torch::Tensor y = forward(x, slot.frames);
    slot.frames = keep;
    slot.seen = true;
    return y;
}

RMSNormImpl::RMSNormImpl(int64_t dim, bool images) : scale_(std::sqrt(static_cast<double>(dim))) {
    gamma = register_parameter("gamma",
                               images ? torch::ones({dim, 1, 1}) : torch::ones({dim, 1, 1, 1}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
    // F.normalize(x, dim=1): x / max(||x||_2, 1e-12) over the channels. As a sum of squares:
    // LibTorch 1.13's norm() over a strided dimension is 10x slower on the CPU for narrow layers
    // (0.24 s vs 0.026 s at 4 channels x 5 frames x 384 x 640), the same at 96 channels.
    const torch::Tensor norm = (x * x).sum(1, /*keepdim=*/true).sqrt().clamp_min(1e-12);
    return x / norm * scale_ * gamma;
}

ResidualBlockImpl::ResidualBlockImpl(int64_t in, int64_t out) {
    norm1 = register_module("norm1", RMSNorm(in, false));
    conv1 = register_module(
        "conv1", CausalConv3d(in, out, std::array<int64_t, 3>{3, 3, 3},
                              std::array<int64_t, 3>{1, 1, 1}, std::array<int64_t, 3>{1, 1, 1}));
    norm2 = register_module("norm2", RMSNorm(out, false));
    conv2 = register_module(
        "conv2", CausalConv3d(out, out, std::array<int64_t, 3>{3, 3, 3},
                              std::array<int64_t, 3>{1, 1, 1}, std::array<int64_t, 3>{1, 1, 1}));
    if (in != out) {
        conv_shortcut = register_module("conv_shortcut",
                                        CausalConv3d(in, out, std::array<int64_t, 3>{1, 1, 1}));
    }
}

torch::Tensor ResidualBlockImpl::forward(const torch::Tensor& x, CausalCache* cache) {
    const torch::Tensor h = conv_shortcut ? conv_shortcut(x) : x;
    torch::Tensor y = torch::silu(norm1(x));
    y = cache != nullptr ? conv1->forward_cached(y, cache->next_slot()) : conv1(y);
    y = torch::silu(norm2(y));
    y = cache != nullptr ? conv2->forward_cached(y, cache->next_slot()) : conv2(y);
    return y + h;
}

AttentionBlockImpl::AttentionBlockImpl(int64_t dim) {
    norm = register_module("norm", RMSNorm(dim, true));
    to_qkv =
        register_module("to_qkv", torch::nn::Conv2d(torch::nn::Conv2dOptions(dim, 3 * dim, 1)));
    proj = register_module("proj", torch::nn::Conv2d(torch::nn::Conv2dOptions(dim, dim, 1)));
}

torch::Tensor AttentionBlockImpl::forward(const torch::Tensor& x) {
    const int64_t b = x.size(0), c = x.size(1), h = x.size(3), w = x.size(4);
    torch::Tensor y = frames_as_batch(x);  // [B, C, T, H, W] -> [B T, C, H, W]
    const int64_t bt = y.size(0);
    // [B T, 3C, H, W] -> [B T, 1, H W, 3C] -> q, k, v [B T, 1, H W, C]
    const torch::Tensor qkv = to_qkv(norm(y)).reshape({bt, 1, 3 * c, h * w}).permute({0, 1, 3, 2});
    const auto parts = qkv.chunk(3, -1);
    y = chunked_attention(parts[0].contiguous(), parts[1].contiguous(), parts[2].contiguous(), {},
                          kAttentionChunk);
    y = y.squeeze(1).permute({0, 2, 1}).reshape({bt, c, h, w});  // [B T, H W, C] -> [B T, C, H, W]
    return batch_as_frames(proj(y), b) + x;
}

MidBlockImpl::MidBlockImpl(int64_t dim) {
    resnets = register_module("resnets", torch::nn::ModuleList());
    attentions = register_module("attentions", torch::nn::ModuleList());
    for (int i = 0; i < 2; ++i) {
        resnet_list_.push_back(ResidualBlock(dim, dim));
        resnets->push_back(resnet_list_.back());
    }
    attention_ = AttentionBlock(dim);
    attentions->push_back(attention_);
}

torch::Tensor MidBlockImpl::forward(const torch::Tensor& x, CausalCache* cache) {
    torch::Tensor y = resnet_list_[0]->forward(x, cache);
    y = attention_(y);
    return resnet_list_[1]->forward(y, cache);
}

ResampleImpl::ResampleImpl(int64_t dim, ResampleMode mode, int64_t out_dim) : mode_(mode) {
    const bool up = mode == ResampleMode::kUpsample2d || mode == ResampleMode::kUpsample3d;
    conv_ = up ? torch::nn::Conv2d(torch::nn::Conv2dOptions(dim, out_dim, 3).padding(1))
               : torch::nn::Conv2d(torch::nn::Conv2dOptions(dim, dim, 3).stride(2));
    resample = register_module("resample", torch::nn::ModuleList());
    resample->push_back(torch::nn::Identity());  // upstream's WanUpsample / ZeroPad2d
    resample->push_back(conv_);
    if (mode == ResampleMode::kUpsample3d) {
        time_conv =
            register_module("time_conv", CausalConv3d(dim, 2 * dim, std::array<int64_t, 3>{3, 1, 1},
                                                      std::array<int64_t, 3>{1, 1, 1},
                                                      std::array<int64_t, 3>{1, 0, 0}));
    } else if (mode == ResampleMode::kDownsample3d) {
        time_conv =
            register_module("time_conv", CausalConv3d(dim, dim, std::array<int64_t, 3>{3, 1, 1},
                                                      std::array<int64_t, 3>{2, 1, 1}));
    }
}

torch::Tensor ResampleImpl::spatial(const torch::Tensor& x) {
    const int64_t b = x.size(0);
    torch::Tensor y = frames_as_batch(x);  // [B T, C, H, W]
    if (mode_ == ResampleMode::kUpsample2d || mode_ == ResampleMode::kUpsample3d) {
        // nearest-exact at exactly 2x picks floor(i / 2) as nearest does; upstream runs it in
        // fp32 and casts back.
        y = torch::upsample_nearest2d(y.to(torch::kFloat), {2 * y.size(2), 2 * y.size(3)})
                .to(x.scalar_type());
    } else {
        y = torch::constant_pad_nd(y, {0, 1, 0, 1}, 0.0);  // right and bottom, as ZeroPad2d
    }
    return batch_as_frames(conv_(y), b);
}

torch::Tensor ResampleImpl::time_up(const torch::Tensor& x, CausalCache::Slot& slot) {
    if (!slot.seen) {
        slot.seen = true;  // the first chunk passes through at its own frame count
        return x;
    }
    torch::Tensor keep = last_frames(x, kCacheFrames);
    if (keep.size(2) < kCacheFrames) {
        keep = torch::cat(
            {slot.frames.defined() ? last_frames(slot.frames, 1) : torch::zeros_like(keep), keep},
            2);
    }
    torch::Tensor y = time_conv(x, slot.frames);  // [B, 2C, T, H, W]
    slot.frames = keep;
    const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
    // [B, 2, C, T, H, W] -> [B, C, T, 2, H, W] -> [B, C, 2T, H, W]: each frame's two halves in turn
    return y.view({b, 2, c, t, h, w}).permute({0, 2, 3, 1, 4, 5}).reshape({b, c, 2 * t, h, w});
}

torch::Tensor ResampleImpl::time_down(const torch::Tensor& x, CausalCache::Slot& slot) {
    if (!slot.seen) {
        slot.seen = true;  // a clip's first frame passes through
        slot.frames = last_frames(x, 1);
        return x;
    }
    torch::Tensor keep = last_frames(x, 1);
    torch::Tensor y = time_conv(torch::cat({slot.frames, x}, 2));  // 1 + T frames -> T / 2
    slot.frames = keep;
    return y;
}

torch::Tensor ResampleImpl::forward(const torch::Tensor& x, CausalCache* cache) {
    const bool temporal =
        mode_ == ResampleMode::kUpsample3d || mode_ == ResampleMode::kDownsample3d;
    SF_CHECK(!temporal || cache != nullptr, "a Wan time resampler needs the causal cache");
    torch::Tensor y = x;
    if (mode_ == ResampleMode::kUpsample3d) y = time_up(y, cache->next_slot());
    y = spatial(y);
    if (mode_ == ResampleMode::kDownsample3d) y = time_down(y, cache->next_slot());
    return y;
}

}  // namespace sf::model::wan

#include "model/dc_ae/dc_ae_blocks.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "core/error.h"

namespace sf::model::dc_ae {
namespace {

namespace F = torch::nn::functional;

// SanaMultiscaleLinearAttention's eps: the denominators can be exactly 0 (all ReLU'd away).
constexpr double kAttentionEps = 1e-15;
// get_normalization's and GLUMBConv's RMSNorm eps.
constexpr double kNormEps = 1e-5;

torch::nn::Conv2d conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride = 1,
                         bool bias = true, int64_t groups = 1) {
    return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, kernel)
                                 .stride(stride)
                                 .padding(kernel / 2)
                                 .groups(groups)
                                 .bias(bias));
}

torch::nn::Linear linear(int64_t in, int64_t out) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

// Applies an nn.Linear over the channels of NCHW, as upstream's movedim / Linear / movedim.
torch::Tensor channel_linear(torch::nn::Linear& layer, const torch::Tensor& x) {
    return layer(x.movedim(1, -1)).movedim(-1, 1);  // [B, C, H, W] -> [B, H, W, C] -> [B, C', H, W]
}

}  // namespace

Activation activation_from_name(const std::string& name) {
    if (name == "silu" || name == "swish") return Activation::kSiLU;
    if (name == "relu") return Activation::kReLU;
    if (name == "gelu") return Activation::kGELU;
    if (name == "mish") return Activation::kMish;
    throw Error::InvalidArgument(
        fmt::format("unknown activation \"{}\" (silu, swish, relu, gelu, mish)", name));
}

torch::Tensor activate(const torch::Tensor& x, Activation act) {
    switch (act) {
        case Activation::kSiLU:
            return torch::silu(x);
        case Activation::kReLU:
            return torch::relu(x);
        case Activation::kGELU:
            return torch::gelu(x);
        case Activation::kMish:
            return torch::mish(x);
    }
    return x;
}

ChannelRMSNormImpl::ChannelRMSNormImpl(int64_t channels, double eps) : eps_(eps) {
    weight = register_parameter("weight", torch::ones({channels}));
    bias = register_parameter("bias", torch::zeros({channels}));
}

torch::Tensor ChannelRMSNormImpl::forward(const torch::Tensor& x) {
    // Upstream: the mean square in fp32, the input scaled by it (type promotion makes the product
    // fp32), cast to the weight's dtype only when the weight is half precision.
    const auto variance = x.to(torch::kFloat32).pow(2).mean(1, /*keepdim=*/true);  // [B, 1, H, W]
    auto y = x * torch::rsqrt(variance + eps_);
    if (weight.scalar_type() == torch::kHalf || weight.scalar_type() == torch::kBFloat16) {
        y = y.to(weight.scalar_type());
    }
    return y * weight.view({1, -1, 1, 1}) + bias.view({1, -1, 1, 1});  // [C] -> [1, C, 1, 1]
}

ChannelNorm::ChannelNorm(torch::nn::Module& parent, const std::string& name,
                         const std::string& norm_type, int64_t channels) {
    if (norm_type == "rms_norm") {
        rms_ = parent.register_module(name, ChannelRMSNorm(channels, kNormEps));
    } else if (norm_type == "batch_norm") {
        batch_ = parent.register_module(
            name, torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(channels).eps(kNormEps)));
    } else {
        throw Error::InvalidArgument(
            fmt::format("unknown norm type \"{}\" (rms_norm, batch_norm)", norm_type));
    }
}

torch::Tensor ChannelNorm::operator()(const torch::Tensor& x) {
    if (rms_) return rms_->forward(x);
    return batch_->forward(x);
}

ResBlockImpl::ResBlockImpl(int64_t channels, const std::string& norm_type, Activation act)
    : act_(act) {
    conv1 = register_module("conv1", conv2d(channels, channels, 3));
    conv2 = register_module("conv2", conv2d(channels, channels, 3, 1, /*bias=*/false));
    norm_ = ChannelNorm(*this, "norm", norm_type, channels);
}

torch::Tensor ResBlockImpl::forward(const torch::Tensor& x) {
    auto h = conv2(activate(conv1(x), act_));
    return norm_(h) + x;
}

MultiscaleProjectionImpl::MultiscaleProjectionImpl(int64_t inner_dim, int64_t heads,
                                                   int64_t kernel_size) {
    const int64_t channels = 3 * inner_dim;
    proj_in =
        register_module("proj_in", conv2d(channels, channels, kernel_size, 1, false, channels));
    proj_out = register_module("proj_out", conv2d(channels, channels, 1, 1, false, 3 * heads));
}

torch::Tensor MultiscaleProjectionImpl::forward(const torch::Tensor& x) {
    return proj_out(proj_in(x));
}

MultiscaleLinearAttentionImpl::MultiscaleLinearAttentionImpl(
    int64_t channels, int64_t head_dim, const std::vector<int64_t>& kernel_sizes,
    const std::string& norm_type, std::shared_ptr<AttentionCalls> calls)
    : head_dim_(head_dim), calls_(std::move(calls)) {
    const int64_t heads = channels / head_dim;  // int(in_channels // attention_head_dim * mult)
    const int64_t inner = heads * head_dim;
    to_q = register_module("to_q", linear(channels, inner));
    to_k = register_module("to_k", linear(channels, inner));
    to_v = register_module("to_v", linear(channels, inner));
    to_qkv_multiscale = register_module("to_qkv_multiscale", torch::nn::ModuleList());
    for (int64_t k : kernel_sizes)
        to_qkv_multiscale->push_back(MultiscaleProjection(inner, heads, k));
    to_out = register_module(
        "to_out", linear(inner * (1 + static_cast<int64_t>(kernel_sizes.size())), channels));
    norm_out_ = ChannelNorm(*this, "norm_out", norm_type, channels);
}

torch::Tensor MultiscaleLinearAttentionImpl::forward(const torch::Tensor& x) {
    const int64_t batch = x.size(0), height = x.size(2), width = x.size(3);
    const int64_t n = height * width;
    // Upstream's rule, on the map of this call: linear attention unless H*W <= head_dim.
    const bool use_linear = n > head_dim_;
    if (calls_) (use_linear ? calls_->linear : calls_->quadratic) += 1;
    const auto original_dtype = x.scalar_type();

    const auto xl = x.movedim(1, -1);  // [B, C, H, W] -> [B, H, W, C]
    auto qkv = torch::cat({to_q(xl), to_k(xl), to_v(xl)}, 3).movedim(-1, 1);  // -> [B, 3I, H, W]
    std::vector<torch::Tensor> scales{qkv};
    for (const auto& block : *to_qkv_multiscale)
        scales.push_back(block->as<MultiscaleProjection>()->forward(qkv));
    auto h = torch::cat(scales, 1);  // [B, 3I (1 + S), H, W]
    if (use_linear) h = h.to(torch::kFloat32);

    // Each run of 3 * head_dim channels is one head's q, k, v (upstream's layout).
    h = h.reshape({batch, -1, 3 * head_dim_, n});  // [B, 3I (1+S), H, W] -> [B, heads', 3d, N]
    auto qkv_chunks = h.chunk(3, 2);               // 3 x [B, heads', d, N]
    const auto q = torch::relu(qkv_chunks[0]);
    const auto k = torch::relu(qkv_chunks[1]);
    const auto& v = qkv_chunks[2];

    torch::Tensor out;
    if (use_linear) {
        // A row of ones under v makes the last output row the normaliser sum_n k_n . q.
        const auto v_pad =
            torch::constant_pad_nd(v, {0, 0, 0, 1}, 1.0);  // [B, h', d, N] -> [B, h', d+1, N]
        const auto kv = torch::matmul(v_pad, k.transpose(-1, -2));       // [B, h', d+1, d]
        out = torch::matmul(kv, q).to(torch::kFloat32);                  // [B, h', d+1, N]
        out = out.slice(2, 0, -1) / (out.slice(2, -1) + kAttentionEps);  // [B, h', d, N]
        out = out.to(original_dtype);
    } else {
        auto scores = torch::matmul(k.transpose(-1, -2), q).to(torch::kFloat32);  // [B, h', N, N]
        scores = scores / (scores.sum(2, /*keepdim=*/true) + kAttentionEps);
        out = torch::matmul(v, scores.to(v.scalar_type()));  // [B, h', d, N]
    }
    out = out.reshape({batch, -1, height, width});  // [B, h', d, N] -> [B, h' d, H, W]
    out = channel_linear(to_out, out);              // [B, I (1+S), H, W] -> [B, C, H, W]
    return norm_out_(out) + x;
}

GLUMBConvImpl::GLUMBConvImpl(int64_t channels) {
    const int64_t hidden = 4 * channels;
    conv_inverted = register_module("conv_inverted", conv2d(channels, 2 * hidden, 1));
    conv_depth =
        register_module("conv_depth", conv2d(2 * hidden, 2 * hidden, 3, 1, true, 2 * hidden));
    conv_point = register_module("conv_point", conv2d(hidden, channels, 1, 1, /*bias=*/false));
    norm = register_module("norm", ChannelRMSNorm(channels, kNormEps));
}

torch::Tensor GLUMBConvImpl::forward(const torch::Tensor& x) {
    auto h = conv_depth(torch::silu(conv_inverted(x)));  // [B, C, H, W] -> [B, 8C, H, W]
    auto parts = h.chunk(2, 1);                          // 2 x [B, 4C, H, W]
    h = conv_point(parts[0] * torch::silu(parts[1]));    // -> [B, C, H, W]
    return norm(h) + x;
}

EfficientViTBlockImpl::EfficientViTBlockImpl(int64_t channels, int64_t head_dim,
                                             const std::vector<int64_t>& kernel_sizes,
                                             const std::string& norm_type,
                                             std::shared_ptr<AttentionCalls> calls) {
    attn = register_module("attn", MultiscaleLinearAttention(channels, head_dim, kernel_sizes,
                                                             norm_type, std::move(calls)));
    conv_out = register_module("conv_out", GLUMBConv(channels));
}

torch::Tensor EfficientViTBlockImpl::forward(const torch::Tensor& x) { return conv_out(attn(x)); }

DownBlockImpl::DownBlockImpl(int64_t in_channels, int64_t out_channels, bool pixel_unshuffle,
                             bool shortcut)
    : pixel_unshuffle_(pixel_unshuffle),
      shortcut_(shortcut),
      out_channels_(out_channels),
      group_size_(in_channels * 4 / out_channels) {
    conv = register_module("conv",
                           conv2d(in_channels, pixel_unshuffle ? out_channels / 4 : out_channels, 3,
                                  pixel_unshuffle ? 1 : 2));
}

torch::Tensor DownBlockImpl::forward(const torch::Tensor& x) {
    auto h = conv(x);
    if (pixel_unshuffle_) h = torch::pixel_unshuffle(h, 2);  // [B, C/4, H, W] -> [B, C, H/2, W/2]
    if (!shortcut_) return h;
    auto y = torch::pixel_unshuffle(x, 2);  // [B, Cin, H, W] -> [B, 4 Cin, H/2, W/2]
    const int64_t b = y.size(0), height = y.size(2), width = y.size(3);
    y = y.reshape({b, out_channels_, group_size_, height, width});  // -> [B, C, g, H/2, W/2]
    return h + y.mean(2);                                           // -> [B, C, H/2, W/2]
}

UpBlockImpl::UpBlockImpl(int64_t in_channels, int64_t out_channels, bool interpolate, bool shortcut)
    : interpolate_(interpolate), shortcut_(shortcut), repeats_(out_channels * 4 / in_channels) {
    conv = register_module("conv",
                           conv2d(in_channels, interpolate ? out_channels : 4 * out_channels, 3));
}

torch::Tensor UpBlockImpl::forward(const torch::Tensor& x) {
    torch::Tensor h;
    if (interpolate_) {
        h = F::interpolate(x, F::InterpolateFuncOptions()
                                  .scale_factor(std::vector<double>{2.0, 2.0})
                                  .mode(torch::kNearest));  // [B, Cin, H, W] -> [B, Cin, 2H, 2W]
        h = conv(h);
    } else {
        h = torch::pixel_shuffle(conv(x), 2);  // [B, 4C, H, W] -> [B, C, 2H, 2W]
    }
    if (!shortcut_) return h;
    auto y = x.repeat_interleave(repeats_, 1);  // [B, Cin, H, W] -> [B, 4C, H, W]
    return h + torch::pixel_shuffle(y, 2);      // -> [B, C, 2H, 2W]
}

}  // namespace sf::model::dc_ae

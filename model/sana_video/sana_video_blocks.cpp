// Numerics follow diffusers v0.36.0 operation by operation (dtype casts included), so that fp32
// results match upstream to rounding: the golden tests hold them to rel 1e-4.
#include "model/sana_video/sana_video_blocks.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/common/autocast.h"
#include "model/common/checkpoint.h"
#include "model/common/linear_attention.h"
#include "model/common/lora.h"
#include "model/common/pointwise_conv.h"

namespace sf::model {
namespace {

namespace nn = torch::nn;

// One rotary table's channels as get_1d_rotary_pos_embed(dim, use_real=True,
// repeat_interleave_real=True) lays them out: channel j turns at theta^(-2 floor(j / 2) / dim).
void append_table(std::vector<double>& freqs, int64_t dim) {
    for (int64_t j = 0; j < dim; ++j) {
        const double exponent = static_cast<double>(2 * (j / 2)) / static_cast<double>(dim);
        freqs.push_back(1.0 / std::pow(10000.0, exponent));
    }
}

}  // namespace

std::pair<at::Tensor, at::Tensor> sana_video_rotary(int64_t head_dim, const VideoGrid& grid,
                                                    const at::Device& device) {
    // Time first, then height, then width: 2 * (head_dim / 6) channels for each spatial axis,
    // the rest for time.
    const int64_t hw_dim = 2 * (head_dim / 6), t_dim = head_dim - 2 * hw_dim;
    std::vector<double> freqs;
    append_table(freqs, t_dim);
    append_table(freqs, hw_dim);
    append_table(freqs, hw_dim);
    std::vector<int64_t> axis(head_dim);  // which position turns each channel
    for (int64_t c = 0; c < head_dim; ++c) axis[c] = c < t_dim ? 0 : c < t_dim + hw_dim ? 1 : 2;

    const auto f64 = at::TensorOptions().dtype(at::kDouble);
    const at::Tensor freq = at::tensor(freqs, f64);  // [d]
    const at::Tensor f = at::arange(grid.frames, f64)
                             .view({-1, 1, 1})
                             .expand({grid.frames, grid.height, grid.width});
    const at::Tensor h = at::arange(grid.height, f64).view({1, -1, 1}).expand_as(f);
    const at::Tensor w = at::arange(grid.width, f64).view({1, 1, -1}).expand_as(f);
    const at::Tensor positions = at::stack({f.reshape({-1}), h.reshape({-1}), w.reshape({-1})}, 1);
    const at::Tensor angles = positions.index_select(1, at::tensor(axis, at::kLong)) * freq;
    // In fp64 as upstream, then fp32 (its tables are .float()); the rotation reads the cosine of
    // the even column and the sine of the odd one of every pair.
    const at::Tensor cos = at::cos(angles).to(at::kFloat).slice(1, 0, head_dim, 2);
    const at::Tensor sin = at::sin(angles).to(at::kFloat).slice(1, 1, head_dim, 2);
    return {cos.contiguous().to(device), sin.contiguous().to(device)};  // [N, d / 2] each
}

at::Tensor apply_video_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    const at::Tensor pairs = x.unflatten(-1, {-1, 2});  // [B, N, H, d / 2, 2]
    const at::Tensor x1 = pairs.select(-1, 0), x2 = pairs.select(-1, 1);
    const at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);  // [N, 1, d / 2]
    const at::Tensor even = x1 * c - x2 * s;
    const at::Tensor odd = x1 * s + x2 * c;
    return at::stack({even, odd}, -1).flatten(-2).to(x.scalar_type());  // [B, N, H, d]
}

SanaVideoLinearAttentionImpl::SanaVideoLinearAttentionImpl(int64_t dim, int64_t heads_,
                                                           int64_t head_dim, bool bias,
                                                           bool qk_norm, double dropout)
    : heads(heads_) {
    const int64_t inner = heads * head_dim;
    to_q = register_module("to_q", nn::Linear(nn::LinearOptions(dim, inner).bias(bias)));
    to_k = register_module("to_k", nn::Linear(nn::LinearOptions(dim, inner).bias(bias)));
    to_v = register_module("to_v", nn::Linear(nn::LinearOptions(dim, inner).bias(bias)));
    if (qk_norm) {
        norm_q = register_module("norm_q", SanaRMSNorm(inner, 1e-5));
        norm_k = register_module("norm_k", SanaRMSNorm(inner, 1e-5));
    }
    to_out = register_module("to_out",
                             make_attention_output(inner, dim, dropout, out_proj, out_dropout));
}

at::Tensor SanaVideoLinearAttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos,
                                                 const at::Tensor& sin) {
    const auto dtype = x.scalar_type();
    // Under the kernel, cast once for the three projections, not once each (and three copies
    // kept for backward).
    const at::Tensor xc = chunk_tokens > 0 ? autocast_cast(x) : x;
    at::Tensor q = apply_linear(to_q, xc);
    at::Tensor k = apply_linear(to_k, xc);
    at::Tensor v = apply_linear(to_v, xc);
    if (norm_q) {
        q = norm_q(q);
        k = norm_k(k);
    }
    if (chunk_tokens > 0) {
        // In q's dtype: under autocast the projection casts it as it would the plain ops' fp32.
        const at::Tensor out = rotary_relu_linear_attention(q, k, v, cos, sin, heads, chunk_tokens);
        return out_dropout(apply_linear(out_proj, out));
    }
    q = torch::relu(q.unflatten(2, {heads, -1}));  // [B, N, D] -> [B, N, H, d]
    k = torch::relu(k.unflatten(2, {heads, -1}));
    v = v.unflatten(2, {heads, -1});
    const at::Tensor q_rot = apply_video_rotary(q, cos, sin).permute({0, 2, 3, 1}).to(at::kFloat);
    const at::Tensor k_rot = apply_video_rotary(k, cos, sin).permute({0, 2, 3, 1}).to(at::kFloat);
    q = q.permute({0, 2, 3, 1});  // [B, N, H, d] -> [B, H, d, N]
    k = k.permute({0, 2, 3, 1});
    v = v.permute({0, 2, 3, 1}).to(at::kFloat);

    // sum_j k_j . q_n from the un-rotated q and k, in the input dtype: [B, H, 1, N].
    const at::Tensor z = 1 / (at::matmul(k.sum(-1, /*keepdim=*/true).transpose(-2, -1), q) + 1e-15);
    const at::Tensor kv = at::matmul(v, k_rot.transpose(-1, -2));  // [B, H, d, d]
    at::Tensor out = at::matmul(kv, q_rot) * z;                    // [B, H, d, N]
    out = out.flatten(1, 2).transpose(1, 2).to(dtype);             // -> [B, N, H * d]
    return out_dropout(apply_linear(out_proj, out));
}

SanaVideoFeedForwardImpl::SanaVideoFeedForwardImpl(int64_t dim, int64_t hidden) {
    conv_inverted =
        register_module("conv_inverted", nn::Conv2d(nn::Conv2dOptions(dim, 2 * hidden, 1)));
    conv_depth = register_module(
        "conv_depth",
        nn::Conv2d(nn::Conv2dOptions(2 * hidden, 2 * hidden, 3).padding(1).groups(2 * hidden)));
    conv_point =
        register_module("conv_point", nn::Conv2d(nn::Conv2dOptions(hidden, dim, 1).bias(false)));
    conv_temp = register_module(
        "conv_temp", nn::Conv2d(nn::Conv2dOptions(dim, dim, {3, 1}).padding({1, 0}).bias(false)));
}

at::Tensor SanaVideoFeedForwardImpl::per_frame(const at::Tensor& frames) {
    const at::Tensor y =
        conv_depth(torch::silu(pointwise_conv(conv_inverted, frames)));  // [n, 2F, h, w]
    const auto halves = y.chunk(2, 1);
    return pointwise_conv(conv_point, halves[0] * torch::silu(halves[1]));  // [n, D, h, w]
}

at::Tensor SanaVideoFeedForwardImpl::forward(const at::Tensor& x, const VideoGrid& g) {
    const int64_t batch = x.size(0), dim = x.size(2);
    // Every frame as an image: [B, N, D] -> [B * f, D, h, w].
    at::Tensor y = x.reshape({batch * g.frames, g.height, g.width, dim}).permute({0, 3, 1, 2});
    if (chunk_frames > 0 && chunk_frames < g.frames) {
        // Chunks of frames of every sample: [B, f, D, h, w] cut along f.
        const at::Tensor framed = y.reshape({batch, g.frames, dim, g.height, g.width});
        std::vector<at::Tensor> parts;
        // Every chunk uses the convolutions: their gradients meet in one accumulation.
        const std::vector<at::Tensor> params =
            at::GradMode::is_enabled() ? params_requiring_grad(*this) : std::vector<at::Tensor>();
        for (int64_t f0 = 0; f0 < g.frames; f0 += chunk_frames) {
            const int64_t n = std::min(chunk_frames, g.frames - f0);
            const at::Tensor chunk =
                framed.narrow(1, f0, n).reshape({batch * n, dim, g.height, g.width});
            at::Tensor out;
            if (at::GradMode::is_enabled()) {
                auto fn = [this](const std::vector<at::Tensor>& in) { return per_frame(in[0]); };
                out = checkpoint(fn, {chunk}, {}, params);
            } else {
                out = per_frame(chunk);
            }
            parts.push_back(out.reshape({batch, n, dim, g.height, g.width}));
        }
        y = at::cat(parts, 1).reshape({batch * g.frames, dim, g.height, g.width});
    } else {
        y = per_frame(y);  // [B * f, D, h, w]
    }
    // Over frames: [B * f, D, h, w] -> [B, D, f, h * w], a 3-tap conv along f.
    const at::Tensor t =
        y.reshape({batch, g.frames, dim, g.height * g.width}).permute({0, 2, 1, 3});
    y = t + conv_temp(t);
    return y.permute({0, 2, 3, 1}).reshape({batch, -1, dim});  // -> [B, N, D]
}

SanaVideoGuidanceEmbeddingImpl::SanaVideoGuidanceEmbeddingImpl(int64_t dim) {
    constexpr int64_t kFeatures = 256;
    timestep_embedder = register_module("timestep_embedder", SanaTimestepEmbedding(kFeatures, dim));
    guidance_embedder = register_module("guidance_embedder", SanaTimestepEmbedding(kFeatures, dim));
    linear = register_module("linear", nn::Linear(dim, 6 * dim));
}

std::pair<at::Tensor, at::Tensor> SanaVideoGuidanceEmbeddingImpl::forward(
    const at::Tensor& timestep, const at::Tensor& guidance, at::ScalarType dtype) {
    const at::Tensor t = timestep_embedder(sana_timestep_features(timestep, 256).to(dtype));
    const at::Tensor g = guidance_embedder(sana_timestep_features(guidance, 256).to(dtype));
    const at::Tensor conditioning = t + g;                     // [M, D]
    return {linear(torch::silu(conditioning)), conditioning};  // [M, 6D], [M, D]
}

at::Tensor modulate_groups(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
    const int64_t batch = x.size(0), groups = shift.size(1);
    const at::Tensor grouped = x.view({batch, groups, -1, x.size(2)});  // [B, G, N / G, D]
    return (grouped * (1 + scale.unsqueeze(2)) + shift.unsqueeze(2)).view(x.sizes());
}

at::Tensor gate_groups(const at::Tensor& x, const at::Tensor& gate) {
    const int64_t batch = x.size(0), groups = gate.size(1);
    return (gate.unsqueeze(2) * x.view({batch, groups, -1, x.size(2)})).view(x.sizes());
}

SanaVideoTransformerBlockImpl::SanaVideoTransformerBlockImpl(const SanaVideoTransformerConfig& c) {
    const int64_t dim = c.inner_dim();
    const bool qk_norm = c.qk_norm.has_value();
    scale_shift_table =
        register_parameter("scale_shift_table", torch::randn({6, dim}) / std::sqrt(double(dim)));
    norm1 = register_module(
        "norm1",
        nn::LayerNorm(nn::LayerNormOptions({dim}).elementwise_affine(false).eps(c.norm_eps)));
    attn1 = register_module(
        "attn1", SanaVideoLinearAttention(dim, c.num_attention_heads, c.attention_head_dim,
                                          c.attention_bias, qk_norm, c.dropout));
    norm2 =
        register_module("norm2", nn::LayerNorm(nn::LayerNormOptions({dim})
                                                   .elementwise_affine(c.norm_elementwise_affine)
                                                   .eps(c.norm_eps)));
    attn2 = register_module(
        "attn2", SanaCrossAttention(dim, c.cross_attention_dim, c.num_cross_attention_heads,
                                    c.cross_attention_head_dim, c.dropout, qk_norm));
    ff = register_module("ff", SanaVideoFeedForward(dim, c.ff_hidden_dim()));
}

at::Tensor SanaVideoTransformerBlockImpl::forward(const at::Tensor& tokens,
                                                  const at::Tensor& context, const at::Tensor& bias,
                                                  const at::Tensor& modulation,
                                                  const at::Tensor& cos, const at::Tensor& sin,
                                                  const VideoGrid& grid) {
    const int64_t batch = tokens.size(0), groups = modulation.size(1);
    // shift, scale, gate for the attention, then for the FFN: [B, G, D] each.
    const at::Tensor per_group = modulation.view({batch, groups, 6, -1});  // [B, G, 6, D]
    const auto mod = (scale_shift_table.unsqueeze(0).unsqueeze(0) + per_group).unbind(2);
    const at::Tensor &shift_msa = mod[0], &scale_msa = mod[1], &gate_msa = mod[2];
    const at::Tensor &shift_mlp = mod[3], &scale_mlp = mod[4], &gate_mlp = mod[5];

    at::Tensor x = modulate_groups(norm1(tokens), shift_msa, scale_msa).to(tokens.scalar_type());
    at::Tensor h = tokens + gate_groups(attn1(x, cos, sin), gate_msa);

    // As in the image model: the cross-attention takes the tokens as they are, ungated.
    h = attn2(h, context, bias) + h;

    x = modulate_groups(norm2(h), shift_mlp, scale_mlp);
    return h + gate_groups(ff(x, grid), gate_mlp);
}

}  // namespace sf::model

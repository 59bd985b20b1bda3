// Numerics follow diffusers v0.33.1 operation by operation (dtype casts included), so that fp32
// results match upstream to rounding: the golden tests hold them to rel 1e-4.
#include "model/sana/sana_blocks.h"

#include <torch/torch.h>

#include <cmath>

#include "core/torch_compat.h"
#include "model/common/checkpoint.h"
#include "model/common/lora.h"
#include "model/common/pointwise_conv.h"

namespace sf::model {
namespace {

namespace nn = torch::nn;

// The half of get_2d_sincos_pos_embed_from_grid for one axis: [M] positions -> [M, dim], sin
// then cos. The positions arrive in fp32 as upstream makes them; the frequencies and the products
// are fp64 there (numpy / torch.float64), and only the result is cast to fp32.
at::Tensor sincos_1d(int64_t dim, const at::Tensor& pos) {
    const auto f64 = pos.options().dtype(at::kDouble);
    at::Tensor omega = at::arange(dim / 2, f64) / (static_cast<double>(dim) / 2.0);
    omega = 1.0 / at::pow(10000.0, omega);                         // [dim / 2]
    const at::Tensor out = at::outer(pos.to(at::kDouble), omega);  // [M, dim / 2]
    return at::cat({at::sin(out), at::cos(out)}, 1);               // [M, dim]
}

}  // namespace

nn::ModuleList make_attention_output(int64_t in, int64_t out, double dropout, nn::Linear& proj,
                                     nn::Dropout& drop) {
    proj = nn::Linear(nn::LinearOptions(in, out).bias(true));
    drop = nn::Dropout(nn::DropoutOptions(dropout));
    nn::ModuleList list;
    list->push_back(proj);
    list->push_back(drop);
    return list;
}

at::Tensor sana_timestep_features(const at::Tensor& timestep, int64_t dim) {
    const int64_t half = dim / 2;
    // exp(-ln(10000) * i / half): fp32 throughout, as upstream.
    at::Tensor exponent =
        at::arange(half, timestep.options().dtype(at::kFloat)) * (-std::log(10000.0));
    exponent = exponent / static_cast<double>(half);
    const at::Tensor freqs = at::exp(exponent);
    const at::Tensor args = timestep.unsqueeze(1).to(at::kFloat) * freqs.unsqueeze(0);  // [B, half]
    // sin, cos concatenated, then flipped to cos, sin (flip_sin_to_cos=True).
    at::Tensor emb = at::cat({at::cos(args), at::sin(args)}, -1);  // [B, 2 * half]
    if (dim % 2 == 1) emb = at::constant_pad_nd(emb, {0, 1, 0, 0}, 0.0);
    return emb;
}

at::Tensor sana_sincos_pos_embed(int64_t dim, int64_t height, int64_t width, int64_t base_size,
                                 double interpolation_scale, const at::Device& device) {
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    // arange / (size / base_size) / interpolation_scale, each step in fp32 as upstream.
    const at::Tensor grid_h = at::arange(height, f32) /
                              (static_cast<double>(height) / static_cast<double>(base_size)) /
                              interpolation_scale;
    const at::Tensor grid_w = at::arange(width, f32) /
                              (static_cast<double>(width) / static_cast<double>(base_size)) /
                              interpolation_scale;
    // Token n = i * width + j sits at column grid_w[j], row grid_h[i].
    const at::Tensor cols = grid_w.unsqueeze(0).expand({height, width}).reshape({-1});  // [h * w]
    const at::Tensor rows = grid_h.unsqueeze(1).expand({height, width}).reshape({-1});  // [h * w]
    const at::Tensor emb = at::cat({sincos_1d(dim / 2, cols), sincos_1d(dim / 2, rows)}, 1);
    return emb.to(at::kFloat);  // [h * w, dim]
}

SanaTimestepEmbeddingImpl::SanaTimestepEmbeddingImpl(int64_t in_features, int64_t dim) {
    linear_1 = register_module("linear_1", nn::Linear(in_features, dim));
    linear_2 = register_module("linear_2", nn::Linear(dim, dim));
}

at::Tensor SanaTimestepEmbeddingImpl::forward(const at::Tensor& x) {
    return linear_2(torch::silu(linear_1(x)));
}

SanaAdaLayerNormSingleImpl::SanaAdaLayerNormSingleImpl(int64_t dim) {
    constexpr int64_t kTimestepFeatures = 256;
    emb = register_module("emb", std::make_shared<nn::Module>());
    timestep_embedder =
        emb->register_module("timestep_embedder", SanaTimestepEmbedding(kTimestepFeatures, dim));
    linear = register_module("linear", nn::Linear(dim, 6 * dim));
}

std::pair<at::Tensor, at::Tensor> SanaAdaLayerNormSingleImpl::forward(const at::Tensor& timestep,
                                                                      at::ScalarType dtype) {
    const at::Tensor features = sana_timestep_features(timestep, 256).to(dtype);
    at::Tensor embedded = timestep_embedder(features);  // [B, D]
    return {linear(torch::silu(embedded)), embedded};   // [B, 6D], [B, D]
}

SanaCaptionProjectionImpl::SanaCaptionProjectionImpl(int64_t in_features, int64_t dim) {
    linear_1 = register_module("linear_1", nn::Linear(in_features, dim));
    linear_2 = register_module("linear_2", nn::Linear(dim, dim));
}

at::Tensor SanaCaptionProjectionImpl::forward(const at::Tensor& x) {
    return linear_2(at::gelu(linear_1(x), "tanh"));
}

SanaRMSNormImpl::SanaRMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
    weight = register_parameter("weight", torch::ones({dim}));
}

at::Tensor SanaRMSNormImpl::forward(const at::Tensor& x) {
    const at::Tensor variance = x.to(at::kFloat).pow(2).mean(-1, /*keepdim=*/true);
    at::Tensor y = x * at::rsqrt(variance + eps);
    // Half-precision weights get a half-precision product, as upstream.
    if (weight.scalar_type() == at::kHalf || weight.scalar_type() == at::kBFloat16) {
        y = y.to(weight.scalar_type());
    }
    return y * weight;
}

SanaPatchEmbedImpl::SanaPatchEmbedImpl(int64_t in_channels, int64_t dim, int64_t patch_size_,
                                       int64_t sample_size, std::optional<double> scale)
    : patch_size(patch_size_), base_size(sample_size / patch_size_), interpolation_scale(scale) {
    proj = register_module(
        "proj", nn::Conv2d(nn::Conv2dOptions(in_channels, dim, patch_size).stride(patch_size)));
}

at::Tensor SanaPatchEmbedImpl::forward(const at::Tensor& x) {
    const int64_t height = x.size(2) / patch_size, width = x.size(3) / patch_size;
    at::Tensor tokens = proj(x).flatten(2).transpose(1, 2);  // [B, D, h, w] -> [B, h * w, D]
    if (!interpolation_scale) return tokens;
    // Upstream adds its cached table when the grid is its base grid and recomputes it otherwise;
    // both are this function of the grid, so computing it always gives the same numbers.
    const at::Tensor pos = sana_sincos_pos_embed(tokens.size(2), height, width, base_size,
                                                 *interpolation_scale, tokens.device());
    return (tokens + pos.unsqueeze(0)).to(tokens.scalar_type());  // [B, h * w, D]
}

SanaLinearAttentionImpl::SanaLinearAttentionImpl(int64_t dim, int64_t heads_, int64_t head_dim,
                                                 bool bias, double dropout)
    : heads(heads_) {
    const int64_t inner = heads * head_dim;
    to_q = register_module("to_q", nn::Linear(nn::LinearOptions(dim, inner).bias(bias)));
    to_k = register_module("to_k", nn::Linear(nn::LinearOptions(dim, inner).bias(bias)));
    to_v = register_module("to_v", nn::Linear(nn::LinearOptions(dim, inner).bias(bias)));
    to_out = register_module("to_out",
                             make_attention_output(inner, dim, dropout, out_proj, out_dropout));
}

namespace {
// [B, n, H * d] -> [B, H, d, n]: heads split the channels, channel c = head * d + i.
at::Tensor split_heads(const at::Tensor& t, int64_t heads) {
    const int64_t batch = t.size(0), tokens = t.size(1);
    return t.transpose(1, 2).reshape({batch, heads, -1, tokens});
}
}  // namespace

at::Tensor SanaLinearAttentionImpl::key_values(const at::Tensor& x) {
    const at::Tensor k = torch::relu(split_heads(apply_linear(to_k, x), heads).transpose(2, 3))
                             .to(at::kFloat);                                 // [B, H, n, d]
    at::Tensor v = split_heads(apply_linear(to_v, x), heads).to(at::kFloat);  // [B, H, d, n]
    // The row of ones makes the last output row sum_j k_j . q: the softmax-free normaliser.
    v = at::constant_pad_nd(v, {0, 0, 0, 1}, 1.0);  // [B, H, d, n] -> [B, H, d + 1, n]
    return at::matmul(v, k);                        // [B, H, d + 1, d]
}

at::Tensor SanaLinearAttentionImpl::attend(const at::Tensor& x, const at::Tensor& kv) {
    const auto dtype = x.scalar_type();
    const int64_t batch = x.size(0), tokens = x.size(1), d = kv.size(3);
    const at::Tensor q =
        torch::relu(split_heads(apply_linear(to_q, x), heads)).to(at::kFloat);  // [B, H, d, n]
    at::Tensor out = at::matmul(kv, q);                                         // [B, H, d + 1, n]
    out = out.narrow(2, 0, d) / (out.narrow(2, d, 1) + 1e-15);                  // [B, H, d, n]
    out = out.reshape({batch, -1, tokens}).transpose(1, 2).to(dtype);  // [B, H, d, n] -> [B, n, C]
    out = out_dropout(apply_linear(out_proj, out));
    if (dtype == at::kHalf) out = out.clamp(-65504, 65504);
    return out;
}

at::Tensor SanaLinearAttentionImpl::forward(const at::Tensor& x) {
    if (chunk_tokens <= 0 || chunk_tokens >= x.size(1)) return attend(x, key_values(x));
    const bool grad = at::GradMode::is_enabled();
    const std::vector<at::Tensor> pieces = x.split(chunk_tokens, 1);  // [B, n, D] each
    at::Tensor kv;
    for (const at::Tensor& piece : pieces) {
        auto fn = [this](const std::vector<at::Tensor>& in) { return key_values(in[0]); };
        const at::Tensor part = grad ? checkpoint(fn, {piece}) : fn({piece});
        kv = kv.defined() ? kv + part : part;
    }
    std::vector<at::Tensor> outs;
    for (const at::Tensor& piece : pieces) {
        auto fn = [this](const std::vector<at::Tensor>& in) { return attend(in[0], in[1]); };
        outs.push_back(grad ? checkpoint(fn, {piece, kv}) : fn({piece, kv}));
    }
    return at::cat(outs, 1);  // [B, N, D]
}

SanaCrossAttentionImpl::SanaCrossAttentionImpl(int64_t dim, int64_t context_dim, int64_t heads_,
                                               int64_t head_dim_, double dropout, bool qk_norm)
    : heads(heads_), head_dim(head_dim_) {
    const int64_t inner = heads * head_dim;
    to_q = register_module("to_q", nn::Linear(dim, inner));
    to_k = register_module("to_k", nn::Linear(context_dim, inner));
    to_v = register_module("to_v", nn::Linear(context_dim, inner));
    if (qk_norm) {
        // diffusers' Attention builds them with its default eps, 1e-5.
        norm_q = register_module("norm_q", SanaRMSNorm(inner, 1e-5));
        norm_k = register_module("norm_k", SanaRMSNorm(inner, 1e-5));
    }
    to_out = register_module("to_out",
                             make_attention_output(inner, dim, dropout, out_proj, out_dropout));
}

at::Tensor SanaCrossAttentionImpl::attend(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, const at::Tensor& bias) const {
    return attention(attention_kernel, q, k, v, bias, attention_chunk);
}

at::Tensor SanaCrossAttentionImpl::forward(const at::Tensor& x, const at::Tensor& context,
                                           const at::Tensor& bias) {
    const int64_t batch = x.size(0);
    auto split_heads = [&](const at::Tensor& t) {
        return t.view({batch, -1, heads, head_dim}).transpose(1, 2);  // [B, L, C] -> [B, H, L, d]
    };
    at::Tensor q = apply_linear(to_q, x);
    at::Tensor k = apply_linear(to_k, context);
    const at::Tensor v = split_heads(apply_linear(to_v, context));
    if (norm_q) {
        // An fp32 norm weight makes q and k fp32 under autocast, as upstream's RMSNorm does; its
        // SDPA then computes in the autocast dtype, which v already has: so do the kernels here.
        q = norm_q(q).to(v.scalar_type());
        k = norm_k(k).to(v.scalar_type());
    }
    q = split_heads(q);  // [B, H, N, d]
    k = split_heads(k);
    at::Tensor out = attend(q, k, v, bias);                            // [B, H, N, d]
    out = out.transpose(1, 2).reshape({batch, -1, heads * head_dim});  // [B, H, N, d] -> [B, N, C]
    return out_dropout(apply_linear(out_proj, out.to(q.scalar_type())));
}

SanaGLUMBConvImpl::SanaGLUMBConvImpl(int64_t dim, int64_t hidden) {
    conv_inverted =
        register_module("conv_inverted", nn::Conv2d(nn::Conv2dOptions(dim, 2 * hidden, 1)));
    conv_depth = register_module(
        "conv_depth",
        nn::Conv2d(nn::Conv2dOptions(2 * hidden, 2 * hidden, 3).padding(1).groups(2 * hidden)));
    conv_point =
        register_module("conv_point", nn::Conv2d(nn::Conv2dOptions(hidden, dim, 1).bias(false)));
}

at::Tensor SanaGLUMBConvImpl::rows(const at::Tensor& window, int64_t first, int64_t count) {
    // F = the hidden width.
    at::Tensor h = torch::silu(pointwise_conv(conv_inverted, window));  // [B, 2F, rows, w]
    at::Tensor y;
    if (window.size(2) == count) {
        y = conv_depth(h);
    } else {
        // A chunk at the image's edge has no halo row there: a zero row of h stands in for it
        // (what the conv's own padding gives the whole run), so that every window the 3x3 conv
        // sees has count + 2 >= 3 rows. On fewer, oneDNN's depthwise conv of channels-last input
        // (h is: pointwise_conv's) takes a path whose scratchpad is megabytes whatever the size
        // (3 MB at 320 channels, 4.6 MB in bf16, on 1 or 2 rows of any width).
        const int64_t below = window.size(2) - first - count;
        h = at::constant_pad_nd(h, {0, 0, 1 - first, 1 - below}, 0.0);
        y = conv_depth(h).narrow(2, 1, count);  // drop the halo's rows
    }
    const auto halves = y.chunk(2, 1);  // value, gate: [B, F, count, w] each
    return pointwise_conv(conv_point, halves[0] * torch::silu(halves[1]));  // [B, D, count, w]
}

at::Tensor SanaGLUMBConvImpl::forward(const at::Tensor& x) {
    const int64_t height = x.size(2);
    if (chunk_rows <= 0 || chunk_rows >= height) return rows(x, 0, height);
    // Each chunk's inputs are its own rows (a split, whose backward gathers the gradients in one
    // concatenation) and one row of each neighbour as the halo, so no chunk's backward makes a
    // gradient of the whole x.
    const std::vector<at::Tensor> pieces = x.split(chunk_rows, 2);
    std::vector<at::Tensor> parts;
    for (size_t i = 0; i < pieces.size(); ++i) {
        std::vector<at::Tensor> in;
        const bool above = i > 0, below = i + 1 < pieces.size();
        if (above) in.push_back(pieces[i - 1].narrow(2, pieces[i - 1].size(2) - 1, 1));
        in.push_back(pieces[i]);
        if (below) in.push_back(pieces[i + 1].narrow(2, 0, 1));
        const int64_t first = above ? 1 : 0, count = pieces[i].size(2);
        auto fn = [this, first, count](const std::vector<at::Tensor>& window) {
            return rows(at::cat(window, 2), first, count);  // [B, D, count (+ halo), w]
        };
        parts.push_back(at::GradMode::is_enabled() ? checkpoint(fn, in) : fn(in));
    }
    return at::cat(parts, 2);  // [B, D, h, w]
}

SanaTransformerBlockImpl::SanaTransformerBlockImpl(const SanaTransformerConfig& c) {
    const int64_t dim = c.inner_dim();
    // Upstream initialises the table as randn / sqrt(dim); checkpoints overwrite it.
    scale_shift_table =
        register_parameter("scale_shift_table", torch::randn({6, dim}) / std::sqrt(double(dim)));
    norm1 = register_module(
        "norm1",
        nn::LayerNorm(nn::LayerNormOptions({dim}).elementwise_affine(false).eps(c.norm_eps)));
    attn1 = register_module("attn1",
                            SanaLinearAttention(dim, c.num_attention_heads, c.attention_head_dim,
                                                c.attention_bias, c.dropout));
    norm2 =
        register_module("norm2", nn::LayerNorm(nn::LayerNormOptions({dim})
                                                   .elementwise_affine(c.norm_elementwise_affine)
                                                   .eps(c.norm_eps)));
    attn2 = register_module(
        "attn2", SanaCrossAttention(dim, c.cross_attention_dim, c.num_cross_attention_heads,
                                    c.cross_attention_head_dim, c.dropout));
    ff = register_module("ff", SanaGLUMBConv(dim, c.ff_hidden_dim()));
}

at::Tensor SanaTransformerBlockImpl::forward(const at::Tensor& tokens, const at::Tensor& context,
                                             const at::Tensor& bias, const at::Tensor& modulation,
                                             int64_t height, int64_t width) {
    const int64_t batch = tokens.size(0);
    // shift, scale, gate for the attention, then for the FFN: [B, 1, D] each.
    const at::Tensor per_sample = modulation.reshape({batch, 6, -1});  // [B, 6D] -> [B, 6, D]
    const auto mod = (scale_shift_table.unsqueeze(0) + per_sample).chunk(6, 1);
    const at::Tensor &shift_msa = mod[0], &scale_msa = mod[1], &gate_msa = mod[2];
    const at::Tensor &shift_mlp = mod[3], &scale_mlp = mod[4], &gate_mlp = mod[5];

    at::Tensor x = norm1(tokens) * (1 + scale_msa) + shift_msa;
    at::Tensor h = tokens + gate_msa * attn1(x.to(tokens.scalar_type()));

    // Upstream's cross-attention takes the tokens as they are: no norm, no modulation, no gate.
    h = attn2(h, context, bias) + h;

    x = norm2(h) * (1 + scale_mlp) + shift_mlp;
    x = x.view({batch, height, width, -1}).permute({0, 3, 1, 2});  // [B, h * w, D] -> [B, D, h, w]
    x = ff(x).flatten(2, 3).permute({0, 2, 1});                    // [B, D, h, w] -> [B, h * w, D]
    return h + gate_mlp * x;
}

}  // namespace sf::model

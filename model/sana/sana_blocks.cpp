// Numerics follow diffusers v0.33.1 operation by operation (dtype casts included), so that fp32
// results match upstream to rounding: the golden tests hold them to rel 1e-4.
#include "model/sana/sana_blocks.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/torch_compat.h"
#include "model/common/autocast.h"
#include "model/common/checkpoint.h"
#include "model/common/linear_attention.h"
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
    return linear(linear_2, at::gelu(linear(linear_1, x), "tanh"));  // x: [B, L, C]
}

SanaRMSNormImpl::SanaRMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
    weight = register_parameter("weight", torch::ones({dim}));
}

namespace {

bool half_precision(const at::Tensor& t) {
    return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
}

// diffusers' RMSNorm as one autograd node: the plain ops keep an fp32 copy of x and the
// normalised x for backward (two fp32 tensors of x's size beside x itself); this keeps x in its
// own dtype and the per-row 1 / rms, and recomputes the normalised x in backward. With
// xhat = x r, r = rsqrt(mean(x^2) + eps), out = xhat w:
//   dw = sum over rows of g xhat,  dx = r (g w - xhat mean(g w xhat)).
struct RMSNormFunction : torch::autograd::Function<RMSNormFunction> {
    static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                              const at::Tensor& weight, double eps) {
        const at::Tensor xf = x.to(at::kFloat);
        const at::Tensor r = at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
        at::Tensor y = xf * r;
        // Half-precision weights get a half-precision product, as upstream.
        if (half_precision(weight)) y = y.to(weight.scalar_type());
        ctx->save_for_backward({x, weight, r});
        return y * weight;
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                   torch::autograd::variable_list grads) {
        const auto saved = ctx->get_saved_variables();
        const at::Tensor &x = saved[0], &weight = saved[1], &r = saved[2];
        at::Tensor xhat = x.to(at::kFloat) * r;
        if (half_precision(weight)) xhat = xhat.to(weight.scalar_type()).to(at::kFloat);
        const at::Tensor g = grads.at(0).to(at::kFloat);
        at::Tensor dx, dw;
        if (ctx->needs_input_grad(1))
            dw = (g * xhat).reshape({-1, weight.numel()}).sum(0).to(weight.scalar_type());
        if (ctx->needs_input_grad(0)) {
            const at::Tensor gw = g * weight.to(at::kFloat);
            const at::Tensor inner = (gw * xhat).mean(-1, /*keepdim=*/true);
            dx = ((gw - xhat * inner) * r).to(x.scalar_type());
        }
        return {dx, dw, at::Tensor()};
    }
};

}  // namespace

at::Tensor SanaRMSNormImpl::forward(const at::Tensor& x) {
    return RMSNormFunction::apply(x, weight, eps);
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
    if (chunk_tokens <= 0) return attend(x, key_values(x));
    // Cast once for the three projections, not once each (and three copies kept for backward).
    const at::Tensor xc = autocast_cast(x);
    const at::Tensor out =
        relu_linear_attention(apply_linear(to_q, xc), apply_linear(to_k, xc),
                              apply_linear(to_v, xc), heads, chunk_tokens);  // [B, N, C]
    at::Tensor projected = out_dropout(apply_linear(out_proj, out));
    if (x.scalar_type() == at::kHalf) projected = projected.clamp(-65504, 65504);
    return projected;
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

MixFFNWeights SanaGLUMBConvImpl::weights() const {
    return {conv_inverted->weight, conv_inverted->bias, conv_depth->weight, conv_depth->bias,
            conv_point->weight};
}

MixFFNWeights SanaGLUMBConvImpl::cast_weights() const {
    MixFFNWeights w = weights();
    for (at::Tensor* t : w.all()) {
        if (!t->defined()) continue;
        const bool grad = t->requires_grad();
        *t = autocast_cast(t->detach());
        if (grad) t->requires_grad_(true);
    }
    return w;
}

at::Tensor SanaGLUMBConvImpl::rows(const at::Tensor& window, int64_t first, int64_t count,
                                   const MixFFNWeights& w) {
    // F = the hidden width.
    at::Tensor h =
        torch::silu(pointwise_conv(window, w.inverted, w.inverted_bias));  // [B, 2F, rows, w]
    at::Tensor y = h;
    if (window.size(2) == count) {
        // The whole latent: conv_depth as upstream runs it (3x3, padding 1, a group per channel).
        y = at::conv2d(y, w.depth, w.depth_bias, /*stride=*/1, /*padding=*/1, /*dilation=*/1,
                       /*groups=*/w.depth.size(0));
    } else {
        // A chunk of rows: its window has one halo row on each side where the latent has one,
        // and a zero row of h where it has none (the image's edge), which is what the conv's
        // own zero padding gives. So the conv pads only the width and yields exactly the chunk's
        // rows: no slice of a larger output, whose backward would allocate and zero a gradient
        // of the whole window. (Windows of 3 rows or more also keep oneDNN's depthwise conv of
        // channels-last input off a path whose scratchpad is megabytes on 1 or 2 rows.)
        const int64_t above = first == 0 ? 1 : 0;
        const int64_t below = window.size(2) - first - count == 0 ? 1 : 0;
        if (above + below > 0) y = at::constant_pad_nd(y, {0, 0, above, below}, 0.0);
        const std::vector<int64_t> width_only = {0, 1};
        y = at::conv2d(y, w.depth, w.depth_bias, /*stride=*/{1, 1}, width_only,
                       /*dilation=*/{1, 1}, /*groups=*/w.depth.size(0));
    }
    const auto halves = y.chunk(2, 1);  // value, gate: [B, F, count, w] each
    return pointwise_conv(halves[0] * torch::silu(halves[1]), w.point,
                          at::Tensor());  // [B, D, count, w]
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// [B, D, rows, w] -> its tokens [B, rows * w, D] (a view).
at::Tensor tokens_of(const at::Tensor& image) { return image.flatten(2, 3).permute({0, 2, 1}); }

// Rows [first, first + count) of the latent and their window [lo, hi): one halo row on each
// side where the latent has one.
struct RowChunk {
    int64_t first, count, lo, hi;
};

std::vector<RowChunk> row_chunks(int64_t height, int64_t rows) {
    std::vector<RowChunk> out;
    for (int64_t first = 0; first < height; first += rows) {
        const int64_t count = std::min(rows, height - first);
        out.push_back(
            {first, count, std::max<int64_t>(0, first - 1), std::min(height, first + count + 1)});
    }
    return out;
}

// What the backward needs besides gate and x: the module and the forward's autocast state.
struct ChunkedFFNState : torch::CustomClassHolder {
    SanaGLUMBConvImpl* ff = nullptr;
    AutocastState autocast;
    std::vector<at::Tensor> params;  // ff's that require grad: the node's inputs after x
};

// The stand-in in `cast` of each parameter (one of `own`'s tensors), in the parameters' order.
std::vector<at::Tensor> stand_ins(const std::vector<at::Tensor>& params, MixFFNWeights own,
                                  MixFFNWeights cast) {
    std::vector<at::Tensor> out;
    for (const at::Tensor& p : params) {
        for (size_t k = 0; k < own.all().size(); ++k) {
            if (own.all()[k]->is_same(p)) out.push_back(*cast.all()[k]);
        }
    }
    TORCH_CHECK(out.size() == params.size(), "ChunkedGatedFFN: a parameter is not the module's");
    return out;
}

// h + gate * ff(x), one node: the forward keeps x and gate, the backward recomputes one chunk
// at a time with grad and takes its gradients (x's, the parameters', the gate's) before the next.
// The parameters' gradients are summed over the chunks and leave this node with the others, so
// each parameter's accumulator runs once (checkpoint.h says why that matters).
struct ChunkedGatedFFN : torch::autograd::Function<ChunkedGatedFFN> {
    static at::Tensor forward(AutogradContext* ctx, SanaGLUMBConvImpl* ff, const at::Tensor& h,
                              const at::Tensor& gate, const at::Tensor& x, at::TensorList params,
                              bool result_unread) {
        auto state = c10::make_intrusive<ChunkedFFNState>();
        state->ff = ff;
        state->params = params.vec();  // used through ff; their gradients leave this node
        state->autocast = AutocastState::capture();
        ctx->save_for_backward({gate, x});
        ctx->saved_data["state"] = at::IValue::make_capsule(std::move(state));
        ctx->saved_data["h_grad"] = h.requires_grad();
        if (result_unread) {
            return at::empty(h.sizes(), h.options().dtype(c10::promoteTypes(h.scalar_type(),
                                                                            gate.scalar_type())));
        }
        return ff->chunked_gated_residual(h, gate, x);
    }

    // One slot per forward argument: ff, h, gate, x, each parameter, result_unread.
    static variable_list backward(AutogradContext* ctx, variable_list grads) {
        const auto state = c10::static_intrusive_pointer_cast<ChunkedFFNState>(
            ctx->saved_data.at("state").toCapsule());
        const variable_list saved = ctx->get_saved_variables();
        const at::Tensor &gate = saved[0], &x = saved[1], &g = grads.at(0);  // g: [B, N, D]
        const int64_t width = x.size(3);
        at::Tensor grad_x = x.requires_grad() ? at::zeros_like(x) : at::Tensor();
        at::Tensor grad_gate = gate.requires_grad() ? at::zeros_like(gate) : at::Tensor();
        const std::vector<at::Tensor>& params = state->params;
        std::vector<at::Tensor> grad_params(params.size());
        AutocastGuard autocast(state->autocast);
        // Cast once for all chunks; each chunk's gradients are taken for the casts and summed in
        // the parameters' dtype, as the casts' own backward would have given them.
        const MixFFNWeights w = state->ff->cast_weights();
        const std::vector<at::Tensor> targets_w = stand_ins(params, state->ff->weights(), w);
        for (const RowChunk& c : row_chunks(x.size(2), state->ff->chunk_rows)) {
            const at::Tensor window =
                x.narrow(2, c.lo, c.hi - c.lo).detach().requires_grad_(x.requires_grad());
            at::Tensor y;  // [B, count * w, D]
            {
                torch::AutoGradMode grad(true);
                y = tokens_of(state->ff->rows(window, c.first - c.lo, c.count, w));
            }
            const at::Tensor g_c = g.narrow(1, c.first * width, c.count * width);
            if (grad_gate.defined()) grad_gate += (g_c * y.detach()).sum(1, true);
            if (!y.requires_grad()) continue;
            std::vector<at::Tensor> targets = targets_w;
            if (grad_x.defined()) targets.push_back(window);
            const variable_list found =
                torch::autograd::grad({y}, targets, {(g_c * gate).to(y.scalar_type())},
                                      /*retain_graph=*/false, /*create_graph=*/false,
                                      /*allow_unused=*/true);
            for (size_t i = 0; i < params.size(); ++i) {
                if (!found[i].defined()) continue;
                if (grad_params[i].defined()) {
                    grad_params[i].add_(found[i]);
                } else {
                    grad_params[i] = found[i].to(params[i].scalar_type());
                }
            }
            if (grad_x.defined()) grad_x.narrow(2, c.lo, c.hi - c.lo) += found.back();
        }
        const bool h_grad = ctx->saved_data.at("h_grad").toBool();
        variable_list out = {at::Tensor(), h_grad ? g : at::Tensor(), grad_gate, grad_x};
        out.insert(out.end(), grad_params.begin(), grad_params.end());
        out.emplace_back();  // result_unread
        return out;
    }
};

}  // namespace

at::Tensor SanaGLUMBConvImpl::chunked_gated_residual(const at::Tensor& h, const at::Tensor& gate,
                                                     const at::Tensor& x) {
    const int64_t width = x.size(3);
    const MixFFNWeights w = cast_weights();
    at::Tensor out;
    for (const RowChunk& c : row_chunks(x.size(2), chunk_rows)) {
        const at::Tensor y =
            tokens_of(rows(x.narrow(2, c.lo, c.hi - c.lo), c.first - c.lo, c.count, w));
        const at::Tensor gated = gate * y;
        if (!out.defined()) {
            out = at::empty(h.sizes(), h.options().dtype(c10::promoteTypes(h.scalar_type(),
                                                                           gated.scalar_type())));
        }
        at::Tensor part = out.narrow(1, c.first * width, c.count * width);
        at::add_out(part, h.narrow(1, c.first * width, c.count * width), gated);
    }
    return out;
}

at::Tensor SanaGLUMBConvImpl::gated_residual(const at::Tensor& h, const at::Tensor& gate,
                                             const at::Tensor& x, bool result_unread) {
    const int64_t height = x.size(2);
    if (chunk_rows <= 0 || chunk_rows >= height) {
        return h + gate * tokens_of(rows(x, 0, height, weights()));
    }
    if (!at::GradMode::is_enabled()) return chunked_gated_residual(h, gate, x);
    const std::vector<at::Tensor> params = params_requiring_grad(*this);
    // As a TensorList, so that apply counts each parameter as an input of the node.
    return ChunkedGatedFFN::apply(this, h, gate, x, at::TensorList(params), result_unread);
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
                                             int64_t height, int64_t width, bool result_unread) {
    const int64_t batch = tokens.size(0);
    // shift, scale, gate for the attention, then for the FFN: [B, 1, D] each.
    const at::Tensor per_sample = modulation.reshape({batch, 6, -1});  // [B, 6D] -> [B, 6, D]
    const auto mod = (scale_shift_table.unsqueeze(0) + per_sample).chunk(6, 1);
    const at::Tensor &shift_msa = mod[0], &scale_msa = mod[1], &gate_msa = mod[2];
    const at::Tensor &shift_mlp = mod[3], &scale_mlp = mod[4], &gate_mlp = mod[5];

    // The attentions' outputs (bf16 under autocast) are promoted to the tokens' dtype (fp32)
    // before they meet them: the numbers the mixed-dtype ops would give, but ATen's element-wise
    // kernels run several times slower on mixed dtypes.
    const auto promoted = [](const at::Tensor& t, at::ScalarType other) {
        return t.to(c10::promoteTypes(t.scalar_type(), other));
    };
    const auto dtype = tokens.scalar_type();
    at::Tensor x = norm1(tokens) * (1 + scale_msa) + shift_msa;
    at::Tensor h = tokens + gate_msa * promoted(attn1(x.to(dtype)), dtype);

    // Upstream's cross-attention takes the tokens as they are: no norm, no modulation, no gate.
    h = promoted(attn2(h, context, bias), h.scalar_type()) + h;

    x = norm2(h) * (1 + scale_mlp) + shift_mlp;
    x = x.view({batch, height, width, -1}).permute({0, 3, 1, 2});  // [B, h * w, D] -> [B, D, h, w]
    return ff->gated_residual(h, gate_mlp, x, result_unread);
}

}  // namespace sf::model

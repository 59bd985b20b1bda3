#include "model/gemma/gemma2.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/shape.h"
#include "model/common/offload.h"
#include "storage/safetensors_file.h"

namespace sf::model {
namespace {

double lowest_value(at::ScalarType dtype) {
    double lowest = 0.0;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "gemma2_mask_min", [&] {
        lowest = static_cast<double>(std::numeric_limits<scalar_t>::lowest());
    });
    return lowest;
}

// [..., D] -> [..., D]: (x1, x2) -> (-x2, x1) on the two halves of the last dimension.
torch::Tensor rotate_half(const torch::Tensor& x) {
    const int64_t half = x.size(-1) / 2;
    return torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

// [B, KV, L, D] -> [B, KV * n_rep, L, D], each KV head repeated n_rep times in place (as
// repeat_interleave on dim 1).
torch::Tensor repeat_kv(const torch::Tensor& x, int64_t n_rep) {
    if (n_rep == 1) return x;
    const int64_t b = x.size(0), kv = x.size(1), l = x.size(2), d = x.size(3);
    return x
        .unsqueeze(2)                     // [B, KV, L, D] -> [B, KV, 1, L, D]
        .expand({b, kv, n_rep, l, d})     // -> [B, KV, n_rep, L, D]
        .reshape({b, kv * n_rep, l, d});  // -> [B, KV * n_rep, L, D]
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Modules

Gemma2RMSNormImpl::Gemma2RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
    // Zeros, as upstream: the scale is (1 + weight).
    weight = register_parameter("weight", torch::zeros({dim}));
}

torch::Tensor Gemma2RMSNormImpl::forward(const torch::Tensor& x) {
    // In fp32 whatever the input, and (x * w) is cast back, not x cast then scaled: the order
    // upstream chose for Gemma (transformers PR 29402).
    const torch::Tensor xf = x.to(torch::kFloat);
    torch::Tensor out = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps_);
    out = out * (1.0 + weight.to(torch::kFloat));
    return out.to(x.scalar_type());
}

Gemma2MLPImpl::Gemma2MLPImpl(const Gemma2Config& c)
    : tanh_gelu_(c.hidden_activation == "gelu_pytorch_tanh") {
    auto linear = [](int64_t in, int64_t out) {
        return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
    };
    gate_proj = register_module("gate_proj", linear(c.hidden_size, c.intermediate_size));
    up_proj = register_module("up_proj", linear(c.hidden_size, c.intermediate_size));
    down_proj = register_module("down_proj", linear(c.intermediate_size, c.hidden_size));
}

torch::Tensor Gemma2MLPImpl::forward(const torch::Tensor& x) {
    const torch::Tensor gate = torch::gelu(gate_proj(x), tanh_gelu_ ? "tanh" : "none");
    return down_proj(gate * up_proj(x));
}

Gemma2AttentionImpl::Gemma2AttentionImpl(const Gemma2Config& c)
    : num_heads_(c.num_attention_heads),
      num_kv_heads_(c.num_key_value_heads),
      head_dim_(c.head_dim),
      scaling_(std::pow(c.query_pre_attn_scalar, -0.5)),
      softcap_(c.attn_logit_softcapping),
      dropout_(c.attention_dropout) {
    auto linear = [&](int64_t in, int64_t out) {
        return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(c.attention_bias));
    };
    q_proj = register_module("q_proj", linear(c.hidden_size, num_heads_ * head_dim_));
    k_proj = register_module("k_proj", linear(c.hidden_size, num_kv_heads_ * head_dim_));
    v_proj = register_module("v_proj", linear(c.hidden_size, num_kv_heads_ * head_dim_));
    o_proj = register_module("o_proj", linear(num_heads_ * head_dim_, c.hidden_size));
}

torch::Tensor Gemma2AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                           const torch::Tensor& sin, const torch::Tensor& mask) {
    const int64_t b = x.size(0), l = x.size(1);
    // [B, L, H * D] -> [B, L, H, D] -> [B, H, L, D]
    torch::Tensor q = q_proj(x).view({b, l, num_heads_, head_dim_}).transpose(1, 2);
    // [B, L, KV * D] -> [B, L, KV, D] -> [B, KV, L, D]
    torch::Tensor k = k_proj(x).view({b, l, num_kv_heads_, head_dim_}).transpose(1, 2);
    torch::Tensor v = v_proj(x).view({b, l, num_kv_heads_, head_dim_}).transpose(1, 2);

    const torch::Tensor c = cos.unsqueeze(1);  // [B, L, D] -> [B, 1, L, D]
    const torch::Tensor s = sin.unsqueeze(1);  // [B, L, D] -> [B, 1, L, D]
    q = q * c + rotate_half(q) * s;
    k = k * c + rotate_half(k) * s;

    const int64_t n_rep = num_heads_ / num_kv_heads_;
    k = repeat_kv(k, n_rep);  // [B, KV, L, D] -> [B, H, L, D]
    v = repeat_kv(v, n_rep);  // [B, KV, L, D] -> [B, H, L, D]

    // [B, H, L, D] x [B, H, D, L] -> [B, H, L, L]; scaled after the product, as upstream.
    torch::Tensor scores = torch::matmul(q, k.transpose(2, 3)) * scaling_;
    if (softcap_) {
        // Capped before the mask is added: masked logits stay at the dtype's lowest value.
        scores = torch::tanh(scores / *softcap_) * *softcap_;
    }
    if (mask.defined()) scores = scores + mask;  // [B, 1, L, L] broadcast over heads
    torch::Tensor weights = torch::softmax(scores, -1, torch::kFloat).to(q.scalar_type());
    if (dropout_ > 0.0) weights = torch::dropout(weights, dropout_, is_training());

    torch::Tensor out = torch::matmul(weights, v);  // [B, H, L, L] x [B, H, L, D] -> [B, H, L, D]
    out = out.transpose(1, 2).reshape({b, l, num_heads_ * head_dim_});  // -> [B, L, H * D]
    return o_proj(out);
}

Gemma2DecoderLayerImpl::Gemma2DecoderLayerImpl(const Gemma2Config& c, int64_t layer_index)
    : is_sliding(c.is_sliding(layer_index)) {
    self_attn = register_module("self_attn", Gemma2Attention(c));
    mlp = register_module("mlp", Gemma2MLP(c));
    input_layernorm =
        register_module("input_layernorm", Gemma2RMSNorm(c.hidden_size, c.rms_norm_eps));
    post_attention_layernorm =
        register_module("post_attention_layernorm", Gemma2RMSNorm(c.hidden_size, c.rms_norm_eps));
    pre_feedforward_layernorm =
        register_module("pre_feedforward_layernorm", Gemma2RMSNorm(c.hidden_size, c.rms_norm_eps));
    post_feedforward_layernorm =
        register_module("post_feedforward_layernorm", Gemma2RMSNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor Gemma2DecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                              const torch::Tensor& sin, const torch::Tensor& mask) {
    torch::Tensor h = post_attention_layernorm(self_attn(input_layernorm(x), cos, sin, mask));
    const torch::Tensor mid = x + h;
    h = post_feedforward_layernorm(mlp(pre_feedforward_layernorm(mid)));
    return mid + h;
}

Gemma2ModelImpl::Gemma2ModelImpl(const Gemma2Config& config) : config_(config) {
    config_.validate();
    auto embed_options = torch::nn::EmbeddingOptions(config_.vocab_size, config_.hidden_size);
    if (config_.pad_token_id) embed_options.padding_idx(*config_.pad_token_id);
    embed_tokens = register_module("embed_tokens", torch::nn::Embedding(embed_options));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < config_.num_hidden_layers; ++i)
        layers->push_back(Gemma2DecoderLayer(config_, i));
    norm = register_module("norm", Gemma2RMSNorm(config_.hidden_size, config_.rms_norm_eps));

    // Upstream's _init_weights: N(0, initializer_range) for linear and embedding weights, the
    // padding row zero. Loading a checkpoint overwrites all of it.
    torch::NoGradGuard no_grad;
    for (auto& p : named_parameters(/*recurse=*/true)) {
        if (p.key().size() >= 7 && p.key().compare(p.key().size() - 7, 7, ".weight") == 0 &&
            p.value().dim() == 2) {
            p.value().normal_(0.0, config_.initializer_range);
        } else if (p.key().size() >= 5 && p.key().compare(p.key().size() - 5, 5, ".bias") == 0) {
            p.value().zero_();
        }
    }
    if (config_.pad_token_id) embed_tokens->weight[*config_.pad_token_id].zero_();

    // inv_freq = 1 / theta^(arange(0, D, 2) / D) in fp32, as upstream computes it.
    const torch::Tensor exponents =
        torch::arange(0, config_.head_dim, 2, torch::kLong).to(torch::kFloat) / config_.head_dim;
    inv_freq_ = 1.0 / torch::pow(config_.rope_theta, exponents);
}

torch::Tensor Gemma2ModelImpl::forward(const torch::Tensor& input_ids,
                                       const torch::Tensor& attention_mask) {
    if (input_ids.dim() != 2 ||
        !(input_ids.scalar_type() == torch::kLong || input_ids.scalar_type() == torch::kInt)) {
        throw Error::InvalidArgument(fmt::format(
            "Gemma2Model: input_ids must be [batch, length] int64, got {} {}",
            std::string(c10::toString(input_ids.scalar_type())), shape_string(input_ids.sizes())));
    }
    if (attention_mask.defined() && attention_mask.sizes() != input_ids.sizes()) {
        throw Error::InvalidArgument(
            fmt::format("Gemma2Model: attention_mask {} does not match input_ids {}",
                        shape_string(attention_mask.sizes()), shape_string(input_ids.sizes())));
    }
    const int64_t b = input_ids.size(0), l = input_ids.size(1);
    if (input_ids.numel() > 0) {
        const int64_t lo = input_ids.min().item<int64_t>(), hi = input_ids.max().item<int64_t>();
        if (lo < 0 || hi >= config_.vocab_size) {
            throw Error::InvalidArgument(
                fmt::format("Gemma2Model: token ids span [{}, {}], outside the vocabulary of {}",
                            lo, hi, config_.vocab_size));
        }
    }

    torch::Tensor h = offload_ ? embed_tokens(input_ids.to(torch::kCPU)).to(*offload_)
                               : embed_tokens(input_ids);  // [B, L] -> [B, L, hidden]
    // sqrt(hidden) rounded to the hidden dtype first (in bf16, sqrt(2304) = 48 exactly, but
    // sqrt(3072) becomes 55.5): upstream multiplies by a tensor of that dtype.
    h = h * torch::scalar_tensor(std::sqrt(static_cast<double>(config_.hidden_size)), h.options());

    // RoPE tables in fp32, then in the hidden dtype, positions 0..L-1 whatever the padding.
    const torch::Tensor positions =
        torch::arange(l, torch::TensorOptions(h.device()).dtype(torch::kFloat));
    const torch::Tensor freqs = torch::outer(positions, inv_freq_.to(h.device()));  // [L, D / 2]
    const torch::Tensor emb = torch::cat({freqs, freqs}, -1).unsqueeze(0);          // [1, L, D]
    const torch::Tensor cos = emb.cos().to(h.scalar_type());
    const torch::Tensor sin = emb.sin().to(h.scalar_type());

    torch::Tensor full_mask, sliding_mask;
    {
        torch::NoGradGuard no_grad;
        full_mask =
            gemma2_attention_mask(attention_mask, b, l, std::nullopt, h.scalar_type(), h.device());
        if (config_.sliding_window) {
            sliding_mask = gemma2_attention_mask(attention_mask, b, l, config_.sliding_window,
                                                 h.scalar_type(), h.device());
        }
    }
    for (const auto& module : *layers) {
        auto* layer = module->as<Gemma2DecoderLayerImpl>();
        std::optional<WeightsOnDevice> on_device;
        if (offload_) on_device.emplace(*layer, *offload_);
        h = layer->forward(h, cos, sin, layer->is_sliding ? sliding_mask : full_mask);
    }
    std::optional<WeightsOnDevice> on_device;
    if (offload_) on_device.emplace(*norm, *offload_);
    return norm(h);
}

void Gemma2ModelImpl::set_offload(std::optional<c10::Device> device) {
    if (device) {
        for (const auto& p : parameters()) {
            if (!p.device().is_cpu()) {
                throw Error::InvalidArgument(
                    "Gemma2Model::set_offload: the weights must be in host memory");
            }
        }
    }
    offload_ = device;
}

torch::Tensor gemma2_attention_mask(const torch::Tensor& attention_mask, int64_t batch,
                                    int64_t length, std::optional<int64_t> sliding_window,
                                    at::ScalarType dtype, const at::Device& device) {
    const auto index_options = torch::TensorOptions(device).dtype(torch::kLong);
    const torch::Tensor query = torch::arange(length, index_options).unsqueeze(1);  // [L, 1]
    const torch::Tensor key = torch::arange(length, index_options).unsqueeze(0);    // [1, L]
    torch::Tensor masked = key > query;                                             // [L, L]
    if (sliding_window) masked = masked | (key <= query - *sliding_window);
    masked = masked.unsqueeze(0).unsqueeze(0).expand({batch, 1, length, length});  // [B, 1, L, L]
    if (attention_mask.defined()) {
        // Upstream masks a key where (causal value + attention_mask) == 0: any non-zero entry is a
        // token.
        const torch::Tensor padded = attention_mask.to(device).eq(0);  // [B, L]
        masked = masked | padded.view({batch, 1, 1, length});          // [B, L] -> [B, 1, 1, L]
    }
    return torch::zeros({batch, 1, length, length}, torch::TensorOptions(device).dtype(dtype))
        .masked_fill(masked, lowest_value(dtype));
}

LoadReport load_gemma2_weights(const Gemma2Model& model, const std::string& path,
                               const LoadOptions& options) {
    const auto checkpoint =
        storage::SafetensorsCheckpoint::open(path, storage::ChecksumPolicy::kSkip);
    const bool causal_lm = !checkpoint.contains("embed_tokens.weight") &&
                           checkpoint.contains("model.embed_tokens.weight");
    if (!causal_lm) return load_weights(*model.ptr(), path, options);
    // Gemma2ForCausalLM: the decoder is its "model" child; the LM head is tied to the embedding.
    auto holder = std::make_shared<torch::nn::Module>();
    holder->register_module("model", model.ptr());
    LoadOptions with_head = options;
    if (checkpoint.contains("lm_head.weight")) with_head.ignore.push_back("lm_head.weight");
    return load_weights(*holder, path, with_head);
}

}  // namespace sf::model

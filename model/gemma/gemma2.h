// Gemma-2, the decoder Sana uses as its text encoder: transformers v4.47.0 `Gemma2Model` (no LM
// head), whose final-norm hidden states are the caption features. Parameter names equal the
// transformers state-dict keys (`embed_tokens.weight`, `layers.N.self_attn.q_proj.weight`,
// `layers.N.mlp.gate_proj.weight`, `layers.N.{input,post_attention,pre_feedforward,
// post_feedforward}_layernorm.weight`, `norm.weight`), so a `text_encoder/` directory loads by
// name.
//
// Attention is upstream's eager path, masks included: an additive mask holding the dtype's lowest
// finite value (not -inf), added after the logit soft-capping, so padded queries and rows whose
// keys are all masked compute exactly what upstream computes.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <optional>
#include <string>

#include "model/common/weights.h"
#include "model/gemma/gemma2_config.h"

namespace sf::model {

// RMSNorm with a (1 + weight) scale, computed in fp32 and cast back to the input dtype.
class Gemma2RMSNormImpl : public torch::nn::Module {
public:
    Gemma2RMSNormImpl(int64_t dim, double eps);
    torch::Tensor forward(const torch::Tensor& x);

    torch::Tensor weight;

private:
    double eps_;
};
TORCH_MODULE(Gemma2RMSNorm);

// GeGLU: down_proj(act(gate_proj(x)) * up_proj(x)).
class Gemma2MLPImpl : public torch::nn::Module {
public:
    explicit Gemma2MLPImpl(const Gemma2Config& config);
    torch::Tensor forward(const torch::Tensor& x);

    torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

private:
    bool tanh_gelu_;
};
TORCH_MODULE(Gemma2MLP);

// Grouped-query self-attention with RoPE and logit soft-capping (eager, upstream's order).
class Gemma2AttentionImpl : public torch::nn::Module {
public:
    explicit Gemma2AttentionImpl(const Gemma2Config& config);
    // x [B, L, hidden]; cos, sin [1 or B, L, head_dim] in x's dtype; mask additive
    // [B, 1, L, L] in x's dtype (0 = attend, lowest finite value = masked).
    torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos,
                          const torch::Tensor& sin, const torch::Tensor& mask);

    torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

private:
    int64_t num_heads_, num_kv_heads_, head_dim_;
    double scaling_;
    std::optional<double> softcap_;
    double dropout_;
};
TORCH_MODULE(Gemma2Attention);

// Pre- and post-norm around both the attention and the MLP (four RMSNorms).
class Gemma2DecoderLayerImpl : public torch::nn::Module {
public:
    Gemma2DecoderLayerImpl(const Gemma2Config& config, int64_t layer_index);
    // `mask` is the full causal + padding mask; sliding layers get the windowed one from the model.
    torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos,
                          const torch::Tensor& sin, const torch::Tensor& mask);

    Gemma2Attention self_attn{nullptr};
    Gemma2MLP mlp{nullptr};
    Gemma2RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
    Gemma2RMSNorm pre_feedforward_layernorm{nullptr}, post_feedforward_layernorm{nullptr};
    const bool is_sliding;
};
TORCH_MODULE(Gemma2DecoderLayer);

class Gemma2ModelImpl : public torch::nn::Module {
public:
    explicit Gemma2ModelImpl(const Gemma2Config& config);

    // input_ids [B, L] int64; attention_mask [B, L] (1 token, 0 padding; any integer or bool
    // dtype), or undefined for no padding. Returns last_hidden_state [B, L, hidden] in the
    // weights' dtype. Positions are 0..L-1 whatever the padding, as upstream's default; padded
    // positions still get outputs (they attend to the earlier real tokens).
    torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {});

    const Gemma2Config& config() const { return config_; }

    // Sequential offload, for a device smaller than the encoder: the weights stay in host memory
    // and each decoder layer's are copied to `device` just for that layer's forward, so the
    // device holds one layer's weights and the activations. The embedding lookup runs on the
    // host (the table is a fifth of Gemma-2-2B). The module must be on the CPU; nullopt turns it
    // off. Results are those of the resident model.
    void set_offload(std::optional<c10::Device> device);

    torch::nn::Embedding embed_tokens{nullptr};
    torch::nn::ModuleList layers{nullptr};
    Gemma2RMSNorm norm{nullptr};

private:
    Gemma2Config config_;
    std::optional<c10::Device> offload_;
    // RoPE inverse frequencies [head_dim / 2], fp32. A plain member: upstream's buffer is
    // non-persistent, so it is not a state-dict key.
    torch::Tensor inv_freq_;
};
TORCH_MODULE(Gemma2Model);

// Upstream's additive attention mask [B, 1, L, L] in `dtype`: the causal mask with padded keys
// masked (attention_mask [B, L], or undefined), and, when `sliding_window` is set, keys at or
// beyond `sliding_window` positions back masked too. Masked entries hold finfo(dtype).min.
torch::Tensor gemma2_attention_mask(const torch::Tensor& attention_mask, int64_t batch,
                                    int64_t length, std::optional<int64_t> sliding_window,
                                    at::ScalarType dtype, const at::Device& device);

// Loads a Gemma2Model checkpoint (file, index or directory, as load_weights). Also accepts the
// weights of a Gemma2ForCausalLM (keys under "model.", with or without "lm_head.weight").
LoadReport load_gemma2_weights(const Gemma2Model& model, const std::string& path,
                               const LoadOptions& options = {});

}  // namespace sf::model

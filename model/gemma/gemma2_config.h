// The configuration of the Gemma-2 text encoder: its `text_encoder/config.json` read and
// validated, the named configurations, and the parameter count computed from the numbers alone.
// The module itself is in model/gemma/gemma2.h.
//
// Torch-free: `sanaflow models` and the planner size the text encoder without building it.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

namespace sf::model {

// transformers' Gemma2Config, the fields the encoder needs. Defaults are upstream's defaults,
// which are google/gemma-2-2b's values.
struct Gemma2Config {
    int64_t vocab_size = 256000;
    int64_t hidden_size = 2304;
    int64_t intermediate_size = 9216;
    int64_t num_hidden_layers = 26;
    int64_t num_attention_heads = 8;
    int64_t num_key_value_heads = 4;
    int64_t head_dim = 256;
    std::string hidden_activation = "gelu_pytorch_tanh";  // or "gelu" (erf)
    int64_t max_position_embeddings = 8192;
    double rms_norm_eps = 1e-6;
    double rope_theta = 10000.0;
    bool attention_bias = false;
    double attention_dropout = 0.0;        // training mode only
    double initializer_range = 0.02;       // std of the random init when no checkpoint is loaded
    double query_pre_attn_scalar = 256.0;  // scores are scaled by query_pre_attn_scalar^-0.5
    std::optional<int64_t> sliding_window = 4096;
    std::optional<double> attn_logit_softcapping = 50.0;
    std::optional<double> final_logit_softcapping = 30.0;  // LM head only: unused by the encoder
    std::optional<int64_t> pad_token_id = 0;
    std::optional<int64_t> bos_token_id = 2;
    // "sliding_attention" / "full_attention" per layer. Empty means upstream v4.47's rule: even
    // layers (0, 2, ...) slide. Newer transformers write the list into config.json.
    std::vector<std::string> layer_types;

    bool is_sliding(int64_t layer) const;
    // Throws sf::Error kInvalidArgument naming `source` and the field.
    void validate(const std::string& source = "Gemma2Config") const;

    // From a transformers config.json object; unknown keys are ignored; a `model_type` other
    // than "gemma2", a key with the wrong type or an invalid value is kInvalidArgument naming the
    // key and `source`. Validated.
    static Gemma2Config from_json(const nlohmann::json& json,
                                  const std::string& source = "config.json");
    // `path` is a config.json file or a directory holding one (e.g. `text_encoder/`). kNotFound
    // when it is missing.
    static Gemma2Config from_json_file(const std::string& path);
    // "gemma-2-2b" (Sana's google/gemma-2-2b-it) or "gemma-2-tiny" (tests, demo).
    static Gemma2Config named(const std::string& name);
};

// sum(p.numel() for p in Gemma2Model(config).parameters()), computed without building the model.
int64_t gemma2_parameter_count(const Gemma2Config& config);

}  // namespace sf::model

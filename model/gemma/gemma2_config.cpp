#include "model/gemma/gemma2_config.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <utility>

#include "core/error.h"
#include "model/common/checked_count.h"
#include "model/common/config_json.h"

namespace sf::model {
namespace {

using nlohmann::json;

constexpr const char* kSlidingAttention = "sliding_attention";
constexpr const char* kFullAttention = "full_attention";

}  // namespace

bool Gemma2Config::is_sliding(int64_t layer) const {
    if (!sliding_window) return false;
    if (!layer_types.empty()) return layer_types.at(layer) == kSlidingAttention;
    return layer % 2 == 0;  // upstream v4.47: `not bool(layer_idx % 2)`
}

void Gemma2Config::validate(const std::string& source) const {
    auto fail = [&](const std::string& what) {
        throw Error::InvalidArgument(fmt::format("{}: {}", source, what));
    };
    const std::pair<const char*, int64_t> positives[] = {
        {"vocab_size", vocab_size},
        {"hidden_size", hidden_size},
        {"intermediate_size", intermediate_size},
        {"num_hidden_layers", num_hidden_layers},
        {"num_attention_heads", num_attention_heads},
        {"num_key_value_heads", num_key_value_heads},
        {"head_dim", head_dim},
        {"max_position_embeddings", max_position_embeddings},
    };
    for (const auto& [key, value] : positives) {
        if (value <= 0) fail(fmt::format("\"{}\" must be positive, got {}", key, value));
    }
    if (num_attention_heads % num_key_value_heads != 0) {
        fail(fmt::format(
            "\"num_attention_heads\" ({}) must be a multiple of \"num_key_value_heads\" ({})",
            num_attention_heads, num_key_value_heads));
    }
    // Upstream v4.47's attention raises on this too, although head_dim is independent.
    if (hidden_size % num_attention_heads != 0) {
        fail(fmt::format("\"hidden_size\" ({}) must be a multiple of \"num_attention_heads\" ({})",
                         hidden_size, num_attention_heads));
    }
    if (head_dim % 2 != 0)
        fail(fmt::format("\"head_dim\" must be even for RoPE, got {}", head_dim));
    if (hidden_activation != "gelu_pytorch_tanh" && hidden_activation != "gelu") {
        fail(fmt::format(
            "\"hidden_activation\" must be \"gelu_pytorch_tanh\" or \"gelu\", got \"{}\"",
            hidden_activation));
    }
    if (!(rms_norm_eps >= 0.0))
        fail(fmt::format("\"rms_norm_eps\" must be >= 0, got {}", rms_norm_eps));
    if (!(rope_theta > 0.0))
        fail(fmt::format("\"rope_theta\" must be positive, got {}", rope_theta));
    if (!(query_pre_attn_scalar > 0.0)) {
        fail(fmt::format("\"query_pre_attn_scalar\" must be positive, got {}",
                         query_pre_attn_scalar));
    }
    if (!(attention_dropout >= 0.0 && attention_dropout < 1.0)) {
        fail(fmt::format("\"attention_dropout\" must be in [0, 1), got {}", attention_dropout));
    }
    if (sliding_window && *sliding_window <= 0) {
        fail(fmt::format("\"sliding_window\" must be positive or null, got {}", *sliding_window));
    }
    if (attn_logit_softcapping && !(*attn_logit_softcapping > 0.0)) {
        fail(fmt::format("\"attn_logit_softcapping\" must be positive or null, got {}",
                         *attn_logit_softcapping));
    }
    if (pad_token_id && (*pad_token_id < 0 || *pad_token_id >= vocab_size)) {
        fail(fmt::format("\"pad_token_id\" {} is outside the vocabulary of {}", *pad_token_id,
                         vocab_size));
    }
    if (!layer_types.empty()) {
        if (static_cast<int64_t>(layer_types.size()) != num_hidden_layers) {
            fail(fmt::format("\"layer_types\" has {} entries for {} layers", layer_types.size(),
                             num_hidden_layers));
        }
        for (const std::string& t : layer_types) {
            if (t != kSlidingAttention && t != kFullAttention) {
                fail(fmt::format("\"layer_types\" holds \"{}\"; expected \"{}\" or \"{}\"", t,
                                 kSlidingAttention, kFullAttention));
            }
        }
    }
    require_countable(source, [this] { return gemma2_parameter_count(*this); });
}

Gemma2Config Gemma2Config::from_json(const json& j, const std::string& source) {
    const ConfigReader r(j, source);
    r.check_class_name("gemma2", "model_type");
    // A later variant (EmbeddingGemma) attends both ways: not what this decoder computes.
    bool bidirectional = false;
    r.boolean("use_bidirectional_attention", bidirectional);
    if (bidirectional) {
        throw Error::InvalidArgument(source + ": \"use_bidirectional_attention\" is not supported");
    }
    Gemma2Config c;
    r.integer("vocab_size", c.vocab_size);
    r.integer("hidden_size", c.hidden_size);
    r.integer("intermediate_size", c.intermediate_size);
    r.integer("num_hidden_layers", c.num_hidden_layers);
    r.integer("num_attention_heads", c.num_attention_heads);
    r.integer("num_key_value_heads", c.num_key_value_heads);
    r.integer("head_dim", c.head_dim);
    // v4.47 reads hidden_activation only; older files also carry "hidden_act", which it ignores.
    r.string("hidden_activation", c.hidden_activation);
    r.integer("max_position_embeddings", c.max_position_embeddings);
    r.number("rms_norm_eps", c.rms_norm_eps);
    r.number("rope_theta", c.rope_theta);
    // Newer transformers nest it: {"rope_parameters": {"rope_type": "default", "rope_theta": ...}}.
    if (r.has_value("rope_parameters")) {
        const ConfigReader rope = r.object("rope_parameters");
        std::string type = "default";
        rope.string("rope_type", type);
        if (type != "default") {
            throw Error::InvalidArgument(fmt::format(
                "{}: rope_type \"{}\" is not supported (only \"default\")", source, type));
        }
        rope.number("rope_theta", c.rope_theta);
    }
    r.boolean("attention_bias", c.attention_bias);
    r.number("attention_dropout", c.attention_dropout);
    r.number("initializer_range", c.initializer_range);
    r.number("query_pre_attn_scalar", c.query_pre_attn_scalar);
    r.nullable_integer("sliding_window", c.sliding_window);
    r.nullable_number("attn_logit_softcapping", c.attn_logit_softcapping);
    r.nullable_number("final_logit_softcapping", c.final_logit_softcapping);
    r.nullable_integer("pad_token_id", c.pad_token_id);
    r.nullable_integer("bos_token_id", c.bos_token_id);
    // null: upstream v4.47's alternating rule.
    if (r.has_value("layer_types")) r.string_list("layer_types", c.layer_types);
    c.validate(source);
    return c;
}

Gemma2Config Gemma2Config::from_json_file(const std::string& path) {
    const ConfigFile file = read_config_file(path, "Gemma-2 config");
    return from_json(file.json, file.path);
}

Gemma2Config Gemma2Config::named(const std::string& name) {
    if (name == "gemma-2-2b") {
        // google/gemma-2-2b and -2b-it config.json (hidden 2304, 26 layers, 8 heads / 4 KV of 256,
        // MLP 9216, vocab 256000, window 4096, soft-caps 50 / 30, query_pre_attn_scalar 256,
        // theta 1e4, eps 1e-6), which are also transformers' Gemma2Config defaults.
        return Gemma2Config{};
    }
    if (name == "gemma-2-tiny") {
        // Shaped like the golden tiny model (hidden 48, GQA 4/2, head_dim 16), with a vocabulary
        // for a toy tokenizer and a window short enough that 300-token prompts slide.
        Gemma2Config c;
        c.vocab_size = 384;
        c.hidden_size = 48;
        c.intermediate_size = 96;
        c.num_hidden_layers = 2;
        c.num_attention_heads = 4;
        c.num_key_value_heads = 2;
        c.head_dim = 16;
        c.max_position_embeddings = 1024;
        c.query_pre_attn_scalar = 16;
        c.sliding_window = 64;
        c.attn_logit_softcapping = 50.0;
        return c;
    }
    throw Error::InvalidArgument(
        fmt::format("unknown Gemma-2 config \"{}\" (known: gemma-2-2b, gemma-2-tiny)", name));
}

int64_t gemma2_parameter_count(const Gemma2Config& c) {
    const Count h = c.hidden_size;
    const Count q = Count(c.num_attention_heads) * c.head_dim;
    const Count kv = Count(c.num_key_value_heads) * c.head_dim;
    Count attention = h * q + 2 * h * kv + q * h;
    if (c.attention_bias) attention += q + 2 * kv + h;
    const Count mlp = 3 * h * c.intermediate_size;
    const Count norms = 4 * h;
    return (c.vocab_size * h + c.num_hidden_layers * (attention + mlp + norms) + h).value();
}

}  // namespace sf::model

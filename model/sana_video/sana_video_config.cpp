#include "model/sana_video/sana_video_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/common/checked_count.h"
#include "model/common/config_json.h"

namespace sf::model {
namespace {

// Patches of at most this many latent pixels per axis (upstream: 1 or 2), so patch_volume() fits.
constexpr int64_t kMaxPatch = 1024;

using nlohmann::json;

constexpr const char* kClassName = "SanaVideoTransformer3DModel";
constexpr const char* kQkNormAcrossHeads = "rms_norm_across_heads";

SanaVideoTransformerConfig from_object(const json& j, const std::string& where) {
    const ConfigReader r(j, where);
    r.check_class_name(kClassName);
    SanaVideoTransformerConfig c;
    r.integer("in_channels", c.in_channels);
    std::optional<int64_t> out_channels = c.out_channels;
    r.nullable_integer("out_channels", out_channels);
    r.integer("num_attention_heads", c.num_attention_heads);
    r.integer("attention_head_dim", c.attention_head_dim);
    r.integer("num_layers", c.num_layers);
    std::optional<int64_t> cross_heads = c.num_cross_attention_heads;
    std::optional<int64_t> cross_head_dim = c.cross_attention_head_dim;
    std::optional<int64_t> cross_dim = c.cross_attention_dim;
    r.nullable_integer("num_cross_attention_heads", cross_heads);
    r.nullable_integer("cross_attention_head_dim", cross_head_dim);
    r.nullable_integer("cross_attention_dim", cross_dim);
    r.integer("caption_channels", c.caption_channels);
    r.number("mlp_ratio", c.mlp_ratio);
    r.number("dropout", c.dropout);
    r.boolean("attention_bias", c.attention_bias);
    r.integer("sample_size", c.sample_size);
    std::vector<int64_t> patch(c.patch_size.begin(), c.patch_size.end());
    r.integer_list("patch_size", patch);
    if (patch.size() != 3) {
        throw Error::InvalidArgument(
            fmt::format("{}: \"patch_size\" must list 3 integers (frames, height, width), got {}",
                        where, patch.size()));
    }
    c.patch_size = {patch[0], patch[1], patch[2]};
    r.boolean("norm_elementwise_affine", c.norm_elementwise_affine);
    r.number("norm_eps", c.norm_eps);
    r.nullable_number("interpolation_scale", c.interpolation_scale);
    r.boolean("guidance_embeds", c.guidance_embeds);
    r.number("guidance_embeds_scale", c.guidance_embeds_scale);
    r.nullable_string("qk_norm", c.qk_norm);
    r.integer("rope_max_seq_len", c.rope_max_seq_len);
    // `out_channels or in_channels` upstream: null and 0 both mean "as many as in".
    c.out_channels = out_channels.value_or(0) == 0 ? c.in_channels : *out_channels;
    if (!cross_heads || !cross_head_dim || !cross_dim) {
        throw Error::InvalidArgument(fmt::format(
            "{}: null cross-attention sizes (no cross attention) are not supported: upstream's "
            "block then has no norm2 and cannot run",
            where));
    }
    c.num_cross_attention_heads = *cross_heads;
    c.cross_attention_head_dim = *cross_head_dim;
    c.cross_attention_dim = *cross_dim;
    c.validate(where);
    return c;
}

}  // namespace

void SanaVideoTransformerConfig::validate(const std::string& where) const {
    auto require = [&where](bool ok, const char* field, const std::string& why) {
        if (!ok) throw Error::InvalidArgument(fmt::format("{}: {} {}", where, field, why));
    };
    auto positive = [&require](int64_t v, const char* field) {
        require(v > 0, field, fmt::format("must be positive, is {}", v));
    };
    positive(in_channels, "in_channels");
    positive(out_channels, "out_channels");
    positive(num_attention_heads, "num_attention_heads");
    positive(attention_head_dim, "attention_head_dim");
    positive(num_layers, "num_layers");
    positive(num_cross_attention_heads, "num_cross_attention_heads");
    positive(cross_attention_head_dim, "cross_attention_head_dim");
    positive(caption_channels, "caption_channels");
    positive(sample_size, "sample_size");
    positive(rope_max_seq_len, "rope_max_seq_len");
    for (const int64_t p : patch_size) {
        require(p > 0 && p <= kMaxPatch, "patch_size",
                fmt::format("must list sizes in [1, {}], has {}", kMaxPatch, p));
    }
    // The rotary tables rotate channel pairs: every split of the head must be even-sized
    // (get_1d_rotary_pos_embed asserts dim % 2 == 0 for the time, height and width tables).
    const int64_t hw_dim = 2 * (attention_head_dim / 6);
    require(attention_head_dim % 2 == 0 && hw_dim > 0, "attention_head_dim",
            fmt::format("must be even and at least 6 for the 3-axis rotary embedding, is {}",
                        attention_head_dim));
    require(cross_attention_dim == inner_dim(), "cross_attention_dim",
            fmt::format("must equal num_attention_heads * attention_head_dim = {} (the captions "
                        "are projected to the model width), is {}",
                        inner_dim(), cross_attention_dim));
    require(ratio_width_fits(mlp_ratio, inner_dim()), "mlp_ratio",
            fmt::format("must give a positive feed-forward width of at most {}, is {}",
                        kMaxConfigInteger, mlp_ratio));
    require(dropout >= 0.0 && dropout < 1.0, "dropout",
            fmt::format("must be in [0, 1), is {}", dropout));
    require(norm_eps > 0.0, "norm_eps", fmt::format("must be positive, is {}", norm_eps));
    require(!qk_norm || *qk_norm == kQkNormAcrossHeads, "qk_norm",
            fmt::format("is \"{}\": only \"{}\" and null are SANA-Video's", qk_norm.value_or(""),
                        kQkNormAcrossHeads));
    require(std::isfinite(guidance_embeds_scale), "guidance_embeds_scale", "must be finite");
    require_countable(where, [this] { return sana_video_parameter_count(*this); });
}

SanaVideoTransformerConfig SanaVideoTransformerConfig::from_json(const std::string& text,
                                                                 const std::string& where) {
    return from_object(parse_config_json(text, where), where);
}

SanaVideoTransformerConfig SanaVideoTransformerConfig::from_json_file(const std::string& path) {
    const ConfigFile file = read_config_file(path, "video transformer config");
    return from_object(file.json, file.path);
}

std::string SanaVideoTransformerConfig::to_json() const {
    json j;
    j["_class_name"] = kClassName;
    j["_diffusers_version"] = "0.36.0";
    j["in_channels"] = in_channels;
    j["out_channels"] = out_channels;
    j["num_attention_heads"] = num_attention_heads;
    j["attention_head_dim"] = attention_head_dim;
    j["num_layers"] = num_layers;
    j["num_cross_attention_heads"] = num_cross_attention_heads;
    j["cross_attention_head_dim"] = cross_attention_head_dim;
    j["cross_attention_dim"] = cross_attention_dim;
    j["caption_channels"] = caption_channels;
    j["mlp_ratio"] = mlp_ratio;
    j["dropout"] = dropout;
    j["attention_bias"] = attention_bias;
    j["sample_size"] = sample_size;
    j["patch_size"] = json::array({patch_size[0], patch_size[1], patch_size[2]});
    j["norm_elementwise_affine"] = norm_elementwise_affine;
    j["norm_eps"] = norm_eps;
    j["interpolation_scale"] = interpolation_scale ? json(*interpolation_scale) : json(nullptr);
    j["guidance_embeds"] = guidance_embeds;
    j["guidance_embeds_scale"] = guidance_embeds_scale;
    j["qk_norm"] = qk_norm ? json(*qk_norm) : json(nullptr);
    j["rope_max_seq_len"] = rope_max_seq_len;
    return j.dump(2) + "\n";
}

std::vector<std::string> SanaVideoTransformerConfig::names() {
    return {"sana-video-2b-480p", "sana-video-2b-720p", "sana-video-tiny"};
}

SanaVideoTransformerConfig SanaVideoTransformerConfig::named(const std::string& name) {
    // SANA_Video_2B as diffusers' convert script builds it: 20 layers of width 2240 (20 heads of
    // 112), cross-attention 20 x 112, Gemma-2-2B captions (2304), mlp_ratio 3, q/k RMSNorm.
    SanaVideoTransformerConfig c;
    c.in_channels = 16;
    c.out_channels = 16;
    c.caption_channels = 2304;
    c.mlp_ratio = 3.0;
    c.attention_bias = false;
    c.norm_elementwise_affine = false;
    c.norm_eps = 1e-6;
    c.qk_norm = kQkNormAcrossHeads;
    c.rope_max_seq_len = 1024;
    if (name == "sana-video-2b-480p" || name == "sana-video-2b-720p") {
        c.num_attention_heads = 20;
        c.attention_head_dim = 112;
        c.num_layers = 20;
        c.num_cross_attention_heads = 20;
        c.cross_attention_head_dim = 112;
        c.cross_attention_dim = 2240;
        const bool p480 = name == "sana-video-2b-480p";
        c.sample_size = p480 ? 30 : 22;
        c.patch_size = p480 ? std::array<int64_t, 3>{1, 2, 2} : std::array<int64_t, 3>{1, 1, 1};
    } else if (name == "sana-video-tiny") {
        // Width 64, two blocks, the golden data's structure; 16-channel latents (Wan2.1's z_dim)
        // and 2304-wide captions keep the real encoders' widths, so it trains on a real cache.
        c.num_attention_heads = 4;
        c.attention_head_dim = 16;
        c.num_layers = 2;
        c.num_cross_attention_heads = 2;
        c.cross_attention_head_dim = 32;
        c.cross_attention_dim = 64;
        c.sample_size = 8;
        c.patch_size = {1, 2, 2};
    } else {
        throw Error::InvalidArgument(fmt::format(
            "unknown video transformer config \"{}\"; known: {}", name, fmt::join(names(), ", ")));
    }
    c.validate(name);
    return c;
}

int64_t sana_video_parameter_count(const SanaVideoTransformerConfig& c) {
    const Count d = c.inner_dim();
    const Count dc = c.cross_inner_dim();
    const Count h = c.ff_hidden_dim();
    const bool qk = c.qk_norm.has_value();
    auto linear = [](Count in, Count out, bool bias) { return in * out + (bias ? out : Count(0)); };
    const Count timestep_embedder = linear(256, d, true) + linear(d, d, true);

    Count n = c.in_channels * d * c.patch_volume() + d;  // patch_embedding (conv with bias)
    n += timestep_embedder;                              // time_embed.(emb.)timestep_embedder
    if (c.guidance_embeds) n += timestep_embedder;       // time_embed.guidance_embedder
    n += linear(d, 6 * d, true);                         // time_embed.linear
    n += linear(c.caption_channels, d, true) + linear(d, d, true);  // caption_projection
    n += d;                                                         // caption_norm.weight

    Count block = 6 * d;                                               // scale_shift_table
    block += 3 * linear(d, d, c.attention_bias) + linear(d, d, true);  // attn1
    if (qk) block += 2 * d;                                            // attn1.norm_q, norm_k
    block += linear(d, dc, true) + 2 * linear(c.cross_attention_dim, dc, true) +
             linear(dc, d, true);                   // attn2
    if (qk) block += 2 * dc;                        // attn2.norm_q, norm_k
    if (c.norm_elementwise_affine) block += 2 * d;  // norm2 weight, bias
    block += linear(d, 2 * h, true);                // ff.conv_inverted
    block += 2 * h * 9 + 2 * h;                     // ff.conv_depth
    block += linear(h, d, false);                   // ff.conv_point
    block += d * d * 3;                             // ff.conv_temp (3 frames, no bias)
    n += c.num_layers * block;

    n += 2 * d;                                               // scale_shift_table
    n += linear(d, c.patch_volume() * c.out_channels, true);  // proj_out
    return n.value();
}

}  // namespace sf::model

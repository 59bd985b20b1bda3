#include "model/sana/sana_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/common/checked_count.h"
#include "model/common/config_json.h"

namespace sf::model {
namespace {

using nlohmann::json;

SanaTransformerConfig from_object(const json& j, const std::string& where) {
    const ConfigReader r(j, where);
    r.check_class_name("SanaTransformer2DModel");
    SanaTransformerConfig c;
    r.integer("in_channels", c.in_channels);
    // Optional[int] upstream, null meaning "not given": out_channels -> in_channels; the
    // cross-attention sizes -> no cross attention, refused below.
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
    r.integer("patch_size", c.patch_size);
    r.boolean("norm_elementwise_affine", c.norm_elementwise_affine);
    r.number("norm_eps", c.norm_eps);
    r.nullable_number("interpolation_scale", c.interpolation_scale);
    r.boolean("guidance_embeds", c.guidance_embeds);
    r.number("guidance_embeds_scale", c.guidance_embeds_scale);
    r.nullable_string("qk_norm", c.qk_norm);
    r.number("timestep_scale", c.timestep_scale);
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

void SanaTransformerConfig::validate(const std::string& where) const {
    auto require = [&where](bool ok, const char* field, const std::string& why) {
        if (!ok) throw Error::InvalidArgument(fmt::format("{}: {} {}", where, field, why));
    };
    require(in_channels > 0, "in_channels", fmt::format("must be positive, is {}", in_channels));
    require(out_channels > 0, "out_channels", fmt::format("must be positive, is {}", out_channels));
    require(num_attention_heads > 0, "num_attention_heads",
            fmt::format("must be positive, is {}", num_attention_heads));
    require(attention_head_dim > 0, "attention_head_dim",
            fmt::format("must be positive, is {}", attention_head_dim));
    require(num_layers > 0, "num_layers", fmt::format("must be positive, is {}", num_layers));
    require(num_cross_attention_heads > 0, "num_cross_attention_heads",
            fmt::format("must be positive, is {}", num_cross_attention_heads));
    require(cross_attention_head_dim > 0, "cross_attention_head_dim",
            fmt::format("must be positive, is {}", cross_attention_head_dim));
    // Upstream builds attn2.to_k with cross_attention_dim inputs but feeds it the caption tokens
    // after caption_projection, which are inner_dim wide: any other value cannot run.
    require(cross_attention_dim == inner_dim(), "cross_attention_dim",
            fmt::format("must equal num_attention_heads * attention_head_dim = {} (the captions "
                        "are projected to the model width), is {}",
                        inner_dim(), cross_attention_dim));
    require(caption_channels > 0, "caption_channels",
            fmt::format("must be positive, is {}", caption_channels));
    require(ratio_width_fits(mlp_ratio, inner_dim()), "mlp_ratio",
            fmt::format("must give a positive feed-forward width of at most {}, is {}",
                        kMaxConfigInteger, mlp_ratio));
    require(dropout >= 0.0 && dropout < 1.0, "dropout",
            fmt::format("must be in [0, 1), is {}", dropout));
    require(sample_size > 0, "sample_size", fmt::format("must be positive, is {}", sample_size));
    require(patch_size > 0, "patch_size", fmt::format("must be positive, is {}", patch_size));
    require(norm_eps > 0.0, "norm_eps", fmt::format("must be positive, is {}", norm_eps));
    if (interpolation_scale) {
        require(std::isfinite(*interpolation_scale) && *interpolation_scale > 0.0,
                "interpolation_scale",
                fmt::format("must be positive or null, is {}", *interpolation_scale));
        // Half the width encodes each axis as sin and cos pairs.
        require(inner_dim() % 4 == 0, "interpolation_scale",
                fmt::format("needs a model width divisible by 4 for the sin-cos position "
                            "embedding, width is {}",
                            inner_dim()));
        // The embedding's grid is scaled by sample_size / patch_size, which must not be 0.
        require(sample_size >= patch_size, "sample_size",
                fmt::format("must be at least patch_size ({}) with a position embedding, is {}",
                            patch_size, sample_size));
    }
    require(!guidance_embeds, "guidance_embeds",
            "is true (a Sana-Sprint checkpoint): the guidance embedder is not implemented");
    require(!qk_norm, "qk_norm",
            fmt::format("is \"{}\" (a Sana-1.5 / Sprint checkpoint): only null is implemented",
                        qk_norm.value_or("")));
    require(std::isfinite(timestep_scale), "timestep_scale", "must be finite");
    require_countable(where, [this] { return sana_parameter_count(*this); });
}

SanaTransformerConfig SanaTransformerConfig::from_json(const std::string& text,
                                                       const std::string& where) {
    return from_object(parse_config_json(text, where), where);
}

SanaTransformerConfig SanaTransformerConfig::from_json_file(const std::string& path) {
    const ConfigFile file = read_config_file(path, "transformer config");
    return from_object(file.json, file.path);
}

std::string SanaTransformerConfig::to_json() const {
    json j;
    j["_class_name"] = "SanaTransformer2DModel";
    j["_diffusers_version"] = "0.33.1";
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
    j["patch_size"] = patch_size;
    j["norm_elementwise_affine"] = norm_elementwise_affine;
    j["norm_eps"] = norm_eps;
    j["interpolation_scale"] = interpolation_scale ? json(*interpolation_scale) : json(nullptr);
    j["guidance_embeds"] = guidance_embeds;
    j["guidance_embeds_scale"] = guidance_embeds_scale;
    j["qk_norm"] = qk_norm ? json(*qk_norm) : json(nullptr);
    j["timestep_scale"] = timestep_scale;
    return j.dump(2) + "\n";
}

std::vector<std::string> SanaTransformerConfig::names() {
    return {"sana-600m", "sana-1600m", "sana-tiny"};
}

SanaTransformerConfig SanaTransformerConfig::named(const std::string& name) {
    // The 1024 px models as diffusers' scripts/convert_sana_to_diffusers.py builds them
    // (SanaMS_600M_P1_D28, SanaMS_1600M_P1_D20): in/out 32, caption 2304, mlp 2.5, patch 1,
    // sample_size 1024 / 32, no position embedding, attention_bias false, norm_eps 1e-6.
    SanaTransformerConfig c;
    c.in_channels = 32;
    c.out_channels = 32;
    c.caption_channels = 2304;
    c.mlp_ratio = 2.5;
    c.sample_size = 32;
    c.patch_size = 1;
    if (name == "sana-600m") {
        c.num_attention_heads = 36;
        c.attention_head_dim = 32;
        c.num_cross_attention_heads = 16;
        c.cross_attention_head_dim = 72;
        c.cross_attention_dim = 1152;
        c.num_layers = 28;
    } else if (name == "sana-1600m") {
        c.num_attention_heads = 70;
        c.attention_head_dim = 32;
        c.num_cross_attention_heads = 20;
        c.cross_attention_head_dim = 112;
        c.cross_attention_dim = 2240;
        c.num_layers = 20;
    } else if (name == "sana-tiny") {
        // Width 64, two blocks: a forward and backward at 32x32 latents take milliseconds on
        // CPU. Latents and captions keep the real widths (32-channel DC-AE latents, 2304-wide
        // Gemma-2-2B features), so it trains on a cache made by the real encoders.
        c.num_attention_heads = 4;
        c.attention_head_dim = 16;
        c.num_cross_attention_heads = 2;
        c.cross_attention_head_dim = 32;
        c.cross_attention_dim = 64;
        c.num_layers = 2;
    } else {
        throw Error::InvalidArgument(fmt::format("unknown transformer config \"{}\"; known: {}",
                                                 name, fmt::join(names(), ", ")));
    }
    c.validate(name);
    return c;
}

int64_t sana_parameter_count(const SanaTransformerConfig& c) {
    const Count d = c.inner_dim();
    const Count dc = c.cross_inner_dim();
    const Count h = c.ff_hidden_dim();
    const Count p2 = c.patch_size * c.patch_size;
    auto linear = [](Count in, Count out, bool bias) { return in * out + (bias ? out : Count(0)); };

    Count n = c.in_channels * d * p2 + d;            // patch_embed.proj (conv with bias)
    n += linear(256, d, true) + linear(d, d, true);  // time_embed.emb.timestep_embedder
    n += linear(d, 6 * d, true);                     // time_embed.linear
    n += linear(c.caption_channels, d, true) + linear(d, d, true);  // caption_projection
    n += d;                                                         // caption_norm.weight

    Count block = 6 * d;                                               // scale_shift_table
    block += 3 * linear(d, d, c.attention_bias) + linear(d, d, true);  // attn1
    block += linear(d, dc, true) + 2 * linear(c.cross_attention_dim, dc, true) +
             linear(dc, d, true);                   // attn2
    if (c.norm_elementwise_affine) block += 2 * d;  // norm2 weight, bias
    block += linear(d, 2 * h, true);                // ff.conv_inverted
    block += 2 * h * 9 + 2 * h;                     // ff.conv_depth
    block += linear(h, d, false);                   // ff.conv_point
    n += c.num_layers * block;

    n += 2 * d;                                 // scale_shift_table
    n += linear(d, p2 * c.out_channels, true);  // proj_out
    return n.value();
}

}  // namespace sf::model

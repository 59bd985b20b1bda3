#include "model/dc_ae/autoencoder_dc_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/common/checked_count.h"
#include "model/common/config_json.h"

namespace sf::model {
namespace {

using nlohmann::json;

std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
}

[[noreturn]] void fail(const std::string& source, const std::string& what) {
    throw Error::InvalidArgument(fmt::format("{}: {}", source, what));
}

// A key upstream accepts as one string for every stage or as one string per stage.
struct PerStage {
    bool is_string = true;
    std::string one;
    std::vector<std::string> list;

    std::vector<std::string> expand(size_t stages) const {
        return is_string ? std::vector<std::string>(stages, one) : list;
    }
};

void read_per_stage(const ConfigReader& r, const char* key, PerStage& out) {
    const json* v = r.find(key);
    if (v == nullptr) return;
    if (v->is_string()) {
        out = {true, v->get<std::string>(), {}};
        return;
    }
    if (!v->is_array() ||
        !std::all_of(v->begin(), v->end(), [](const json& e) { return e.is_string(); })) {
        r.fail(key, "a string or a list of strings", *v);
    }
    out = {false, "", v->get<std::vector<std::string>>()};
}

// Upstream only asks `== "pixel_unshuffle"`; real configs write "Conv". One spelling here.
std::string canonical_downsample(const std::string& s) { return lower(s) == "conv" ? "conv" : s; }

bool is_activation(const std::string& a) {
    return a == "silu" || a == "swish" || a == "relu" || a == "gelu" || a == "mish";
}

std::string stage_list(const std::vector<int64_t>& v) {
    return fmt::format("[{}]", fmt::join(v, ", "));
}

void validate_stages(const std::string& source, const char* side,
                     const std::vector<std::string>& types, const std::vector<int64_t>& channels,
                     const std::vector<int64_t>& layers,
                     const std::vector<std::vector<int64_t>>& multiscales, int64_t head_dim) {
    const size_t n = channels.size();
    if (n == 0) fail(source, fmt::format("`{}_block_out_channels` must not be empty", side));
    auto same_length = [&](size_t size, const char* key) {
        if (size != n) {
            fail(source, fmt::format("`{}_{}` has {} entries but `{}_block_out_channels` has {}",
                                     side, key, size, side, n));
        }
    };
    same_length(types.size(), "block_types");
    same_length(layers.size(), "layers_per_block");
    same_length(multiscales.size(), "qkv_multiscales");
    for (size_t i = 0; i < n; ++i) {
        if (channels[i] <= 0) {
            fail(source, fmt::format("`{}_block_out_channels` must be positive, got {}", side,
                                     stage_list(channels)));
        }
        if (layers[i] < 0) {
            fail(source, fmt::format("`{}_layers_per_block` must not be negative, got {}", side,
                                     stage_list(layers)));
        }
        // Upstream skips the resampling block of an empty stage, which only fits the first one
        // (the stem resamples instead); elsewhere it silently changes the compression ratio.
        if (i > 0 && layers[i] == 0) {
            fail(source,
                 fmt::format("`{}_layers_per_block` stage {} is empty: only stage 0 may be, got {}",
                             side, i, stage_list(layers)));
        }
        if (types[i] != "ResBlock" && types[i] != "EfficientViTBlock") {
            fail(source,
                 fmt::format(
                     "`{}_block_types` stage {}: \"{}\" is not ResBlock or EfficientViTBlock", side,
                     i, types[i]));
        }
        if (types[i] == "EfficientViTBlock" && layers[i] > 0 && channels[i] < head_dim) {
            fail(source,
                 fmt::format("`{}_block_out_channels` stage {}: {} channels is less than one "
                             "attention head (`attention_head_dim` {})",
                             side, i, channels[i], head_dim));
        }
        for (int64_t k : multiscales[i]) {
            // An even kernel with padding k // 2 would grow the feature map by one.
            if (k <= 0 || k % 2 == 0) {
                fail(source,
                     fmt::format(
                         "`{}_qkv_multiscales` stage {}: kernel size {} must be odd and positive",
                         side, i, k));
            }
        }
    }
}

}  // namespace

int64_t AutoencoderDCConfig::spatial_compression_ratio() const {
    return int64_t{1} << (encoder_block_out_channels.size() - 1);
}

void AutoencoderDCConfig::validate(const std::string& source) const {
    if (in_channels <= 0)
        fail(source, fmt::format("`in_channels` must be positive, got {}", in_channels));
    if (latent_channels <= 0) {
        fail(source, fmt::format("`latent_channels` must be positive, got {}", latent_channels));
    }
    if (attention_head_dim <= 0) {
        fail(source,
             fmt::format("`attention_head_dim` must be positive, got {}", attention_head_dim));
    }
    if (!std::isfinite(scaling_factor) || scaling_factor <= 0) {
        fail(source, fmt::format("`scaling_factor` must be positive, got {}", scaling_factor));
    }
    if (upsample_block_type != "interpolate" && upsample_block_type != "pixel_shuffle") {
        fail(source, fmt::format("`upsample_block_type` \"{}\" is not interpolate or pixel_shuffle",
                                 upsample_block_type));
    }
    if (downsample_block_type != "pixel_unshuffle" && lower(downsample_block_type) != "conv") {
        fail(source, fmt::format("`downsample_block_type` \"{}\" is not pixel_unshuffle or conv",
                                 downsample_block_type));
    }
    if (!is_activation(decoder_conv_act_fn)) {
        fail(source, fmt::format("`decoder_conv_act_fn` \"{}\" is not silu, relu, gelu or mish",
                                 decoder_conv_act_fn));
    }
    validate_stages(source, "encoder", encoder_block_types, encoder_block_out_channels,
                    encoder_layers_per_block, encoder_qkv_multiscales, attention_head_dim);
    validate_stages(source, "decoder", decoder_block_types, decoder_block_out_channels,
                    decoder_layers_per_block, decoder_qkv_multiscales, attention_head_dim);
    const size_t nd = decoder_block_out_channels.size();
    if (decoder_norm_types.size() != nd) {
        fail(source,
             fmt::format(
                 "`decoder_norm_types` has {} entries but `decoder_block_out_channels` has {}",
                 decoder_norm_types.size(), nd));
    }
    if (decoder_act_fns.size() != nd) {
        fail(source,
             fmt::format("`decoder_act_fns` has {} entries but `decoder_block_out_channels` has {}",
                         decoder_act_fns.size(), nd));
    }
    for (size_t i = 0; i < nd; ++i) {
        if (decoder_norm_types[i] != "rms_norm" && decoder_norm_types[i] != "batch_norm") {
            fail(source,
                 fmt::format("`decoder_norm_types` stage {}: \"{}\" is not rms_norm or batch_norm",
                             i, decoder_norm_types[i]));
        }
        if (!is_activation(decoder_act_fns[i])) {
            fail(source,
                 fmt::format("`decoder_act_fns` stage {}: \"{}\" is not silu, relu, gelu or mish",
                             i, decoder_act_fns[i]));
        }
    }

    // Channel arithmetic of the shortcuts: each averages groups of channels or repeats them, so
    // the counts must divide, or upstream fails at its first forward.
    const auto& ec = encoder_block_out_channels;
    const auto& el = encoder_layers_per_block;
    const bool unshuffle = downsample_is_pixel_unshuffle();
    if (el[0] == 0 && ec.size() < 2) {
        fail(source, "`encoder_layers_per_block` stage 0 is empty, which needs a second stage");
    }
    const int64_t first = el[0] > 0 ? ec[0] : ec[1];
    if (el[0] == 0 && unshuffle && first % 4 != 0) {
        fail(source,
             fmt::format("`encoder_block_out_channels` stage 1: {} is not a multiple of 4, as "
                         "pixel_unshuffle needs",
                         first));
    }
    for (size_t i = 0; i + 1 < ec.size(); ++i) {
        if (el[i] == 0) continue;
        if ((4 * ec[i]) % ec[i + 1] != 0 || ec[i + 1] > 4 * ec[i] ||
            (unshuffle && ec[i + 1] % 4 != 0)) {
            fail(source,
                 fmt::format(
                     "`encoder_block_out_channels` stages {} -> {}: {} -> {} channels do not "
                     "fit the downsampling shortcut (4 x {} must be a multiple of {}{})",
                     i, i + 1, ec[i], ec[i + 1], ec[i], ec[i + 1],
                     unshuffle ? ", itself a multiple of 4" : ""));
        }
    }
    if (encoder_out_shortcut && ec.back() % latent_channels != 0) {
        fail(source,
             fmt::format("`latent_channels` {} must divide the last encoder stage's {} channels "
                         "(`encoder_out_shortcut` averages groups of them)",
                         latent_channels, ec.back()));
    }
    const auto& dc = decoder_block_out_channels;
    const auto& dl = decoder_layers_per_block;
    if (dl[0] == 0 && dc.size() < 2) {
        fail(source, "`decoder_layers_per_block` stage 0 is empty, which needs a second stage");
    }
    for (size_t i = 0; i + 1 < dc.size(); ++i) {
        if (dl[i] == 0) continue;
        if ((4 * dc[i]) % dc[i + 1] != 0 || 4 * dc[i] < dc[i + 1]) {
            fail(source,
                 fmt::format(
                     "`decoder_block_out_channels` stages {} -> {}: {} -> {} channels do not "
                     "fit the upsampling shortcut (4 x {} must be a multiple of {})",
                     i + 1, i, dc[i + 1], dc[i], dc[i], dc[i + 1]));
        }
    }
    if (decoder_in_shortcut && dc.back() % latent_channels != 0) {
        fail(source,
             fmt::format("`latent_channels` {} must divide the last decoder stage's {} channels "
                         "(`decoder_in_shortcut` repeats the latent channels)",
                         latent_channels, dc.back()));
    }
}

AutoencoderDCConfig AutoencoderDCConfig::from_json(const json& j, const std::string& source) {
    // Unknown keys (_diffusers_version, keys of later versions) are ignored, as diffusers
    // ignores unexpected config keys.
    const ConfigReader r(j, source);
    r.check_class_name("AutoencoderDC");
    AutoencoderDCConfig c;
    // Upstream's defaults for the keys that may be one string for every stage.
    PerStage enc_types{true, "ResBlock", {}}, dec_types{true, "ResBlock", {}};
    PerStage norms{true, "rms_norm", {}}, acts{true, "silu", {}};
    r.integer("in_channels", c.in_channels);
    r.integer("latent_channels", c.latent_channels);
    r.integer("attention_head_dim", c.attention_head_dim);
    read_per_stage(r, "encoder_block_types", enc_types);
    read_per_stage(r, "decoder_block_types", dec_types);
    r.integer_list("encoder_block_out_channels", c.encoder_block_out_channels);
    r.integer_list("decoder_block_out_channels", c.decoder_block_out_channels);
    r.integer_list("encoder_layers_per_block", c.encoder_layers_per_block);
    r.integer_list("decoder_layers_per_block", c.decoder_layers_per_block);
    r.integer_lists("encoder_qkv_multiscales", c.encoder_qkv_multiscales);
    r.integer_lists("decoder_qkv_multiscales", c.decoder_qkv_multiscales);
    r.string("upsample_block_type", c.upsample_block_type);
    r.string("downsample_block_type", c.downsample_block_type);
    read_per_stage(r, "decoder_norm_types", norms);
    read_per_stage(r, "decoder_act_fns", acts);
    r.boolean("encoder_out_shortcut", c.encoder_out_shortcut);
    r.boolean("decoder_in_shortcut", c.decoder_in_shortcut);
    r.string("decoder_conv_act_fn", c.decoder_conv_act_fn);
    r.number("scaling_factor", c.scaling_factor);
    c.downsample_block_type = canonical_downsample(c.downsample_block_type);
    c.encoder_block_types = enc_types.expand(c.encoder_block_out_channels.size());
    c.decoder_block_types = dec_types.expand(c.decoder_block_out_channels.size());
    c.decoder_norm_types = norms.expand(c.decoder_block_out_channels.size());
    c.decoder_act_fns = acts.expand(c.decoder_block_out_channels.size());
    c.validate(source);
    return c;
}

AutoencoderDCConfig AutoencoderDCConfig::from_json_text(const std::string& text,
                                                        const std::string& source) {
    return from_json(parse_config_json(text, source), source);
}

AutoencoderDCConfig AutoencoderDCConfig::from_json_file(const std::string& path) {
    const ConfigFile file = read_config_file(path, "AutoencoderDC config");
    return from_json(file.json, file.path);
}

std::string AutoencoderDCConfig::to_json_text() const {
    json j;
    j["_class_name"] = "AutoencoderDC";
    j["in_channels"] = in_channels;
    j["latent_channels"] = latent_channels;
    j["attention_head_dim"] = attention_head_dim;
    j["encoder_block_types"] = encoder_block_types;
    j["decoder_block_types"] = decoder_block_types;
    j["encoder_block_out_channels"] = encoder_block_out_channels;
    j["decoder_block_out_channels"] = decoder_block_out_channels;
    j["encoder_layers_per_block"] = encoder_layers_per_block;
    j["decoder_layers_per_block"] = decoder_layers_per_block;
    j["encoder_qkv_multiscales"] = encoder_qkv_multiscales;
    j["decoder_qkv_multiscales"] = decoder_qkv_multiscales;
    j["upsample_block_type"] = upsample_block_type;
    j["downsample_block_type"] = downsample_block_type;
    j["decoder_norm_types"] = decoder_norm_types;
    j["decoder_act_fns"] = decoder_act_fns;
    j["encoder_out_shortcut"] = encoder_out_shortcut;
    j["decoder_in_shortcut"] = decoder_in_shortcut;
    j["decoder_conv_act_fn"] = decoder_conv_act_fn;
    j["scaling_factor"] = scaling_factor;
    return j.dump(2);
}

AutoencoderDCConfig AutoencoderDCConfig::named(const std::string& name) {
    AutoencoderDCConfig c;
    if (name == "dc-ae-f32c32") {
        // mit-han-lab/dc-ae-f32c32-sana-1.0-diffusers (also Sana's `vae/`): the values of
        // diffusers' scripts/convert_dcae_to_diffusers.py for "dc-ae-f32c32-sana-1.0", which wrote
        // that repository's config.json; "Conv" there is this "conv".
        const std::vector<std::string> types = {"ResBlock",          "ResBlock",
                                                "ResBlock",          "EfficientViTBlock",
                                                "EfficientViTBlock", "EfficientViTBlock"};
        c.in_channels = 3;
        c.latent_channels = 32;
        c.attention_head_dim = 32;
        c.encoder_block_types = c.decoder_block_types = types;
        c.encoder_block_out_channels =
            c.decoder_block_out_channels = {128, 256, 512, 512, 1024, 1024};
        c.encoder_layers_per_block = {2, 2, 2, 3, 3, 3};
        c.decoder_layers_per_block = {3, 3, 3, 3, 3, 3};
        c.encoder_qkv_multiscales = c.decoder_qkv_multiscales = {{}, {}, {}, {5}, {5}, {5}};
        c.upsample_block_type = "interpolate";
        c.downsample_block_type = "conv";
        c.decoder_norm_types = std::vector<std::string>(6, "rms_norm");
        c.decoder_act_fns = std::vector<std::string>(6, "silu");
        c.scaling_factor = 0.41407;
    } else if (name == "dc-ae-tiny") {
        // Equal to tests/data/golden/vae/config.json, so the golden weights load into it.
        const std::vector<std::string> types = {"ResBlock", "ResBlock", "EfficientViTBlock",
                                                "EfficientViTBlock"};
        c.in_channels = 3;
        c.latent_channels = 8;
        c.attention_head_dim = 8;
        c.encoder_block_types = c.decoder_block_types = types;
        c.encoder_block_out_channels = c.decoder_block_out_channels = {8, 16, 32, 32};
        c.encoder_layers_per_block = {1, 1, 2, 2};
        c.decoder_layers_per_block = {1, 2, 2, 2};
        c.encoder_qkv_multiscales = c.decoder_qkv_multiscales = {{}, {}, {5}, {5}};
        c.upsample_block_type = "interpolate";
        c.downsample_block_type = "conv";
        c.decoder_norm_types = std::vector<std::string>(4, "rms_norm");
        c.decoder_act_fns = std::vector<std::string>(4, "silu");
        c.scaling_factor = 0.41407;
    } else {
        throw Error::InvalidArgument(
            fmt::format("unknown AutoencoderDC configuration \"{}\" (known: {})", name,
                        fmt::join(names(), ", ")));
    }
    c.validate(name);
    return c;
}

std::vector<std::string> AutoencoderDCConfig::names() { return {"dc-ae-f32c32", "dc-ae-tiny"}; }

bool operator==(const AutoencoderDCConfig& a, const AutoencoderDCConfig& b) {
    return a.in_channels == b.in_channels && a.latent_channels == b.latent_channels &&
           a.attention_head_dim == b.attention_head_dim &&
           a.encoder_block_types == b.encoder_block_types &&
           a.decoder_block_types == b.decoder_block_types &&
           a.encoder_block_out_channels == b.encoder_block_out_channels &&
           a.decoder_block_out_channels == b.decoder_block_out_channels &&
           a.encoder_layers_per_block == b.encoder_layers_per_block &&
           a.decoder_layers_per_block == b.decoder_layers_per_block &&
           a.encoder_qkv_multiscales == b.encoder_qkv_multiscales &&
           a.decoder_qkv_multiscales == b.decoder_qkv_multiscales &&
           a.upsample_block_type == b.upsample_block_type &&
           canonical_downsample(a.downsample_block_type) ==
               canonical_downsample(b.downsample_block_type) &&
           a.decoder_norm_types == b.decoder_norm_types && a.decoder_act_fns == b.decoder_act_fns &&
           a.encoder_out_shortcut == b.encoder_out_shortcut &&
           a.decoder_in_shortcut == b.decoder_in_shortcut &&
           a.decoder_conv_act_fn == b.decoder_conv_act_fn && a.scaling_factor == b.scaling_factor;
}

// ---- parameter counts, block by block as the modules register them ----
namespace {

Count conv(Count in, Count out, Count k, bool bias = true, Count groups = 1) {
    return out * (in / groups) * k * k + (bias ? out : Count(0));
}

// RMSNorm (weight and bias) and BatchNorm2d (affine weight and bias) both hold 2 C parameters.
Count norm(Count c) { return 2 * c; }

Count res_block(Count c) { return conv(c, c, 3) + conv(c, c, 3, /*bias=*/false) + norm(c); }

Count efficient_vit_block(Count c, Count head_dim, const std::vector<int64_t>& scales) {
    const Count heads = c / head_dim;  // int(in_channels // attention_head_dim * 1.0)
    const Count inner = heads * head_dim;
    Count n = 3 * c * inner;  // to_q, to_k, to_v, no bias
    for (const int64_t k : scales) {
        n += conv(3 * inner, 3 * inner, k, false, 3 * inner);  // proj_in, depthwise
        n += conv(3 * inner, 3 * inner, 1, false, 3 * heads);  // proj_out, grouped per head
    }
    n += inner * (1 + static_cast<int64_t>(scales.size())) * c;  // to_out, no bias
    n += norm(c);                                                // norm_out
    const Count hidden = 4 * c;                                  // GLUMBConv expand_ratio 4
    n += conv(c, 2 * hidden, 1) + conv(2 * hidden, 2 * hidden, 3, true, 2 * hidden) +
         conv(hidden, c, 1, false) + norm(c);
    return n;
}

Count stage_blocks(const std::string& type, Count c, Count layers, Count head_dim,
                   const std::vector<int64_t>& scales) {
    return layers * (type == "ResBlock" ? res_block(c) : efficient_vit_block(c, head_dim, scales));
}

Count down_block(Count in, Count out, bool unshuffle) {
    return conv(in, unshuffle ? out / 4 : out, 3);
}

Count up_block(Count in, Count out, bool interpolate) {
    return conv(in, interpolate ? out : 4 * out, 3);
}

}  // namespace

int64_t dc_ae_parameter_count(const AutoencoderDCConfig& c, bool with_decoder) {
    c.validate();
    Count n = 0;
    const auto& ec = c.encoder_block_out_channels;
    const auto& el = c.encoder_layers_per_block;
    const bool unshuffle = c.downsample_is_pixel_unshuffle();
    n += el[0] > 0 ? conv(c.in_channels, ec[0], 3) : down_block(c.in_channels, ec[1], unshuffle);
    for (size_t i = 0; i < ec.size(); ++i) {
        n += stage_blocks(c.encoder_block_types[i], ec[i], el[i], c.attention_head_dim,
                          c.encoder_qkv_multiscales[i]);
        if (i + 1 < ec.size() && el[i] > 0) n += down_block(ec[i], ec[i + 1], unshuffle);
    }
    n += conv(ec.back(), c.latent_channels, 3);
    if (!with_decoder) return n.value();

    const auto& dc = c.decoder_block_out_channels;
    const auto& dl = c.decoder_layers_per_block;
    const bool interpolate = c.upsample_is_interpolate();
    n += conv(c.latent_channels, dc.back(), 3);
    for (size_t i = 0; i < dc.size(); ++i) {
        if (i + 1 < dc.size() && dl[i] > 0) n += up_block(dc[i + 1], dc[i], interpolate);
        n += stage_blocks(c.decoder_block_types[i], dc[i], dl[i], c.attention_head_dim,
                          c.decoder_qkv_multiscales[i]);
    }
    const Count channels = dl[0] > 0 ? dc[0] : dc[1];
    n += norm(channels);
    n += dl[0] > 0 ? conv(channels, c.in_channels, 3)
                   : up_block(channels, c.in_channels, interpolate);
    return n.value();
}

}  // namespace sf::model

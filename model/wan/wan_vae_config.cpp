#include "model/wan/wan_vae_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/common/config_json.h"

namespace sf::model {
namespace {

using nlohmann::json;

constexpr size_t kMaxStages = 12;
constexpr int64_t kMaxWidth = int64_t{1} << 20;
constexpr int64_t kMaxResBlocks = 1024;

[[noreturn]] void fail(const std::string& source, const std::string& what) {
    throw Error::InvalidArgument(fmt::format("{}: {}", source, what));
}

// Parameters of the building blocks, as their modules register them.
int64_t conv(int64_t in, int64_t out, int64_t kernel_elements) {
    return out * in * kernel_elements + out;  // weight + bias
}
int64_t residual(int64_t in, int64_t out) {
    // norm1 (in), conv1 3x3x3, norm2 (out), conv2 3x3x3, a 1x1x1 shortcut when the width changes
    return in + conv(in, out, 27) + out + conv(out, out, 27) + (in != out ? conv(in, out, 1) : 0);
}
int64_t attention(int64_t dim) { return dim + conv(dim, 3 * dim, 1) + conv(dim, dim, 1); }
int64_t mid_block(int64_t dim) { return 2 * residual(dim, dim) + attention(dim); }

}  // namespace

int64_t WanVAEConfig::spatial_compression_ratio() const {
    return int64_t{1} << temperal_downsample.size();
}

int64_t WanVAEConfig::temporal_compression_ratio() const {
    return int64_t{1} << std::count(temperal_downsample.begin(), temperal_downsample.end(), true);
}

int64_t WanVAEConfig::latent_frames(int64_t frames) const {
    const int64_t r = temporal_compression_ratio();
    if (frames < 1 || (frames - 1) % r != 0) {
        throw Error::InvalidArgument(fmt::format(
            "the Wan VAE encodes 1 + {} k frames (1, {}, {}, ...), got {}: upstream would drop the "
            "last {}",
            r, 1 + r, 1 + 2 * r, frames, frames < 1 ? 0 : (frames - 1) % r));
    }
    return 1 + (frames - 1) / r;
}

void WanVAEConfig::validate(const std::string& source) const {
    auto positive = [&](int64_t v, const char* key) {
        if (v <= 0) fail(source, fmt::format("`{}` must be positive, got {}", key, v));
    };
    positive(base_dim, "base_dim");
    if (decoder_base_dim) positive(*decoder_base_dim, "decoder_base_dim");
    positive(z_dim, "z_dim");
    positive(num_res_blocks, "num_res_blocks");
    positive(in_channels, "in_channels");
    positive(out_channels, "out_channels");
    if (dim_mult.empty() || dim_mult.size() > kMaxStages) {
        fail(source, fmt::format("`dim_mult` must have 1 to {} entries, got {}", kMaxStages,
                                 dim_mult.size()));
    }
    for (int64_t m : dim_mult) {
        if (m <= 0) fail(source, fmt::format("`dim_mult` {} has a non-positive entry", dim_mult));
        // Bounds that keep every count in 64 bits (no VAE is near them).
        if (m > kMaxWidth / std::max(base_dim, decoder_dim())) {
            fail(source, fmt::format("`dim_mult` {} with base_dim {} makes a stage wider than {} "
                                     "channels",
                                     dim_mult, std::max(base_dim, decoder_dim()), kMaxWidth));
        }
    }
    if (z_dim > kMaxWidth || in_channels > kMaxWidth || out_channels > kMaxWidth) {
        fail(source, fmt::format("`z_dim`, `in_channels` and `out_channels` must be at most {}",
                                 kMaxWidth));
    }
    if (num_res_blocks > kMaxResBlocks) {
        fail(source, fmt::format("`num_res_blocks` must be at most {}, got {}", kMaxResBlocks,
                                 num_res_blocks));
    }
    if (temperal_downsample.size() + 1 != dim_mult.size()) {
        fail(source, fmt::format("`temperal_downsample` has {} entries, `dim_mult` {}: one per "
                                 "downsampling stage (len(dim_mult) - 1) is needed",
                                 temperal_downsample.size(), dim_mult.size()));
    }
    if (!attn_scales.empty()) {
        fail(source,
             "`attn_scales` must be empty: upstream's encoder fails with attention in its down "
             "blocks and its decoder ignores them, so no Wan VAE has any");
    }
    if (!(dropout >= 0.0 && dropout < 1.0)) {
        fail(source, fmt::format("`dropout` must be in [0, 1), got {}", dropout));
    }
    if (latents_mean.size() != static_cast<size_t>(z_dim) ||
        latents_std.size() != static_cast<size_t>(z_dim)) {
        fail(source, fmt::format("`latents_mean` and `latents_std` need z_dim = {} entries, got {} "
                                 "and {}",
                                 z_dim, latents_mean.size(), latents_std.size()));
    }
    for (double s : latents_std) {
        if (!(s > 0.0) || !std::isfinite(s)) {
            fail(source, fmt::format("`latents_std` entries must be positive, got {}", s));
        }
    }
    if (is_residual) {
        fail(source, "`is_residual` true is Wan2.2's VAE, which sanaflow does not implement");
    }
    if (patch_size && *patch_size > 1) {
        fail(source, fmt::format("`patch_size` {} is Wan2.2's patchified VAE, which sanaflow does "
                                 "not implement",
                                 *patch_size));
    }
    // Every decoder stage after the first takes half its input width (Wan2.1's upsamplers halve
    // the channels): the widths must stay even.
    for (size_t i = 0; i + 1 < dim_mult.size(); ++i) {
        if ((decoder_dim() * dim_mult[dim_mult.size() - 1 - i]) % 2 != 0) {
            fail(source,
                 "decoder widths must be even (each upsampler halves them): `base_dim` or "
                 "`decoder_base_dim` is odd");
        }
    }
    if (scale_factor_spatial != spatial_compression_ratio() ||
        scale_factor_temporal != temporal_compression_ratio()) {
        fail(source, fmt::format("`scale_factor_spatial` {} and `scale_factor_temporal` {} do not "
                                 "match the structure ({} and {})",
                                 scale_factor_spatial, scale_factor_temporal,
                                 spatial_compression_ratio(), temporal_compression_ratio()));
    }
}

WanVAEConfig WanVAEConfig::from_json(const json& j, const std::string& source) {
    const ConfigReader r(j, source);
    r.check_class_name("AutoencoderKLWan");
    WanVAEConfig c;
    r.integer("base_dim", c.base_dim);
    r.nullable_integer("decoder_base_dim", c.decoder_base_dim);
    r.integer("z_dim", c.z_dim);
    r.integer_list("dim_mult", c.dim_mult);
    r.integer("num_res_blocks", c.num_res_blocks);
    r.number_list("attn_scales", c.attn_scales);
    r.boolean_list("temperal_downsample", c.temperal_downsample);
    r.number("dropout", c.dropout);
    r.number_list("latents_mean", c.latents_mean);
    r.number_list("latents_std", c.latents_std);
    r.boolean("is_residual", c.is_residual);
    r.integer("in_channels", c.in_channels);
    r.integer("out_channels", c.out_channels);
    r.nullable_integer("patch_size", c.patch_size);
    // v0.33.1 configs have neither key: the structure decides, as upstream's own ratio does
    // (a list too long to shift by is refused by validate()).
    if (c.temperal_downsample.size() < kMaxStages) {
        c.scale_factor_spatial = c.spatial_compression_ratio();
        c.scale_factor_temporal = c.temporal_compression_ratio();
    }
    if (r.has_value("scale_factor_spatial"))
        r.integer("scale_factor_spatial", c.scale_factor_spatial);
    if (r.has_value("scale_factor_temporal")) {
        r.integer("scale_factor_temporal", c.scale_factor_temporal);
    }
    c.validate(source);
    return c;
}

WanVAEConfig WanVAEConfig::from_json_text(const std::string& text, const std::string& source) {
    return from_json(parse_config_json(text, source), source);
}

WanVAEConfig WanVAEConfig::from_json_file(const std::string& path) {
    const ConfigFile file = read_config_file(path, "AutoencoderKLWan config");
    return from_json(file.json, file.path);
}

std::string WanVAEConfig::to_json_text() const {
    json j;
    j["_class_name"] = "AutoencoderKLWan";
    j["base_dim"] = base_dim;
    j["decoder_base_dim"] = decoder_base_dim ? json(*decoder_base_dim) : json(nullptr);
    j["z_dim"] = z_dim;
    j["dim_mult"] = dim_mult;
    j["num_res_blocks"] = num_res_blocks;
    j["attn_scales"] = attn_scales;
    j["temperal_downsample"] = temperal_downsample;
    j["dropout"] = dropout;
    j["latents_mean"] = latents_mean;
    j["latents_std"] = latents_std;
    j["is_residual"] = is_residual;
    j["in_channels"] = in_channels;
    j["out_channels"] = out_channels;
    j["patch_size"] = patch_size ? json(*patch_size) : json(nullptr);
    j["scale_factor_temporal"] = scale_factor_temporal;
    j["scale_factor_spatial"] = scale_factor_spatial;
    return j.dump(2);
}

WanVAEConfig WanVAEConfig::named(const std::string& name) {
    WanVAEConfig c;  // upstream's defaults are Wan2.1's VAE
    if (name == "wan2.1-vae") return c;
    if (name == "wan-vae-tiny") {
        // tests/data/golden-video/vae_wan: Wan2.1's structure at base_dim 4, z_dim 8, with the
        // first 8 of Wan2.1's channel statistics.
        c.base_dim = 4;
        c.z_dim = 8;
        c.latents_mean.resize(8);
        c.latents_std.resize(8);
        return c;
    }
    throw Error::InvalidArgument(
        fmt::format("no built-in Wan VAE config '{}' (have: {})", name, fmt::join(names(), ", ")));
}

std::vector<std::string> WanVAEConfig::names() { return {"wan2.1-vae", "wan-vae-tiny"}; }

bool operator==(const WanVAEConfig& a, const WanVAEConfig& b) {
    return a.to_json_text() == b.to_json_text();
}

int64_t wan_vae_parameter_count(const WanVAEConfig& c, bool with_decoder) {
    c.validate();
    const size_t stages = c.dim_mult.size();
    // Encoder: conv_in, per stage num_res_blocks residual blocks and (but the last) a downsampler
    // (a stride-2 3x3 conv, plus a stride-2 time conv where it halves the frames), the middle
    // block, norm_out and conv_out to mean and log-variance; then quant_conv.
    int64_t n = conv(c.in_channels, c.base_dim, 27);
    int64_t in = c.base_dim;
    for (size_t i = 0; i < stages; ++i) {
        const int64_t out = c.base_dim * c.dim_mult[i];
        for (int64_t b = 0; b < c.num_res_blocks; ++b) {
            n += residual(in, out);
            in = out;
        }
        if (i + 1 < stages) {
            n += conv(out, out, 9) + (c.temperal_downsample[i] ? conv(out, out, 3) : 0);
        }
    }
    n += mid_block(in) + in + conv(in, 2 * c.z_dim, 27) + conv(2 * c.z_dim, 2 * c.z_dim, 1);
    if (!with_decoder) return n;
    // Decoder: post_quant_conv, conv_in, the middle block, per stage num_res_blocks + 1 residual
    // blocks and (but the last) an upsampler to half the width (a 3x3 conv, plus a time conv to
    // twice the channels where it doubles the frames), norm_out, conv_out.
    const int64_t top = c.decoder_dim() * c.dim_mult.back();
    n += conv(c.z_dim, c.z_dim, 1) + conv(c.z_dim, top, 27) + mid_block(top);
    in = top;
    for (size_t i = 0; i < stages; ++i) {
        const int64_t out = c.decoder_dim() * c.dim_mult[stages - 1 - i];
        if (i > 0) in /= 2;  // the previous stage's upsampler halved it
        for (int64_t b = 0; b <= c.num_res_blocks; ++b) {
            n += residual(in, out);
            in = out;
        }
        if (i + 1 < stages) {
            const bool temporal = c.temperal_downsample[stages - 2 - i];
            n += conv(out, out / 2, 9) + (temporal ? conv(out, 2 * out, 3) : 0);
        }
    }
    n += in + conv(in, c.out_channels, 27);
    return n;
}

}  // namespace sf::model

#include "pipelines/models_table.h"

#include <fmt/format.h>

#include "core/log.h"
#include "model/dc_ae/autoencoder_dc_config.h"
#include "model/gemma/gemma2_config.h"
#include "model/sana/sana_config.h"
#include "model/sana_video/sana_video_config.h"
#include "model/wan/wan_vae_config.h"

namespace sf::pipelines {
namespace {

std::string row(const std::string& name, const std::string& kind, int64_t params) {
    // Thousands separators: exact counts are the point, and 1592971104 is hard to read.
    std::string digits = std::to_string(params), grouped;
    for (size_t i = 0; i < digits.size(); ++i) {
        if (i > 0 && (digits.size() - i) % 3 == 0) grouped += ',';
        grouped += digits[i];
    }
    return fmt::format("{:<22} {:<38} {:>15} {:>11} {:>11}\n", name, kind, grouped,
                       format_bytes(params * 4), format_bytes(params * 2));
}

}  // namespace

std::string models_table() {
    std::string out = fmt::format("{:<22} {:<38} {:>15} {:>11} {:>11}\n", "name", "model",
                                  "parameters", "fp32", "bf16");
    for (const std::string& name : model::SanaTransformerConfig::names()) {
        out += row(name, "SanaTransformer2DModel",
                   model::sana_parameter_count(model::SanaTransformerConfig::named(name)));
    }
    for (const std::string& name : model::SanaVideoTransformerConfig::names()) {
        out +=
            row(name, "SanaVideoTransformer3DModel",
                model::sana_video_parameter_count(model::SanaVideoTransformerConfig::named(name)));
    }
    for (const std::string& name : model::AutoencoderDCConfig::names()) {
        const auto config = model::AutoencoderDCConfig::named(name);
        out +=
            row(name, "AutoencoderDC", model::dc_ae_parameter_count(config, /*with_decoder=*/true));
        out += row(name + " (encoder)", "AutoencoderDC encoder (for caching)",
                   model::dc_ae_parameter_count(config, /*with_decoder=*/false));
    }
    for (const std::string& name : model::WanVAEConfig::names()) {
        const auto config = model::WanVAEConfig::named(name);
        out += row(name, "AutoencoderKLWan (video VAE)",
                   model::wan_vae_parameter_count(config, /*with_decoder=*/true));
        out += row(name + " (encoder)", "AutoencoderKLWan encoder (for caching)",
                   model::wan_vae_parameter_count(config, /*with_decoder=*/false));
    }
    for (const std::string name : {"gemma-2-2b", "gemma-2-tiny"}) {
        out += row(name, "Gemma2Model (text encoder)",
                   model::gemma2_parameter_count(model::Gemma2Config::named(name)));
    }
    return out;
}

}  // namespace sf::pipelines

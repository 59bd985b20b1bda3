// The config.json readers of the models and of the samplers' scheduler_config.json; the first
// byte picks which.
#include "fuzz_util.h"
#include "model/common/config_json.h"
#include "model/dc_ae/autoencoder_dc_config.h"
#include "model/gemma/gemma2_config.h"
#include "model/sana/sana_config.h"
#include "model/sana_video/sana_video_config.h"
#include "model/wan/wan_vae_config.h"
#include "stages/sample/scheduler_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const std::string text(sf::fuzz::as_text(data + 1, size - 1));
    sf::fuzz::refused_or_read([&] {
        switch (data[0] % 6) {
            case 0:
                sf::model::sana_parameter_count(
                    sf::model::SanaTransformerConfig::from_json(text, "config.json"));
                break;
            case 1:
                sf::model::dc_ae_parameter_count(
                    sf::model::AutoencoderDCConfig::from_json_text(text, "config.json"));
                break;
            case 2:
                sf::model::sana_video_parameter_count(
                    sf::model::SanaVideoTransformerConfig::from_json(text, "config.json"));
                break;
            case 3:
                sf::model::wan_vae_parameter_count(
                    sf::model::WanVAEConfig::from_json_text(text, "config.json"));
                break;
            case 5:
                sf::sample::check_sampler(
                    sf::sample::scheduler_from_config(
                        sf::model::parse_config_json(text, "scheduler_config.json"),
                        "scheduler_config.json"),
                    20);
                break;
            default:
                sf::model::gemma2_parameter_count(sf::model::Gemma2Config::from_json(
                    sf::model::parse_config_json(text, "config.json"), "config.json"));
        }
    });
    return 0;
}

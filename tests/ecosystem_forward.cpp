// For tests/python/ecosystem_test.py: sanaflow's SanaTransformer, loaded from a diffusers-layout
// transformer directory (and optionally a LoRA file), run on inputs read from a safetensors file,
// its output written to one; or its Wan VAE's decoder, tiled; or validation's sampler. The Python
// side runs diffusers' model (or pipeline) on the same files and compares, so the two
// implementations meet only through files a user would exchange.
//
//   ecosystem_forward TRANSFORMER_DIR INPUTS OUTPUT [LORA_FILE RANK ALPHA TARGETS]
//   ecosystem_forward --wan-decode VAE_DIR INPUTS OUTPUT TILE_H TILE_W STRIDE_H STRIDE_W
//   ecosystem_forward --sample TRANSFORMER_DIR INPUTS OUTPUT STEPS GUIDANCE SCHEDULER_CONFIG
//
// INPUTS holds hidden_states [B, C, H, W], encoder_hidden_states [B, L, caption_channels],
// timestep [B] and encoder_attention_mask [B, L]; OUTPUT gets `sample` [B, C, H, W] (fp32). For
// --wan-decode, INPUTS holds `latent` [B, z, t, h, w] and OUTPUT gets `sample`, the tiled decode
// (tiles and strides in pixels) clamped as upstream returns it. For --sample, INPUTS holds
// `latents` [B, C, H, W] (the starting noise), `caption` [L, caption_channels] and `empty` [n,
// caption_channels] (the empty prompt's features); OUTPUT gets `sample`, the latents validation
// samples with the scheduler_config.json given.
#include <torch/torch.h>

#include <cstdio>
#include <exception>
#include <sstream>
#include <string>

#include "model/common/lora.h"
#include "model/common/weights.h"
#include "model/sana/sana_transformer.h"
#include "model/wan/autoencoder_kl_wan.h"
#include "stages/sample/flow_sampler.h"
#include "storage/safetensors_file.h"
#include "storage/tensor_convert.h"

namespace {

int wan_decode(char** argv) {
    using namespace sf;
    model::AutoencoderKLWan vae = model::load_autoencoder_kl_wan(argv[2], /*with_decoder=*/true);
    vae->eval();
    const auto inputs = storage::SafetensorsFile::open(argv[3]);
    const model::WanTiling tiling{std::stoll(argv[5]), std::stoll(argv[6]), std::stoll(argv[7]),
                                  std::stoll(argv[8])};
    torch::NoGradGuard no_grad;
    const at::Tensor sample =
        vae->decode(storage::from_tensor_data(inputs.read("latent")), true, &tiling);
    storage::write_tensors_file(argv[4], {{"sample", sample.to(at::kFloat)}}, {});
    return 0;
}

int sample(char** argv) {
    using namespace sf;
    const std::string dir = argv[2];
    model::SanaTransformer transformer(model::SanaTransformerConfig::from_json_file(dir));
    model::load_weights(*transformer, dir);
    transformer->eval();
    const auto inputs = storage::SafetensorsFile::open(argv[3]);
    auto get = [&](const char* name) { return storage::from_tensor_data(inputs.read(name)); };
    const at::Tensor caption = get("caption").unsqueeze(0);
    const at::Tensor latents = get("latents");
    const at::Tensor mask = torch::ones({latents.size(0), caption.size(1)}, at::kLong);
    const sample::Velocity v =
        sample::guided_velocity(*transformer, caption.expand({latents.size(0), -1, -1}), mask,
                                get("empty"), std::stod(argv[6]));
    const at::Tensor x = sample::sample_flow(v, latents, std::stoll(argv[5]),
                                             sample::read_scheduler_config(argv[7]));
    storage::write_tensors_file(argv[4], {{"sample", x}}, {});
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "";
    if ((argc == 9 && mode == "--wan-decode") || (argc == 8 && mode == "--sample")) {
        try {
            return mode == "--sample" ? sample(argv) : wan_decode(argv);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "ecosystem_forward: %s\n", e.what());
            return 1;
        }
    }
    if (argc != 4 && argc != 8) {
        std::fprintf(stderr,
                     "usage: %s TRANSFORMER_DIR INPUTS OUTPUT [LORA_FILE RANK ALPHA TARGETS]\n",
                     argv[0]);
        return 2;
    }
    try {
        using namespace sf;
        const std::string dir = argv[1];
        model::SanaTransformer transformer(model::SanaTransformerConfig::from_json_file(dir));
        model::load_weights(*transformer, dir);
        if (argc == 8) {
            model::LoRAConfig lora;
            lora.rank = std::stoll(argv[5]);
            lora.alpha = std::stod(argv[6]);
            lora.targets.clear();
            std::stringstream targets(argv[7]);
            for (std::string t; std::getline(targets, t, ',');) lora.targets.push_back(t);
            model::add_lora(*transformer, lora);
            model::load_lora(*transformer, argv[4]);
        }
        transformer->eval();
        const auto inputs = storage::SafetensorsFile::open(argv[2]);
        auto get = [&](const char* name) { return storage::from_tensor_data(inputs.read(name)); };
        torch::NoGradGuard no_grad;
        const at::Tensor sample =
            transformer->forward(get("hidden_states"), get("encoder_hidden_states"),
                                 get("timestep"), get("encoder_attention_mask"));
        storage::write_tensors_file(argv[3], {{"sample", sample.to(at::kFloat)}}, {});
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "ecosystem_forward: %s\n", e.what());
        return 1;
    }
}

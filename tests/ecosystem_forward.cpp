// For tests/python/ecosystem_test.py: sanaflow's SanaTransformer, loaded from a diffusers-layout
// transformer directory (and optionally a LoRA file), run on inputs read from a safetensors file,
// its output written to one; or its Wan VAE's decoder, tiled. The Python side runs diffusers'
// model on the same files and compares, so the two implementations meet only through files a
// user would exchange.
//
//   ecosystem_forward TRANSFORMER_DIR INPUTS OUTPUT [LORA_FILE RANK ALPHA TARGETS]
//   ecosystem_forward --wan-decode VAE_DIR INPUTS OUTPUT TILE_H TILE_W STRIDE_H STRIDE_W
//
// INPUTS holds hidden_states [B, C, H, W], encoder_hidden_states [B, L, caption_channels],
// timestep [B] and encoder_attention_mask [B, L]; OUTPUT gets `sample` [B, C, H, W] (fp32). For
// --wan-decode, INPUTS holds `latent` [B, z, t, h, w] and OUTPUT gets `sample`, the tiled decode
// (tiles and strides in pixels) clamped as upstream returns it.
#include <torch/torch.h>

#include <cstdio>
#include <exception>
#include <sstream>
#include <string>

#include "model/common/lora.h"
#include "model/common/weights.h"
#include "model/sana/sana_transformer.h"
#include "model/wan/autoencoder_kl_wan.h"
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

}  // namespace

int main(int argc, char** argv) {
    if (argc == 9 && std::string(argv[1]) == "--wan-decode") {
        try {
            return wan_decode(argv);
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

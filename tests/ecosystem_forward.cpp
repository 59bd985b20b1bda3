// For tests/python/ecosystem_test.py: sanaflow's SanaTransformer, loaded from a diffusers-layout
// transformer directory (and optionally a LoRA file), run on inputs read from a safetensors file,
// its output written to one. The Python side runs diffusers' model on the same files and
// compares, so the two implementations meet only through files a user would exchange.
//
//   ecosystem_forward TRANSFORMER_DIR INPUTS OUTPUT [LORA_FILE RANK ALPHA TARGETS]
//
// INPUTS holds hidden_states [B, C, H, W], encoder_hidden_states [B, L, caption_channels],
// timestep [B] and encoder_attention_mask [B, L]; OUTPUT gets `sample` [B, C, H, W] (fp32).
#include <torch/torch.h>

#include <cstdio>
#include <exception>
#include <sstream>

#include "model/common/lora.h"
#include "model/common/weights.h"
#include "model/sana/sana_transformer.h"
#include "storage/safetensors_file.h"
#include "storage/tensor_convert.h"

int main(int argc, char** argv) {
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

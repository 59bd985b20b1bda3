// What the memory benchmarks (memory_ablation, plan_accuracy) share: the transformer they run, 4
// blocks of width 512 with the real block structure of sana-600m (heads of 32, Mix-FFN 2.5x,
// 2304-wide captions, 32-channel latents), its feed-forward chunk, and their list flags.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "model/sana/sana_config.h"

namespace sf::bench {

inline model::SanaTransformerConfig ablation_config() {
    model::SanaTransformerConfig c = model::SanaTransformerConfig::named("sana-600m");
    c.num_attention_heads = 16;
    c.attention_head_dim = 32;
    c.num_cross_attention_heads = 8;
    c.cross_attention_head_dim = 64;
    c.cross_attention_dim = 512;
    c.num_layers = 4;
    return c;
}

// The image variants' feed-forward chunk: 16 latent rows (of 32 to 128 at the default grids).
// Each chunk recomputes 2 halo rows and casts and sums the weights' gradients once, so smaller
// chunks cost time for little memory: all remedies at 4096 px (batch 2), 8 rows 1.04 GiB and
// 22.5 s a step, 16 rows 1.07 GiB and 21.3 s; at 1024 px the step 1.95 s against 1.62-1.74 s.
constexpr int64_t kImageFFRows = 16;

// "32,64,128" -> {32, 64, 128}; std::invalid_argument for an item that is no number.
inline std::vector<int64_t> parse_list(const std::string& s) {
    std::vector<int64_t> out;
    std::stringstream in(s);
    std::string item;
    while (std::getline(in, item, ',')) out.push_back(std::stoll(item));
    return out;
}

}  // namespace sf::bench

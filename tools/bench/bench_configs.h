// The transformer the memory benchmarks run (memory_ablation, plan_accuracy): 4 blocks of width
// 512 with the real block structure of sana-600m (heads of 32, Mix-FFN 2.5x, 2304-wide captions,
// 32-channel latents).
#pragma once

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

// The image variants' feed-forward chunk: 8 latent rows (of 32 to 128 at the default grids).
constexpr int64_t kImageFFRows = 8;

}  // namespace sf::bench

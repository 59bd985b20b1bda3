#include "stages/train/auto_fit.h"

#include <fmt/format.h>

namespace sf::train {

std::optional<std::string> relieve(TrainStepOptions& o, int64_t batch_size, bool video) {
    const int64_t per_pass = (batch_size + o.micro_batch_split - 1) / o.micro_batch_split;
    if (per_pass > 1) {
        const int64_t split = o.micro_batch_split * 2;
        const int64_t now = (batch_size + split - 1) / split;
        o.micro_batch_split = split;
        return fmt::format(
            "each micro-batch of {} as {} passes of at most {} samples "
            "(--micro_batch_split {})",
            batch_size, split, now, split);
    }
    if (o.gradient_checkpointing != 1) {
        o.gradient_checkpointing = 1;
        return std::string("gradient checkpointing of every block (--gradient_checkpointing)");
    }
    if (o.attention == "dense") {
        o.attention = "chunked";
        return fmt::format("chunked attention of {} tokens (--attention chunked)",
                           o.attention_chunk);
    }
    if (o.ff_chunk_size == 0) {
        o.ff_chunk_size = video ? 1 : 8;
        return fmt::format("the feed-forward over {} latent {} at a time (--ff_chunk_size {})",
                           o.ff_chunk_size, video ? "frame" : "rows", o.ff_chunk_size);
    }
    return std::nullopt;
}

}  // namespace sf::train

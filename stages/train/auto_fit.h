// --auto_fit: what a run changes, cheapest first, when a step runs out of memory. The step is
// then run again on the same samples and noise (the caller restores its sampler and generator),
// so the run goes on as if it had been started with the changed settings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "stages/train/train_step.h"

namespace sf::train {

// Applies the next change to `o` and says what it was, or nullopt when nothing is left:
//   1. each micro-batch of `batch_size` as twice as many passes (micro_batch_split), while a
//      pass holds more than one sample: same samples, noise and gradients, half the activations;
//   2. gradient checkpointing of every block;
//   3. chunked attention (the cross-attention's score matrix and the linear self-attention a
//      chunk of tokens at a time);
//   4. the feed-forward over chunks (8 latent rows of an image, 1 latent frame of a video).
// Mixed precision is never turned on: it changes the numbers, not only the memory.
std::optional<std::string> relieve(TrainStepOptions& o, int64_t batch_size, bool video);

}  // namespace sf::train

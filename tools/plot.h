// `sanaflow plot OUTPUT_DIR`: OUTPUT_DIR/metrics.jsonl drawn into OUTPUT_DIR/metrics.png, one
// panel each for the loss (each step and its running mean), the learning rate and the peak memory
// of every phase, over the steps. Training writes it at the end too. With OpenCV (media builds).
#pragma once

#include <string>

namespace sf::tools {

// Returns the PNG's path. kNotFound without metrics.jsonl; kInvalidArgument when it holds no step.
std::string plot_metrics(const std::string& output_dir);

}  // namespace sf::tools

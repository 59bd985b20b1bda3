// `sanaflow plot OUTPUT_DIR`: OUTPUT_DIR/metrics.jsonl drawn into OUTPUT_DIR/metrics.png, one
// panel each for the loss (each step and its running mean), the learning rate and the peak memory
// of every phase, over the steps; and OUTPUT_DIR/memory_timeline.json into memory_timeline.png.
// Training writes both at the end too. With OpenCV (media builds).
#pragma once

#include <string>

namespace sf::tools {

// Returns the PNG's path. kNotFound without metrics.jsonl; kInvalidArgument when it holds no step.
std::string plot_metrics(const std::string& output_dir);

// DIR/memory_timeline.json (core/timeline.h; an OUTPUT_DIR or a cache) drawn into
// DIR/memory_timeline.png: the memory counters over time, and under them one row of bars per lane
// (prep phases, train steps and their phases, resident models). Returns the PNG's path; kNotFound
// without the file, kInvalidArgument when it is not a trace or holds no sample.
std::string plot_memory_timeline(const std::string& dir);

}  // namespace sf::tools

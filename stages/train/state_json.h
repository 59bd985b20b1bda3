// The two JSON files of a training checkpoint (train_state.h), written and read without torch so
// that the fuzzers (tools/fuzz/) run the readers: state.json, the run's position and settings,
// and manifest.json, each file's size and checksum. Every field a reader takes is checked; a bad
// one is kCorruption naming the file and the field.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace sf::train {

constexpr int kStateVersion = 1;  // frozen: a layout change that old readers cannot read bumps it

struct StateFields {
    int64_t step = 0;  // optimizer steps done
    int64_t sampler_epoch = 0;
    int64_t sampler_batch = 0;
    // Joint image-video training: the image sampler's position (0, 0 otherwise, and for
    // checkpoints written before it existed).
    int64_t image_sampler_epoch = 0;
    int64_t image_sampler_batch = 0;
    std::map<std::string, double> scaler;         // finite numbers
    std::map<std::string, std::string> settings;  // what must match on resume
    std::vector<double> losses;  // NaN for a step whose loss was not finite (null in the file)
};

std::string state_json(const StateFields& fields);
// kInvalidArgument for another version; kCorruption for anything else wrong.
StateFields parse_state_json(const std::string& text, const std::string& where);

struct ManifestEntry {
    uint64_t bytes = 0;
    std::string xxh3_128;  // 32 hex characters
};

std::string manifest_json(const std::map<std::string, ManifestEntry>& files);
std::map<std::string, ManifestEntry> parse_manifest_json(const std::string& text,
                                                         const std::string& where);

}  // namespace sf::train

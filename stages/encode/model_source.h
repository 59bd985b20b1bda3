// Where a model stage's weights come from, and the fingerprint that names them.
//
// A pretrained model is a diffusers-layout directory (`transformer/`, `vae/`, `text_encoder/`,
// `tokenizer/`, each with config.json and safetensors weights). Without one, a stage builds its
// built-in configuration with weights drawn from a seeded generator: the demo and the tests run
// the whole pipeline this way, and the same seed gives the same weights, hence the same cache.
#pragma once

#include <cstdint>
#include <string>

namespace sf::stages {

struct ModelSource {
    std::string pretrained;  // diffusers-layout root; empty: the built-in `builtin`
    std::string builtin;     // a named configuration, e.g. "dc-ae-tiny"
    uint64_t seed = 0;       // for the built-in's random weights

    bool is_pretrained() const { return !pretrained.empty(); }
    // `pretrained`/`component`, checked to exist (kNotFound naming it otherwise).
    std::string component_dir(const std::string& component) const;
};

// Names the weights of `component` (or the built-in and its seed): for a directory, an XXH3-128
// over config.json, the index if any, and for each safetensors file its size, header and 64
// blocks of 4 KiB spread through it. Sampling keeps a fully cached rerun from reading gigabytes
// of weights just to learn that nothing changed; retrained or fine-tuned weights differ in every
// block, so they are caught.
std::string weights_fingerprint(const ModelSource& source, const std::string& component);

}  // namespace sf::stages

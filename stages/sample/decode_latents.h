// The VAE's decoder, on the device for one validation only: latents as training sees them ->
// RGB pixels. DC-AE's images (latents multiplied by its scaling factor) or the Wan VAE's videos
// (latents normalised per channel as SANA-Video's pipelines do). Built and loaded when
// constructed, freed when destroyed (stages::ResidentModel, stage "decode_vae"); the caller holds
// the device lease.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>

#include "stages/encode/model_source.h"

namespace sf::sample {

class LatentDecoder {
public:
    enum class Kind { kDcAe, kWan };
    // The VAE of `source` (its vae/, or the built-in configuration from its seed, drawn as prep
    // draws it: the encoder's weights first, so they are prep's). kNotFound when the directory
    // has no vae/.
    LatentDecoder(const stages::ModelSource& source, c10::Device device, Kind kind = Kind::kDcAe);
    ~LatentDecoder();
    LatentDecoder(const LatentDecoder&) = delete;
    LatentDecoder& operator=(const LatentDecoder&) = delete;

    // DC-AE: [B, C, h, w] scaled latents -> [B, 3, h r, w r]. Wan: [B, C, f, h, w] normalised
    // latents -> [B, 3, 1 + 4 (f - 1), 8 h, 8 w]. `tiled`: upstream's tiled decode of either, at
    // its default tiles (memory follows the tile). Pixels are uint8 on the CPU ([-1, 1] clamped).
    at::Tensor decode(const at::Tensor& latents, bool tiled = false);

private:
    struct Model;
    std::unique_ptr<Model> model_;
    c10::Device device_;
    Kind kind_;
};

}  // namespace sf::sample

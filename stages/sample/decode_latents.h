// The VAE's decoder, on the device for one validation only: latents as training sees them
// (multiplied by the scaling factor) -> RGB images. Built and loaded when constructed, freed when
// destroyed (stages::ResidentModel, stage "decode_vae"); the caller holds the device lease.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>

#include "stages/encode/model_source.h"

namespace sf::sample {

class LatentDecoder {
public:
    // The DC-AE of `source` (its vae/, or the built-in configuration from its seed, drawn as
    // prep draws it). kNotFound when the directory has no vae/.
    LatentDecoder(const stages::ModelSource& source, c10::Device device);
    ~LatentDecoder();
    LatentDecoder(const LatentDecoder&) = delete;
    LatentDecoder& operator=(const LatentDecoder&) = delete;

    // [B, C, h, w] scaled latents -> [B, 3, h r, w r] uint8 on the CPU ([-1, 1] clamped);
    // `tiled`: upstream's tiled decode (memory follows the tile).
    at::Tensor decode(const at::Tensor& latents, bool tiled = false);

private:
    struct Model;
    std::unique_ptr<Model> model_;
    c10::Device device_;
};

}  // namespace sf::sample

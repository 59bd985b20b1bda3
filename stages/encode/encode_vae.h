// encode_vae: decoded images -> DC-AE latents, as cache records.
//
// The stage is a plain class with a validated config. open() builds and loads the encoder (only
// the encoder: caching never decodes) for one phase; the returned session frees it when it goes,
// marking memory before load, after load, at peak and after free. The pipeline holds the device
// lease for the session's life.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "stages/encode/model_source.h"
#include "storage/cache_schema.h"
#include "storage/fingerprint.h"
#include "storage/tensor_record.h"

namespace sf::stages {

struct EncodeVAEConfig {
    ModelSource model{"", "dc-ae-tiny", 0};
    std::string device = "auto";         // --device
    std::string mixed_precision = "no";  // --mixed_precision: the encoder's dtype
    int batch_size = 4;                  // images per forward, all of one bucket
    int64_t tile_above = 2048;           // a side above this is encoded in 512-px tiles
};

class EncodeVAEStage {
public:
    // Validates the config (kInvalidArgument naming the field) and fingerprints the weights.
    explicit EncodeVAEStage(EncodeVAEConfig config);
    ~EncodeVAEStage();

    const EncodeVAEConfig& config() const { return config_; }
    // Everything that determines a latent: weights, dtype, tiling, scaling.
    const storage::Fingerprint& fingerprint() const { return fingerprint_; }

    class Session {
    public:
        virtual ~Session() = default;
        // `images`: [3, H, W] uint8 (0..255) or float (-1..1), all of one size. Returns one
        // latent per image, [C, H / r, W / r], multiplied by the scaling factor, in the stage's
        // dtype, on the CPU.
        virtual std::vector<at::Tensor> encode(const std::vector<at::Tensor>& images) = 0;
        virtual int64_t compression_ratio() const = 0;
    };
    // Builds and loads the encoder on the device; it lives as long as the session.
    std::unique_ptr<Session> open() const;

    // The cache record of one latent.
    storage::Record record(const at::Tensor& latent, const std::string& source,
                           const storage::schema::Bucket& bucket) const;

private:
    EncodeVAEConfig config_;
    storage::Fingerprint fingerprint_;
    std::string fingerprint_hash_;
};

}  // namespace sf::stages

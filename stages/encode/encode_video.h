// encode_video: decoded clip windows (and images, as one-frame videos) -> Wan2.1 VAE latents, as
// cache records.
//
// The stage is a plain class with a validated config. open() builds and loads the encoder (only
// the encoder: caching never decodes) for one phase; the session frees it when it goes, marking
// memory around it. A window's frames are pushed one at a time as the decoder produces them and
// encoded chunk by chunk (the first frame alone, then 4 at a time, as upstream): pixel memory is
// one chunk, not the window, and the latent grows by one latent frame per chunk.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "stages/encode/model_source.h"
#include "storage/cache_schema.h"
#include "storage/fingerprint.h"
#include "storage/tensor_record.h"

namespace sf::stages {

struct EncodeVideoConfig {
    ModelSource model{"", "wan-vae-tiny", 0};
    std::string device = "auto";         // --device
    std::string mixed_precision = "no";  // --mixed_precision: the encoder's dtype
    // Frames wider or taller than this are encoded in upstream's spatial tiles (256 px at 192 px
    // steps), so a 1280 x 720 window needs the memory of a tile, not of the frame.
    int64_t tile_above = 512;
};

class EncodeVideoStage {
public:
    // Validates the config (kInvalidArgument naming the field) and fingerprints the weights.
    explicit EncodeVideoStage(EncodeVideoConfig config);
    ~EncodeVideoStage();

    const EncodeVideoConfig& config() const { return config_; }
    // Everything that determines a latent: weights, dtype, tiling, the normalisation.
    const storage::Fingerprint& fingerprint() const { return fingerprint_; }

    class Session {
    public:
        virtual ~Session() = default;
        // Starts a window (any unfinished one is dropped).
        virtual void begin_window() = 0;
        // One frame [3, H, W], uint8 (0..255) or float (-1..1), of the window's size.
        virtual void push_frame(const at::Tensor& rgb) = 0;
        // The window's latent: the normalised posterior mean [C, f, h, w], in the stage's dtype,
        // on the CPU. kInvalidArgument when the frames pushed are not 1 + 4k.
        virtual at::Tensor finish_window() = 0;
        // Bytes the open window holds between frames (causal caches, a partial chunk).
        virtual int64_t held_bytes() const = 0;
        virtual int64_t compression_ratio() const = 0;  // spatial
    };
    // Builds and loads the encoder on the device; it lives as long as the session.
    std::unique_ptr<Session> open() const;

    // The cache record of one window's latent; `frames` is "start:count" (empty for an image).
    storage::Record record(const at::Tensor& latent, const std::string& source,
                           const storage::schema::Bucket& bucket, const std::string& frames) const;

private:
    EncodeVideoConfig config_;
    storage::Fingerprint fingerprint_;
    std::string fingerprint_hash_;
};

}  // namespace sf::stages

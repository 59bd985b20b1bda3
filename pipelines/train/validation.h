// Validation samples during training, as diffusers' train_dreambooth_lora_sana.py makes them:
// every --validation_epochs epochs (at the end of each 0-based epoch e with e % k == 0), or every
// --validation_steps steps, and after the last step, --num_validation_images images of each
// --validation_prompt under OUTPUT_DIR/validation/step-N/ (prompt-P-image-I.png and grid.png:
// a row per prompt). On a cache of video latents, videos of the largest bucket's window instead:
// prompt-P-video-I.mp4 (MPEG-4 at 16 fps, decoded by the Wan VAE), and in grid.png each video's
// first, middle and last frames.
//
// The prompts' features come from the cache (prep encodes them), so no text encoder is loaded.
// Each image is sampled alone (upstream's loop) from noise seeded by --seed, the same noise at
// every validation, so the images of two steps differ only by training. Sampling runs the
// transformer in eval mode under no grad and the run's autocast; then, with the sampler's memory
// released, the VAE's decoder is loaded for the decode only, inside the device lease, and freed.
// The phase's peak is the "validation" row of the per-phase table.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "pipelines/train/train.h"
#include "stages/encode/model_source.h"
#include "stages/sample/scheduler_config.h"
#include "stages/train/train_data.h"
#include "stages/train/train_step.h"

namespace sf::model {
class DiffusionTransformer;
}

namespace sf::pipelines::training {

// The VAE that encoded a cache: the pretrained root's vae/ when it has one, else the built-in one
// prep draws from the same seed (DC-AE for images, the Wan VAE for video latents).
stages::ModelSource cache_vae(const TrainOptions& o, bool video);
// kInvalidArgument, naming `flag`, unless `vae`'s weights are those that encoded `cache`'s latents.
void check_cache_vae(storage::Cache cache, const stages::ModelSource& vae, bool video,
                     const std::string& flag);

// The sampler of validation and class images, by --validation_scheduler: "auto" reads the
// pretrained root's scheduler/scheduler_config.json when it has one (its shift, not --flow_shift,
// as upstream's pipeline loads it), else DPM-Solver++ 2M at --flow_shift, as Sana's and
// SANA-Video's pipelines are set up; "dpm_solver", "unipc" (order 2) or "euler" is that sampler
// at --flow_shift.
// kInvalidArgument naming the file and key of a config it cannot run, or naming the flag of a bad
// step count or shift.
sample::SamplerSpec validation_sampler(const TrainOptions& o);

struct ValidationResult {
    std::string dir;
    std::vector<std::string> images;  // the samples' PNGs (or MP4s), grid.png not among them
    train::PhasePeak peak;
};

class Validator {
public:
    // Checked before the first step: every prompt and the empty prompt in the cache, a VAE whose
    // weights encoded the cache (`pretrained`'s vae/, else the built-in DC-AE or Wan VAE from
    // --seed).
    // kInvalidArgument naming the flag or the missing record.
    Validator(const TrainOptions& o, const train::TrainingSet& set, storage::Cache cache,
              int64_t steps_per_epoch, c10::Device device);

    bool enabled() const { return !prompts_.empty(); }
    // Whether the step just done (1-based) is one to validate after.
    bool due(int64_t step) const;
    // Samples, decodes and writes the images of `step`; the model is back in train mode after.
    ValidationResult run(model::DiffusionTransformer& model, const train::TrainStepOptions& options,
                         int64_t step);

private:
    TrainOptions o_;
    std::vector<std::string> prompts_;
    std::vector<at::Tensor> features_;  // [n, hidden] each
    at::Tensor empty_;
    std::vector<int64_t> noise_sizes_;  // a latent of the bucket: [1, C, (f,) h, w]
    int64_t steps_per_epoch_ = 1;
    bool video_ = false;  // the cache holds the Wan VAE's [C, f, h, w] latents
    stages::ModelSource vae_;
    sample::SamplerSpec sampler_;
    c10::Device device_;
};

}  // namespace sf::pipelines::training

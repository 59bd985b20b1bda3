// The class images of prior preservation, generated as diffusers' train_dreambooth_lora_sana.py
// generates them before training: when --class_data_dir holds fewer than --num_class_images
// images, the base transformer (no adapters) samples the rest from --class_prompt and the VAE
// decodes them into JPEGs named "<index>-<hash>.jpg", index counting on from the images found.
//
// Here the prompt's features come from the instance cache (prep encodes --class_prompt with the
// captions), so no text encoder is loaded; the transformer samples them all, then leaves the
// device before the VAE's decoder arrives, each inside the device lease. The images are made at
// the sizes of the instance samples' aspect buckets, taken round-robin over the buckets (image i
// at entry i mod n of that order), so the first images cover every bucket and the rest follow the
// buckets' sizes; with no class image yet, fewer images than buckets is refused before any is made.
// Noise is seeded by --seed and i alone: a run killed midway leaves whole files only (each written
// atomically), and the rerun makes the same images for the indices still missing.
// Sampling is validation's: --validation_scheduler's sampler (validation.h: DPM-Solver++ 2M as
// Sana's pipeline unless the model root's scheduler config says otherwise),
// --validation_inference_steps (20) of it, with guidance --validation_guidance_scale (4.5)
// against the empty prompt.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pipelines/train/train.h"

namespace sf::distributed {
class World;
}  // namespace sf::distributed

namespace sf::pipelines {

struct ClassImageOptions {
    std::string class_data_dir;
    std::string class_prompt;
    int64_t num_class_images = 100;  // upstream's default
    int64_t sample_batch_size = 4;   // images sampled together (upstream's default)
    // The autocast of sampling: "no"/"fp32", "fp16" or "bf16"; "": the run's --mixed_precision.
    std::string precision;
};

struct ClassImageReport {
    int64_t found = 0;                 // images in class_data_dir before
    std::vector<std::string> written;  // the new images' paths, in index order
};

// The images in `dir` that prep would read (image extensions, no dot names, in subfolders too).
int64_t count_class_images(const std::string& dir);

// kInvalidArgument naming the flag: a missing --class_data_dir or --class_prompt, a count or
// batch out of range, or a generation precision that autocast refuses on `o`'s device (fp16 on a
// CPU LibTorch 1.13). What generate_class_images checks first, for callers that check before
// other work.
void check_class_image_options(const TrainOptions& o, const ClassImageOptions& c);

// Generates what is missing, using `o`'s cache (the instance samples, with the class prompt's
// features; every shard of a sharded prep), model and device. With `ranks` (a data-parallel
// launch, train.h's join_ranks) every rank calls it: they count the images found, then each
// makes the missing indices i with i mod N its rank (on cuda:LOCAL_RANK on CUDA), and each
// returns when all are written; an image is the same whichever rank makes it. `written` is this
// rank's. kInvalidArgument naming the flag for bad options, a cache without the class prompt or
// the empty prompt, or video latents.
ClassImageReport generate_class_images(const TrainOptions& o, const ClassImageOptions& c,
                                       distributed::World* ranks = nullptr);

}  // namespace sf::pipelines

// Internal to pipelines/train: what run_train sets up before its loop and what a checkpoint
// captures and restores, each in its own file so that the loop in train.cpp reads top to bottom.
#pragma once

#include <ATen/core/Generator.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/common/diffusion_transformer.h"
#include "pipelines/train/train.h"
#include "stages/train/prior_pairs.h"
#include "stages/train/train_data.h"
#include "stages/train/train_state.h"
#include "stages/train/train_step.h"

namespace sf::pipelines::training {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// run_data.cpp: what a run draws its micro-batches from.
// The instance samples and, with prior preservation, the class samples.
struct RunData {
    const train::TrainingSet& set;
    const train::TrainingSet* classes = nullptr;
};

// The samplers of a run: one over every bucket, or with --joint_training_interval k one over the
// video windows and one over the images, the images' drawn at every step s > 0 with s % k == 0
// (as SANA-Video's trainer counts its global step). With prior preservation the main sampler
// draws pairs of an instance and a class sample (stages/train/prior_pairs.h).
struct Samplers {
    std::unique_ptr<train::BucketSampler> main, images;
    std::optional<train::PriorPairs> prior;

    // The batch of the step `step` (0-based: the steps done before it).
    std::vector<int64_t> next(int64_t step, int64_t interval) {
        const bool image_step = images && step > 0 && step % interval == 0;
        return image_step ? images->next() : main->next();
    }
};
// `classes`: the class samples of prior preservation, or null. kInvalidArgument for joint
// training on a cache without both kinds, or a bucket of instances without class samples.
Samplers make_samplers(const TrainOptions& o, const train::TrainingSet& set,
                       const train::TrainingSet* classes);
// Optimizer steps in an epoch, as upstream counts them: ceil(batches / accumulation).
int64_t steps_per_epoch(const TrainOptions& o, const Samplers& samplers);
// With prior preservation (o.class_cache_dir), the class cache's samples, checked to join the
// instance batches: image latents of the same VAE's channels and caption features of the same
// width (kInvalidArgument otherwise); nullopt without.
std::optional<train::TrainingSet> open_class_samples(const TrainOptions& o,
                                                     const train::TrainingSet& set);
// The next micro-batch of the step `step` (0-based), its samples counted into `samples`: a batch
// whose samples all turned out damaged (--skip_corrupt) is passed over. With prior preservation,
// the drawn pairs' instance samples then their class samples, weighted.
train::MicroBatch draw_micro_batch(const TrainOptions& o, const RunData& data, Samplers& samplers,
                                   int64_t step, at::Generator& gen, int64_t& samples);

// model_setup.cpp: the transformer the options name (pretrained, a config.json with seeded
// weights, or the built-in tiny one sized to the cache), checked against what the cache holds,
// with LoRA adapters when --rank asks; `source` says where it came from.
std::shared_ptr<model::DiffusionTransformer> build_transformer(const TrainOptions& o,
                                                               const train::TrainingSet& set,
                                                               std::string& source);

// The settings a checkpoint must share with this run for the resumed run to be the same run:
// the options that shape the run, max_train_steps where the schedule's curve depends on it, and
// the data (kDataSetting: TrainingSet::content_hash, kDataSizeSetting: its size, for messages).
constexpr const char* kDataSetting = "data";
constexpr const char* kDataSizeSetting = "data_size";
std::map<std::string, std::string> run_settings(const TrainOptions& o, const std::string& source,
                                                const train::TrainingSet& set);

// The resolved configuration, one "key  value" line each, printed when training starts.
std::string resolved_config(const TrainOptions& o, model::DiffusionTransformer& model,
                            const std::string& source, const train::TrainingSet& set,
                            int64_t trainable_count, c10::Device device);

// resume.cpp: the parts of a run that a checkpoint holds.
struct RunParts {
    train::TrainStep& step;
    train::BucketSampler& sampler;
    at::Generator& data_gen;  // noise, timesteps, caption dropout
    const NamedTensors& trainable;
    const std::map<std::string, std::string>& settings;
    train::BucketSampler* image_sampler = nullptr;  // joint image-video training only
    // Where the model runs: on a GPU its generator (LoRA dropout's masks) is part of the state.
    c10::Device device = c10::kCPU;
};

// "a,b,,c" -> {"a", "b", "c"}.
std::vector<std::string> split_csv(const std::string& s);

// start_plan.cpp: --auto_fit with a budget: `start` (the run's own step options) or the
// remedies the plan adds to it (listed in `changes`) so the first step is predicted to fit
// `budget`; kOutOfMemory with the plan's table when nothing does. A video run is planned on its
// largest window.
train::TrainStepOptions plan_start_of_run(const TrainOptions& o, const train::TrainingSet& set,
                                          model::DiffusionTransformer& transformer,
                                          const train::TrainStepOptions& start, int64_t budget,
                                          c10::Device device, std::vector<std::string>& changes);

// The latent frames where --chunk_index's timestep chunks start ("" -> none);
// kInvalidArgument naming the flag for anything but increasing integers from 0.
std::vector<int64_t> parse_chunk_index(const std::string& text);

train::TrainState capture_state(const RunParts& run, const std::vector<double>& losses);
// Restores `run` from the checkpoint in `dir` (verified by the caller: train::verify_checkpoint,
// or chosen by train::latest_checkpoint) and returns the losses so far. kInvalidArgument naming
// each setting that differs (the data too, unless `allow_new_data`); kCorruption for a trainable
// tensor or random generator state missing or misshaped.
std::vector<double> restore_state(const std::string& dir, const RunParts& run, bool allow_new_data);

}  // namespace sf::pipelines::training

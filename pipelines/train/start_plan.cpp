// --auto_fit's plan before the first step (stages/plan/start_plan.h) for the run's own shape: the
// largest bucket of the cache, the captions' longest length, the effective batch.
#include "stages/plan/start_plan.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "model/sana/sana_config.h"
#include "model/sana_video/sana_video_config.h"
#include "pipelines/train/train_setup.h"

namespace sf::pipelines::training {

train::TrainStepOptions plan_start_of_run(const TrainOptions& o, const train::TrainingSet& set,
                                          model::DiffusionTransformer& transformer,
                                          const train::TrainStepOptions& start, int64_t budget,
                                          c10::Device device, std::vector<std::string>& changes) {
    plan::PlanShape shape;
    const bool video = transformer.latent_rank() == 5;
    if (video) {
        shape.video = model::SanaVideoTransformerConfig::from_json(transformer.config_json(),
                                                                   "the transformer's config");
    } else {
        shape.config = model::SanaTransformerConfig::from_json(transformer.config_json(),
                                                               "the transformer's config");
    }
    train::Bucket largest;
    for (const auto& [bucket, indices] : set.buckets()) {
        if (bucket.frames * bucket.height * bucket.width >
            largest.frames * largest.height * largest.width)
            largest = bucket;
    }
    // The Wan VAE's 4x over frames (1 + 4k frames: one latent frame, then one per four).
    shape.latent_frames = video ? 1 + (largest.frames - 1) / 4 : 1;
    shape.latent_height = largest.height / set.latent_downsample();
    shape.latent_width = largest.width / set.latent_downsample();
    shape.batch = o.train_batch_size * o.gradient_accumulation_steps;
    shape.caption_tokens = set.max_caption_tokens();
    shape.lora_rank = o.rank;
    shape.lora_targets = split_csv(o.lora_target_modules);

    const std::string file =
        o.plan_calibration.empty() ? plan::default_calibration_file(device) : o.plan_calibration;
    plan::CalibrationStore store(device, file, /*recalibrate=*/false, o.plan_calibration_points);
    // The calibration's own tiny steps are not the run's: the byte budget waits for the run.
    const mem::BudgetGuard no_budget(0);
    const plan::StartPlan p = plan::plan_start(shape, o.train_batch_size, start, o.optimizer,
                                               o.offload_optimizer, budget, store);
    store.save();
    const std::string flags =
        plan::remedies_of(p.options, o.optimizer, o.offload_optimizer).flags();
    const std::string settings = flags.empty() ? "no remedies" : flags;
    if (!p.fits) {
        throw Error::OutOfMemory(fmt::format(
            "train: --auto_fit: the {}x{} bucket in micro-batches of {} is predicted to take {} "
            "(x{} margin) with {}, over --memory_budget {}:\n{}left to try: --mixed_precision "
            "bf16, --optimizer adamw8bit, --fused_backward_pass, LoRA (--rank), a smaller "
            "--resolution or --train_batch_size; `sanaflow plan --memory_budget` searches them",
            largest.width, largest.height, o.train_batch_size, format_bytes(p.predicted.peak),
            plan::kStartMargin, settings, format_bytes(budget),
            plan::footprint_table(p.predicted)));
    }
    changes = p.changes;
    if (changes.empty()) {
        log_info("train: --auto_fit: the step is predicted to take {} of the budget of {}",
                 format_bytes(p.predicted.peak), format_bytes(budget));
    }
    for (const std::string& change : changes) {
        log_warn("train: --auto_fit: predicted over --memory_budget {}; turned on: {}",
                 format_bytes(budget), change);
    }
    if (!changes.empty()) {
        log_info("train: --auto_fit: starting with {}: predicted {} (in the {} phase)", settings,
                 format_bytes(p.predicted.peak), p.predicted.peak_phase);
    }
    return p.options;
}

}  // namespace sf::pipelines::training

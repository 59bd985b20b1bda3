// --auto_fit before the first step: the run's own settings predicted by the memory model and,
// while the prediction (with a margin for the model's error) does not fit the budget, the next
// remedy of train::relieve() turned on, as a step that ran out of memory would turn it on. So a
// run that cannot fit as asked starts adapted instead of failing its first step, and a run that
// cannot fit at all is refused before the model reaches the device.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "stages/plan/calibration.h"
#include "stages/plan/memory_model.h"
#include "stages/train/train_step.h"

namespace sf::plan {

// The prediction must fit the budget by this factor: the memory model's error is within 10% on
// the ablation's shapes (tools/bench/plan_accuracy).
constexpr double kStartMargin = 1.1;

struct StartPlan {
    train::TrainStepOptions options;   // what the run starts with
    std::vector<std::string> changes;  // what the plan turned on, in order (train::relieve's words)
    Footprint predicted;               // of `options`
    bool fits = false;                 // predicted.peak x kStartMargin <= the budget
};

// The remedies of a trainer's options (as PlanRemedies counts them), and the trainer's options of
// remedies (global-norm clipping on, as the trainer's default, unless the pass is fused).
PlanRemedies remedies_of(const train::TrainStepOptions& o, const std::string& optimizer,
                         bool offload_optimizer = false);
// (The optimizer, and whether it is offloaded, are AdamWOptions: not in the step's options.)
train::TrainStepOptions step_options_of(const PlanRemedies& r);

// `shape.batch` is the effective batch (micro-batch x accumulation); `micro_batch` what
// train::relieve() splits.
StartPlan plan_start(const PlanShape& shape, int64_t micro_batch, train::TrainStepOptions o,
                     const std::string& optimizer, bool offload_optimizer, int64_t budget,
                     CalibrationStore& store);

}  // namespace sf::plan

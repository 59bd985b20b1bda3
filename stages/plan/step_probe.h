// One measured training step on random data of a given shape: what the memory ablation, the
// planner's calibration (memory_model.h) and its accuracy benchmark all run, so that the numbers
// they compare come from one place.
//
// The step is TrainStep's own (the trainer's): one warm-up step, then `steps` more. Memory is the
// peak of counted tensor bytes (the CUDA allocator's on a GPU) per phase over all of them, the
// warm-up included; time is the median of the steps after the warm-up (the warm-up creates
// AdamW's state and touches every page first).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "model/common/diffusion_transformer.h"
#include "stages/train/train_step.h"

namespace sf::plan {

struct ProbeInput {
    at::Tensor latents;  // [batch, C, h, w] or [batch, C, f, h, w]: the step's whole batch
    int64_t caption_tokens = 300;
    int64_t caption_channels = 2304;
    int64_t steps = 1;  // measured steps after the warm-up
    train::AdamWOptions adamw;
    // The data-parallel reduction (bench_ddp); null for one process. `latents` is then the
    // global batch, of which this rank computes its share.
    std::shared_ptr<train::GradientSync> sync;
    // Called before every step, the warm-up included (the ablation's online encoding).
    std::function<void()> before_step;
};

struct ProbeResult {
    std::map<std::string, train::PhasePeak> phases;  // TrainStep::phase_peaks()
    int64_t peak_tensor_bytes = 0;                   // the highest phase, or before_step's
    int64_t peak_rss_bytes = 0;
    double step_seconds = 0;  // median of the measured steps (the warm-up's with steps = 0)
    double loss = 0;          // of the last step
    int64_t micro_batch = 0;  // samples per micro-batch
    std::string phase_table;
    int64_t optimizer_state_bytes = 0;  // this rank's AdamW state after the steps
};

// Runs the steps of `model` (already on `device`, its trainable parameters marked) with options
// `o` (o.accumulation micro-batches of batch / accumulation samples each). Throws what the step
// throws: kOutOfMemory when it does not fit the byte budget.
ProbeResult probe_step(const std::shared_ptr<model::DiffusionTransformer>& model,
                       const ProbeInput& in, const train::TrainStepOptions& o, c10::Device device);

}  // namespace sf::plan

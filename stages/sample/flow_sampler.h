// Sampling images from a flow-matching transformer, for validation during training.
//
//   sigmas    FlowMatchEulerDiscreteScheduler's (diffusers, shift = --flow_shift): N values
//             linspace(1, sigma_min, N) with sigma_min the scheduler's own shifted 1/1000, each
//             shifted again, s -> shift s / (1 + (shift - 1) s) (upstream's set_timesteps shifts
//             twice), then a trailing 0; the model sees timestep = sigma * 1000
//   Euler     x <- x + (sigma_next - sigma) v(x, sigma * 1000), from pure noise at sigma = 1
//   guidance  v = v_empty + g (v_caption - v_empty), both in one batch as Sana's pipeline runs
//             them (the empty prompt first); g <= 1 runs the caption alone
//
// Sana's pipelines default to a flow DPM-Solver; this sampler is the Euler one (what diffusers'
// SD3/Flux pipelines and FlowMatchEulerDiscreteScheduler do), exact to that scheduler.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "stages/sample/flow_schedule.h"

namespace sf::model {
class DiffusionTransformer;
}

namespace sf::sample {

// steps + 1 sigmas, descending from 1 to the trailing 0. kInvalidArgument for steps < 1 or a
// shift that is not a finite positive number.
std::vector<double> euler_sigmas(int64_t steps, double shift, int64_t num_train_timesteps = 1000);

// The velocity at latents `x` [B, ...] and timesteps [B] (sigma * num_train_timesteps).
using Velocity = std::function<at::Tensor(const at::Tensor& x, const at::Tensor& timestep)>;

// The multistep solvers' data prediction at step i of `schedule`: x - sigma_i v(x, timestep_i),
// the model given the step's int64 timestep as upstream's pipelines give it (float32).
at::Tensor data_prediction(const Velocity& velocity, const at::Tensor& x,
                           const FlowSchedule& schedule, size_t i);

// Integrates `velocity` from `noise` (at sigmas.front()) down the sigmas; returns the last x.
at::Tensor euler_sample(const Velocity& velocity, const at::Tensor& noise,
                        const std::vector<double>& sigmas, int64_t num_train_timesteps = 1000);

// The transformer's velocity for `caption` [B, L, D] with `mask` [B, L], guided away from the
// empty prompt's `empty` [n, D] by `guidance_scale` (none when <= 1). Runs under no grad; the
// caller sets eval mode and autocast.
Velocity guided_velocity(model::DiffusionTransformer& model, const at::Tensor& caption,
                         const at::Tensor& mask, const at::Tensor& empty, double guidance_scale);

}  // namespace sf::sample

// Sampling images from a flow-matching transformer, for validation and class images: the sampler a
// SamplerSpec names (scheduler_config.h), from pure noise down its schedule (flow_schedule.h).
//
//   DPM-Solver++, UniPC   dpm_solver.h, unipc.h: Sana's pipelines' default, and Wan's
//   Euler                 x <- x + (sigma_next - sigma) v(x, sigma * 1000): what diffusers'
//                         FlowMatchEulerDiscreteScheduler does, exact to it
//   guidance              v = v_empty + g (v_caption - v_empty), both in one batch as Sana's
//                         pipeline runs them (the empty prompt first); g <= 1 runs the caption
//                         alone
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "stages/sample/flow_schedule.h"
#include "stages/sample/scheduler_config.h"

namespace sf::model {
class DiffusionTransformer;
}

namespace sf::sample {

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

// `steps` steps of `spec`'s sampler (dpm_solver.h, unipc.h or Euler) from `noise`; the last x
// (float32).
at::Tensor sample_flow(const Velocity& velocity, const at::Tensor& noise, int64_t steps,
                       const SamplerSpec& spec);

}  // namespace sf::sample

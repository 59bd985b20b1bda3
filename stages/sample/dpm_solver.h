// Sampling with diffusers' DPMSolverMultistepScheduler as Sana's and SANA-Video's pipelines set it
// up (algorithm_type "dpmsolver++", prediction_type "flow_prediction", use_flow_sigmas,
// final_sigmas_type "zero"): DPM-Solver++ on the flow's data prediction x0 = x - sigma v.
//
//   sigmas     steps values: 1 - linspace(1, 1/N, steps + 1), shifted s -> shift s / (1 + (shift
//              - 1) s), reversed, the last (0) dropped; then a trailing 0. Stored as float32, as
//              upstream stores them
//   timesteps  the model sees int64(sigma * N) of the float64 sigmas (upstream truncates them)
//   lambda     log(1 - sigma) - log(sigma), h = lambda_next - lambda
//   order 1    x <- (sigma_next / sigma) x - (1 - sigma_next)(e^-h - 1) x0
//   order 2    adds -1/2 (1 - sigma_next)(e^-h - 1) D1 ("midpoint") or
//              +(1 - sigma_next)((e^-h - 1) / h + 1) D1 ("heun"), D1 = (x0 - x0_prev) / r,
//              r = (lambda - lambda_prev) / h; the first step is order 1, and so is the last
//              (to sigma 0, where it lands on x0)
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "stages/sample/flow_sampler.h"

namespace sf::sample {

struct DpmSolverSchedule {
    std::vector<double> sigmas;      // steps + 1, descending to the trailing 0
    std::vector<int64_t> timesteps;  // steps: what the model is given
};

// kInvalidArgument for steps outside [1, 10000] or a shift that is not a finite positive number.
DpmSolverSchedule dpm_solver_schedule(int64_t steps, double shift,
                                      int64_t num_train_timesteps = 1000);

struct DpmSolverOptions {
    int order = 2;      // solver_order: 1 or 2
    bool heun = false;  // solver_type "heun" rather than "midpoint" (order 2 only)
};

// Integrates `velocity` from `noise` (at sigmas.front()) down the schedule; returns the last x
// (float32).
at::Tensor dpm_solver_sample(const Velocity& velocity, const at::Tensor& noise,
                             const DpmSolverSchedule& schedule, const DpmSolverOptions& options);

}  // namespace sf::sample

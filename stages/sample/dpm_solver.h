// Sampling with diffusers' DPMSolverMultistepScheduler as Sana's and SANA-Video's pipelines set it
// up (algorithm_type "dpmsolver++", prediction_type "flow_prediction", use_flow_sigmas,
// final_sigmas_type "zero"): DPM-Solver++ on the flow's data prediction x0 = x - sigma v.
//
//   schedule   stages/sample/flow_schedule.h's sigmas, timesteps and lambda; h = lambda_next -
//              lambda
//   order 1    x <- (sigma_next / sigma) x - (1 - sigma_next)(e^-h - 1) x0
//   order 2    adds -1/2 (1 - sigma_next)(e^-h - 1) D1 ("midpoint") or
//              +(1 - sigma_next)((e^-h - 1) / h + 1) D1 ("heun"), D1 = (x0 - x0_prev) / r,
//              r = (lambda - lambda_prev) / h; the first step is order 1, and so is the last
//              (to sigma 0, where it lands on x0)
#pragma once

#include <ATen/core/Tensor.h>

#include "stages/sample/flow_sampler.h"
#include "stages/sample/flow_schedule.h"

namespace sf::sample {

struct DpmSolverOptions {
    int order = 2;      // solver_order: 1 or 2
    bool heun = false;  // solver_type "heun" rather than "midpoint" (order 2 only)
};

// Integrates `velocity` from `noise` (at sigmas.front()) down the schedule; returns the last x
// (float32).
at::Tensor dpm_solver_sample(const Velocity& velocity, const at::Tensor& noise,
                             const FlowSchedule& schedule, const DpmSolverOptions& options);

}  // namespace sf::sample

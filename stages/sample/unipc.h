// Sampling with diffusers' UniPCMultistepScheduler on flow sigmas (prediction_type
// "flow_prediction", use_flow_sigmas, predict_x0, final_sigmas_type "zero"): what Wan's pipelines
// use, and one of the schedulers diffusers' SANA-Video converter writes ("uni-pc"). A
// predictor-corrector on the data prediction x0 = x - sigma v, in lambda = log(1 - sigma) -
// log(sigma) (stages/sample/flow_schedule.h), with h = lambda_next - lambda and hh = -h:
//
//   B(h)        e^hh - 1 (solver_type "bh2"; upstream's "bh1", B(h) = hh, ends in NaN at sigma 0
//               and is refused by the config reader)
//   b_i         phi_i(hh) i! / B(h), phi_1 = (e^hh - 1) / hh - 1, phi_(i+1) = phi_i / hh - 1/(i+1)!
//   r_k         (lambda of the k-th earlier step - lambda) / h, D_k = (x0_k - x0) / r_k
//   predictor   x <- (sigma_next / sigma) x - alpha_next (e^hh - 1) x0 - alpha_next B(h) sum
//               rho_k D_k, rho solving R rho = b over the earlier steps (1/2 at order 2)
//   corrector   once the model has seen the predicted x, the same step again from the step's start
//               with the new x0 as one more point (rho solving the whole system; 1/2 at order 1),
//               except after the steps in `disable_corrector`
//
// The order warms up (1, 2, ... up to solver_order) and, with lower_order_final, falls to the
// steps left at the end, so the last step (to sigma 0) lands on its x0 (upstream's
// lower_order_final false would divide by r_k = 0 there, and is refused by the config reader).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "stages/sample/flow_sampler.h"
#include "stages/sample/flow_schedule.h"

namespace sf::sample {

struct UniPcOptions {
    int order = 2;                           // solver_order: 1 to 3
    std::vector<int64_t> disable_corrector;  // steps whose correction is skipped
};

// Integrates `velocity` from `noise` (at sigmas.front()) down the schedule; returns the last x
// (float32).
at::Tensor unipc_sample(const Velocity& velocity, const at::Tensor& noise,
                        const FlowSchedule& schedule, const UniPcOptions& options);

}  // namespace sf::sample

#include "stages/sample/dpm_solver.h"

#include <torch/torch.h>

#include <cmath>

#include "core/check.h"

namespace sf::sample {

at::Tensor dpm_solver_sample(const Velocity& velocity, const at::Tensor& noise,
                             const FlowSchedule& schedule, const DpmSolverOptions& options) {
    SF_CHECK(options.order == 1 || options.order == 2, "DPM-Solver++ order must be 1 or 2");
    const auto& sigmas = schedule.sigmas;
    SF_CHECK(!schedule.timesteps.empty() && sigmas.size() == schedule.timesteps.size() + 1,
             "the DPM-Solver schedule needs steps + 1 sigmas");
    torch::NoGradGuard no_grad;
    at::Tensor x = noise.to(at::kFloat);
    at::Tensor x0_prev;
    for (size_t i = 0; i < schedule.timesteps.size(); ++i) {
        const double sigma = sigmas[i], next = sigmas[i + 1];
        const at::Tensor x0 = data_prediction(velocity, x, schedule, i);
        if (next == 0) {
            x = x0;  // order 1 to sigma 0: (0 / sigma) x + x0
        } else {
            const double h = flow_lambda(next) - flow_lambda(sigma);
            const double alpha = 1 - next;
            const double c = alpha * std::expm1(-h);  // alpha_t (e^-h - 1)
            at::Tensor update = (next / sigma) * x - c * x0;
            if (options.order == 2 && x0_prev.defined()) {
                const double r = (flow_lambda(sigma) - flow_lambda(sigmas[i - 1])) / h;
                const at::Tensor d1 = (x0 - x0_prev) / r;
                update = options.heun ? update + alpha * (std::expm1(-h) / h + 1) * d1
                                      : update - 0.5 * c * d1;
            }
            x = update;
        }
        x0_prev = x0;
    }
    return x;
}

}  // namespace sf::sample

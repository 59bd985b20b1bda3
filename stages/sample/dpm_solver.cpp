#include "stages/sample/dpm_solver.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>

#include "core/check.h"
#include "core/error.h"

namespace sf::sample {
namespace {

double lambda(double sigma) { return std::log(1 - sigma) - std::log(sigma); }

}  // namespace

DpmSolverSchedule dpm_solver_schedule(int64_t steps, double shift, int64_t num_train_timesteps) {
    if (steps < 1 || steps > 10'000)
        throw Error::InvalidArgument(
            fmt::format("sampling steps must be in [1, 10000], got {}", steps));
    if (!std::isfinite(shift) || shift <= 0)
        throw Error::InvalidArgument(fmt::format("the flow shift must be > 0, got {:g}", shift));
    if (num_train_timesteps < 1) throw Error::InvalidArgument("num_train_timesteps must be >= 1");
    const double n = static_cast<double>(num_train_timesteps);
    // numpy's linspace(1, 1/N, steps + 1): start + i * step, the end point exact. Reversed and the
    // last dropped, entry i is the linspace's entry steps - i.
    const double step = (1 / n - 1) / static_cast<double>(steps);
    DpmSolverSchedule s;
    for (int64_t i = 0; i < steps; ++i) {
        const int64_t k = steps - i;
        const double alpha = k == steps ? 1 / n : 1 + static_cast<double>(k) * step;
        const double sigma = 1 - alpha;
        const double shifted = shift * sigma / (1 + (shift - 1) * sigma);
        s.timesteps.push_back(static_cast<int64_t>(shifted * n));
        s.sigmas.push_back(static_cast<double>(static_cast<float>(shifted)));
    }
    s.sigmas.push_back(0.0);
    return s;
}

at::Tensor dpm_solver_sample(const Velocity& velocity, const at::Tensor& noise,
                             const DpmSolverSchedule& schedule, const DpmSolverOptions& options) {
    SF_CHECK(options.order == 1 || options.order == 2, "DPM-Solver++ order must be 1 or 2");
    const auto& sigmas = schedule.sigmas;
    SF_CHECK(!schedule.timesteps.empty() && sigmas.size() == schedule.timesteps.size() + 1,
             "the DPM-Solver schedule needs steps + 1 sigmas");
    torch::NoGradGuard no_grad;
    at::Tensor x = noise.to(at::kFloat);
    at::Tensor x0_prev;
    for (size_t i = 0; i < schedule.timesteps.size(); ++i) {
        const double sigma = sigmas[i], next = sigmas[i + 1];
        const at::Tensor t =
            torch::full({x.size(0)}, static_cast<double>(schedule.timesteps[i]), x.options());
        const at::Tensor x0 = x - sigma * velocity(x, t).to(at::kFloat);
        if (next == 0) {
            x = x0;  // order 1 to sigma 0: (0 / sigma) x + x0
        } else {
            const double h = lambda(next) - lambda(sigma);
            const double alpha = 1 - next;
            const double c = alpha * std::expm1(-h);  // alpha_t (e^-h - 1)
            at::Tensor update = (next / sigma) * x - c * x0;
            if (options.order == 2 && x0_prev.defined()) {
                const double r = (lambda(sigma) - lambda(sigmas[i - 1])) / h;
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

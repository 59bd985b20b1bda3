#include "stages/sample/flow_schedule.h"

#include <fmt/format.h>

#include <cmath>

#include "core/error.h"

namespace sf::sample {
namespace {

double shifted(double s, double shift) { return shift * s / (1 + (shift - 1) * s); }

void check_schedule(int64_t steps, double shift, int64_t num_train_timesteps) {
    if (steps < 1 || steps > 10'000)
        throw Error::InvalidArgument(
            fmt::format("sampling steps must be in [1, 10000], got {}", steps));
    if (!std::isfinite(shift) || shift <= 0)
        throw Error::InvalidArgument(fmt::format("the flow shift must be > 0, got {:g}", shift));
    if (num_train_timesteps < 1) throw Error::InvalidArgument("num_train_timesteps must be >= 1");
}

}  // namespace

std::vector<double> euler_sigmas(int64_t steps, double shift, int64_t num_train_timesteps) {
    check_schedule(steps, shift, num_train_timesteps);
    // The scheduler's own range: sigma_max = shifted(1) = 1, sigma_min = shifted(1 / N).
    const double n = static_cast<double>(num_train_timesteps);
    const double sigma_max = shifted(1.0, shift);
    const double sigma_min = shifted(1.0 / n, shift);
    std::vector<double> sigmas;
    for (int64_t i = 0; i < steps; ++i) {
        // np.linspace(t_max, t_min, steps) / N, in timesteps as upstream spaces them.
        const double t_max = sigma_max * n, t_min = sigma_min * n;
        const double t = steps == 1 ? t_max
                                    : t_max + (t_min - t_max) * static_cast<double>(i) /
                                                  static_cast<double>(steps - 1);
        sigmas.push_back(shifted(t / n, shift));
    }
    sigmas.push_back(0.0);
    return sigmas;
}

FlowSchedule flow_schedule(int64_t steps, double shift, int64_t num_train_timesteps) {
    check_schedule(steps, shift, num_train_timesteps);
    const double n = static_cast<double>(num_train_timesteps);
    // numpy's linspace(1, 1/N, steps + 1): start + i * step, the end point exact. Reversed and the
    // last dropped, entry i is the linspace's entry steps - i.
    const double step = (1 / n - 1) / static_cast<double>(steps);
    FlowSchedule s;
    for (int64_t i = 0; i < steps; ++i) {
        const int64_t k = steps - i;
        const double alpha = k == steps ? 1 / n : 1 + static_cast<double>(k) * step;
        const double sigma = 1 - alpha;
        const double sigma_shifted = shifted(sigma, shift);
        s.timesteps.push_back(static_cast<int64_t>(sigma_shifted * n));
        s.sigmas.push_back(static_cast<double>(static_cast<float>(sigma_shifted)));
    }
    s.sigmas.push_back(0.0);
    return s;
}

double flow_lambda(double sigma) { return std::log(1 - sigma) - std::log(sigma); }

}  // namespace sf::sample

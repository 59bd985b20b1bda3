#include "stages/sample/flow_schedule.h"

#include <fmt/format.h>

#include <cmath>

#include "core/error.h"

namespace sf::sample {

FlowSchedule flow_schedule(int64_t steps, double shift, int64_t num_train_timesteps) {
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
    FlowSchedule s;
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

double flow_lambda(double sigma) { return std::log(1 - sigma) - std::log(sigma); }

}  // namespace sf::sample

#include "stages/sample/flow_sampler.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/error.h"
#include "model/common/diffusion_transformer.h"

namespace sf::sample {
namespace {

double shifted(double s, double shift) { return shift * s / (1 + (shift - 1) * s); }

}  // namespace

std::vector<double> euler_sigmas(int64_t steps, double shift, int64_t num_train_timesteps) {
    if (steps < 1 || steps > 10'000)
        throw Error::InvalidArgument(
            fmt::format("sampling steps must be in [1, 10000], got {}", steps));
    if (!std::isfinite(shift) || shift <= 0)
        throw Error::InvalidArgument(fmt::format("the flow shift must be > 0, got {:g}", shift));
    if (num_train_timesteps < 1) throw Error::InvalidArgument("num_train_timesteps must be >= 1");
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

at::Tensor euler_sample(const Velocity& velocity, const at::Tensor& noise,
                        const std::vector<double>& sigmas, int64_t num_train_timesteps) {
    SF_CHECK(sigmas.size() >= 2, "the sampler needs at least one step");
    torch::NoGradGuard no_grad;
    at::Tensor x = noise.to(at::kFloat);
    const auto n = static_cast<double>(num_train_timesteps);
    for (size_t i = 0; i + 1 < sigmas.size(); ++i) {
        const at::Tensor t = torch::full({x.size(0)}, sigmas[i] * n, x.options());
        const at::Tensor v = velocity(x, t).to(at::kFloat);
        x = x + (sigmas[i + 1] - sigmas[i]) * v;
    }
    return x;
}

at::Tensor data_prediction(const Velocity& velocity, const at::Tensor& x,
                           const FlowSchedule& schedule, size_t i) {
    const at::Tensor t =
        torch::full({x.size(0)}, static_cast<double>(schedule.timesteps.at(i)), x.options());
    return x - schedule.sigmas.at(i) * velocity(x, t).to(at::kFloat);
}

Velocity guided_velocity(model::DiffusionTransformer& model, const at::Tensor& caption,
                         const at::Tensor& mask, const at::Tensor& empty, double guidance_scale) {
    if (guidance_scale <= 1) {
        return [&model, caption, mask](const at::Tensor& x, const at::Tensor& t) {
            torch::NoGradGuard no_grad;
            return model.forward(x, caption, t, mask);
        };
    }
    // [empty; caption] padded to the longer of the two, as one batch of 2B.
    const int64_t b = caption.size(0);
    const int64_t len = std::max(caption.size(1), empty.size(0));
    at::Tensor both = torch::zeros({2 * b, len, caption.size(2)}, caption.options());
    at::Tensor both_mask = torch::zeros({2 * b, len}, mask.options());
    both.slice(0, 0, b).slice(1, 0, empty.size(0)).copy_(empty.to(caption.dtype()).unsqueeze(0));
    both_mask.slice(0, 0, b).slice(1, 0, empty.size(0)).fill_(1);
    both.slice(0, b).slice(1, 0, caption.size(1)).copy_(caption);
    both_mask.slice(0, b).slice(1, 0, caption.size(1)).copy_(mask);
    return [&model, both, both_mask, guidance_scale](const at::Tensor& x, const at::Tensor& t) {
        torch::NoGradGuard no_grad;
        const at::Tensor v = model.forward(torch::cat({x, x}), both, torch::cat({t, t}), both_mask);
        const auto halves = v.chunk(2);
        return halves[0] + guidance_scale * (halves[1] - halves[0]);
    };
}

}  // namespace sf::sample

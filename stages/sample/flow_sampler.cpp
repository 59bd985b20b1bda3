#include "stages/sample/flow_sampler.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/error.h"
#include "model/common/diffusion_transformer.h"
#include "stages/sample/dpm_solver.h"
#include "stages/sample/unipc.h"

namespace sf::sample {

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

at::Tensor sample_flow(const Velocity& velocity, const at::Tensor& noise, int64_t steps,
                       const SamplerSpec& spec) {
    if (spec.kind == SamplerSpec::Kind::kEuler)
        return euler_sample(velocity, noise,
                            euler_sigmas(steps, spec.shift, spec.num_train_timesteps),
                            spec.num_train_timesteps);
    const FlowSchedule schedule = flow_schedule(steps, spec.shift, spec.num_train_timesteps);
    if (spec.kind == SamplerSpec::Kind::kUniPc)
        return unipc_sample(velocity, noise, schedule, {spec.solver_order, spec.disable_corrector});
    return dpm_solver_sample(velocity, noise, schedule, {spec.solver_order, spec.heun});
}

}  // namespace sf::sample

#include "stages/train/flow_matching.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <vector>

#include "core/error.h"

namespace sf::train {

void check_flow_matching(const FlowMatchingConfig& c) {
    if (c.flow_shift <= 0)
        throw Error::InvalidArgument(fmt::format("--flow_shift must be > 0, got {}", c.flow_shift));
    if (c.num_train_timesteps < 1) throw Error::InvalidArgument("num_train_timesteps must be >= 1");
    if (c.weighting_scheme != "logit_normal" && c.weighting_scheme != "uniform") {
        throw Error::InvalidArgument(fmt::format(
            "--weighting_scheme must be logit_normal or uniform, got '{}'", c.weighting_scheme));
    }
    if (c.logit_std <= 0) throw Error::InvalidArgument("--logit_std must be > 0");
}

NoisedBatch flow_matching_noise(const at::Tensor& latents, const FlowMatchingConfig& c,
                                at::Generator& gen) {
    const int64_t batch = latents.size(0);
    const auto cpu = at::TensorOptions().dtype(at::kFloat);
    // Drawn on the CPU from `gen` whatever the device, so a run is reproducible across devices,
    // and sample by sample (u, then the noise), so a batch draws what its samples would draw one
    // at a time: k micro-batches of 1 see the same noise as one batch of k.
    std::vector<at::Tensor> us, noises;
    for (int64_t i = 0; i < batch; ++i) {
        us.push_back(c.weighting_scheme == "logit_normal"
                         ? at::sigmoid(at::normal(c.logit_mean, c.logit_std, {1}, gen, cpu))
                         : at::rand({1}, gen, cpu));
        noises.push_back(at::normal(0.0, 1.0, latents[i].sizes(), gen, cpu));
    }
    const at::Tensor u = at::cat(us);
    const double n = static_cast<double>(c.num_train_timesteps);
    const at::Tensor index = (u * n).floor().clamp_max(n - 1);  // [B] in 0 .. N - 1
    const at::Tensor s = (n - index) / n;                       // the unshifted sigma, 1 .. 1 / N
    const at::Tensor sigmas = c.flow_shift * s / (1 + (c.flow_shift - 1) * s);
    const at::Tensor noise = at::stack(noises).to(latents.device(), latents.scalar_type());
    std::vector<int64_t> shape(static_cast<size_t>(latents.dim()), 1);  // [B, 1, 1, ...]
    shape[0] = batch;
    const at::Tensor sig = sigmas.to(latents.device(), latents.scalar_type()).view(shape);
    NoisedBatch out;
    out.noisy = (1 - sig) * latents + sig * noise;
    out.target = noise - latents;
    out.sigmas = sigmas.to(latents.device());
    out.timesteps = (sigmas * n).to(latents.device());
    return out;
}

at::Tensor flow_matching_loss(const at::Tensor& prediction, const at::Tensor& target) {
    const at::Tensor diff = prediction.to(at::kFloat) - target.to(at::kFloat);
    return diff.pow(2).reshape({diff.size(0), -1}).mean(1).mean();
}

}  // namespace sf::train

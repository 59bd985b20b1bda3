// Sana's training objective: rectified flow with a velocity target, as diffusers'
// train_dreambooth_lora_sana.py computes it.
//
//   u ~ logit-normal(mean, std)           (weighting_scheme "logit_normal"; "uniform": u ~ U(0,1))
//   i = floor(u * N)                      an index into the scheduler's N timesteps, descending
//   s = (N - i) / N;  sigma = shift * s / (1 + (shift - 1) * s)    (FlowMatchEulerDiscrete, shift)
//   x_t = (1 - sigma) * x_0 + sigma * noise;   timestep = sigma * N
//   target = noise - x_0;   loss = mean over the batch of the per-sample mean squared error
//
// All randomness comes from the generator passed in, so that a resumed run draws the same noise.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace sf::train {

struct FlowMatchingConfig {
    double flow_shift = 3.0;  // Sana's scheduler shift (3.0 for the 1024 px models)
    int64_t num_train_timesteps = 1000;
    std::string weighting_scheme = "logit_normal";  // or "uniform"
    double logit_mean = 0.0;
    double logit_std = 1.0;
};

struct NoisedBatch {
    at::Tensor noisy;      // x_t, the model's input
    at::Tensor target;     // noise - x_0
    at::Tensor timesteps;  // [B] float, sigma * N
    at::Tensor sigmas;     // [B] float
};

// Validates the config (kInvalidArgument naming the flag).
void check_flow_matching(const FlowMatchingConfig& config);

// latents [B, C, H, W] (float) -> the noised input and the velocity target, drawn from `gen`
// (a CPU generator; the draws are moved to the latents' device).
NoisedBatch flow_matching_noise(const at::Tensor& latents, const FlowMatchingConfig& config,
                                at::Generator& gen);

// Mean squared error between prediction and target, computed in fp32.
at::Tensor flow_matching_loss(const at::Tensor& prediction, const at::Tensor& target);

}  // namespace sf::train

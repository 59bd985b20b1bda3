// Sana's training objective: rectified flow with a velocity target, as diffusers'
// train_dreambooth_lora_sana.py computes it.
//
//   u ~ logit-normal(mean, std)           weighting_scheme "logit_normal"
//   u = 1 - v - scale (cos^2(pi v / 2) - 1 + v), v ~ U(0,1)     "mode" (mode_scale)
//   u ~ U(0, 1)                           "none" (upstream's default; "uniform" is the same),
//                                         "sigma_sqrt", "cosmap"
//   i = floor(u * N)                      an index into the scheduler's N timesteps, descending
//   s = (N - i) / N;  sigma = shift * s / (1 + (shift - 1) * s)    (FlowMatchEulerDiscrete, shift)
//   x_t = (1 - sigma) * x_0 + sigma * noise;   timestep = sigma * N
//   target = noise - x_0;   loss = mean over the batch of the per-sample mean of w (pred -
//   target)^2 w = 1; sigma^-2 for "sigma_sqrt"; 2 / (pi (1 - 2 sigma + 2 sigma^2)) for "cosmap"
//   (diffusers' compute_density_for_timestep_sampling and compute_loss_weighting_for_sd3)
//
// Video windows [B, C, f, h, w] may also take a timestep per latent frame (SANA-Video's trainer,
// train_video_scripts/train_video_ivjoint_chunk.py):
//   chunks        each chunk of latent frames [start_k, start_k+1) draws its own u, in order
//   clean first   image-to-video: latent frame 0 stays the clean latent (sigma 0, timestep 0)
//                 and is left out of the loss
//
// All randomness comes from the generator passed in, so that a resumed run draws the same noise.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace sf::train {

struct FlowMatchingConfig {
    double flow_shift = 3.0;  // Sana's scheduler shift (3.0 for the 1024 px models)
    int64_t num_train_timesteps = 1000;
    std::string weighting_scheme = "logit_normal";  // the schemes above
    double logit_mean = 0.0;
    double logit_std = 1.0;
    double mode_scale = 1.29;
};

// How the timesteps of a video window are laid out; the default is one per sample.
struct FrameTimesteps {
    // Latent frames where chunks start (the first is 0); empty or {0}: one chunk. Starts at or
    // past the window's last frame are ignored.
    std::vector<int64_t> chunk_starts;
    // Image-to-video conditioning on latent frame 0 (ignored for a one-frame window).
    bool clean_first_frame = false;
};

struct NoisedBatch {
    at::Tensor noisy;          // x_t, the model's input
    at::Tensor target;         // noise - x_0
    at::Tensor timesteps;      // [B] float, sigma * N; [B, f] with per-frame timesteps
    at::Tensor sigmas;         // [B] float; [B, f] with per-frame timesteps
    at::Tensor frame_weights;  // [B, f] 1 for frames in the loss, 0 out; undefined: every frame
    at::Tensor loss_weights;   // w, shaped as sigmas (0 on frames out of the loss); undefined: 1
};

// Validates the config (kInvalidArgument naming the flag).
void check_flow_matching(const FlowMatchingConfig& config);

// kInvalidArgument naming --chunk_index unless the starts begin at 0 and increase.
void check_chunk_starts(const std::vector<int64_t>& starts);

// latents [B, C, H, W] or [B, C, f, H, W] (float) -> the noised input and the velocity target,
// drawn from `gen` (a CPU generator; the draws are moved to the latents' device). `frames`
// applies to [B, C, f, H, W] latents only. Per sample: its u (one per chunk), then its noise; with
// one timestep per sample the draws are those of earlier versions.
NoisedBatch flow_matching_noise(const at::Tensor& latents, const FlowMatchingConfig& config,
                                at::Generator& gen, const FrameTimesteps& frames = {});

// Mean squared error between prediction and target, computed in fp32, each element weighted by
// `loss_weights` ([B], or [B, f] per frame) when given: per sample the mean over its elements
// (over the frames whose weight is 1 when `frame_weights` [B, f] is given), then the mean over
// the batch, each sample's mean multiplied by `sample_weights` [B] when given (prior
// preservation's instance and class weights: prior_pairs.h).
at::Tensor flow_matching_loss(const at::Tensor& prediction, const at::Tensor& target,
                              const at::Tensor& frame_weights = at::Tensor(),
                              const at::Tensor& loss_weights = at::Tensor(),
                              const at::Tensor& sample_weights = at::Tensor());

}  // namespace sf::train

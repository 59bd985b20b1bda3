#include "stages/train/flow_matching.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <vector>

#include "core/error.h"

namespace sf::train {

void check_flow_matching(const FlowMatchingConfig& c) {
    if (c.flow_shift <= 0)
        throw Error::InvalidArgument(fmt::format("--flow_shift must be > 0, got {}", c.flow_shift));
    if (c.num_train_timesteps < 1) throw Error::InvalidArgument("num_train_timesteps must be >= 1");
    static const char* const schemes[] = {"none",       "logit_normal", "mode",
                                          "sigma_sqrt", "cosmap",       "uniform"};
    if (std::find(std::begin(schemes), std::end(schemes), c.weighting_scheme) ==
        std::end(schemes)) {
        throw Error::InvalidArgument(fmt::format(
            "--weighting_scheme must be none, logit_normal, mode, sigma_sqrt or cosmap, got '{}'",
            c.weighting_scheme));
    }
    if (!std::isfinite(c.logit_mean)) throw Error::InvalidArgument("--logit_mean must be finite");
    if (!(c.logit_std > 0) || !std::isfinite(c.logit_std))
        throw Error::InvalidArgument("--logit_std must be a finite number > 0");
    if (!std::isfinite(c.mode_scale)) throw Error::InvalidArgument("--mode_scale must be finite");
}

void check_chunk_starts(const std::vector<int64_t>& starts) {
    for (size_t i = 0; i < starts.size(); ++i) {
        if ((i == 0 && starts[i] != 0) || (i > 0 && starts[i] <= starts[i - 1])) {
            throw Error::InvalidArgument(fmt::format(
                "--chunk_index must list increasing latent frames starting at 0 (e.g. 0,3,6); "
                "entry {} is {}",
                i + 1, starts[i]));
        }
    }
}

namespace {

// One u in [0, 1) as diffusers' compute_density_for_timestep_sampling draws it.
at::Tensor draw_u(const FlowMatchingConfig& c, at::Generator& gen) {
    const auto cpu = at::TensorOptions().dtype(at::kFloat);
    if (c.weighting_scheme == "logit_normal")
        return at::sigmoid(at::normal(c.logit_mean, c.logit_std, {1}, gen, cpu));
    const at::Tensor v = at::rand({1}, gen, cpu);
    if (c.weighting_scheme != "mode") return v;
    return 1 - v - c.mode_scale * (at::cos(M_PI * v / 2).pow(2) - 1 + v);
}

// diffusers' compute_loss_weighting_for_sd3; undefined where it is 1.
at::Tensor loss_weighting(const std::string& scheme, const at::Tensor& sigmas) {
    if (scheme == "sigma_sqrt") return sigmas.pow(-2.0);
    if (scheme == "cosmap") return 2.0 / (M_PI * (1 - 2 * sigmas + 2 * sigmas.pow(2)));
    return at::Tensor();
}

}  // namespace

NoisedBatch flow_matching_noise(const at::Tensor& latents, const FlowMatchingConfig& c,
                                at::Generator& gen, const FrameTimesteps& frames) {
    const int64_t batch = latents.size(0);
    const int64_t num_frames = latents.dim() == 5 ? latents.size(2) : 1;
    // A one-frame window (an image) has no frame to predict from its first: never clean.
    const bool clean_first = frames.clean_first_frame && num_frames > 1;
    const bool per_frame = latents.dim() == 5 && (frames.chunk_starts.size() > 1 || clean_first);
    // The chunks of this window: [begin, end) latent frames each.
    std::vector<std::pair<int64_t, int64_t>> chunks;
    if (per_frame) {
        std::vector<int64_t> starts =
            frames.chunk_starts.empty() ? std::vector<int64_t>{0} : frames.chunk_starts;
        for (size_t k = 0; k < starts.size() && starts[k] < num_frames; ++k) {
            const int64_t end =
                k + 1 < starts.size() ? std::min(starts[k + 1], num_frames) : num_frames;
            chunks.emplace_back(starts[k], end);
        }
    } else {
        chunks.emplace_back(0, 1);  // one u per sample: [B, 1]
    }
    const auto cpu = at::TensorOptions().dtype(at::kFloat);
    // Drawn on the CPU from `gen` whatever the device, so a run is reproducible across devices,
    // and sample by sample (u, then the noise), so a batch draws what its samples would draw one
    // at a time: k micro-batches of 1 see the same noise as one batch of k.
    std::vector<at::Tensor> us, noises;  // us: [f] per sample (the chunk's u on its frames)
    for (int64_t i = 0; i < batch; ++i) {
        std::vector<at::Tensor> per_chunk;
        for (const auto& [begin, end] : chunks) {
            per_chunk.push_back(draw_u(c, gen).expand({end - begin}));
        }
        us.push_back(at::cat(per_chunk));
        noises.push_back(at::normal(0.0, 1.0, latents[i].sizes(), gen, cpu));
    }
    const at::Tensor u = at::stack(us);  // [B, 1] or [B, f]
    const double n = static_cast<double>(c.num_train_timesteps);
    const at::Tensor index = (u * n).floor().clamp_max(n - 1);  // in 0 .. N - 1
    const at::Tensor s = (n - index) / n;                       // the unshifted sigma, 1 .. 1 / N
    at::Tensor sigmas = c.flow_shift * s / (1 + (c.flow_shift - 1) * s);
    NoisedBatch out;
    if (clean_first) {
        sigmas.select(1, 0).zero_();  // frame 0 is the condition: clean, at timestep 0
        out.frame_weights = at::ones({batch, num_frames}, cpu);
        out.frame_weights.select(1, 0).zero_();
        out.frame_weights = out.frame_weights.to(latents.device());
    }
    const at::Tensor noise = at::stack(noises).to(latents.device(), latents.scalar_type());
    std::vector<int64_t> shape(static_cast<size_t>(latents.dim()), 1);  // [B, 1, 1, ...]
    shape[0] = batch;
    if (per_frame) shape[2] = num_frames;  // [B, 1, f, 1, 1]
    const at::Tensor sig = sigmas.to(latents.device(), latents.scalar_type()).view(shape);
    out.noisy = (1 - sig) * latents + sig * noise;
    out.target = noise - latents;
    if (!per_frame) sigmas = sigmas.view({batch});
    out.loss_weights = loss_weighting(c.weighting_scheme, sigmas);
    if (out.loss_weights.defined()) {
        if (clean_first) out.loss_weights.select(1, 0).zero_();  // sigma 0: out of the loss
        out.loss_weights = out.loss_weights.to(latents.device());
    }
    out.sigmas = sigmas.to(latents.device());
    out.timesteps = (sigmas * n).to(latents.device());
    return out;
}

at::Tensor flow_matching_loss(const at::Tensor& prediction, const at::Tensor& target,
                              const at::Tensor& frame_weights, const at::Tensor& loss_weights,
                              const at::Tensor& sample_weights) {
    const at::Tensor diff = prediction.to(at::kFloat) - target.to(at::kFloat);
    const int64_t batch = diff.size(0);
    at::Tensor squared = diff.pow(2);
    if (loss_weights.defined()) {
        // [B] -> [B, 1, 1, ...]; [B, f] -> [B, 1, f, 1, 1].
        std::vector<int64_t> shape(static_cast<size_t>(diff.dim()), 1);
        shape[0] = batch;
        if (loss_weights.dim() == 2) shape[2] = loss_weights.size(1);
        squared = squared * loss_weights.to(at::kFloat).view(shape);
    }
    at::Tensor per_sample;  // [B]
    if (!frame_weights.defined()) {
        per_sample = squared.reshape({batch, -1}).mean(1);
    } else {
        // [B, C, f, h, w] * [B, 1, f, 1, 1]: the frames out of the loss contribute nothing.
        const at::Tensor w = frame_weights.to(at::kFloat).view({batch, 1, -1, 1, 1});
        const double per_frame = static_cast<double>(diff.numel() / batch / diff.size(2));
        per_sample = (squared * w).reshape({batch, -1}).sum(1) /
                     (frame_weights.to(at::kFloat).sum(1) * per_frame);
    }
    if (sample_weights.defined())
        per_sample = per_sample * sample_weights.to(per_sample.device(), at::kFloat);
    return per_sample.mean();
}

}  // namespace sf::train

#include "stages/plan/step_probe.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "model/common/lora.h"

namespace sf::plan {

ProbeResult probe_step(const std::shared_ptr<model::DiffusionTransformer>& model,
                       const ProbeInput& in, const train::TrainStepOptions& o, c10::Device device) {
    const int64_t batch = in.latents.size(0);
    if (o.accumulation < 1 || batch % o.accumulation != 0) {
        throw Error::InvalidArgument(
            fmt::format("probe_step: a batch of {} does not split into {} micro-batches", batch,
                        o.accumulation));
    }
    train::TrainStep step(model, model::trainable_parameters(model->module()), in.adamw,
                          train::LRSchedule("constant", 1e-4, 0, 1), o, device, in.sync);
    const at::Tensor latents = in.latents.to(device);
    const at::Tensor captions =
        torch::randn({batch, in.caption_tokens, in.caption_channels}).to(device);
    const at::Tensor mask = torch::ones({batch, in.caption_tokens}, torch::kLong).to(device);
    const int64_t micro = batch / o.accumulation;
    at::Generator gen = at::detail::createCPUGenerator(0);

    ProbeResult r;
    r.micro_batch = micro;
    std::vector<double> times;
    mem::reset_peak();
    for (int64_t i = 0; i <= in.steps; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        if (in.before_step) {
            in.before_step();
            r.peak_tensor_bytes =
                std::max(r.peak_tensor_bytes,
                         device.is_cuda() ? mem::cuda_stats().peak : mem::cpu_stats().peak);
            r.peak_rss_bytes = std::max(r.peak_rss_bytes, mem::peak_rss_bytes());
        }
        const train::StepResult s = step.step(
            [&](int64_t k) {
                return train::MicroBatch{latents.slice(0, k * micro, (k + 1) * micro),
                                         captions.slice(0, k * micro, (k + 1) * micro),
                                         mask.slice(0, k * micro, (k + 1) * micro)};
            },
            gen);
        r.loss = s.loss;
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (i > 0 || in.steps == 0) times.push_back(seconds);
    }
    std::sort(times.begin(), times.end());
    r.step_seconds = times[times.size() / 2];
    r.phases = step.phase_peaks();
    // TrainStep resets the peaks at each phase and keeps each phase's highest over the steps:
    // the run's peak is theirs.
    for (const auto& [phase, peak] : r.phases) {
        r.peak_tensor_bytes = std::max(r.peak_tensor_bytes, peak.tensor_bytes);
        r.peak_rss_bytes = std::max(r.peak_rss_bytes, peak.rss_bytes);
    }
    r.phase_table = step.phase_table();
    for (const auto& [name, t] : step.optimizer().state())
        r.optimizer_state_bytes += t.numel() * static_cast<int64_t>(t.element_size());
    return r;
}

}  // namespace sf::plan

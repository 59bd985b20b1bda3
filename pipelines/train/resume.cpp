// What a training checkpoint captures of a run, and how a run resumes from one exactly: weights,
// optimizer and scaler state, the sampler's position and the random generators (the CPU's
// default, the data's, and on a GPU the device's).
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>

#include "core/error.h"
#include "core/torch_compat.h"
#include "pipelines/train/train_setup.h"
#include "storage/fingerprint.h"

namespace sf::pipelines::training {
namespace {

int device_index(const c10::Device& device) { return std::max<int>(0, device.index()); }

const at::Tensor& required_rng(const train::TrainState& state, const char* name,
                               const std::string& dir) {
    const auto it = state.rng.find(name);
    if (it == state.rng.end()) {
        throw Error::Corruption(fmt::format(
            "{}/optimizer.safetensors: no tensor rng.{} (the state of a random generator)", dir,
            name));
    }
    return it->second;
}

}  // namespace

train::TrainState capture_state(const RunParts& run, const std::vector<double>& losses) {
    train::TrainState state;
    state.step = run.step.steps_done();
    const auto pos = run.sampler.position();
    state.sampler_epoch = pos.epoch;
    state.sampler_batch = pos.batch;
    if (run.image_sampler != nullptr) {
        const auto image = run.image_sampler->position();
        state.image_sampler_epoch = image.epoch;
        state.image_sampler_batch = image.batch;
    }
    state.scaler = run.step.scaler().state();
    state.settings = run.settings;
    state.trainable = run.trainable;
    state.optimizer = run.step.optimizer_state();
    at::Generator global = at::detail::getDefaultCPUGenerator();  // a handle: shares the state
    state.rng["default"] = global.get_state();
    state.rng["data"] = run.data_gen.get_state();
    if (run.device.is_cuda()) {
        const at::Tensor cuda = compat::cuda_rng_state(device_index(run.device));
        if (cuda.defined()) state.rng["cuda"] = cuda;  // undefined in a build without CUDA
    }
    state.losses = losses;
    return state;
}

std::vector<double> restore_state(const std::string& dir, const RunParts& run,
                                  bool allow_new_data) {
    train::TrainState state = train::load_checkpoint(dir);
    std::map<std::string, std::string> stored = state.settings, wanted = run.settings;
    if (allow_new_data) {
        for (const char* key : {kDataSetting, kDataSizeSetting}) {
            stored.erase(key);
            wanted.erase(key);
        }
    }
    const auto diff = storage::fingerprint_diff(stored, wanted, "checkpoint");
    if (!diff.empty()) {
        auto value = [](const std::map<std::string, std::string>& m, const char* key) {
            const auto it = m.find(key);
            return it == m.end() ? std::string() : it->second;
        };
        const bool data = value(stored, kDataSetting) != value(wanted, kDataSetting);
        throw Error::InvalidArgument(fmt::format(
            "--resume_from_checkpoint {}: the checkpoint was made with other settings:\n  {}{}",
            dir, fmt::join(diff, "\n  "),
            data ? "\n(the data differs: another cache, resolution or encoder; "
                   "--allow_new_data resumes on it anyway)"
                 : ""));
    }
    const at::Tensor& default_rng = required_rng(state, "default", dir);
    const at::Tensor& data_rng = required_rng(state, "data", dir);
    torch::NoGradGuard no_grad;
    std::map<std::string, at::Tensor> saved(state.trainable.begin(), state.trainable.end());
    for (const auto& [name, p] : run.trainable) {
        auto it = saved.find(name);
        if (it == saved.end() || !it->second.sizes().equals(p.sizes())) {
            throw Error::Corruption(
                fmt::format("{}: trainable tensor {} missing or misshaped", dir, name));
        }
        p.copy_(it->second);
    }
    run.step.optimizer().load_state(state.optimizer);
    run.step.scaler().load_state(state.scaler);
    run.step.set_steps_done(state.step);
    run.sampler.seek({state.sampler_epoch, state.sampler_batch});
    if (run.image_sampler != nullptr)
        run.image_sampler->seek({state.image_sampler_epoch, state.image_sampler_batch});
    at::Generator global = at::detail::getDefaultCPUGenerator();  // a handle: shares the state
    global.set_state(default_rng);
    run.data_gen.set_state(data_rng);
    // A checkpoint from a CPU run resumed on a GPU has none: that generator starts from the seed.
    if (const auto it = state.rng.find("cuda"); it != state.rng.end() && run.device.is_cuda())
        compat::set_cuda_rng_state(device_index(run.device), it->second);
    return state.losses;
}

}  // namespace sf::pipelines::training

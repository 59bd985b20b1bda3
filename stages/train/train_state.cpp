#include "stages/train/train_state.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "storage/atomic_file.h"
#include "storage/safetensors_file.h"
#include "storage/tensor_convert.h"

namespace sf::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kPrefix = "checkpoint-";
constexpr const char* kStateFile = "state.json";
constexpr int kStateVersion = 1;  // frozen: a layout change that old readers cannot read bumps it

std::map<std::string, at::Tensor> read_tensors(const std::string& path) {
    const auto file = storage::SafetensorsFile::open(path);
    std::map<std::string, at::Tensor> out;
    for (const auto& name : file.names()) out[name] = storage::from_tensor_data(file.read(name));
    return out;
}

std::optional<int64_t> step_of(const fs::path& dir) {
    const std::string name = dir.filename().string();
    if (name.rfind(kPrefix, 0) != 0) return std::nullopt;
    const std::string digits = name.substr(std::char_traits<char>::length(kPrefix));
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit))
        return std::nullopt;
    if (!fs::exists(dir / kStateFile)) return std::nullopt;  // not complete
    return std::stoll(digits);
}

std::vector<std::pair<int64_t, fs::path>> checkpoints(const std::string& output_dir) {
    std::vector<std::pair<int64_t, fs::path>> out;
    std::error_code ec;
    if (!fs::is_directory(output_dir, ec)) return out;
    for (const auto& entry : fs::directory_iterator(output_dir)) {
        if (!entry.is_directory()) continue;
        if (auto step = step_of(entry.path())) out.emplace_back(*step, entry.path());
    }
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace

std::string save_checkpoint(const std::string& output_dir, const TrainState& state,
                            int64_t total_limit) {
    fs::create_directories(output_dir);
    const fs::path final_dir = fs::path(output_dir) / fmt::format("{}{}", kPrefix, state.step);
    const fs::path temp_dir =
        fs::path(output_dir) / fmt::format(".{}{}.tmp-{}", kPrefix, state.step, ::getpid());
    // Leftovers of runs that crashed while saving.
    for (const auto& entry : fs::directory_iterator(output_dir)) {
        const std::string name = entry.path().filename().string();
        if (name.rfind(std::string(".") + kPrefix, 0) == 0) fs::remove_all(entry.path());
    }
    fs::create_directories(temp_dir);

    storage::write_tensors_file((temp_dir / "trainable.safetensors").string(), state.trainable,
                                {{"format", "pt"}});
    std::vector<std::pair<std::string, at::Tensor>> extra;
    for (const auto& [name, t] : state.optimizer) extra.emplace_back("optimizer." + name, t);
    for (const auto& [name, t] : state.rng) extra.emplace_back("rng." + name, t);
    storage::write_tensors_file((temp_dir / "optimizer.safetensors").string(), extra,
                                {{"format", "pt"}});

    nlohmann::json j;
    j["version"] = kStateVersion;
    j["step"] = state.step;
    j["sampler"] = {{"epoch", state.sampler_epoch}, {"batch", state.sampler_batch}};
    j["scaler"] = state.scaler;
    j["settings"] = state.settings;
    j["losses"] = state.losses;
    storage::write_file_atomic((temp_dir / kStateFile).string(), j.dump(2));

    // Into place: a checkpoint of the same step from an earlier run is replaced whole.
    if (fs::exists(final_dir)) fs::remove_all(final_dir);
    fs::rename(temp_dir, final_dir);
    storage::fsync_parent_dir(final_dir.string());

    if (total_limit > 0) {
        auto all = checkpoints(output_dir);
        for (size_t i = 0; i + static_cast<size_t>(total_limit) < all.size(); ++i) {
            log_info("train: removing {} (--checkpoints_total_limit {})", all[i].second.string(),
                     total_limit);
            fs::remove_all(all[i].second);
        }
    }
    return final_dir.string();
}

std::optional<std::string> latest_checkpoint(const std::string& output_dir) {
    auto all = checkpoints(output_dir);
    if (all.empty()) return std::nullopt;
    return all.back().second.string();
}

TrainState load_checkpoint(const std::string& dir) {
    const std::string state_path = (fs::path(dir) / kStateFile).string();
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(storage::read_file(state_path));
    } catch (const nlohmann::json::exception& e) {
        throw Error::Corruption(fmt::format("{}: {}", state_path, e.what()));
    }
    TrainState s;
    try {
        if (j.at("version").get<int>() != kStateVersion) {
            throw Error::InvalidArgument(
                fmt::format("{}: checkpoint version {} (this build reads {})", state_path,
                            j.at("version").get<int>(), kStateVersion));
        }
        s.step = j.at("step").get<int64_t>();
        s.sampler_epoch = j.at("sampler").at("epoch").get<int64_t>();
        s.sampler_batch = j.at("sampler").at("batch").get<int64_t>();
        s.scaler = j.at("scaler").get<std::map<std::string, double>>();
        s.settings = j.at("settings").get<std::map<std::string, std::string>>();
        s.losses = j.at("losses").get<std::vector<double>>();
    } catch (const nlohmann::json::exception& e) {
        throw Error::Corruption(fmt::format("{}: {}", state_path, e.what()));
    }
    for (auto& [name, t] : read_tensors((fs::path(dir) / "trainable.safetensors").string())) {
        s.trainable.emplace_back(name, t);
    }
    for (auto& [name, t] : read_tensors((fs::path(dir) / "optimizer.safetensors").string())) {
        if (name.rfind("optimizer.", 0) == 0) s.optimizer[name.substr(10)] = t;
        if (name.rfind("rng.", 0) == 0) s.rng[name.substr(4)] = t;
    }
    return s;
}

}  // namespace sf::train

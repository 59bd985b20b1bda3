#include "stages/train/train_state.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "stages/train/state_json.h"
#include "storage/atomic_file.h"
#include "storage/json_text.h"
#include "storage/safetensors_file.h"
#include "storage/tensor_convert.h"
#include "storage/xxh3.h"

namespace sf::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kPrefix = "checkpoint-";
constexpr const char* kStateFile = "state.json";

std::map<std::string, at::Tensor> read_tensors(const std::string& path) {
    const auto file = storage::SafetensorsFile::open(path);
    std::map<std::string, at::Tensor> out;
    for (const auto& name : file.names()) out[name] = storage::from_tensor_data(file.read(name));
    return out;
}

constexpr const char* kManifestFile = "manifest.json";  // written last: the checkpoint is whole
constexpr const char* kFiles[] = {"trainable.safetensors", "optimizer.safetensors", kStateFile};

// The step a checkpoint-<step> name says, or nullopt for any other name (digits that overflow
// included).
std::optional<int64_t> step_of(const fs::path& dir) {
    const std::string name = dir.filename().string();
    if (name.rfind(kPrefix, 0) != 0) return std::nullopt;
    const std::string digits = name.substr(std::char_traits<char>::length(kPrefix));
    int64_t step = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
    if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || step < 0)
        return std::nullopt;
    return step;
}

// Every directory named checkpoint-<step> under `output_dir`, oldest first, complete or not.
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

// XXH3-128 of a file, read in blocks: checkpoint files may be many gigabytes.
std::string file_checksum(const fs::path& path, uint64_t* bytes) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error::NotFound(fmt::format("{}: missing", path.string()));
    storage::XXH3Hasher hasher;
    std::vector<char> block(1 << 20);
    *bytes = 0;
    while (in.read(block.data(), static_cast<std::streamsize>(block.size())) || in.gcount() > 0) {
        hasher.update({block.data(), static_cast<size_t>(in.gcount())});
        *bytes += static_cast<uint64_t>(in.gcount());
    }
    if (in.bad()) throw Error::IOError(fmt::format("{}: cannot read", path.string()));
    return hasher.hex();
}

Error corrupt_checkpoint(const std::string& where, const std::string& what) {
    return Error::Corruption(fmt::format("{}: {}", where, what));
}

TrainState read_state(const std::string& path) {
    TrainState s;
    static_cast<StateFields&>(s) = parse_state_json(storage::read_file(path), path);
    return s;
}

// Checks every file a checkpoint's manifest lists against its size and checksum, and state.json's
// fields; a checkpoint of an earlier version without a manifest is checked by opening its files
// (the safetensors checksums). kCorruption / kNotFound naming the file.
void verify(const fs::path& dir) {
    const fs::path manifest_path = dir / kManifestFile;
    if (!fs::exists(manifest_path)) {
        if (!fs::exists(dir / kStateFile)) {
            throw Error::NotFound(
                fmt::format("{}: no {} (an incomplete checkpoint)", dir.string(), kManifestFile));
        }
        for (const char* name : {"trainable.safetensors", "optimizer.safetensors"})
            storage::SafetensorsFile::open((dir / name).string());
    } else {
        const std::string where = manifest_path.string();
        const auto files = parse_manifest_json(storage::read_file(where), where);
        for (const char* name : kFiles) {
            if (!files.count(name))
                throw corrupt_checkpoint(where, fmt::format("lists no {}", name));
        }
        for (const auto& entry : files) {  // the extras too
            const std::string& name = entry.first;
            if (name.find('/') != std::string::npos || name.empty() || name[0] == '.')
                throw corrupt_checkpoint(
                    where, fmt::format("lists a file outside the checkpoint: {}", name));
            uint64_t bytes = 0;
            const std::string got = file_checksum(dir / name, &bytes);
            if (bytes != entry.second.bytes || got != entry.second.xxh3_128) {
                throw corrupt_checkpoint(
                    (dir / name).string(),
                    fmt::format("{} bytes with checksum {}, the manifest says {} bytes "
                                "with {}",
                                bytes, got, entry.second.bytes, entry.second.xxh3_128));
            }
        }
    }
    read_state((dir / kStateFile).string());
}

}  // namespace

std::string checkpoint_dir(const std::string& output_dir, int64_t step) {
    return (fs::path(output_dir) / fmt::format("{}{}", kPrefix, step)).string();
}

std::string save_checkpoint(const std::string& output_dir, const TrainState& state,
                            int64_t total_limit, const CheckpointExtras& extras) {
    fs::create_directories(output_dir);
    const fs::path final_dir = checkpoint_dir(output_dir, state.step);
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

    storage::write_file_atomic((temp_dir / kStateFile).string(),
                               state_json(static_cast<const StateFields&>(state)));
    std::vector<std::string> names(std::begin(kFiles), std::end(kFiles));
    if (extras) {
        for (const std::string& name : extras(temp_dir.string())) names.push_back(name);
    }
    // Last: the sizes and checksums of everything above.
    std::map<std::string, ManifestEntry> files;
    for (const std::string& name : names) {
        ManifestEntry& entry = files[name];
        entry.xxh3_128 = file_checksum(temp_dir / name, &entry.bytes);
    }
    storage::write_file_atomic((temp_dir / kManifestFile).string(), manifest_json(files));

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
    const auto all = checkpoints(output_dir);
    std::vector<std::string> refused;
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
        try {
            verify(it->second);
        } catch (const Error& e) {
            log_warn("train: {} is damaged or incomplete, trying an older checkpoint: {}",
                     it->second.string(), e.message());
            refused.push_back(e.message());
            continue;
        }
        return it->second.string();
    }
    if (!refused.empty()) {
        // Starting again from step 0 would write over what may still be rescued by hand.
        throw Error::Corruption(fmt::format(
            "no intact checkpoint in {} ({} damaged: {}); move them away to start from step 0",
            output_dir, refused.size(), refused.front()));
    }
    return std::nullopt;
}

void verify_checkpoint(const std::string& dir) { verify(dir); }

TrainState load_checkpoint(const std::string& dir) {
    TrainState s = read_state((fs::path(dir) / kStateFile).string());
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

// SafetensorsCheckpoint: one file, or shards named by a Hugging Face style index:
//   {"metadata": {"total_size": ...}, "weight_map": {"tensor.name":
//   "model-00001-of-00002.safetensors"}}
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "storage/atomic_file.h"
#include "storage/json_text.h"
#include "storage/safetensors_file.h"

namespace sf::storage {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A directory names its checkpoint by holding exactly one index, or else exactly one file.
std::string resolve_directory(const std::string& dir) {
    std::vector<std::string> indexes, files;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
        std::string name = entry.path().filename().string();
        if (ends_with(name, ".safetensors.index.json")) indexes.push_back(entry.path().string());
        if (ends_with(name, ".safetensors")) files.push_back(entry.path().string());
    }
    if (ec) throw Error::IOError("listing " + dir + ": " + ec.message());
    if (indexes.size() == 1) return indexes[0];
    if (indexes.empty() && files.size() == 1) return files[0];
    throw Error::InvalidArgument(dir + " holds " + std::to_string(indexes.size()) +
                                 " safetensors indexes and " + std::to_string(files.size()) +
                                 " safetensors files; name the one to load");
}

}  // namespace

SafetensorsCheckpoint SafetensorsCheckpoint::open(const std::string& path_in,
                                                  ChecksumPolicy policy) {
    std::error_code ec;
    std::string path = fs::is_directory(path_in, ec) ? resolve_directory(path_in) : path_in;
    SafetensorsCheckpoint checkpoint;
    checkpoint.path_ = path;

    if (!ends_with(path, ".index.json")) {
        checkpoint.shards_.push_back(SafetensorsFile::open(path, policy));
        for (const auto& name : checkpoint.shards_[0].names()) checkpoint.shard_of_[name] = 0;
        checkpoint.metadata_ = checkpoint.shards_[0].metadata();
        return checkpoint;
    }

    std::string text = read_file(path);
    const json index = parse_json(text, path + ": index", ErrorCode::kCorruption);
    if (!index.is_object()) throw Error::Corruption(path + ": index is not a JSON object");
    auto weight_map = index.find("weight_map");
    if (weight_map == index.end() || !weight_map->is_object()) {
        throw Error::Corruption(path + ": index has no weight_map object");
    }
    auto metadata = index.find("metadata");
    if (metadata != index.end() && metadata->is_object()) {
        for (const auto& [key, value] : metadata->items()) {
            checkpoint.metadata_[key] =
                value.is_string() ? value.get<std::string>()
                                  : value.dump(-1, ' ', false, json::error_handler_t::replace);
        }
    }

    fs::path dir = fs::path(path).parent_path();
    std::map<std::string, size_t> shard_index;
    for (const auto& [name, file] : weight_map->items()) {
        if (!file.is_string()) {
            throw Error::Corruption(path + ": weight_map entry of '" + text_excerpt(name) +
                                    "' is not a file name");
        }
        std::string shard = file.get<std::string>();
        // Shards live beside the index; anything else is a damaged or hostile index.
        fs::path relative(shard);
        if (shard.empty() || relative.is_absolute() || relative.has_parent_path()) {
            throw Error::Corruption(path + ": weight_map names '" + text_excerpt(shard) +
                                    "', which is not a file beside the index");
        }
        auto [it, added] = shard_index.emplace(shard, checkpoint.shards_.size());
        if (added) {
            std::string shard_path = (dir / relative).string();
            if (!fs::exists(shard_path, ec)) {
                throw Error::NotFound(path + " names shard " + shard + ", which does not exist");
            }
            checkpoint.shards_.push_back(SafetensorsFile::open(shard_path, policy));
        }
        const SafetensorsFile& opened = checkpoint.shards_[it->second];
        if (!opened.contains(name)) {
            throw Error::Corruption(path + " places tensor '" + name + "' in " + shard +
                                    ", which does not hold it");
        }
        checkpoint.shard_of_[name] = it->second;
    }
    return checkpoint;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
    std::vector<std::string> out;
    for (const auto& [name, shard] : shard_of_) out.push_back(name);
    return out;
}

const SafetensorsFile& SafetensorsCheckpoint::file_of(const std::string& name) const {
    auto it = shard_of_.find(name);
    if (it == shard_of_.end()) throw Error::NotFound(path_ + " has no tensor '" + name + "'");
    return shards_[it->second];
}

const TensorInfo& SafetensorsCheckpoint::info(const std::string& name) const {
    return file_of(name).info(name);
}

std::string_view SafetensorsCheckpoint::view(const std::string& name) const {
    return file_of(name).view(name);
}

TensorData SafetensorsCheckpoint::read(const std::string& name) const {
    return file_of(name).read(name);
}

}  // namespace sf::storage

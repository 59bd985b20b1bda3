#include "stages/encode/model_source.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "storage/content_key.h"

namespace sf::stages {
namespace fs = std::filesystem;
namespace {

constexpr int kSampledBlocks = 64;
constexpr size_t kBlockBytes = 4096;

void add_sampled_file(storage::ContentKey& key, const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error::IOError("cannot read " + path.string());
    const uint64_t size = fs::file_size(path);
    key.add_source(path.filename().string());
    key.add_source(std::to_string(size));
    // The safetensors header (8-byte length + JSON): every name, dtype, shape and offset.
    uint64_t header_len = 0;
    in.read(reinterpret_cast<char*>(&header_len), 8);
    std::string block(std::min<uint64_t>(header_len, size), '\0');
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    key.add_source(block);
    block.resize(kBlockBytes);
    for (int i = 0; i < kSampledBlocks && size > kBlockBytes; ++i) {
        in.clear();
        in.seekg(static_cast<std::streamoff>((size - kBlockBytes) * i / (kSampledBlocks - 1)));
        in.read(block.data(), kBlockBytes);
        key.add_source(std::string_view(block.data(), static_cast<size_t>(in.gcount())));
    }
}

}  // namespace

std::string ModelSource::component_dir(const std::string& component) const {
    const fs::path dir = fs::path(pretrained) / component;
    if (!fs::is_directory(dir)) {
        throw Error::NotFound("--pretrained_model_name_or_path " + pretrained + " has no " +
                              component + "/ folder (diffusers layout expected)");
    }
    return dir.string();
}

std::string weights_fingerprint(const ModelSource& source, const std::string& component) {
    storage::ContentKey key;
    if (!source.is_pretrained()) {
        key.add_param("builtin", source.builtin)
            .add_param("seed", static_cast<int64_t>(source.seed));
        return "builtin:" + source.builtin + ":" + key.hex();
    }
    const fs::path dir = source.component_dir(component);
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(dir)) {
        const std::string name = entry.path().filename().string();
        if (name == "config.json" || (name.size() > 5 && name.substr(name.size() - 5) == ".json") ||
            entry.path().extension() == ".safetensors" || entry.path().extension() == ".model") {
            files.push_back(entry.path());
        }
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
        if (f.extension() == ".safetensors") {
            add_sampled_file(key, f);
        } else {
            std::ifstream in(f, std::ios::binary);
            key.add_source(f.filename().string());
            key.add_source(std::string(std::istreambuf_iterator<char>(in), {}));
        }
    }
    key.add_param("component", component);
    return component + ":" + key.hex();
}

}  // namespace sf::stages

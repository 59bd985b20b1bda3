#include "storage/cache_shards.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <regex>

#include "core/error.h"
#include "storage/xxh3.h"

namespace sf::storage {
namespace {

namespace fs = std::filesystem;

// The shard folders in `cache_dir`: (rank, count) by folder name.
std::map<std::string, std::pair<int, int>> shard_folders(const std::string& cache_dir) {
    static const std::regex name(R"(shard-(\d{5})-of-(\d{5}))");
    std::map<std::string, std::pair<int, int>> out;
    std::error_code ec;
    if (!fs::is_directory(cache_dir, ec)) return out;
    for (const auto& entry : fs::directory_iterator(cache_dir, ec)) {
        std::smatch m;
        const std::string file = entry.path().filename().string();
        if (entry.is_directory(ec) && std::regex_match(file, m, name))
            out[file] = {std::stoi(m[1].str()), std::stoi(m[2].str())};
    }
    return out;
}

}  // namespace

std::string shard_dir_name(int rank, int count) {
    if (count < 1 || count > kMaxShards || rank < 0 || rank >= count) {
        throw Error::InvalidArgument(
            fmt::format("shard {} of {}: not a shard (1 to {} shards)", rank, count, kMaxShards));
    }
    return fmt::format("shard-{:05d}-of-{:05d}", rank, count);
}

int shard_of(const std::string& key, int count) {
    const std::string hex = xxh3_128_hex(key);
    return static_cast<int>(std::stoull(hex.substr(0, 15), nullptr, 16) %
                            static_cast<unsigned long long>(count));
}

std::set<int> cache_shard_counts(const std::string& cache_dir) {
    std::set<int> counts;
    for (const auto& [name, rc] : shard_folders(cache_dir)) counts.insert(rc.second);
    return counts;
}

std::vector<std::string> cache_shard_dirs(const std::string& cache_dir) {
    const auto folders = shard_folders(cache_dir);
    if (folders.empty()) return {cache_dir};
    std::error_code ec;
    if (fs::exists(fs::path(cache_dir) / "data.mdb", ec)) {
        throw Error::InvalidArgument(fmt::format(
            "{} holds both a cache of one process (data.mdb) and the shards of a sharded prep "
            "({}, ...): use one --cache_dir for each",
            cache_dir, folders.begin()->first));
    }
    const int count = folders.begin()->second.second;
    std::vector<std::string> dirs;
    for (int r = 0; r < count; ++r) {
        const std::string name = shard_dir_name(r, count);
        if (!folders.count(name)) {
            throw Error::InvalidArgument(fmt::format(
                "{}: {} is missing (a sharded prep of {} ranks writes one shard each): rerun the "
                "prep with {} ranks",
                cache_dir, name, count, count));
        }
        dirs.push_back((fs::path(cache_dir) / name).string());
    }
    for (const auto& [name, rc] : folders) {
        if (rc.second != count) {
            throw Error::InvalidArgument(fmt::format(
                "{}: shards of two preps, {} and {}: a cache's shards come from one prep (remove "
                "the other's)",
                cache_dir, shard_dir_name(0, count), name));
        }
    }
    return dirs;
}

}  // namespace sf::storage

#include "stages/train/state_json.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "storage/json_text.h"

namespace sf::train {
namespace {

Error corrupt(const std::string& where, const std::string& what) {
    return Error::Corruption(fmt::format("{}: {}", where, what));
}

int64_t read_int(const nlohmann::json& j, const char* key, int64_t lo, const std::string& where) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer() ||
        (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{INT64_MAX}) ||
        it->get<int64_t>() < lo) {
        throw corrupt(where, fmt::format("\"{}\" must be an integer >= {}, got {}", key, lo,
                                         it == j.end() ? "nothing" : storage::json_excerpt(*it)));
    }
    return it->get<int64_t>();
}

const nlohmann::json& read_object(const nlohmann::json& j, const char* key,
                                  const std::string& where) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_object()) {
        throw corrupt(where, fmt::format("\"{}\" must be an object, got {}", key,
                                         it == j.end() ? "nothing" : storage::json_excerpt(*it)));
    }
    return *it;
}

}  // namespace

std::string state_json(const StateFields& s) {
    nlohmann::json j;
    j["version"] = kStateVersion;
    j["step"] = s.step;
    j["sampler"] = {{"epoch", s.sampler_epoch}, {"batch", s.sampler_batch}};
    j["image_sampler"] = {{"epoch", s.image_sampler_epoch}, {"batch", s.image_sampler_batch}};
    j["scaler"] = s.scaler;
    j["settings"] = s.settings;
    j["losses"] = s.losses;  // a NaN or infinity is written as null
    return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

StateFields parse_state_json(const std::string& text, const std::string& state_path) {
    const nlohmann::json j = storage::parse_json(text, state_path, ErrorCode::kCorruption);
    if (!j.is_object()) throw corrupt(state_path, "not a JSON object");
    StateFields s;
    const int64_t version = read_int(j, "version", 0, state_path);
    if (version != kStateVersion) {
        throw Error::InvalidArgument(fmt::format("{}: checkpoint version {} (this build reads {})",
                                                 state_path, version, kStateVersion));
    }
    s.step = read_int(j, "step", 0, state_path);
    const nlohmann::json& sampler = read_object(j, "sampler", state_path);
    s.sampler_epoch = read_int(sampler, "epoch", 0, state_path + ": sampler");
    s.sampler_batch = read_int(sampler, "batch", 0, state_path + ": sampler");
    if (j.contains("image_sampler")) {
        const nlohmann::json& image = read_object(j, "image_sampler", state_path);
        s.image_sampler_epoch = read_int(image, "epoch", 0, state_path + ": image_sampler");
        s.image_sampler_batch = read_int(image, "batch", 0, state_path + ": image_sampler");
    }
    for (const auto& [key, value] : read_object(j, "scaler", state_path).items()) {
        if (!value.is_number() || !std::isfinite(value.get<double>())) {
            throw corrupt(state_path,
                          fmt::format("scaler \"{}\" must be a finite number, got {}",
                                      storage::text_excerpt(key), storage::json_excerpt(value)));
        }
        s.scaler[key] = value.get<double>();
    }
    for (const auto& [key, value] : read_object(j, "settings", state_path).items()) {
        if (!value.is_string()) {
            throw corrupt(state_path,
                          fmt::format("setting \"{}\" must be a string, got {}",
                                      storage::text_excerpt(key), storage::json_excerpt(value)));
        }
        s.settings[key] = value.get<std::string>();
    }
    const auto losses = j.find("losses");
    if (losses == j.end() || !losses->is_array()) {
        throw corrupt(state_path, "\"losses\" must be a list of numbers");
    }
    for (const nlohmann::json& loss : *losses) {
        // null: a step fp16 loss scaling skipped, whose loss was not finite (JSON has no NaN).
        if (!loss.is_number() && !loss.is_null()) {
            throw corrupt(state_path, "\"losses\" holds " + storage::json_excerpt(loss));
        }
        s.losses.push_back(loss.is_null() ? std::nan("") : loss.get<double>());
    }
    return s;
}

std::string manifest_json(const std::map<std::string, ManifestEntry>& files) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [name, entry] : files)
        out[name] = {{"bytes", entry.bytes}, {"xxh3_128", entry.xxh3_128}};
    return nlohmann::json{{"version", 1}, {"files", out}}.dump(2);
}

std::map<std::string, ManifestEntry> parse_manifest_json(const std::string& text,
                                                         const std::string& where) {
    const nlohmann::json manifest = storage::parse_json(text, where, ErrorCode::kCorruption);
    if (!manifest.is_object()) throw corrupt(where, "not a JSON object");
    std::map<std::string, ManifestEntry> out;
    for (const auto& [name, entry] : read_object(manifest, "files", where).items()) {
        const std::string file = where + ": " + storage::text_excerpt(name);
        if (!entry.is_object()) throw corrupt(file, "not a JSON object");
        ManifestEntry e;
        e.bytes = static_cast<uint64_t>(read_int(entry, "bytes", 0, file));
        const auto hash = entry.find("xxh3_128");
        if (hash == entry.end() || !hash->is_string() ||
            hash->get_ref<const std::string&>().size() != 32)
            throw corrupt(file, "\"xxh3_128\" must be 32 hex characters");
        e.xxh3_128 = hash->get<std::string>();
        out[name] = std::move(e);
    }
    return out;
}

}  // namespace sf::train

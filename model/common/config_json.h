// The one reader of the models' config.json files (diffusers and transformers write them): the
// file found and parsed with a nesting limit, the class checked, and each key read with its type
// checked, so every config refuses a bad file with the same kind of message:
//
//     vae/config.json: "latent_channels" must be an integer, got "32"
//
// Torch-free: the configs that use it are read by the planner and `sanaflow models` too.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "storage/json_text.h"

namespace sf::model {

// Nesting limit and message excerpts: storage/json_text.h's, shared by every JSON reader.
constexpr int kMaxConfigJsonDepth = storage::kMaxJsonDepth;
constexpr size_t kConfigValueExcerpt = storage::kJsonExcerpt;
// Every integer a config holds is a size, a count or an id: one larger in magnitude than this is
// refused as it is read, so products of two never overflow int64 (and the parameter counts check
// the rest: model/common/checked_count.h).
constexpr int64_t kMaxConfigInteger = (int64_t{1} << 31) - 1;
using storage::json_excerpt;

// True when int(ratio * width), a feed-forward width as upstream's int() truncates it, is in
// [1, kMaxConfigInteger]: checked before the cast, which is undefined out of int64's range.
inline bool ratio_width_fits(double ratio, int64_t width) {
    const double w = ratio * static_cast<double>(width);
    return std::isfinite(ratio) && ratio > 0.0 && w >= 1.0 && w <= kMaxConfigInteger;
}

// Parses config text that must be a JSON object. Python's json.dump writes a non-finite float as
// the bare word Infinity, -Infinity or NaN (diffusers' scheduler configs hold
// "lambda_min_clipped": -Infinity): outside strings those read as null. kInvalidArgument naming
// `where`: "not valid JSON", "not a JSON object", or a nesting deeper than kMaxConfigJsonDepth.
nlohmann::json parse_config_json(const std::string& text, const std::string& where);

struct ConfigFile {
    std::string path;     // the file read, for messages: config.json inside a directory
    nlohmann::json json;  // a JSON object
};

// Reads a config file, or the config.json of a directory, and parses it as parse_config_json
// does. `what` names it in the kNotFound message ("transformer config"); kIOError when it exists
// but cannot be read.
ConfigFile read_config_file(const std::string& path, const std::string& what);

// The `_class_name` of a config file or directory ("" when it names none), e.g.
// "SanaVideoTransformer3DModel".
std::string config_class(const std::string& path, const std::string& what);

// Typed reads of one JSON object's keys. A missing key leaves the output as it is (so it keeps
// the caller's default, as upstream's constructor defaults do); unknown keys are never looked at;
// a key of the wrong type, or an integer beyond +-kMaxConfigInteger, is kInvalidArgument:
//
//     <where>: "<key>" must be <an integer|a number|...>, got <the value, cut short>
class ConfigReader {
public:
    // `object` must outlive the reader. kInvalidArgument "<where>: not a JSON object" otherwise.
    ConfigReader(const nlohmann::json& object, std::string where);

    const std::string& where() const { return where_; }
    // The value of `key`, or nullptr when it is absent.
    const nlohmann::json* find(const char* key) const;
    // Present and not null.
    bool has_value(const char* key) const;

    void integer(const char* key, int64_t& out) const;
    void number(const char* key, double& out) const;  // an integer is a number too
    void boolean(const char* key, bool& out) const;
    void string(const char* key, std::string& out) const;
    // Optional[...] upstream: null resets `out`.
    void nullable_integer(const char* key, std::optional<int64_t>& out) const;
    void nullable_number(const char* key, std::optional<double>& out) const;
    void nullable_string(const char* key, std::optional<std::string>& out) const;
    void integer_list(const char* key, std::vector<int64_t>& out) const;
    void integer_lists(const char* key, std::vector<std::vector<int64_t>>& out) const;
    void string_list(const char* key, std::vector<std::string>& out) const;
    void number_list(const char* key, std::vector<double>& out) const;  // finite numbers
    void boolean_list(const char* key, std::vector<bool>& out) const;
    // The object under `key`, read with keys named "<key>.<inner key>"; an empty one when absent.
    ConfigReader object(const char* key) const;

    // When `key` is present it must be the string `expected`: a config.json written for another
    // model class is refused before any of its numbers are misread.
    void check_class_name(const std::string& expected, const char* key = "_class_name") const;

    // The wrong-type error for `key`, for readers of shapes only one config has.
    [[noreturn]] void fail(const char* key, const char* want, const nlohmann::json& got) const;

private:
    ConfigReader(const nlohmann::json& object, std::string where, std::string prefix);

    const nlohmann::json& object_;
    std::string where_;
    std::string prefix_;  // "<outer key>." for a nested object
};

}  // namespace sf::model

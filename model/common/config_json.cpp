#include "model/common/config_json.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "storage/json_text.h"

namespace sf::model {
namespace {

using nlohmann::json;

bool is_config_integer(const json& v) {
    // Integers above 2^63 - 1 parse as unsigned, and get<int64_t>() would wrap them negative.
    if (!v.is_number_integer()) return false;
    if (v.is_number_unsigned())
        return v.get<uint64_t>() <= static_cast<uint64_t>(kMaxConfigInteger);
    const int64_t i = v.get<int64_t>();
    return i >= -kMaxConfigInteger && i <= kMaxConfigInteger;
}

bool is_config_integer_list(const json& v) {
    return v.is_array() && std::all_of(v.begin(), v.end(), is_config_integer);
}

void require_object(const json& j, const std::string& where) {
    if (!j.is_object()) throw Error::InvalidArgument(fmt::format("{}: not a JSON object", where));
}

// Python's bare Infinity, -Infinity and NaN outside strings, as null; the rest as it is.
std::string python_nonfinite_as_null(const std::string& text) {
    static constexpr std::string_view kWords[] = {"-Infinity", "Infinity", "NaN"};
    std::string out;
    out.reserve(text.size());
    bool in_string = false;
    for (size_t i = 0; i < text.size();) {
        const char c = text[i];
        if (in_string) {
            out += c;
            if (c == '\\' && i + 1 < text.size())
                out += text[++i];
            else if (c == '"')
                in_string = false;
            ++i;
            continue;
        }
        if (c == '"') in_string = true;
        bool replaced = false;
        for (const std::string_view word : kWords) {
            if (std::string_view(text).substr(i, word.size()) == word) {
                out += "null";
                i += word.size();
                replaced = true;
                break;
            }
        }
        if (!replaced) out += text[i++];
    }
    return out;
}

}  // namespace

json parse_config_json(const std::string& text, const std::string& where) {
    json j = storage::parse_json(python_nonfinite_as_null(text), where);
    require_object(j, where);
    return j;
}

ConfigFile read_config_file(const std::string& path, const std::string& what) {
    namespace fs = std::filesystem;
    fs::path file = path;
    std::error_code error;
    if (fs::is_directory(file, error)) file /= "config.json";
    ConfigFile out;
    out.path = file.string();
    const fs::file_status status = fs::status(file, error);
    if (status.type() == fs::file_type::not_found) {
        throw Error::NotFound(fmt::format("{} {} not found", what, out.path));
    }
    if (error) {
        throw Error::IOError(fmt::format("cannot read {} {}: {}", what, out.path, error.message()));
    }
    // Opening a directory succeeds and reading it yields nothing: "not valid JSON" would mislead.
    if (fs::is_directory(status)) {
        throw Error::IOError(fmt::format("cannot read {} {}: a directory", what, out.path));
    }
    std::ifstream in(file, std::ios::binary);
    if (!in) {
        throw Error::IOError(
            fmt::format("cannot read {} {}: {}", what, out.path, std::strerror(errno)));
    }
    std::string text;
    char buffer[1 << 16];
    while (in.read(buffer, sizeof buffer) || in.gcount() > 0)
        text.append(buffer, static_cast<size_t>(in.gcount()));
    if (in.bad()) throw Error::IOError(fmt::format("cannot read {} {}", what, out.path));
    out.json = parse_config_json(text, out.path);
    return out;
}

std::string config_class(const std::string& path, const std::string& what) {
    const ConfigFile file = read_config_file(path, what);
    const auto it = file.json.find("_class_name");
    return it != file.json.end() && it->is_string() ? it->get<std::string>() : "";
}

ConfigReader::ConfigReader(const json& object, std::string where)
    : ConfigReader(object, std::move(where), "") {
    require_object(object_, where_);
}

// Nested readers are made of objects already checked.
ConfigReader::ConfigReader(const json& object, std::string where, std::string prefix)
    : object_(object), where_(std::move(where)), prefix_(std::move(prefix)) {}

const json* ConfigReader::find(const char* key) const {
    auto it = object_.find(key);
    return it == object_.end() ? nullptr : &*it;
}

bool ConfigReader::has_value(const char* key) const {
    const json* v = find(key);
    return v != nullptr && !v->is_null();
}

void ConfigReader::fail(const char* key, const char* want, const json& got) const {
    throw Error::InvalidArgument(fmt::format("{}: \"{}{}\" must be {}, got {}", where_, prefix_,
                                             key, want, json_excerpt(got)));
}

void ConfigReader::integer(const char* key, int64_t& out) const {
    const json* v = find(key);
    if (v == nullptr) return;
    if (!is_config_integer(*v))
        fail(key,
             v->is_number_integer() ? "an integer of magnitude at most 2^31 - 1" : "an integer",
             *v);
    out = v->get<int64_t>();
}

void ConfigReader::number(const char* key, double& out) const {
    const json* v = find(key);
    if (v == nullptr) return;
    if (!v->is_number()) fail(key, "a number", *v);
    out = v->get<double>();
}

void ConfigReader::boolean(const char* key, bool& out) const {
    const json* v = find(key);
    if (v == nullptr) return;
    if (!v->is_boolean()) fail(key, "true or false", *v);
    out = v->get<bool>();
}

void ConfigReader::string(const char* key, std::string& out) const {
    const json* v = find(key);
    if (v == nullptr) return;
    if (!v->is_string()) fail(key, "a string", *v);
    out = v->get<std::string>();
}

void ConfigReader::nullable_integer(const char* key, std::optional<int64_t>& out) const {
    const json* v = find(key);
    if (v == nullptr) return;
    if (v->is_null()) {
        out.reset();
        return;
    }
    if (!is_config_integer(*v)) {
        fail(key,
             v->is_number_integer() ? "an integer of magnitude at most 2^31 - 1 or null"
                                    : "an integer or null",
             *v);
    }
    out = v->get<int64_t>();
}

void ConfigReader::nullable_number(const char* key, std::optional<double>& out) const {
    const json* v = find(key);
    if (v == nullptr) return;
    if (v->is_null()) {
        out.reset();
        return;
    }
    if (!v->is_number()) fail(key, "a number or null", *v);
    out = v->get<double>();
}

void ConfigReader::nullable_string(const char* key, std::optional<std::string>& out) const {
    const json* v = find(key);
    if (v == nullptr) return;
    if (v->is_null()) {
        out.reset();
        return;
    }
    if (!v->is_string()) fail(key, "a string or null", *v);
    out = v->get<std::string>();
}

void ConfigReader::integer_list(const char* key, std::vector<int64_t>& out) const {
    const json* v = find(key);
    if (v == nullptr) return;
    if (!is_config_integer_list(*v)) fail(key, "a list of integers", *v);
    out = v->get<std::vector<int64_t>>();
}

void ConfigReader::integer_lists(const char* key, std::vector<std::vector<int64_t>>& out) const {
    const json* v = find(key);
    if (v == nullptr) return;
    if (!v->is_array() || !std::all_of(v->begin(), v->end(), is_config_integer_list)) {
        fail(key, "a list of lists of integers", *v);
    }
    out = v->get<std::vector<std::vector<int64_t>>>();
}

void ConfigReader::number_list(const char* key, std::vector<double>& out) const {
    const json* v = find(key);
    if (v == nullptr) return;
    // nlohmann keeps NaN and inf only when parsing is lenient; refuse them here all the same.
    if (!v->is_array() || !std::all_of(v->begin(), v->end(), [](const json& e) {
            return e.is_number() && std::isfinite(e.get<double>());
        })) {
        fail(key, "a list of finite numbers", *v);
    }
    out = v->get<std::vector<double>>();
}

void ConfigReader::boolean_list(const char* key, std::vector<bool>& out) const {
    const json* v = find(key);
    if (v == nullptr) return;
    if (!v->is_array() ||
        !std::all_of(v->begin(), v->end(), [](const json& e) { return e.is_boolean(); })) {
        fail(key, "a list of true or false", *v);
    }
    out = v->get<std::vector<bool>>();
}

void ConfigReader::string_list(const char* key, std::vector<std::string>& out) const {
    const json* v = find(key);
    if (v == nullptr) return;
    if (!v->is_array() ||
        !std::all_of(v->begin(), v->end(), [](const json& e) { return e.is_string(); })) {
        fail(key, "a list of strings", *v);
    }
    out = v->get<std::vector<std::string>>();
}

ConfigReader ConfigReader::object(const char* key) const {
    static const json kEmpty = json::object();
    const json* v = find(key);
    if (v == nullptr) return ConfigReader(kEmpty, where_, prefix_ + key + ".");
    if (!v->is_object()) fail(key, "an object", *v);
    return ConfigReader(*v, where_, prefix_ + key + ".");
}

void ConfigReader::check_class_name(const std::string& expected, const char* key) const {
    const json* v = find(key);
    if (v == nullptr || (v->is_string() && v->get_ref<const std::string&>() == expected)) return;
    throw Error::InvalidArgument(fmt::format("{}: \"{}{}\" is {}, not \"{}\"", where_, prefix_, key,
                                             json_excerpt(*v), expected));
}

}  // namespace sf::model

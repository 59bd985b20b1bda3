#include "storage/fingerprint.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "storage/json_text.h"
#include "storage/xxh3.h"

namespace sf::storage {

std::string fingerprint_to_json(const Fingerprint& fingerprint) {
    try {
        return nlohmann::json(fingerprint).dump();
    } catch (const nlohmann::json::exception& e) {
        throw Error::InvalidArgument(std::string("fingerprint field is not UTF-8: ") + e.what());
    }
}

Fingerprint fingerprint_from_json(std::string_view text, const std::string& where) {
    const nlohmann::json j = parse_json(text, where + ": fingerprint", ErrorCode::kCorruption);
    if (!j.is_object()) throw Error::Corruption(where + ": fingerprint is not a JSON object");
    Fingerprint out;
    for (const auto& [key, value] : j.items()) {
        if (!value.is_string()) {
            throw Error::Corruption(where + ": fingerprint field '" + text_excerpt(key) +
                                    "' is not a string");
        }
        out[key] = value.get<std::string>();
    }
    return out;
}

std::string fingerprint_hash(const Fingerprint& fingerprint) {
    return xxh3_128_hex(fingerprint_to_json(fingerprint));
}

std::vector<std::string> fingerprint_diff(const Fingerprint& stored, const Fingerprint& wanted,
                                          const std::string& stored_by) {
    auto value_or_none = [](const Fingerprint& f, const std::string& key) -> std::string {
        auto it = f.find(key);
        return it == f.end() ? "nothing" : it->second;
    };
    std::map<std::string, bool> fields;
    for (const auto& [key, value] : stored) fields[key] = true;
    for (const auto& [key, value] : wanted) fields[key] = true;
    std::vector<std::string> lines;
    for (const auto& [key, unused] : fields) {
        auto a = stored.find(key);
        auto b = wanted.find(key);
        bool same = a != stored.end() && b != wanted.end() && a->second == b->second;
        if (!same) {
            lines.push_back(key + ": " + stored_by + " has " + value_or_none(stored, key) +
                            ", run wants " + value_or_none(wanted, key));
        }
    }
    return lines;
}

void check_fingerprint(const Fingerprint& stored, const Fingerprint& wanted,
                       const std::string& stage, const std::string& where) {
    std::vector<std::string> diff = fingerprint_diff(stored, wanted);
    if (diff.empty()) return;
    std::string name = stage.empty() ? "this stage" : "stage '" + stage + "'";
    std::string message = (where.empty() ? "" : "cache " + where + ": ") + name +
                          " was built with a different fingerprint:";
    for (const auto& line : diff) message += "\n  " + line;
    message += "\nrun with --rebuild to rebuild " + name + " (its cached records are dropped)";
    throw Error::InvalidArgument(message);
}

}  // namespace sf::storage

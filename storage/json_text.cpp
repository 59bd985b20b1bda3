#include "storage/json_text.h"

#include <algorithm>
#include <utility>

namespace sf::storage {
namespace {

using nlohmann::json;

void append_string(const std::string& s, size_t limit, std::string& out) {
    // Only what can show is escaped. The cut may split a UTF-8 character, which `replace`
    // turns into U+FFFD instead of throwing.
    const size_t room = limit + 1 - std::min(out.size(), limit + 1);
    out += json(s.substr(0, room)).dump(-1, ' ', false, json::error_handler_t::replace);
}

// Appends `value` as compact JSON, as dump() writes it, but stops once `out` is longer than
// `limit`. Each level adds a character, so the recursion is at most `limit` deep whatever the
// value's depth.
void append_excerpt(const json& value, size_t limit, std::string& out) {
    if (out.size() > limit) return;
    if (value.is_array()) {
        out += '[';
        for (auto it = value.begin(); it != value.end() && out.size() <= limit; ++it) {
            if (it != value.begin()) out += ',';
            append_excerpt(*it, limit, out);
        }
        out += ']';
    } else if (value.is_object()) {
        out += '{';
        for (auto it = value.begin(); it != value.end() && out.size() <= limit; ++it) {
            if (it != value.begin()) out += ',';
            append_string(it.key(), limit, out);
            out += ':';
            append_excerpt(it.value(), limit, out);
        }
        out += '}';
    } else if (value.is_string()) {
        append_string(value.get_ref<const std::string&>(), limit, out);
    } else {
        out += value.dump();  // a number, a boolean or null: short
    }
}

}  // namespace

std::string text_excerpt(std::string_view text, size_t limit) {
    if (text.size() <= limit) return std::string(text);
    size_t end = limit;
    while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
    return std::string(text.substr(0, end)) + "...";
}

std::string json_excerpt(const json& value, size_t limit) {
    std::string out;
    append_excerpt(value, limit, out);
    return text_excerpt(out, limit);
}

json parse_json(std::string_view text, const std::string& where, ErrorCode code, int max_depth) {
    // Called as each array or object opens, with the number of containers around it.
    const json::parser_callback_t depth_limit = [&](int depth, json::parse_event_t event, json&) {
        if ((event == json::parse_event_t::object_start ||
             event == json::parse_event_t::array_start) &&
            depth >= max_depth) {
            throw Error(
                code, where + ": JSON nested deeper than " + std::to_string(max_depth) + " levels");
        }
        return true;
    };
    try {
        return json::parse(text.begin(), text.end(), depth_limit);
    } catch (const json::exception& e) {
        // The parser quotes the token it stopped in, which may be a whole long string.
        throw Error(code, where + ": not valid JSON: " + text_excerpt(e.what(), 3 * kJsonExcerpt));
    }
}

}  // namespace sf::storage

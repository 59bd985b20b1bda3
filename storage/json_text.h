// The one way the program reads JSON it did not write itself (safetensors headers and indexes,
// configs, state.json, fingerprints, manifests, metadata.jsonl): parsed with a nesting limit, and
// quoted in messages only as a short excerpt. nlohmann's parser and destructor do not recurse,
// but dump() and the code that walks a value do; a hostile file of a million brackets must never
// reach them, and a megabyte value must never be pasted whole into a message.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/error.h"

namespace sf::storage {

// Deeper JSON is refused while parsing: the deepest file the program reads nests 4 levels.
constexpr int kMaxJsonDepth = 64;
// The most characters of a value quoted in a message.
constexpr size_t kJsonExcerpt = 80;

// Parses `text`. On failure throws an sf::Error of `code` naming `where`: "<where>: not valid
// JSON: <the parser's message, cut short>" or "<where>: JSON nested deeper than 64 levels".
nlohmann::json parse_json(std::string_view text, const std::string& where,
                          ErrorCode code = ErrorCode::kInvalidArgument,
                          int max_depth = kMaxJsonDepth);

// `value` as compact JSON text cut to about `limit` characters (then ending in "..."); never
// serialises more than it shows, never recurses deeper than `limit`, never splits a UTF-8
// character, and escapes what is not valid UTF-8.
std::string json_excerpt(const nlohmann::json& value, size_t limit = kJsonExcerpt);

// Untrusted text (a tensor name, a key) for a message: at most `limit` bytes plus "...", cut at
// a UTF-8 character boundary.
std::string text_excerpt(std::string_view text, size_t limit = kJsonExcerpt);

}  // namespace sf::storage

// Checks of flag values shared by the commands: integers checked as text before CLI11 converts
// them (CLI11 turns an integer that overflows into the largest one, and an unsigned flag takes -1
// as 2^64 - 1).
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <string>

namespace sf::tools {

constexpr int64_t kMaxSteps = 1'000'000'000'000;  // a trillion steps: no run gets near it
constexpr int64_t kMaxSeed = INT64_MAX;

// An integer flag's text checked before CLI11 converts it: CLI11 turns an integer that
// overflows into the largest one, and an unsigned flag takes -1 as 2^64 - 1.
inline CLI::Validator integer_in(int64_t lo, int64_t hi) {
    const std::string range =
        hi == INT64_MAX ? fmt::format(">= {}", lo) : fmt::format("in [{}, {}]", lo, hi);
    return CLI::Validator(
        [lo, hi, range](std::string& text) -> std::string {
            int64_t value = 0;
            const char* end = text.data() + text.size();
            const auto [ptr, ec] = std::from_chars(text.data(), end, value);
            const std::string shown = text.size() > 40 ? text.substr(0, 40) + "..." : text;
            if (ec == std::errc() && ptr == end && value >= lo && value <= hi) return "";
            if (ec == std::errc::invalid_argument || (ec == std::errc() && ptr != end)) {
                return fmt::format("{} is not an integer", shown);
            }
            return fmt::format("{} is not {}", shown, range);
        },
        "INT " + range);
}

}  // namespace sf::tools

#include "tools/yaml_config.h"

#include <fmt/format.h>

#include <fstream>
#include <set>

#include "core/error.h"

namespace sf::tools {
namespace {

std::string trim(const std::string& s) {
    const size_t a = s.find_first_not_of(" \t\r");
    if (a == std::string::npos) return {};
    return s.substr(a, s.find_last_not_of(" \t\r") - a + 1);
}

// Drops a '#' comment that is outside quotes and starts a word.
std::string strip_comment(const std::string& s) {
    char quote = 0;
    for (size_t i = 0; i < s.size(); ++i) {
        if (quote != 0) {
            if (s[i] == quote) quote = 0;
        } else if (s[i] == '"' || s[i] == '\'') {
            quote = s[i];
        } else if (s[i] == '#' && (i == 0 || s[i - 1] == ' ' || s[i - 1] == '\t')) {
            return s.substr(0, i);
        }
    }
    return s;
}

std::vector<std::pair<std::string, std::string>> read_flat_yaml(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw Error::NotFound(fmt::format("--config {}: cannot open the file", path));
    std::vector<std::pair<std::string, std::string>> out;
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
        line = strip_comment(line);
        const std::string text = trim(line);
        if (text.empty() || text == "---") continue;
        const size_t colon = text.find(':');
        if (colon == std::string::npos || line.find_first_not_of(" \t") != 0) {
            throw Error::InvalidArgument(
                fmt::format("--config {} line {}: expected 'key: value' at the start of the line",
                            path, number));
        }
        std::string key = trim(text.substr(0, colon));
        std::string value = trim(text.substr(colon + 1));
        if (value.empty() || value.front() == '[' || value.front() == '{') {
            throw Error::InvalidArgument(
                fmt::format("--config {} line {} ({}): only single values are read, no nested "
                            "mappings or lists",
                            path, number, key));
        }
        if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') &&
            value.back() == value.front()) {
            value = value.substr(1, value.size() - 2);
        }
        if (key.rfind("--", 0) == 0) key.erase(0, 2);
        out.emplace_back(key, value);
    }
    return out;
}

}  // namespace

std::vector<std::string> expand_yaml_config(int argc, const char* const* argv) {
    std::vector<std::string> args(argv + 1, argv + argc);
    std::set<std::string> typed;  // flags given on the command line
    for (const auto& a : args) {
        if (a.rfind("--", 0) == 0)
            typed.insert(a.substr(
                2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2));
    }
    std::vector<std::string> out;
    for (size_t i = 0; i < args.size(); ++i) {
        std::string path;
        if (args[i] == "--config") {
            if (i + 1 >= args.size()) throw Error::InvalidArgument("--config needs a file");
            path = args[++i];
        } else if (args[i].rfind("--config=", 0) == 0) {
            path = args[i].substr(9);
        } else {
            out.push_back(args[i]);
            continue;
        }
        for (const auto& [key, value] : read_flat_yaml(path)) {
            if (!typed.count(key)) out.push_back(fmt::format("--{}={}", key, value));
        }
    }
    return out;
}

}  // namespace sf::tools

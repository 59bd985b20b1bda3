#include "tools/cli/yaml_config.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <set>

#include "core/error.h"

namespace sf::tools {
namespace {

// Sections within sections, at most: a config of flags needs one or two.
constexpr int kMaxSectionDepth = 8;

struct Entry {
    std::string key, value;
    int line = 0;  // 1-based
};

[[noreturn]] void fail(const std::string& path, const YAML::Mark& mark, const std::string& what) {
    throw Error::InvalidArgument(fmt::format("--config {} line {}: {}", path, mark.line + 1, what));
}

// A scalar or a list of scalars as a flag's value ("a,b,c").
std::string flag_value(const std::string& path, const std::string& key, const YAML::Node& node) {
    if (node.IsScalar()) return node.Scalar();
    std::string joined;
    for (const YAML::Node& item : node) {
        if (!item.IsScalar()) {
            fail(path, item.Mark(),
                 fmt::format("\"{}\": a list of single values is read, not of lists or mappings",
                             key));
        }
        joined += (joined.empty() ? "" : ",") + item.Scalar();
    }
    return joined;
}

void collect(const std::string& path, const YAML::Node& map, int depth, std::vector<Entry>& out) {
    if (depth > kMaxSectionDepth) {
        fail(path, map.Mark(), fmt::format("sections nested deeper than {}", kMaxSectionDepth));
    }
    for (const auto& kv : map) {
        if (!kv.first.IsScalar()) fail(path, kv.first.Mark(), "a key must be a name");
        std::string key = kv.first.Scalar();
        if (key.rfind("--", 0) == 0) key.erase(0, 2);
        const YAML::Node& value = kv.second;
        if (value.IsNull()) continue;  // the flag's default
        if (value.IsMap()) {
            collect(path, value, depth + 1, out);
            continue;
        }
        out.push_back({key, flag_value(path, key, value), kv.first.Mark().line + 1});
    }
}

std::vector<Entry> read_yaml(const std::string& path) {
    YAML::Node root;
    try {
        root = YAML::LoadFile(path);
    } catch (const YAML::BadFile&) {
        throw Error::NotFound(fmt::format("--config {}: cannot open the file", path));
    } catch (const YAML::Exception& e) {
        fail(path, e.mark, fmt::format("not valid YAML: {}", e.msg));
    }
    std::vector<Entry> out;
    if (root.IsNull()) return out;
    if (!root.IsMap())
        fail(path, root.Mark(), "expected a mapping of flags, 'key: value' per line");
    try {
        collect(path, root, 0, out);
    } catch (const YAML::Exception& e) {
        fail(path, e.mark, e.msg);
    }
    std::map<std::string, int> seen;
    for (const Entry& e : out) {
        const auto [it, fresh] = seen.emplace(e.key, e.line);
        if (!fresh) {
            throw Error::InvalidArgument(
                fmt::format("--config {} line {}: \"{}\" is set twice (first on line {})", path,
                            e.line, e.key, it->second));
        }
    }
    return out;
}

}  // namespace

std::vector<std::string> expand_yaml_config(int argc, const char* const* argv,
                                            ConfigOrigins* origins) {
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
        for (const Entry& e : read_yaml(path)) {
            if (typed.count(e.key)) continue;
            out.push_back(fmt::format("--{}={}", e.key, e.value));
            if (origins != nullptr)
                (*origins)["--" + e.key] = fmt::format("{} line {}", path, e.line);
        }
    }
    return out;
}

}  // namespace sf::tools

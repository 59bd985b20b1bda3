#include "tools/cli/flag_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>

namespace sf::tools {
namespace {

constexpr const char* kNoHub =
    "there is no model hub here: models are read from a local diffusers directory "
    "(--pretrained_model_name_or_path)";
constexpr const char* kNoPush =
    "sanaflow does not upload; it writes OUTPUT_DIR only (upload that folder with "
    "huggingface-cli upload)";
constexpr const char* kNoHubData =
    "hub datasets are not read: give --instance_data_dir (images with same-stem .txt captions "
    "or --instance_prompt) or --manifest";

// Upstream's flags (diffusers v0.33.1 train_dreambooth_lora_sana.py) this tool does not take.
const std::map<std::string, std::string>& refused() {
    static const std::map<std::string, std::string> table = {
        {"push_to_hub", kNoPush},
        {"hub_token", kNoPush},
        {"hub_model_id", kNoPush},
        {"revision", kNoHub},
        {"variant", kNoHub},
        {"dataset_name", kNoHubData},
        {"dataset_config_name", kNoHubData},
        {"image_column", kNoHubData},
        {"adam_weight_decay_text_encoder",
         "the text encoder is not trained here: its embeddings are cached by prep"},
        {"enable_npu_flash_attention", "there is no NPU support: --attention fused uses SDPA"},
    };
    return table;
}

// "--name=value" and "--name" -> "name"; anything else -> "".
std::string long_name(const std::string& arg) {
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) return "";
    return arg.substr(2,
                      arg.find('=') == std::string::npos ? std::string::npos : arg.find('=') - 2);
}

// " (FILE line N)" for a flag that came from a config file, else "".
std::string origin_of(const std::string& flag, const FlagOrigins& origins) {
    const auto it = origins.find(flag);
    return it == origins.end() ? "" : " (" + it->second + ")";
}

}  // namespace

size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    std::iota(row.begin(), row.end(), size_t{0});
    for (size_t i = 1; i <= a.size(); ++i) {
        size_t diagonal = row[0];
        row[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            const size_t up = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
            diagonal = up;
        }
    }
    return row[b.size()];
}

std::vector<std::string> refused_flags(const std::vector<std::string>& args,
                                       const FlagOrigins& origins) {
    std::vector<std::string> lines;
    for (const std::string& arg : args) {
        const auto it = refused().find(long_name(arg));
        if (it != refused().end()) {
            const std::string flag = "--" + it->first;
            lines.push_back(fmt::format("{}{}: {}", flag, origin_of(flag, origins), it->second));
        }
    }
    return lines;
}

std::string unknown_flags_message(const std::vector<std::string>& extras,
                                  const std::vector<std::string>& known,
                                  const FlagOrigins& origins) {
    std::vector<std::string> named;
    for (const std::string& arg : extras) {
        if (arg.size() < 2 || arg[0] != '-' || (arg[1] >= '0' && arg[1] <= '9') || arg[1] == '.')
            continue;  // a value (negative numbers too), not a flag
        const std::string name = arg[1] == '-' ? long_name(arg) : arg.substr(1);
        std::string best;
        size_t best_distance = std::max<size_t>(2, name.size() / 3) + 1;
        for (const std::string& k : known) {
            const size_t d = edit_distance(name, k);
            if (d < best_distance) {
                best_distance = d;
                best = k;
            }
        }
        const std::string flag = arg.substr(0, arg.find('='));
        const std::string shown = flag + origin_of(flag, origins);
        named.push_back(best.empty() ? shown : fmt::format("{} (did you mean --{}?)", shown, best));
    }
    if (named.empty()) return "";
    return fmt::format("unknown flag{}: {}", named.size() > 1 ? "s" : "", fmt::join(named, ", "));
}

}  // namespace sf::tools

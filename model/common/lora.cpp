// The file format, checked against the sources (diffusers main, 2025; peft main):
//  - diffusers/loaders/lora_pipeline.py, SanaLoraLoaderMixin.save_lora_weights:
//    state_dict = pack_weights(transformer_lora_layers, "transformer"), and lora_base.py's
//    _pack_dict_with_prefix makes each key f"transformer.{key}"; write_lora_layers saves
//    safetensors with metadata {"format": "pt"} plus, when given, "lora_adapter_metadata":
//    json.dumps(metadata prefixed "transformer.", indent=2, sort_keys=True).
//  - transformer_lora_layers is peft's get_peft_model_state_dict(transformer)
//    (peft/utils/save_and_load.py): the "lora_" entries of the state dict with the adapter name
//    removed, "...to_q.lora_A.default.weight" -> "...to_q.lora_A.weight".
//  - Loading (diffusers/loaders/peft.py, load_lora_adapter): keys starting with "transformer."
//    are kept and the prefix removed (a dict without such keys is taken as is); the rank is
//    lora_B.shape[1]; without metadata, utils/peft_utils.py get_peft_kwargs sets
//    lora_alpha = r, with metadata LoraConfig(**metadata) is used, and
//    _maybe_raise_error_for_ambiguous_keys reads metadata["rank_pattern"], so it must be there.
// So the keys are "transformer.transformer_blocks.0.attn1.to_q.lora_A.weight" ([rank, in]) and
// "...lora_B.weight" ([out, rank]), and alpha != rank needs the metadata to load right.
#include "model/common/lora.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <shared_mutex>
#include <unordered_map>

#include "core/error.h"
#include "core/shape.h"
#include "model/common/load_report.h"
#include "storage/json_text.h"
#include "storage/safetensors_file.h"
#include "storage/tensor_convert.h"

namespace sf::model {
namespace {

namespace nn = torch::nn;

// diffusers' transformer_name + "." and LORA_ADAPTER_METADATA_KEY.
constexpr const char* kPrefix = "transformer.";
constexpr const char* kMetadataKey = "lora_adapter_metadata";
// save_lora(bake_scale): the alpha the adapters were trained with, before alpha / rank went into
// lora_B.
constexpr const char* kTrainedAlphaKey = "sanaflow.trained_lora_alpha";

struct Adapter {
    // Weak: the table must not keep a dead model's layers alive. `layer` expiring also tells a
    // stale entry from a new layer that happens to get the same address.
    std::weak_ptr<nn::Module> layer;
    std::weak_ptr<nn::LinearImpl> a, b;
    // Shared: find() copies the entry on every forward, which must not copy the target list.
    std::shared_ptr<const LoRAConfig> config;
};

// Adapters by the address of the Linear they belong to. LibTorch modules cannot carry extra
// fields and looking a child up by name copies the children dict, so apply_linear, which runs for
// every projection of every forward, finds its adapter here: one hash lookup under a shared lock.
class AdapterTable {
public:
    static AdapterTable& get() {
        static AdapterTable table;
        return table;
    }

    // The live adapter of `layer`, or nullopt.
    std::optional<Adapter> find(const nn::Module* layer) const {
        std::shared_lock lock(mutex_);
        if (entries_.empty()) return std::nullopt;  // the common case without LoRA
        const auto it = entries_.find(layer);
        if (it == entries_.end() || it->second.layer.expired()) return std::nullopt;
        return it->second;
    }

    void insert(const nn::Module* layer, Adapter adapter) {
        std::unique_lock lock(mutex_);
        // Entries of destroyed models go first, so the table stays as small as the live adapters.
        for (auto it = entries_.begin(); it != entries_.end();) {
            it = it->second.layer.expired() ? entries_.erase(it) : std::next(it);
        }
        entries_[layer] = std::move(adapter);
    }

private:
    mutable std::shared_mutex mutex_;
    std::unordered_map<const nn::Module*, Adapter> entries_;
};

bool matches(const std::string& path, const std::string& target) {
    return path == target ||
           (path.size() > target.size() &&
            path.compare(path.size() - target.size(), target.size(), target) == 0 &&
            path[path.size() - target.size() - 1] == '.');
}

// What a user would write as a target for this path: the last component, or the last two when the
// last is a list index ("to_out.0").
std::string short_name(const std::string& path) {
    const size_t dot = path.rfind('.');
    if (dot == std::string::npos) return path;
    const std::string last = path.substr(dot + 1);
    const bool index = std::all_of(last.begin(), last.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c)) != 0;
    });
    if (!index) return last;
    const size_t before = path.rfind('.', dot - 1);
    return before == std::string::npos ? path : path.substr(before + 1);
}

std::string available_linears(const std::vector<std::string>& linear_paths) {
    std::vector<std::string> names;
    for (const auto& path : linear_paths) {
        std::string name = short_name(path);
        if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
    constexpr size_t kMaxListed = 16;
    std::string out = fmt::format(
        "{}", fmt::join(names.begin(), names.begin() + std::min(names.size(), kMaxListed), ", "));
    if (names.size() > kMaxListed) out += fmt::format(", ... ({} in all)", names.size());
    return out;
}

// Every adapted Linear of `root` with its path, in module order.
std::vector<std::pair<std::string, Adapter>> adapters_of(const nn::Module& root) {
    std::vector<std::pair<std::string, Adapter>> out;
    for (const auto& m : root.named_modules("", /*include_self=*/false)) {
        if (auto adapter = AdapterTable::get().find(m.value().get()))
            out.emplace_back(m.key(), *adapter);
    }
    return out;
}

// peft LoraConfig fields, as diffusers' training scripts store `peft_config.to_dict()`; only the
// fields every peft version with metadata support accepts.
nlohmann::json adapter_metadata(const LoRAConfig& c) {
    nlohmann::json peft;
    peft["r"] = c.rank;
    if (c.alpha == std::floor(c.alpha)) {
        peft["lora_alpha"] = static_cast<int64_t>(c.alpha);
    } else {
        peft["lora_alpha"] = c.alpha;
    }
    peft["lora_dropout"] = c.dropout;
    peft["target_modules"] = c.targets;
    peft["rank_pattern"] = nlohmann::json::object();
    peft["alpha_pattern"] = nlohmann::json::object();
    peft["bias"] = "none";
    peft["use_rslora"] = false;
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [key, value] : peft.items()) out[std::string(kPrefix) + key] = value;
    return out;
}

// A file's rank and alpha that differ from the model's, as error lines.
std::vector<std::string> metadata_conflicts(const std::map<std::string, std::string>& metadata,
                                            const LoRAConfig& model_config,
                                            const std::string& path) {
    const auto it = metadata.find(kMetadataKey);
    if (it == metadata.end()) return {};
    const auto json = storage::parse_json(
        it->second, fmt::format("LoRA file {}: metadata \"{}\"", path, kMetadataKey));
    if (!json.is_object()) {
        throw Error::InvalidArgument(
            fmt::format("LoRA file {}: metadata \"{}\" is not a JSON object", path, kMetadataKey));
    }
    std::vector<std::string> out;
    auto check = [&](const char* field, double ours) {
        const auto value = json.find(std::string(kPrefix) + field);
        if (value == json.end() || !value->is_number()) return;
        if (value->get<double>() != ours) {
            out.push_back(fmt::format("{}{}: file has {}, model has {}", kPrefix, field,
                                      value->get<double>(), ours));
        }
    };
    check("r", static_cast<double>(model_config.rank));
    check("lora_alpha", model_config.alpha);
    return out;
}

}  // namespace

void LoRAConfig::validate(const std::string& where) const {
    auto bad = [&](const std::string& field, const std::string& why) {
        throw Error::InvalidArgument(fmt::format("{}: {} {}", where, field, why));
    };
    if (rank < 1) bad("rank", fmt::format("must be >= 1, got {}", rank));
    if (!(alpha > 0) || !std::isfinite(alpha))
        bad("alpha", fmt::format("must be > 0, got {}", alpha));
    if (targets.empty()) bad("targets", "must name at least one module");
    for (const auto& t : targets) {
        if (t.empty() || t.front() == '.' || t.back() == '.') {
            bad("targets", fmt::format("has an invalid module name \"{}\"", t));
        }
    }
    if (!(dropout >= 0 && dropout < 1))
        bad("dropout", fmt::format("must be in [0, 1), got {}", dropout));
}

int64_t add_lora(nn::Module& root, const LoRAConfig& config) {
    config.validate();
    std::vector<std::string> linear_paths;
    std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> chosen;
    std::vector<std::string> unmatched;
    const auto modules = root.named_modules("", /*include_self=*/false);
    for (const auto& m : modules) {
        if (m.value()->as<nn::Linear>()) linear_paths.push_back(m.key());
        if (AdapterTable::get().find(m.value().get())) {
            throw Error::InvalidArgument(fmt::format(
                "add_lora: the model already has LoRA adapters ({} has one); add them once",
                m.key()));
        }
    }
    for (const auto& target : config.targets) {
        bool found = false;
        for (const auto& m : modules) {
            if (!matches(m.key(), target)) continue;
            found = true;
            if (!m.value()->as<nn::Linear>()) {
                throw Error::InvalidArgument(fmt::format(
                    "add_lora: target \"{}\" matches {}, a {}, not a Linear; Linear names: {}",
                    target, m.key(), m.value()->name(), available_linears(linear_paths)));
            }
            // By identity: two targets may match one layer, and LibTorch's named_modules lists a
            // module registered under two names twice.
            const bool seen = std::any_of(chosen.begin(), chosen.end(), [&](const auto& c) {
                return c.second.get() == m.value().get();
            });
            if (!seen) chosen.emplace_back(m.key(), m.value());
        }
        if (!found) unmatched.push_back(target);
    }
    if (!unmatched.empty()) {
        throw Error::InvalidArgument(
            fmt::format("add_lora: target{} \"{}\" match{} no module; Linear names: {}",
                        unmatched.size() > 1 ? "s" : "", fmt::join(unmatched, "\", \""),
                        unmatched.size() > 1 ? "" : "es", available_linears(linear_paths)));
    }

    const auto shared_config = std::make_shared<const LoRAConfig>(config);
    // Freeze first: the adapters registered below are the only trainable parameters.
    for (auto& p : root.parameters(/*recurse=*/true)) p.requires_grad_(false);
    for (const auto& [path, module] : chosen) {
        auto* linear = module->as<nn::Linear>();
        const at::Tensor& w = linear->weight;  // [out, in]
        const auto options = nn::LinearOptions(w.size(1), config.rank).bias(false);
        auto a = module->register_module("lora_A", nn::Linear(options));
        auto b = module->register_module(
            "lora_B", nn::Linear(nn::LinearOptions(config.rank, w.size(0)).bias(false)));
        a->to(w.device(), w.scalar_type());
        b->to(w.device(), w.scalar_type());
        {
            torch::NoGradGuard no_grad;
            nn::init::kaiming_uniform_(a->weight, std::sqrt(5.0));  // peft's reset_lora_parameters
            nn::init::zeros_(b->weight);
        }
        a->train(linear->is_training());
        b->train(linear->is_training());
        AdapterTable::get().insert(module.get(), Adapter{module, a, b, shared_config});
    }
    return static_cast<int64_t>(chosen.size());
}

bool has_lora(const nn::Linear& layer) { return AdapterTable::get().find(layer.get()).has_value(); }

at::Tensor linear(const nn::Linear& layer, const at::Tensor& x) {
    return at::linear(x, layer->weight, layer->bias);
}

at::Tensor apply_linear(const nn::Linear& layer, const at::Tensor& x) {
    at::Tensor out = linear(layer, x);
    const auto adapter = AdapterTable::get().find(layer.get());
    if (!adapter) return out;
    const auto a = adapter->a.lock();
    const auto b = adapter->b.lock();
    if (!a || !b) return out;  // unreachable while the layer holds its children
    at::Tensor h = x.to(a->weight.scalar_type());
    if (adapter->config->dropout > 0 && layer->is_training()) {
        h = torch::dropout(h, adapter->config->dropout, /*train=*/true);
    }
    const double scale = adapter->config->alpha / static_cast<double>(adapter->config->rank);
    // peft: result + lora_B(lora_A(dropout(x))) * scaling, then back to the result's dtype.
    return (out + b->forward(a->forward(h)) * scale).to(out.scalar_type());
}

std::vector<std::pair<std::string, at::Tensor>> lora_state_dict(const nn::Module& root,
                                                                const std::string& prefix) {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& [path, adapter] : adapters_of(root)) {
        out.emplace_back(prefix + path + ".lora_A.weight", adapter.a.lock()->weight);
        out.emplace_back(prefix + path + ".lora_B.weight", adapter.b.lock()->weight);
    }
    return out;
}

void save_lora(const nn::Module& root, const std::string& path,
               const std::map<std::string, std::string>& metadata, bool bake_scale) {
    const auto adapters = adapters_of(root);
    if (adapters.empty()) {
        throw Error::InvalidArgument(fmt::format(
            "save_lora {}: the model has no LoRA adapters (call add_lora first)", path));
    }
    std::map<std::string, std::string> meta = metadata;
    for (const char* reserved : {"format", kMetadataKey, kTrainedAlphaKey}) {
        if (meta.count(reserved)) {
            throw Error::InvalidArgument(
                fmt::format("save_lora {}: metadata key \"{}\" is written by save_lora itself",
                            path, reserved));
        }
    }
    LoRAConfig written = *adapters.front().second.config;
    auto tensors = lora_state_dict(root, kPrefix);
    if (bake_scale && written.alpha != static_cast<double>(written.rank)) {
        const double scale = written.alpha / static_cast<double>(written.rank);
        torch::NoGradGuard no_grad;
        for (auto& [name, t] : tensors) {
            if (name.size() > 14 && name.compare(name.size() - 14, 14, ".lora_B.weight") == 0)
                t = t.mul(scale);
        }
        meta[kTrainedAlphaKey] = fmt::format("{}", written.alpha);
        written.alpha = static_cast<double>(written.rank);
    }
    meta["format"] = "pt";
    meta[kMetadataKey] = adapter_metadata(written).dump(2);
    storage::write_tensors_file(path, tensors, meta);
}

void load_lora(nn::Module& root, const std::string& path) {
    const auto adapters = adapters_of(root);
    if (adapters.empty()) {
        throw Error::InvalidArgument(fmt::format(
            "load_lora {}: the model has no LoRA adapters (call add_lora with the file's targets "
            "and rank first)",
            path));
    }
    auto file = storage::SafetensorsCheckpoint::open(path);
    const auto names = file.names();
    // Pipeline files carry "transformer."; a model's own save_lora_adapter file does not.
    const bool prefixed = std::any_of(
        names.begin(), names.end(), [](const std::string& n) { return n.rfind(kPrefix, 0) == 0; });
    const auto wanted = lora_state_dict(root, prefixed ? kPrefix : "");

    std::vector<std::string> missing, misshaped, unexpected;
    std::set<std::string> wanted_names;
    for (const auto& [name, tensor] : wanted) {
        wanted_names.insert(name);
        if (!file.contains(name)) {
            missing.push_back(fmt::format("{} {}", name, shape_string(tensor.sizes())));
            continue;
        }
        const auto& shape = file.info(name).shape;
        if (!std::equal(shape.begin(), shape.end(), tensor.sizes().begin(), tensor.sizes().end())) {
            misshaped.push_back(fmt::format("{}: file has {}, model wants {}", name,
                                            shape_string(shape), shape_string(tensor.sizes())));
        }
    }
    for (const auto& name : names) {
        if (!wanted_names.count(name)) unexpected.push_back(name);
    }
    // A file written with bake_scale holds B x alpha / rank and says alpha = rank: into adapters
    // of its trained alpha it loads as B again.
    LoRAConfig expected = *adapters.front().second.config;
    double unbake = 1.0;
    const auto trained_alpha = file.metadata().find(kTrainedAlphaKey);
    if (trained_alpha != file.metadata().end() &&
        trained_alpha->second == fmt::format("{}", expected.alpha)) {
        unbake = static_cast<double>(expected.rank) / expected.alpha;
        expected.alpha = static_cast<double>(expected.rank);
    }
    const auto conflicts = metadata_conflicts(file.metadata(), expected, path);
    if (!missing.empty() || !misshaped.empty() || !unexpected.empty() || !conflicts.empty()) {
        std::string msg = fmt::format("LoRA weights {} do not fit the model's adapters:", path);
        append_list(msg, "missing", missing);
        append_list(msg, "misshaped", misshaped);
        append_list(msg, "unexpected", unexpected);
        append_list(msg, "differing in lora_adapter_metadata", conflicts);
        throw Error::InvalidArgument(msg);
    }

    torch::NoGradGuard no_grad;
    for (const auto& [name, tensor] : wanted) {
        const auto& info = file.info(name);
        at::Tensor target = tensor;  // shares storage with the parameter
        target.copy_(storage::wrap_view({info.dtype, info.shape, file.view(name)}));
        if (unbake != 1.0 && name.size() > 14 &&
            name.compare(name.size() - 14, 14, ".lora_B.weight") == 0)
            target.mul_(unbake);
    }
}

void cast_frozen(nn::Module& root, c10::ScalarType dtype) {
    torch::NoGradGuard no_grad;
    for (auto& p : root.parameters(/*recurse=*/true)) {
        // set_data keeps the Parameter object, so module members and optimizers still point at it.
        if (!p.requires_grad() && p.is_floating_point() && p.scalar_type() != dtype) {
            p.set_data(p.to(dtype));
        }
    }
}

std::vector<std::pair<std::string, at::Tensor>> trainable_parameters(const nn::Module& root) {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& p : root.named_parameters(/*recurse=*/true)) {
        if (p.value().requires_grad()) out.emplace_back(p.key(), p.value());
    }
    return out;
}

}  // namespace sf::model

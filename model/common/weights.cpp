#include "model/common/weights.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/shape.h"
#include "model/common/load_report.h"
#include "storage/safetensors_file.h"
#include "storage/tensor_convert.h"

namespace sf::model {

void append_list(std::string& out, const char* what, const std::vector<std::string>& items) {
    constexpr size_t kMaxListed = 40;  // names per kind; the count is always given
    if (items.empty()) return;
    out += fmt::format("\n  {} {}:", items.size(), what);
    for (size_t i = 0; i < items.size() && i < kMaxListed; ++i) out += "\n    " + items[i];
    if (items.size() > kMaxListed)
        out += fmt::format("\n    ... and {} more", items.size() - kMaxListed);
}

std::vector<std::pair<std::string, at::Tensor>> state_dict(const torch::nn::Module& module) {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& p : module.named_parameters(/*recurse=*/true))
        out.emplace_back(p.key(), p.value());
    for (const auto& b : module.named_buffers(/*recurse=*/true))
        out.emplace_back(b.key(), b.value());
    return out;
}

LoadReport load_weights(torch::nn::Module& module, const std::string& path,
                        const LoadOptions& options) {
    auto checkpoint = storage::SafetensorsCheckpoint::open(path);
    if (options.dtype) module.to(*options.dtype);

    const std::set<std::string> ignored(options.ignore.begin(), options.ignore.end());
    std::vector<std::string> missing, misshaped, unexpected;
    std::set<std::string> wanted;
    const auto tensors = state_dict(module);
    for (const auto& [name, tensor] : tensors) {
        wanted.insert(name);
        if (!checkpoint.contains(name)) {
            missing.push_back(fmt::format("{} {}", name, shape_string(tensor.sizes())));
            continue;
        }
        const auto& info = checkpoint.info(name);
        if (!std::equal(info.shape.begin(), info.shape.end(), tensor.sizes().begin(),
                        tensor.sizes().end())) {
            misshaped.push_back(fmt::format("{}: checkpoint has {}, model wants {}", name,
                                            shape_string(info.shape),
                                            shape_string(tensor.sizes())));
        }
    }
    auto is_ignored = [&](const std::string& name) {
        if (ignored.count(name) != 0) return true;
        for (const std::string& prefix : options.ignore_prefixes) {
            if (name.rfind(prefix, 0) == 0) return true;
        }
        return false;
    };
    for (const std::string& name : checkpoint.names()) {
        if (!wanted.count(name) && !is_ignored(name)) unexpected.push_back(name);
    }
    if (!missing.empty() || !misshaped.empty() || !unexpected.empty()) {
        std::string msg = fmt::format("weights {} do not fit the model:", path);
        append_list(msg, "missing", missing);
        append_list(msg, "misshaped", misshaped);
        append_list(msg, "unexpected", unexpected);
        throw Error::InvalidArgument(msg);
    }

    LoadReport report;
    torch::NoGradGuard no_grad;
    for (const auto& [name, tensor] : tensors) {
        const auto& info = checkpoint.info(name);
        storage::TensorView view{info.dtype, info.shape, checkpoint.view(name)};
        // Copies straight from the mapping, converting dtype and device on the way.
        at::Tensor t = tensor;  // shares storage with the parameter
        t.copy_(storage::wrap_view(view));
        report.tensors += 1;
        report.bytes += static_cast<int64_t>(view.bytes.size());
    }
    return report;
}

void save_weights(const torch::nn::Module& module, const std::string& file,
                  const std::map<std::string, std::string>& metadata) {
    storage::write_tensors_file(file, state_dict(module), metadata);
}

int64_t parameter_count(const torch::nn::Module& module) {
    int64_t n = 0;
    for (const auto& p : module.parameters(/*recurse=*/true)) n += p.numel();
    return n;
}

}  // namespace sf::model

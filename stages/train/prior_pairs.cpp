#include "stages/train/prior_pairs.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>

#include "core/check.h"
#include "core/error.h"

namespace sf::train {

PriorPairs pair_with_class_samples(const std::map<Bucket, std::vector<int64_t>>& instances,
                                   const std::map<Bucket, std::vector<int64_t>>& classes,
                                   int64_t class_limit) {
    // The first class_limit class samples, by index, each in its bucket.
    std::map<Bucket, std::vector<int64_t>> kept = classes;
    if (class_limit > 0) {
        std::vector<int64_t> all;
        for (const auto& [bucket, indices] : classes)
            all.insert(all.end(), indices.begin(), indices.end());
        std::sort(all.begin(), all.end());
        if (static_cast<int64_t>(all.size()) > class_limit) {
            const int64_t last = all[static_cast<size_t>(class_limit - 1)];
            for (auto& [bucket, indices] : kept)
                indices.erase(std::remove_if(indices.begin(), indices.end(),
                                             [last](int64_t i) { return i > last; }),
                              indices.end());
        }
    }
    PriorPairs out;
    std::vector<std::string> uncovered;
    for (const auto& [bucket, inst] : instances) {
        const auto it = kept.find(bucket);
        if (it == kept.end() || it->second.empty()) {
            uncovered.push_back(
                fmt::format("{} ({} instance samples)", bucket.name(), inst.size()));
            continue;
        }
        const std::vector<int64_t>& cls = it->second;
        const size_t count = std::max(inst.size(), cls.size());
        std::vector<int64_t>& mine = out.buckets[bucket];
        for (size_t j = 0; j < count; ++j) {
            mine.push_back(static_cast<int64_t>(out.pairs.size()));
            out.pairs.emplace_back(inst[j % inst.size()], cls[j % cls.size()]);
        }
    }
    if (!uncovered.empty()) {
        throw Error::InvalidArgument(fmt::format(
            "--with_prior_preservation: no class image in the aspect bucket of {} (a batch pairs "
            "instance and class samples of one shape): add class images of that shape to "
            "--class_data_dir, raise --num_class_images so that more are generated (they are made "
            "at the instance buckets' sizes), or use --center_crop (one square bucket, as "
            "upstream)",
            fmt::join(uncovered, ", ")));
    }
    return out;
}

PriorBatch join_prior_batch(const TrainingBatch& instances, const TrainingBatch& classes,
                            double prior_loss_weight) {
    SF_CHECK(!instances.indices.empty() && !classes.indices.empty(), "an empty half of a batch");
    SF_CHECK(instances.latents.sizes().slice(1) == classes.latents.sizes().slice(1),
             "instance and class latents of different shapes");
    const int64_t n = instances.latents.size(0), m = classes.latents.size(0);
    const int64_t longest =
        std::max(instances.prompt_embeds.size(1), classes.prompt_embeds.size(1));
    auto pad = [longest](const at::Tensor& t) {
        if (t.size(1) == longest) return t;
        std::vector<int64_t> shape = t.sizes().vec();
        shape[1] = longest - t.size(1);
        return at::cat({t, at::zeros(shape, t.options())}, 1);
    };
    PriorBatch out;
    out.batch.latents = at::cat({instances.latents, classes.latents});
    out.batch.prompt_embeds = at::cat({pad(instances.prompt_embeds), pad(classes.prompt_embeds)});
    out.batch.prompt_mask = at::cat({pad(instances.prompt_mask), pad(classes.prompt_mask)});
    out.batch.indices = instances.indices;
    const double total = static_cast<double>(n + m);
    out.sample_weights =
        at::cat({at::full({n}, total / static_cast<double>(n), at::kFloat),
                 at::full({m}, prior_loss_weight * total / static_cast<double>(m), at::kFloat)});
    return out;
}

}  // namespace sf::train

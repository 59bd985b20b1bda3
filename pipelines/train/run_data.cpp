// The samples a training run draws: its samplers and their micro-batches (train_setup.h).
#include <fmt/format.h>

#include <set>

#include "core/error.h"
#include "core/log.h"
#include "pipelines/train/train_setup.h"
#include "storage/cache.h"
#include "storage/cache_shards.h"

namespace sf::pipelines::training {

Samplers make_samplers(const TrainOptions& o, const train::TrainingSet& set,
                       const train::TrainingSet* classes) {
    Samplers s;
    const auto buckets = train::repeat_samples(set.buckets(), o.repeats);
    if (classes != nullptr) {
        s.prior = train::pair_with_class_samples(buckets, classes->buckets(), o.num_class_images);
        std::set<int64_t> used;
        for (const auto& [instance, cls] : s.prior->pairs) used.insert(cls);
        log_info(
            "train: prior preservation: {} class samples of {} paired with {} instance samples "
            "({} pairs an epoch), prior loss weight {:g}",
            used.size(), classes->samples().size(), set.samples().size(), s.prior->pairs.size(),
            o.prior_loss_weight);
        s.main =
            std::make_unique<train::BucketSampler>(s.prior->buckets, o.train_batch_size, o.seed);
        return s;
    }
    if (o.joint_training_interval == 0) {
        s.main = std::make_unique<train::BucketSampler>(buckets, o.train_batch_size, o.seed);
        return s;
    }
    const train::FrameSplit split = train::split_by_frames(buckets);
    if (split.videos.empty() || split.images.empty()) {
        throw Error::InvalidArgument(fmt::format(
            "--joint_training_interval {} alternates video windows and images, but the cache {} "
            "holds {}: prep a folder with both through --vae wan",
            o.joint_training_interval, o.cache_dir,
            split.videos.empty() ? "no video windows" : "no images"));
    }
    auto count = [](const std::map<train::Bucket, std::vector<int64_t>>& buckets) {
        size_t n = 0;
        for (const auto& [bucket, indices] : buckets) n += indices.size();
        return n;
    };
    log_info(
        "train: joint image-video: every {} steps a batch of the {} images, else of the {} "
        "video windows",
        o.joint_training_interval, count(split.images) / o.repeats,
        count(split.videos) / o.repeats);
    s.main = std::make_unique<train::BucketSampler>(split.videos, o.train_batch_size, o.seed);
    // Its own sequence: seeded apart from the video sampler's and the data generator's (seed + 1).
    s.images = std::make_unique<train::BucketSampler>(split.images, o.train_batch_size, o.seed + 2);
    return s;
}

int64_t steps_per_epoch(const TrainOptions& o, const Samplers& samplers) {
    const int64_t batches = samplers.main->batches_per_epoch();
    return std::max<int64_t>(
        1, (batches + o.gradient_accumulation_steps - 1) / o.gradient_accumulation_steps);
}

std::optional<train::TrainingSet> open_class_samples(const TrainOptions& o,
                                                     const train::TrainingSet& set) {
    if (o.class_cache_dir.empty()) return std::nullopt;
    // The class cache, or every shard of it when a launch prepped it.
    std::vector<storage::Cache> shards;
    for (const auto& dir : storage::cache_shard_dirs(o.class_cache_dir))
        shards.push_back(storage::Cache::open(dir, /*create=*/false));
    train::TrainingSet classes = train::TrainingSet::open(shards, o.skip_corrupt);
    if (set.latent_rank() != 3) {
        throw Error::InvalidArgument(
            "--with_prior_preservation is for image caches (DC-AE latents): " + o.cache_dir +
            " holds video latents");
    }
    if (classes.latent_rank() != set.latent_rank() ||
        classes.latent_channels() != set.latent_channels() ||
        classes.latent_downsample() != set.latent_downsample() ||
        classes.text_hidden() != set.text_hidden()) {
        throw Error::InvalidArgument(fmt::format(
            "the class cache {} was encoded otherwise than {} (latents of {} channels at 1/{} "
            "against {} at 1/{}, captions {} wide against {}): prep both with the same models",
            o.class_cache_dir, o.cache_dir, classes.latent_channels(), classes.latent_downsample(),
            set.latent_channels(), set.latent_downsample(), classes.text_hidden(),
            set.text_hidden()));
    }
    return classes;
}

train::MicroBatch draw_micro_batch(const TrainOptions& o, const RunData& data, Samplers& samplers,
                                   int64_t step, at::Generator& gen, int64_t& samples) {
    for (;;) {
        const std::vector<int64_t> drawn = samplers.next(step, o.joint_training_interval);
        if (!samplers.prior) {
            const train::TrainingBatch b = data.set.load(drawn, o.caption_dropout, gen);
            if (b.indices.empty()) continue;
            samples += static_cast<int64_t>(b.indices.size());
            return train::MicroBatch{b.latents, b.prompt_embeds, b.prompt_mask};
        }
        std::vector<int64_t> instances, classes;
        for (const int64_t pair : drawn) {
            const auto& [instance, cls] = samplers.prior->pairs.at(static_cast<size_t>(pair));
            instances.push_back(instance);
            classes.push_back(cls);
        }
        const train::TrainingBatch b = data.set.load(instances, o.caption_dropout, gen);
        const train::TrainingBatch c = data.classes->load(classes, o.caption_dropout, gen);
        if (b.indices.empty() || c.indices.empty()) continue;
        samples += static_cast<int64_t>(b.indices.size() + c.indices.size());
        const train::PriorBatch joined = train::join_prior_batch(b, c, o.prior_loss_weight);
        return train::MicroBatch{joined.batch.latents, joined.batch.prompt_embeds,
                                 joined.batch.prompt_mask, joined.sample_weights};
    }
}

}  // namespace sf::pipelines::training

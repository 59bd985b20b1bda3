// What training reads from a cache: the samples of the last prep, their latents and caption
// features, batched one aspect bucket at a time by a seeded sampler whose position is part of a
// checkpoint.
//
// The sample list is the manifest prep writes at its end (storage/cache_schema.h: the keys of
// every sample of that run, rejects excluded). Without it (a cache from an older prep) every
// sample record is used. A sample whose latent or text record is missing is left out with a
// warning naming how many, so a cache that a crash left partial still trains on what it has.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "storage/cache.h"
#include "storage/cache_schema.h"

namespace sf::train {

using storage::schema::Bucket;

struct TrainingSample {
    std::string sample_key, latent_key, text_key;
    Bucket bucket;
    size_t shard = 0;  // the cache it is in, an index into the shards open() was given
};

struct TrainingBatch {
    at::Tensor latents;        // [B, C, h, w] for images, [B, C, f, h, w] for video windows
    at::Tensor prompt_embeds;  // [B, L, hidden], zero-padded to the longest caption in the batch
    at::Tensor prompt_mask;    // [B, L] int64, 1 for a token
    std::vector<int64_t> indices;  // into TrainingSet::samples()
};

class TrainingSet {
public:
    // kNotFound when the cache has no samples, latents or text db; kInvalidArgument when no
    // sample is complete; kCorruption when a sample the manifest lists is damaged (its record,
    // its latent or its text missing or undecodable), unless `skip_damaged` leaves such samples
    // out (counted by damaged()).
    static TrainingSet open(const storage::Cache& cache, bool skip_damaged = false);
    // The samples of several caches (the shards that data-parallel prep writes, one per rank),
    // in shard order; a sample found in two shards is taken once. Each sample's latent and text
    // records are read from its own shard.
    static TrainingSet open(const std::vector<storage::Cache>& shards, bool skip_damaged = false);

    const std::vector<TrainingSample>& samples() const { return samples_; }
    // Samples left out as damaged (with skip_damaged): those open() found, and those whose latent
    // or text record load() could not decode.
    int64_t damaged() const { return damaged_ + static_cast<int64_t>(damaged_in_load_.size()); }
    // bucket -> indices into samples(), buckets in name order.
    const std::map<Bucket, std::vector<int64_t>>& buckets() const { return buckets_; }
    int64_t latent_channels() const { return latent_channels_; }
    // Dimensions of one sample's latent: 3 for an image [C, h, w], 4 for a video window
    // [C, f, h, w] (what the video VAE makes, of images too: one-frame videos).
    int64_t latent_rank() const { return latent_rank_; }
    int64_t text_hidden() const { return text_hidden_; }
    // Pixels per latent cell (32 for DC-AE, 8 for the Wan VAE), from the first sample's bucket.
    int64_t latent_downsample() const { return latent_downsample_; }
    // The most caption tokens a sample may have: the text encoder's padded length as prep
    // recorded it (the first caption's length when the record does not say).
    int64_t max_caption_tokens() const { return max_caption_tokens_; }
    // XXH3-128 of every sample's keys, in order. The keys are content keys of the source bytes
    // and every encoder setting, so two sets hash alike only when they hold the same samples
    // encoded the same way (same resolution, same encoder weights).
    std::string content_hash() const;
    // The empty prompt's features [n, hidden], or undefined when prep did not store them.
    const at::Tensor& empty_prompt() const { return empty_prompt_; }
    // A --validation_prompt's features [n, hidden] as prep stored them
    // (schema::validation_prompt_key), from the first shard that has them; undefined when none
    // has. kCorruption when the record does not decode.
    at::Tensor validation_prompt(const std::string& prompt) const;

    // Reads and stacks the samples at `indices` (one bucket). With `caption_dropout` > 0, each
    // caption is replaced by the empty prompt with that probability, drawn from `gen`. A record
    // that fails to decode is kCorruption naming it, unless the set was opened with skip_damaged:
    // then the sample is left out of this and every later batch (counted by damaged()), and a
    // batch of nothing but damaged samples comes back with no indices (draw the next one).
    // kCorruption when every sample has turned out damaged.
    TrainingBatch load(const std::vector<int64_t>& indices, double caption_dropout,
                       at::Generator& gen) const;

private:
    // What open() counts over the shards.
    struct OpenTally {
        int64_t listed = 0, incomplete = 0;
        std::string first_damage;
    };
    TrainingSet() = default;
    // Reads one cache's samples (skipped when it is an empty shard of `several`), leaving out the
    // damaged (counted in damaged_) and, without a manifest, the incomplete ones.
    void add_shard(storage::Cache c, bool several, std::set<std::string>& seen, OpenTally& tally);
    // The latent's channels, rank and downsampling and the captions' width and length, from the
    // first sample.
    void read_shapes();
    std::vector<std::shared_ptr<storage::Cache>> shards_;
    std::vector<TrainingSample> samples_;
    std::map<Bucket, std::vector<int64_t>> buckets_;
    int64_t latent_channels_ = 0, latent_rank_ = 0, text_hidden_ = 0;
    int64_t latent_downsample_ = 1, max_caption_tokens_ = 0;
    int64_t damaged_ = 0;
    bool skip_damaged_ = false;
    // Indices into samples_ found damaged while training: load() is called from the training
    // loop only, one batch at a time.
    mutable std::set<int64_t> damaged_in_load_;
    at::Tensor empty_prompt_;
};

// The buckets of one-frame windows (images, as the video VAE encodes them) and of longer windows,
// for joint image-video training.
struct FrameSplit {
    std::map<Bucket, std::vector<int64_t>> videos, images;
};
FrameSplit split_by_frames(const std::map<Bucket, std::vector<int64_t>>& buckets);

// Every bucket's samples `times` times over (upstream's --repeats): a sampler over the result hands
// out each sample `times` times per epoch, shuffled with the others. kInvalidArgument naming
// --repeats for times < 1.
std::map<Bucket, std::vector<int64_t>> repeat_samples(
    const std::map<Bucket, std::vector<int64_t>>& buckets, int64_t times);

// Batches of one bucket each. An epoch shuffles every bucket's samples, cuts them into batches
// of `batch_size` (a bucket's last batch may be smaller) and shuffles the order of all batches;
// both shuffles are seeded by (seed, epoch), so the sequence is a function of the seed alone and
// a position (epoch, batch) restores it exactly.
class BucketSampler {
public:
    BucketSampler(const std::map<Bucket, std::vector<int64_t>>& buckets, int64_t batch_size,
                  uint64_t seed);

    std::vector<int64_t> next();  // the next batch, moving into the next epoch when one ends

    struct Position {
        int64_t epoch = 0;
        int64_t batch = 0;  // batches of this epoch already handed out
    };
    Position position() const { return {epoch_, cursor_}; }
    void seek(Position position);
    int64_t batches_per_epoch() const { return static_cast<int64_t>(order_.size()); }

private:
    void plan_epoch();
    std::vector<std::vector<int64_t>> buckets_;
    int64_t batch_size_;
    uint64_t seed_;
    int64_t epoch_ = 0, cursor_ = 0;
    std::vector<std::vector<int64_t>> order_;  // this epoch's batches
};

}  // namespace sf::train

#include "stages/train/train_data.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <random>
#include <set>

#include "core/check.h"
#include "core/error.h"
#include "core/log.h"
#include "storage/cache_reader.h"
#include "storage/tensor_convert.h"
#include "storage/xxh3.h"

namespace sf::train {
namespace {

namespace schema = storage::schema;

at::Tensor tensor_of(const storage::Record& r, const char* name, const std::string& where) {
    return storage::from_tensor_data(schema::required_tensor(r, name, where));
}

// Fisher-Yates over a 64-bit Mersenne Twister: the engine's output is fixed by the standard (the
// distributions are not), so the order is the same with every standard library.
template <typename T>
void seeded_shuffle(std::vector<T>& v, std::mt19937_64& rng) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng() % i]);
}

}  // namespace

TrainingSet TrainingSet::open(const storage::Cache& cache, bool skip_damaged) {
    return open(std::vector<storage::Cache>{cache}, skip_damaged);
}

std::string TrainingSet::content_hash() const {
    storage::XXH3Hasher hasher;
    for (const TrainingSample& s : samples_) {
        for (const std::string* key : {&s.sample_key, &s.latent_key, &s.text_key}) {
            hasher.update_u64(key->size()).update(*key);
        }
    }
    return hasher.hex();
}

at::Tensor TrainingSet::validation_prompt(const std::string& prompt) const {
    const std::string key = schema::validation_prompt_key(prompt);
    for (const auto& shard : shards_) {
        const storage::CacheReader texts(*shard, schema::kTextDb);
        if (auto record = texts.get(key)) return tensor_of(*record, schema::kPromptEmbeds, key);
    }
    return {};
}

TrainingSet TrainingSet::open(const std::vector<storage::Cache>& shards, bool skip_damaged) {
    SF_CHECK(!shards.empty(), "a training set of no cache");
    TrainingSet set;
    set.skip_damaged_ = skip_damaged;
    std::set<std::string> seen;  // a sample in two shards (prep run twice) is trained on once
    OpenTally tally;
    for (const storage::Cache& c : shards) set.add_shard(c, shards.size() > 1, seen, tally);
    if (set.damaged_ > 0) {
        if (!skip_damaged) {
            throw Error::Corruption(fmt::format(
                "{} of {} samples of the cache are damaged (first: {}): `sanaflow inspect {} "
                "--verify` lists them; rerun prep to repair them, or train without them with "
                "--skip_corrupt",
                set.damaged_, tally.listed, tally.first_damage, shards.front().dir()));
        }
        log_warn("train: --skip_corrupt: {} of {} samples are damaged and left out (first: {})",
                 set.damaged_, tally.listed, tally.first_damage);
    }
    if (tally.incomplete > 0) {
        log_warn(
            "train: {} of {} samples lack a latent or text record and are left out (rerun prep to "
            "complete them)",
            tally.incomplete, tally.listed);
    }
    if (set.samples_.empty()) {
        throw Error::InvalidArgument(fmt::format(
            "cache {}: no sample with both a latent and a text record", shards.front().dir()));
    }
    set.read_shapes();
    return set;
}

void TrainingSet::add_shard(storage::Cache c, bool several, std::set<std::string>& seen,
                            OpenTally& tally) {
    const auto manifest =
        storage::CacheReader(c, schema::kManifestDb).get(schema::kManifestSamplesKey);
    std::vector<std::string> keys;
    if (manifest) keys = schema::manifest_keys(*manifest, c.dir() + "/" + schema::kManifestDb);
    // A shard of a sharded prep whose share of the dataset was empty: nothing to read.
    if (manifest && keys.empty() && several) return;
    for (const char* db : {schema::kSamplesDb, schema::kLatentsDb, schema::kTextDb}) {
        if (!c.find_db(db)) {
            throw Error::NotFound(fmt::format(
                "cache {} has no '{}' records: run sanaflow prep on it first", c.dir(), db));
        }
    }
    const size_t index = shards_.size();  // in shards_: empty shards are left out
    shards_.push_back(std::make_shared<storage::Cache>(c));
    const storage::CacheSnapshot samples = storage::CacheReader(c, schema::kSamplesDb).snapshot();
    const storage::CacheSnapshot latents = storage::CacheReader(c, schema::kLatentsDb).snapshot();
    const storage::CacheSnapshot texts = storage::CacheReader(c, schema::kTextDb).snapshot();

    bool from_manifest = true;
    if (!manifest) {
        log_warn(
            "train: cache {} has no manifest (prep before this version?): training on every "
            "sample record",
            c.dir());
        from_manifest = false;
        samples.for_each([&](std::string_view key, std::string_view) { keys.emplace_back(key); });
    }
    tally.listed += static_cast<int64_t>(keys.size());
    // Prep lists a sample in the manifest once its records are all written: one that is not
    // whole now was damaged. Without a manifest, a sample may be incomplete (prep cut off).
    auto left_out = [&](const std::string& why) {
        ++damaged_;
        if (tally.first_damage.empty()) tally.first_damage = why;
    };
    for (const auto& key : keys) {
        const std::string where = c.dir() + "/" + schema::kSamplesDb + "/" + key;
        std::optional<storage::Record> record;
        std::optional<schema::SampleRecord> sample;
        try {
            record = samples.get(key);
            if (record) sample = schema::SampleRecord::from_record(*record, where);
        } catch (const Error& e) {
            left_out(e.message());
            continue;
        }
        if (!record) {
            if (from_manifest) {
                left_out(where + ": the manifest lists it, but it is missing");
            } else {
                ++tally.incomplete;
            }
            continue;
        }
        TrainingSample s{key, sample->latent_key, sample->text_key, sample->bucket, index};
        if (!latents.contains(s.latent_key) || !texts.contains(s.text_key)) {
            if (from_manifest) {
                left_out(fmt::format("{}: its {} record {} is missing", where,
                                     latents.contains(s.latent_key) ? "text" : "latent",
                                     latents.contains(s.latent_key) ? s.text_key : s.latent_key));
            } else {
                ++tally.incomplete;
            }
            continue;
        }
        if (!seen.insert(key).second) continue;
        buckets_[s.bucket].push_back(static_cast<int64_t>(samples_.size()));
        samples_.push_back(std::move(s));
    }
    if (!empty_prompt_.defined()) {
        if (auto empty = texts.get(schema::kEmptyPromptKey)) {
            empty_prompt_ = tensor_of(*empty, schema::kPromptEmbeds, schema::kEmptyPromptKey);
        }
    }
}

void TrainingSet::read_shapes() {
    const TrainingSample& first = samples_.front();
    const storage::Cache& c = *shards_[first.shard];
    const at::Tensor latent =
        tensor_of(*storage::CacheReader(c, schema::kLatentsDb).get(first.latent_key),
                  schema::kLatent, first.latent_key);
    if (latent.dim() != 3 && latent.dim() != 4) {
        throw Error::Corruption(
            fmt::format("{}/{}/{}: a latent of {} dimensions; training reads [C, h, w] (images) or "
                        "[C, f, h, w] (video windows)",
                        c.dir(), schema::kLatentsDb, first.latent_key, latent.dim()));
    }
    latent_channels_ = latent.size(0);
    latent_rank_ = latent.dim();
    latent_downsample_ = std::max<int64_t>(1, first.bucket.height / latent.size(-2));
    const storage::Record text = *storage::CacheReader(c, schema::kTextDb).get(first.text_key);
    const at::Tensor embeds = tensor_of(text, schema::kPromptEmbeds, first.text_key);
    text_hidden_ = embeds.size(1);
    max_caption_tokens_ = embeds.size(0);
    if (auto it = text.metadata.find(schema::kMaxLength); it != text.metadata.end()) {
        try {
            max_caption_tokens_ = std::max<int64_t>(embeds.size(0), std::stoll(it->second));
        } catch (const std::exception&) {
            // A text record with a damaged max_length: its own length is the bound.
        }
    }
}

TrainingBatch TrainingSet::load(const std::vector<int64_t>& indices, double caption_dropout,
                                at::Generator& gen) const {
    SF_CHECK(!indices.empty(), "an empty batch");
    // One read snapshot of each shard the batch touches.
    std::map<size_t, std::pair<storage::CacheSnapshot, storage::CacheSnapshot>> snapshots;
    std::vector<at::Tensor> lat, txt;
    std::vector<int64_t> kept;
    for (int64_t i : indices) {
        if (damaged_in_load_.count(i) != 0) continue;
        const TrainingSample& s = samples_.at(static_cast<size_t>(i));
        auto it = snapshots.find(s.shard);
        if (it == snapshots.end()) {
            const storage::Cache& shard = *shards_.at(s.shard);
            it = snapshots
                     .emplace(
                         s.shard,
                         std::make_pair(storage::CacheReader(shard, schema::kLatentsDb).snapshot(),
                                        storage::CacheReader(shard, schema::kTextDb).snapshot()))
                     .first;
        }
        const std::string latent_where = std::string(schema::kLatentsDb) + "/" + s.latent_key;
        const std::string text_where = std::string(schema::kTextDb) + "/" + s.text_key;
        at::Tensor latent, text;
        try {
            auto l = it->second.first.get(s.latent_key);
            if (!l) throw Error::Corruption(latent_where + ": the record vanished");
            latent = tensor_of(*l, schema::kLatent, latent_where).to(at::kFloat);
            auto t = it->second.second.get(s.text_key);
            if (!t) throw Error::Corruption(text_where + ": the record vanished");
            text = tensor_of(*t, schema::kPromptEmbeds, text_where).to(at::kFloat);
        } catch (const Error& e) {
            if (!skip_damaged_) {
                throw Error::Corruption(fmt::format(
                    "sample {} is damaged: {} (`sanaflow inspect {} --verify` lists every "
                    "damaged record; rerun prep to repair them, or train without them with "
                    "--skip_corrupt)",
                    s.sample_key, e.message(), shards_.at(s.shard)->dir()));
            }
            log_warn("train: --skip_corrupt: sample {} left out: {}", s.sample_key, e.message());
            damaged_in_load_.insert(i);
            if (damaged_in_load_.size() == samples_.size()) {
                throw Error::Corruption(fmt::format(
                    "every sample of the cache is damaged (the last: {})", e.message()));
            }
            continue;
        }
        lat.push_back(std::move(latent));
        txt.push_back(std::move(text));
        kept.push_back(i);
    }
    if (kept.empty()) return TrainingBatch{};  // all damaged: the caller draws the next batch
    if (caption_dropout > 0) {
        if (!empty_prompt_.defined()) {
            throw Error::InvalidArgument(
                "--caption_dropout needs the empty prompt's features in the cache: rerun prep");
        }
        const at::Tensor draw = at::rand({static_cast<int64_t>(kept.size())}, gen,
                                         at::TensorOptions().dtype(at::kFloat));
        for (size_t i = 0; i < txt.size(); ++i) {
            if (draw[static_cast<int64_t>(i)].item<float>() < caption_dropout)
                txt[i] = empty_prompt_.to(at::kFloat);
        }
    }
    int64_t longest = 0;
    for (const auto& t : txt) longest = std::max(longest, t.size(0));
    const auto n = static_cast<int64_t>(kept.size());
    TrainingBatch batch;
    batch.latents = at::stack(lat);  // one bucket: every latent has the same shape
    batch.prompt_embeds = at::zeros({n, longest, txt.front().size(1)}, at::kFloat);
    batch.prompt_mask = at::zeros({n, longest}, at::kLong);
    for (int64_t i = 0; i < n; ++i) {
        const int64_t len = txt[static_cast<size_t>(i)].size(0);
        batch.prompt_embeds[i].slice(0, 0, len).copy_(txt[static_cast<size_t>(i)]);
        batch.prompt_mask[i].slice(0, 0, len).fill_(1);
    }
    batch.indices = std::move(kept);
    return batch;
}

FrameSplit split_by_frames(const std::map<Bucket, std::vector<int64_t>>& buckets) {
    FrameSplit split;
    for (const auto& [bucket, indices] : buckets)
        (bucket.frames > 1 ? split.videos : split.images)[bucket] = indices;
    return split;
}

std::map<Bucket, std::vector<int64_t>> repeat_samples(
    const std::map<Bucket, std::vector<int64_t>>& buckets, int64_t times) {
    if (times < 1)
        throw Error::InvalidArgument(fmt::format("--repeats must be >= 1, got {}", times));
    constexpr int64_t kMost = 100'000'000;  // 800 MB of indices
    int64_t samples = 0;
    for (const auto& [bucket, indices] : buckets) samples += static_cast<int64_t>(indices.size());
    if (samples > kMost / times) {
        throw Error::InvalidArgument(fmt::format(
            "--repeats {} over {} samples is more than {} per epoch", times, samples, kMost));
    }
    std::map<Bucket, std::vector<int64_t>> out;
    for (const auto& [bucket, indices] : buckets) {
        std::vector<int64_t>& all = out[bucket];
        all.reserve(indices.size() * static_cast<size_t>(times));
        for (int64_t i = 0; i < times; ++i) all.insert(all.end(), indices.begin(), indices.end());
    }
    return out;
}

BucketSampler::BucketSampler(const std::map<Bucket, std::vector<int64_t>>& buckets,
                             int64_t batch_size, uint64_t seed)
    : batch_size_(batch_size), seed_(seed) {
    if (batch_size < 1)
        throw Error::InvalidArgument(
            fmt::format("--train_batch_size must be >= 1, got {}", batch_size));
    for (const auto& [name, indices] : buckets) buckets_.push_back(indices);
    SF_CHECK(!buckets_.empty(), "a sampler over no samples");
    plan_epoch();
}

void BucketSampler::plan_epoch() {
    std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(epoch_));
    order_.clear();
    for (auto indices : buckets_) {
        seeded_shuffle(indices, rng);
        for (size_t i = 0; i < indices.size(); i += static_cast<size_t>(batch_size_)) {
            const size_t end = std::min(indices.size(), i + static_cast<size_t>(batch_size_));
            order_.emplace_back(indices.begin() + static_cast<std::ptrdiff_t>(i),
                                indices.begin() + static_cast<std::ptrdiff_t>(end));
        }
    }
    seeded_shuffle(order_, rng);
}

std::vector<int64_t> BucketSampler::next() {
    if (cursor_ >= static_cast<int64_t>(order_.size())) {
        ++epoch_;
        cursor_ = 0;
        plan_epoch();
    }
    return order_[static_cast<size_t>(cursor_++)];
}

void BucketSampler::seek(Position position) {
    if (position.epoch < 0 || position.batch < 0)
        throw Error::InvalidArgument("sampler position must be >= 0");
    epoch_ = position.epoch;
    cursor_ = position.batch;
    plan_epoch();
}

}  // namespace sf::train

#include "stages/train_data.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "core/check.h"
#include "core/error.h"
#include "core/log.h"
#include "storage/cache_reader.h"
#include "storage/tensor_convert.h"

namespace sf {
namespace {

constexpr const char* kSamplesDb = "samples";
constexpr const char* kLatentsDb = "latents";
constexpr const char* kTextDb = "text";

std::string meta_of(const storage::Record& r, const char* key, const std::string& where) {
    auto it = r.metadata.find(key);
    if (it == r.metadata.end()) throw Error::Corruption(fmt::format("{}: metadata '{}' missing", where, key));
    return it->second;
}

at::Tensor tensor_of(const storage::Record& r, const char* name, const std::string& where) {
    auto it = r.tensors.find(name);
    if (it == r.tensors.end()) throw Error::Corruption(fmt::format("{}: tensor '{}' missing", where, name));
    return storage::from_tensor_data(it->second);
}

// Fisher-Yates over a 64-bit Mersenne Twister: the engine's output is fixed by the standard (the
// distributions are not), so the order is the same with every standard library.
template <typename T>
void seeded_shuffle(std::vector<T>& v, std::mt19937_64& rng) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng() % i]);
}

}  // namespace

storage::Record manifest_record(const std::vector<std::string>& sample_keys) {
    std::string joined;
    for (const auto& k : sample_keys) {
        joined += k;
        joined += '\n';
    }
    storage::TensorData keys;
    keys.dtype = storage::DType::kU8;
    keys.shape = {static_cast<int64_t>(joined.size())};
    keys.bytes = std::move(joined);
    storage::Record r;
    r.tensors["keys"] = std::move(keys);
    r.metadata["count"] = std::to_string(sample_keys.size());
    r.metadata[storage::record_meta::kStage] = "prep";
    return r;
}

std::vector<std::string> manifest_keys(const storage::Record& record, const std::string& where) {
    auto it = record.tensors.find("keys");
    if (it == record.tensors.end()) throw Error::Corruption(where + ": manifest without 'keys'");
    std::vector<std::string> keys;
    const std::string& bytes = it->second.bytes;
    size_t start = 0;
    for (size_t i = 0; i < bytes.size(); ++i) {
        if (bytes[i] != '\n') continue;
        keys.push_back(bytes.substr(start, i - start));
        start = i + 1;
    }
    return keys;
}

TrainingSet TrainingSet::open(const storage::Cache& cache) {
    storage::Cache c = cache;
    for (const char* db : {kSamplesDb, kLatentsDb, kTextDb}) {
        if (!c.find_db(db)) {
            throw Error::NotFound(fmt::format("cache {} has no '{}' records: run sanaflow prep on it first", c.dir(), db));
        }
    }
    TrainingSet set;
    set.cache_ = std::make_shared<storage::Cache>(c);
    const storage::CacheSnapshot samples = storage::CacheReader(c, kSamplesDb).snapshot();
    const storage::CacheSnapshot latents = storage::CacheReader(c, kLatentsDb).snapshot();
    const storage::CacheSnapshot texts = storage::CacheReader(c, kTextDb).snapshot();

    std::vector<std::string> keys;
    if (auto manifest = storage::CacheReader(c, kManifestDb).get(kManifestSamplesKey)) {
        keys = manifest_keys(*manifest, c.dir() + "/manifest");
    } else {
        log_warn("train: cache {} has no manifest (prep before this version?): training on every sample record", c.dir());
        samples.for_each([&](std::string_view key, std::string_view) { keys.emplace_back(key); });
    }
    int64_t incomplete = 0;
    for (const auto& key : keys) {
        auto record = samples.get(key);
        if (!record) {
            ++incomplete;
            continue;
        }
        const std::string where = "samples/" + key;
        TrainingSample s{key, meta_of(*record, "latent_key", where), meta_of(*record, "text_key", where),
                         meta_of(*record, storage::record_meta::kBucket, where)};
        if (!latents.contains(s.latent_key) || !texts.contains(s.text_key)) {
            ++incomplete;
            continue;
        }
        set.buckets_[s.bucket].push_back(static_cast<int64_t>(set.samples_.size()));
        set.samples_.push_back(std::move(s));
    }
    if (incomplete > 0) {
        log_warn("train: {} of {} samples lack a latent or text record and are left out (rerun prep to complete them)",
                 incomplete, keys.size());
    }
    if (set.samples_.empty()) {
        throw Error::InvalidArgument(fmt::format("cache {}: no sample with both a latent and a text record", c.dir()));
    }
    const TrainingSample& first = set.samples_.front();
    set.latent_channels_ = tensor_of(*latents.get(first.latent_key), "latent", first.latent_key).size(0);
    set.text_hidden_ = tensor_of(*texts.get(first.text_key), "prompt_embeds", first.text_key).size(1);
    if (auto empty = texts.get(kEmptyPromptKey)) set.empty_prompt_ = tensor_of(*empty, "prompt_embeds", kEmptyPromptKey);
    return set;
}

TrainingBatch TrainingSet::load(const std::vector<int64_t>& indices, double caption_dropout, at::Generator& gen) const {
    SF_CHECK(!indices.empty(), "an empty batch");
    const storage::CacheSnapshot latents = storage::CacheReader(*cache_, kLatentsDb).snapshot();
    const storage::CacheSnapshot texts = storage::CacheReader(*cache_, kTextDb).snapshot();
    std::vector<at::Tensor> lat, txt;
    for (int64_t i : indices) {
        const TrainingSample& s = samples_.at(static_cast<size_t>(i));
        auto l = latents.get(s.latent_key);
        auto t = texts.get(s.text_key);
        if (!l || !t) throw Error::NotFound(fmt::format("sample {}: its latent or text record vanished", s.sample_key));
        lat.push_back(tensor_of(*l, "latent", "latents/" + s.latent_key).to(at::kFloat));
        txt.push_back(tensor_of(*t, "prompt_embeds", "text/" + s.text_key).to(at::kFloat));
    }
    if (caption_dropout > 0) {
        if (!empty_prompt_.defined()) {
            throw Error::InvalidArgument("--caption_dropout needs the empty prompt's features in the cache: rerun prep");
        }
        const at::Tensor draw = at::rand({static_cast<int64_t>(indices.size())}, gen, at::TensorOptions().dtype(at::kFloat));
        for (size_t i = 0; i < txt.size(); ++i) {
            if (draw[static_cast<int64_t>(i)].item<float>() < caption_dropout) txt[i] = empty_prompt_.to(at::kFloat);
        }
    }
    int64_t longest = 0;
    for (const auto& t : txt) longest = std::max(longest, t.size(0));
    const auto n = static_cast<int64_t>(indices.size());
    TrainingBatch batch;
    batch.latents = at::stack(lat);  // one bucket: every latent has the same shape
    batch.prompt_embeds = at::zeros({n, longest, txt.front().size(1)}, at::kFloat);
    batch.prompt_mask = at::zeros({n, longest}, at::kLong);
    for (int64_t i = 0; i < n; ++i) {
        const int64_t len = txt[static_cast<size_t>(i)].size(0);
        batch.prompt_embeds[i].slice(0, 0, len).copy_(txt[static_cast<size_t>(i)]);
        batch.prompt_mask[i].slice(0, 0, len).fill_(1);
    }
    batch.indices = indices;
    return batch;
}

BucketSampler::BucketSampler(const std::map<std::string, std::vector<int64_t>>& buckets, int64_t batch_size,
                             uint64_t seed)
    : batch_size_(batch_size), seed_(seed) {
    if (batch_size < 1) throw Error::InvalidArgument(fmt::format("--train_batch_size must be >= 1, got {}", batch_size));
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
    if (position.epoch < 0 || position.batch < 0) throw Error::InvalidArgument("sampler position must be >= 0");
    epoch_ = position.epoch;
    cursor_ = position.batch;
    plan_epoch();
}

}  // namespace sf

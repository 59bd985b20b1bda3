#include "storage/cache_schema.h"

#include <fmt/format.h>

#include <cstring>

#include "core/error.h"
#include "storage/xxh3.h"

namespace sf::storage::schema {
namespace {

TensorData int32_pair(int64_t a, int64_t b) {
    TensorData t;
    t.dtype = DType::kI32;
    t.shape = {2};
    const int32_t v[2] = {static_cast<int32_t>(a), static_cast<int32_t>(b)};
    t.bytes.assign(reinterpret_cast<const char*>(v), sizeof(v));
    return t;
}

std::pair<int64_t, int64_t> int32_pair_of(const Record& r, const char* name,
                                          const std::string& where) {
    const TensorData& t = required_tensor(r, name, where);
    if (t.dtype != DType::kI32 || t.shape != std::vector<int64_t>{2}) {
        throw Error::Corruption(fmt::format("{}: tensor '{}' is not int32 [2]", where, name));
    }
    int32_t v[2];
    std::memcpy(v, t.bytes.data(), sizeof(v));
    return {v[0], v[1]};
}

// A positive decimal integer, the whole of `s`.
bool parse_dim(const std::string& s, int64_t& out) {
    if (s.empty() || s.size() > 9) return false;
    out = 0;
    for (char c : s) {
        if (c < '0' || c > '9') return false;
        out = out * 10 + (c - '0');
    }
    return out > 0;
}

}  // namespace

std::string validation_prompt_key(const std::string& prompt) {
    return kValidationPromptPrefix + xxh3_128_hex(prompt);
}

uint64_t max_record_bytes(const std::string& db) {
    if (db == kLatentsDb) return kMaxLatentRecordBytes;
    if (db == kTextDb) return kMaxTextRecordBytes;
    if (db == kSamplesDb) return kMaxSampleRecordBytes;
    if (db == kManifestDb) return kMaxManifestRecordBytes;
    return kMaxOtherRecordBytes;
}

std::string Bucket::name() const {
    if (frames == 1) return fmt::format("{}x{}", height, width);
    return fmt::format("{}x{}x{}", frames, height, width);
}

Bucket Bucket::parse(const std::string& name, const std::string& where) {
    std::vector<std::string> parts;
    size_t start = 0;
    for (size_t x = name.find('x');; x = name.find('x', start)) {
        parts.push_back(name.substr(start, x == std::string::npos ? std::string::npos : x - start));
        if (x == std::string::npos) break;
        start = x + 1;
    }
    Bucket b;
    bool ok = parts.size() == 2 || parts.size() == 3;
    size_t i = 0;
    if (ok && parts.size() == 3) ok = parse_dim(parts[i++], b.frames);
    if (ok) ok = parse_dim(parts[i], b.height) && parse_dim(parts[i + 1], b.width);
    if (!ok)
        throw Error::Corruption(
            fmt::format("{}: bucket '{}' is neither HxW nor FxHxW", where, name));
    return b;
}

const std::string& required_meta(const Record& record, const char* key, const std::string& where) {
    auto it = record.metadata.find(key);
    if (it == record.metadata.end())
        throw Error::Corruption(fmt::format("{}: metadata '{}' missing", where, key));
    return it->second;
}

const TensorData& required_tensor(const Record& record, const char* name,
                                  const std::string& where) {
    auto it = record.tensors.find(name);
    if (it == record.tensors.end())
        throw Error::Corruption(fmt::format("{}: tensor '{}' missing", where, name));
    return it->second;
}

Record SampleRecord::to_record() const {
    Record r;
    r.tensors[kOriginalSize] = int32_pair(original_height, original_width);
    r.tensors[kBucketSize] = int32_pair(bucket.height, bucket.width);
    r.metadata[kSource] = source;
    r.metadata[kBucket] = bucket.name();
    r.metadata[kStage] = stage;
    if (!frames.empty()) r.metadata[kFrames] = frames;
    r.metadata[kFingerprint] = fingerprint;
    r.metadata[kCaption] = caption;
    r.metadata[kBucketRatio] = bucket_ratio;
    r.metadata[kLatentKey] = latent_key;
    r.metadata[kTextKey] = text_key;
    return r;
}

SampleRecord SampleRecord::from_record(const Record& record, const std::string& where) {
    SampleRecord s;
    s.source = required_meta(record, kSource, where);
    s.caption = required_meta(record, kCaption, where);
    s.bucket = Bucket::parse(required_meta(record, kBucket, where), where);
    s.bucket_ratio = required_meta(record, kBucketRatio, where);
    s.latent_key = required_meta(record, kLatentKey, where);
    s.text_key = required_meta(record, kTextKey, where);
    s.fingerprint = required_meta(record, kFingerprint, where);
    s.stage = required_meta(record, kStage, where);
    if (auto it = record.metadata.find(kFrames); it != record.metadata.end()) s.frames = it->second;
    std::tie(s.original_height, s.original_width) = int32_pair_of(record, kOriginalSize, where);
    return s;
}

Record manifest_record(const std::vector<std::string>& sample_keys) {
    std::string joined;
    for (const auto& k : sample_keys) {
        joined += k;
        joined += '\n';
    }
    TensorData keys;
    keys.dtype = DType::kU8;
    keys.shape = {static_cast<int64_t>(joined.size())};
    keys.bytes = std::move(joined);
    Record r;
    r.tensors[kManifestKeys] = std::move(keys);
    r.metadata[kCount] = std::to_string(sample_keys.size());
    r.metadata[kStage] = kPrepStage;
    return r;
}

std::vector<std::string> manifest_keys(const Record& record, const std::string& where) {
    const std::string& bytes = required_tensor(record, kManifestKeys, where).bytes;
    std::vector<std::string> keys;
    size_t start = 0;
    for (size_t i = 0; i < bytes.size(); ++i) {
        if (bytes[i] != '\n') continue;
        keys.push_back(bytes.substr(start, i - start));
        start = i + 1;
    }
    if (start != bytes.size())
        throw Error::Corruption(where + ": manifest keys do not end in a newline");
    return keys;
}

}  // namespace sf::storage::schema

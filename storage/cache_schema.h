// The names a sanaflow cache is made of, in one place that writers (prep, the encoder stages)
// and readers (training, inspect) share, as leveldb's log_format.h does for its log. Every name
// here is part of the on-disk format (docs/cache-format.md lists them): frozen, like the values
// of an on-disk enum. Renaming one orphans every existing cache.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "storage/tensor_record.h"

namespace sf::storage::schema {

// --- Record databases and their fixed keys -----------------------------------------------------
constexpr const char* kSamplesDb = "samples";    // sample key -> SampleRecord
constexpr const char* kLatentsDb = "latents";    // latent key -> {kLatent}
constexpr const char* kTextDb = "text";          // text key -> {kPromptEmbeds}
constexpr const char* kManifestDb = "manifest";  // kManifestSamplesKey -> the last dataset's keys

constexpr const char* kEmptyPromptKey = "empty-prompt";  // text db: for caption dropout
constexpr const char* kManifestSamplesKey = "samples";   // manifest db
// Text db: a --validation_prompt's features, "validation-prompt-" and the XXH3-128 of the prompt
// (what training samples from; a caption's key depends on the stage, this one on the prompt only).
constexpr const char* kValidationPromptPrefix = "validation-prompt-";
std::string validation_prompt_key(const std::string& prompt);

// --- Record size limits ----------------------------------------------------------------------
// The most bytes a record of each database may decode to, far above what the record kind holds
// (a latent of the largest image bucket is 2 MiB, an 81-frame 720p video window 19 MiB; text of
// 300 tokens of a 4096-wide encoder 4.7 MiB; a sample record is a caption and a few keys). Readers
// refuse a record whose frame declares more before allocating anything, and writers refuse to
// write one, so no record is written that the reader would call corrupt.
constexpr uint64_t kMaxLatentRecordBytes = uint64_t{512} << 20;
constexpr uint64_t kMaxTextRecordBytes = uint64_t{64} << 20;
constexpr uint64_t kMaxSampleRecordBytes = uint64_t{1} << 20;
constexpr uint64_t kMaxManifestRecordBytes = uint64_t{1} << 30;  // ~30M sample keys
constexpr uint64_t kMaxOtherRecordBytes = uint64_t{64} << 20;    // a db the schema does not name
uint64_t max_record_bytes(const std::string& db);

// The longest caption prep accepts, in bytes. The text encoder keeps the first 300 tokens, which
// no real caption anywhere near this long needs; a longer one is a rejected sample.
constexpr size_t kMaxCaptionBytes = 64 * 1024;

// --- Stage names: keys of the fingerprints db and the `stage` of the records they write --------
constexpr const char* kDecodeImageStage = "decode_image";
constexpr const char* kEncodeTextStage = "encode_text";
constexpr const char* kEncodeVAEStage = "encode_vae";
constexpr const char* kDecodeVideoStage = "decode_video";
constexpr const char* kEncodeVideoVAEStage = "encode_video_vae";  // the Wan VAE, videos and images
constexpr const char* kPrepStage = "prep";                        // the manifest

// --- Tensor names ------------------------------------------------------------------------------
// latents: [C, h, w] (DC-AE: scaled) or [C, f, h, w] (Wan VAE: normalised), dtype of the VAE
constexpr const char* kLatent = "latent";
constexpr const char* kPromptEmbeds = "prompt_embeds";  // text: [tokens, hidden], valid tokens only
constexpr const char* kOriginalSize = "original_size";  // samples: int32 [2] = (height, width)
constexpr const char* kBucketSize = "bucket_size";      // samples: int32 [2] = (height, width)
constexpr const char* kManifestKeys = "keys";           // manifest: uint8, each key then '\n'

// --- Metadata keys (values are strings) --------------------------------------------------------
// Every record kind, where it applies:
constexpr const char* kSource = "source";            // the source path (or caption, for text)
constexpr const char* kBucket = "bucket";            // the bucket's name, Bucket::name()
constexpr const char* kFrames = "frames";            // video frame window, "start:count"
constexpr const char* kDType = "dtype";              // dtype the stage computed in
constexpr const char* kStage = "stage";              // stage that wrote the record
constexpr const char* kFingerprint = "fingerprint";  // fingerprint_hash() of that stage
// Latent records: what the stored latent is of the VAE's output, kLatentScaled (DC-AE: times its
// scaling factor) or kLatentNormalizedMean (Wan: (posterior mean - latents_mean) / latents_std).
constexpr const char* kLatentForm = "latent_form";
constexpr const char* kLatentScaled = "scaled";
constexpr const char* kLatentNormalizedMean = "normalized_mean";
// Sample records:
constexpr const char* kCaption = "caption";
constexpr const char* kBucketRatio = "bucket_ratio";  // the bucket table's aspect-ratio key
constexpr const char* kLatentKey = "latent_key";      // key of its record in the latents db
constexpr const char* kTextKey = "text_key";          // key of its record in the text db
// Text records:
constexpr const char* kTokens = "tokens";         // valid tokens stored
constexpr const char* kMaxLength = "max_length";  // the encoder's padded length
// The manifest:
constexpr const char* kCount = "count";  // number of sample keys

// A bucket: the shape that every sample in it is resized (and, for video, cut) to, in pixels
// and frames. Named "HxW" for images (frames == 1) and "FxHxW" for video windows in records.
struct Bucket {
    int64_t frames = 1;
    int64_t height = 0;
    int64_t width = 0;

    std::string name() const;
    // kCorruption naming `where` when `name` is neither form.
    static Bucket parse(const std::string& name, const std::string& where);

    bool operator==(const Bucket& o) const {
        return frames == o.frames && height == o.height && width == o.width;
    }
    bool operator!=(const Bucket& o) const { return !(*this == o); }
    // By name, the order earlier versions kept buckets in (as "HxW" strings): a sampler's
    // sequence for a seed depends on it, so it stays.
    bool operator<(const Bucket& o) const { return name() < o.name(); }
};

// One sample of the dataset: where it came from and the keys of its latent and text records.
struct SampleRecord {
    std::string source;
    std::string caption;
    Bucket bucket;
    std::string bucket_ratio;
    int64_t original_height = 0, original_width = 0;  // before resizing
    std::string latent_key, text_key;
    std::string fingerprint;  // of the decode stage
    // A video window: "start:count" frames of `source` at the decode frame rate; empty for an
    // image. The decode stage that wrote it: kDecodeImageStage or kDecodeVideoStage.
    std::string frames;
    std::string stage = kDecodeImageStage;

    Record to_record() const;
    // kCorruption naming `where` and the missing or malformed field.
    static SampleRecord from_record(const Record& record, const std::string& where);
};

// The manifest record of `sample_keys`, and back (kCorruption naming `where`).
Record manifest_record(const std::vector<std::string>& sample_keys);
std::vector<std::string> manifest_keys(const Record& record, const std::string& where);

// A metadata value or tensor a record must have; kCorruption naming `where` and the name.
const std::string& required_meta(const Record& record, const char* key, const std::string& where);
const TensorData& required_tensor(const Record& record, const char* name, const std::string& where);

}  // namespace sf::storage::schema

// Internal to pipelines/prep: the phases run_prep runs in turn, and what they share.
//
//   stages and fingerprints   prep.cpp: the stage objects of this run, checked against the cache
//   index                     index_phase.cpp: every source read and hashed into content keys
//   text                      text_phase.cpp: the missing captions through the text encoder
//   image                     image_phase.cpp: the missing images decoded and VAE-encoded
//   video                     video_phase.cpp: the clips' missing windows decoded and encoded
//   manifest                  prep.cpp: this dataset's sample keys, for training
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "graph/pipeline.h"
#include "pipelines/prep/prep.h"
#include "stages/encode/encode_text.h"
#include "stages/encode/encode_vae.h"
#include "stages/encode/encode_video.h"
#include "stages/image/dataset.h"
#include "stages/image/decode_image.h"
#include "stages/video/decode_video.h"
#include "storage/cache.h"
#include "storage/cache_shards.h"
#include "storage/cache_writer.h"
#include "storage/fingerprint.h"

namespace sf::pipelines::prep {

// The stages of one run and the hashes of their fingerprints, which go into the content keys.
struct PrepStages {
    stages::DecodeImageConfig decode_config;
    std::unique_ptr<stages::DecodeImageStage> decoder;
    std::unique_ptr<stages::EncodeTextStage> text;  // null without the text phase
    std::unique_ptr<stages::EncodeVAEStage> vae;    // DC-AE: null without it
    // --vae wan: the video VAE encodes clips, and images as one-frame videos.
    std::unique_ptr<stages::EncodeVideoStage> video_vae;
    std::unique_ptr<stages::DecodeVideoStage> video_decoder;
    storage::Fingerprint decode_fingerprint, video_decode_fingerprint;
    // Empty for an absent stage; vae_fp_hash is the VAE in use (DC-AE or Wan).
    std::string decode_fp_hash, video_decode_fp_hash, text_fp_hash, vae_fp_hash;

    bool has_vae() const { return vae || video_vae; }
};

// This rank's part of a sharded prep (a data-parallel launch): the samples whose content key is
// in its shard, and the rejects whose file is. One process: everything.
struct PrepShard {
    int rank = 0, count = 1;
    bool owns(const std::string& key) const {
        return count == 1 || storage::shard_of(key, count) == rank;
    }
};

// One sample's keys and what the cache lacks of it, from the index phase. A sample the index
// phase rejected has an empty path and takes no part in later phases.
struct PlannedSample {
    stages::Sample sample;
    std::string sample_key;
    std::string latent_key;
    std::string text_key;
    std::string predicted_bucket;  // from the header alone, to order the VAE's work by bucket
    bool need_sample = false;
    bool need_latent = false;
    // A video clip (by its container's magic): its samples are windows, keyed in the video
    // phase from the clip's content key; sample_key and latent_key stay empty.
    bool is_clip = false;
    std::string clip_key;
};

// Reads and hashes every scanned sample in parallel; a sample that cannot be read is rejected
// (into `samples_writer` and the returned `rejected` count when its file is in `shard`).
struct IndexResult {
    std::vector<PlannedSample> plan;  // in scan order
    int64_t rejected = 0;
};
IndexResult run_index_phase(const PrepStages& stages, storage::Cache& cache,
                            const std::vector<stages::Sample>& samples, const PrepOptions& o,
                            storage::CacheWriter& samples_writer, PrepReport& report,
                            const PrepShard& shard);

// Encodes the captions the cache lacks (each distinct one once) and the empty prompt.
void run_text_phase(const stages::EncodeTextStage& stage, storage::Cache& cache,
                    const std::vector<PlannedSample>& plan, const PrepOptions& o,
                    PrepReport& report);

// Decodes the samples in `todo` and VAE-encodes those that lack a latent; returns the sample
// keys it rejected.
std::set<std::string> run_image_phase(const PrepStages& stages, storage::Cache& cache,
                                      std::vector<const PlannedSample*> todo, const PrepOptions& o,
                                      storage::CacheWriter& samples_writer, PrepReport& report);

// What the video phase leaves for the manifest: each clip's window sample keys (cached or
// written, in window order), by clip path.
struct VideoResult {
    std::map<std::string, std::vector<std::string>> window_keys;
};
// Plans every clip's windows, decodes and encodes those the cache lacks, writes their records.
VideoResult run_video_phase(const PrepStages& stages, storage::Cache& cache,
                            const std::vector<const PlannedSample*>& clips, const PrepOptions& o,
                            storage::CacheWriter& samples_writer, PrepReport& report);

// --- Shared helpers (prep.cpp) -------------------------------------------------------------
// The whole file, rejected (sf::Reject) when it cannot be read or is larger than `max_bytes`.
std::string read_file(const std::string& path, int64_t max_bytes);
// Runs `pipeline`; the writers are flushed whether it ends or fails, so what its sink accepted
// before a failure is committed and a rerun does the rest.
graph::RunStats run_and_commit(graph::LinearPipeline& pipeline,
                               const std::vector<storage::CacheWriter*>& writers);
// Reports a pipeline reject to the cache's reject list and to the run's reject summary.
void add_reject(storage::CacheWriter& writer, const graph::RejectInfo& r, PrepReport& report);
double seconds_since(std::chrono::steady_clock::time_point t0);

}  // namespace sf::pipelines::prep

// The prep pipeline: media folder -> cache. Scans the dataset, hashes each source into a content
// key, skips what the cache already holds, decodes and buckets the rest in parallel, and writes
// the sample index (and every reject with its reason) to the cache in batches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sf::pipelines {

struct PrepOptions {
    std::string instance_data_dir;  // folder of images (+ same-stem .txt captions)
    std::string manifest;           // JSONL manifest; optional
    std::string instance_prompt;    // one caption for every image; optional
    std::string cache_dir;
    int resolution = 1024;  // bucket table: 512, 1024, 2048 or 4096
    int min_side = 0;       // reject images smaller than this; 0 = resolution / 4
    int workers = 2;        // parallel decode workers
    int max_in_flight = 0;  // token bound on decoded items; 0 = 4 x workers
    int commit_batch = 64;  // records per LMDB transaction
    bool rebuild = false;   // drop a stage whose fingerprint differs, instead of refusing
};

struct PrepStageRow {
    std::string name;
    int64_t items = 0;
    int64_t rejects = 0;
    double seconds = 0;
    int64_t peak_bytes = 0;
};

struct PrepReport {
    int64_t scanned = 0;   // samples the dataset scan found
    int64_t cached = 0;    // already in the cache: skipped without decoding
    int64_t written = 0;   // new records committed by this run
    int64_t rejected = 0;  // scan and decode rejects
    double seconds = 0;
    std::vector<PrepStageRow> stages;
    std::string table() const;
};

// Throws sf::Error on a fatal problem (bad options, cache refused, disk full); a bad sample is
// a reject, never an exception.
PrepReport run_prep(const PrepOptions& options);

}  // namespace sf::pipelines

// The prep pipeline: media folder -> cache of sample index, text features and VAE latents.
//
//   scan      the dataset: (image, caption) pairs; bad entries are rejects
//   index     every image read and hashed in parallel into content keys; what the cache holds
//             already is skipped from here on, so an unchanged dataset loads no model
//   text      the missing captions (identical ones once) through the text encoder, in batches
//   image     the missing images decoded in parallel while the VAE encodes batches on the device
//   video     the clips cut into windows of 4k+1 frames, each window decoded as a stream and
//             encoded chunk by chunk by the video VAE (--vae wan); a window already cached is
//             never decoded again
//
// Each model phase holds the device lease for its whole run, loads its model inside it and frees
// it at the end; memory is marked at each step. Every edge that carries pixels is bounded by a
// token pool. Bad samples are rejected with a reason, recorded in the cache, and the run goes on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "stages/video/frame_windows.h"

namespace sf::pipelines {

struct PrepOptions {
    std::string instance_data_dir;  // folder of images (+ same-stem .txt captions)
    std::string manifest;           // JSONL manifest; optional
    std::string instance_prompt;    // one caption for every image; optional
    std::string caption_column;     // the manifest's caption key; "" caption, text or prompt
    std::string cache_dir;
    // Diffusers-layout directory (vae/, text_encoder/, tokenizer/); empty: built-in `model`.
    std::string pretrained_model_name_or_path;
    std::string model = "tiny";  // built-in configurations when no weights are given
    uint64_t seed = 0;           // the built-in models' random weights
    std::string device = "auto";
    std::string mixed_precision = "no";  // dtype of the frozen encoders
    int resolution = 512;                // bucket table: 512 (upstream's default), 1024, 2048, 4096
    // Images (not clips) resized and center-cropped to one --resolution square, as upstream's
    // --center_crop, instead of the aspect buckets; mirrored half of them (--random_flip, chosen
    // by each file's hash, so the cache is the same on every run).
    bool center_crop = false;
    bool random_flip = false;
    int min_side = 0;       // reject images smaller than this; 0 = resolution / 4
    int workers = 2;        // parallel decode workers
    int max_in_flight = 0;  // token bound on decoded items; 0 = 4 x workers (>= VAE batch)
    int vae_batch_size = 4;
    int text_batch_size = 8;
    int max_sequence_length = 300;  // caption tokens kept (Sana's and upstream's 300)
    // Prepended to every caption: "" none (upstream's default), "default" Sana's own, a file (one
    // entry per line) or the text itself.
    std::string complex_human_instruction;
    // --validation_prompt: encoded like captions into the text db (schema::validation_prompt_key)
    // for the images training samples along the way.
    std::vector<std::string> validation_prompts;
    int commit_batch = 64;  // records per LMDB transaction
    bool rebuild = false;   // drop a stage whose fingerprint differs, instead of refusing
    bool offload = false;   // text encoder weights on the host, one layer at a time on the device
    bool text = true;       // run the text phase
    bool vae = true;        // run the VAE phase (off: sample index only)
    // --vae: "dc-ae" (Sana's image VAE; clips are rejected) or "wan" (Wan2.1's video VAE, which
    // SANA-Video uses: clips become windows of video latents, images one-frame videos).
    std::string vae_kind = "dc-ae";
    // Clips (musubi-tuner's flags): the decode rate (0 = each clip's own) and the windows.
    double video_fps = 0;
    stages::FrameWindowConfig windows;
};

struct PrepStageRow {
    std::string name;
    int64_t items = 0;
    int64_t rejects = 0;
    double seconds = 0;
    int64_t peak_bytes = 0;  // counted tensor bytes (CUDA allocator bytes on a GPU)
};

// The rejects of a run that share a reason (its numbers aside), with the first one's file.
struct RejectGroup {
    std::string stage;
    std::string pattern;  // the reason with each number as '#'
    std::string example_source;
    std::string example_reason;
    int64_t count = 0;
};

struct PrepReport {
    int64_t scanned = 0;  // samples the dataset scan found
    int64_t cached = 0;   // samples whose records were all there: nothing done
    int64_t written = 0;  // sample records committed by this run
    int64_t latents_written = 0;
    int64_t clips = 0;            // video clips found (their windows count as samples below)
    int64_t windows_planned = 0;  // windows of those clips, cached or not
    int64_t clips_truncated = 0;  // clips whose stream broke: the windows before the break kept
    int64_t texts_written = 0;
    int64_t rejected = 0;  // scan, read and decode rejects
    // Samples in memory at once (images, or clips' windows in the video phase), at most.
    int64_t max_in_flight = 0;
    std::vector<std::string> models_loaded;  // stages that loaded a model
    double seconds = 0;
    std::vector<PrepStageRow> stages;
    std::vector<RejectGroup> reject_groups;  // in order of first appearance
    // The stage table, the sample counts and, when there were rejects, reject_summary().
    std::string table() const;
    void add_reject(const std::string& stage, const std::string& source, const std::string& reason);
    // One line per reason, the most frequent first: "  3 x [decode] ... (e.g. a.png: ...)".
    std::string reject_summary(size_t max_groups = 5) const;
};

// Throws sf::Error on a fatal problem (bad options, cache refused, disk full); a bad sample is
// a reject, never an exception. Everything committed before a fatal error stays valid.
PrepReport run_prep(const PrepOptions& options);

}  // namespace sf::pipelines

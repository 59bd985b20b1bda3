// `sanaflow plan`: the peak memory of a training step predicted per phase before anything is
// allocated (stages/plan/memory_model.h, calibrated on the device by tiny measured steps), and
// with a budget the remedy combinations that fit it, cheapest first, with the command line of the
// best.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "stages/plan/calibration.h"
#include "stages/plan/memory_model.h"

namespace sf::pipelines {

struct PlanOptions {
    // The transformer: a diffusers directory, a config.json, or a built-in name (an image
    // transformer's, or a video one's: SanaVideoTransformer3DModel).
    std::string pretrained_model_name_or_path, transformer_config, model = "sana-600m";
    int64_t resolution = 1024;  // pixels of a square bucket
    int64_t frames = 81;        // frames of a video window (1 + 4k): the video transformer only
    std::string bucket;         // "WIDTHxHEIGHT" pixels, instead of the square
    int64_t train_batch_size = 1;
    // DreamBooth's prior preservation: each batch is its instance samples and as many class
    // samples, so a micro-batch holds 2 x train_batch_size samples and the search splits pairs.
    bool with_prior_preservation = false;
    int64_t max_sequence_length = 300;
    int64_t rank = 4;  // LoRA rank; 0: full fine-tune
    std::vector<std::string> lora_target_modules = {"to_q", "to_k", "to_v"};
    plan::PlanRemedies remedies;   // the flags given: the table's row
    std::string memory_budget;     // "24GiB", "500MB", bytes; empty: no search
    std::string device = "cpu";    // calibrated here; "cuda" also reads the free memory
    std::string calibration_file;  // read when it matches, written after calibrating; "": the
                                   // default (plan::default_calibration_file)
    bool calibrate = false;        // measure again even when the file has it
    int64_t calibration_points = plan::kCalibrationPoints;  // tiny steps per remedy key
    // The remedies the search may vary (plan::searchable_remedies()); the others stay as given.
    std::vector<std::string> search = {
        "mixed_precision", "gradient_checkpointing", "accumulation",
        "attention",       "ff_chunk_size",          "fused_backward",
        "optimizer",       "blocks_to_swap",         "offload_optimizer"};
    int64_t top = 8;  // rows of the search shown
};

struct PlanReport {
    std::string text;
    bool fits = true;  // with a budget: some combination fits it
};

// kInvalidArgument naming the flag for a bad value; kNotFound for a missing config.
PlanReport run_plan(const PlanOptions& o);

}  // namespace sf::pipelines

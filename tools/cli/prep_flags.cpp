#include "tools/cli/prep_flags.h"

#include <algorithm>

#include "tools/cli/flag_values.h"

namespace sf::tools {

using pipelines::PrepOptions;

namespace {

// The VAE and how clips become windows (musubi-tuner's window flags).
void add_video_flags(CLI::App* cmd, PrepOptions& o) {
    cmd->add_option("--vae", o.vae_kind,
                    "dc-ae (Sana's image VAE) or wan (Wan2.1's video VAE: clips become windows of "
                    "video latents, images one-frame videos)")
        ->check(CLI::IsMember({"dc-ae", "wan"}))
        ->capture_default_str();
    cmd->add_option("--video_fps", o.video_fps,
                    "frame rate clips are decoded at, by timestamps (0: each clip's own)")
        ->check(CLI::Range(0.0, 1000.0))
        ->capture_default_str();
    cmd->add_option_function<std::string>(
           "--frame_extraction",
           [&o](const std::string& mode) {
               o.windows.frame_extraction = sf::stages::parse_frame_extraction(mode);
           },
           "windows of a clip: head (the first), chunk (consecutive), slide (every "
           "--frame_stride frames), uniform (--frame_sample spread over the clip), full (the "
           "whole clip, up to --max_frames) [head]")
        ->check(CLI::IsMember({"head", "chunk", "slide", "uniform", "full"}));
    cmd->add_option("--target_frames", o.windows.target_frames,
                    "window lengths, each 1 + 4k, e.g. 1,25,45,81")
        ->delimiter(',')
        ->check(integer_in(1, 100'001))
        ->capture_default_str();
    cmd->add_option("--frame_stride", o.windows.frame_stride, "slide: frames between windows")
        ->check(integer_in(1, 1'000'000))
        ->capture_default_str();
    cmd->add_option("--frame_sample", o.windows.frame_sample, "uniform: windows per length")
        ->check(integer_in(1, 10'000))
        ->capture_default_str();
    cmd->add_option("--max_frames", o.windows.max_frames, "full: the longest window")
        ->check(integer_in(1, 100'001))
        ->capture_default_str();
}

}  // namespace

// Prep's data flags: what to read and how to cut it into samples. `sanaflow train` takes them too,
// for the one-command form.
void add_prep_data_flags(CLI::App* cmd, PrepOptions& o) {
    cmd->add_option("--instance_data_dir", o.instance_data_dir,
                    "folder of images with same-stem .txt captions")
        ->check(CLI::ExistingDirectory);
    cmd->add_option("--manifest", o.manifest,
                    "JSONL manifest: one {\"file\": ..., \"caption\": ...} per line")
        ->check(CLI::ExistingFile);
    cmd->add_option("--instance_prompt", o.instance_prompt,
                    "caption for every image (DreamBooth style)");
    cmd->add_option("--caption_column", o.caption_column,
                    "the caption key of a manifest or metadata.jsonl (default: caption, text or "
                    "prompt)");
    cmd->add_option("--resolution", o.resolution,
                    "Sana's aspect-ratio bucket table: 512, 1024, 2048 or 4096; another multiple "
                    "of 32 takes the nearest")
        ->check(integer_in(256, 8192))
        ->capture_default_str();
    cmd->add_flag("--center_crop", o.center_crop,
                  "images: resize and center-crop every one to a --resolution square (upstream's "
                  "--center_crop) instead of the aspect buckets");
    cmd->add_flag("--random_flip", o.random_flip,
                  "images: mirror half of them left to right, each chosen by its file's hash "
                  "(the same ones on every run)");
    cmd->add_option("--min_side", o.min_side,
                    "reject images with a smaller side (0: resolution / 4)")
        ->check(integer_in(0, 1'000'000))
        ->capture_default_str();
    cmd->add_option_function<int>(
           "--dataloader_num_workers", [&o](int n) { o.workers = std::max(1, n); },
           "parallel decode workers; 0 (upstream's default) means one [2]")
        ->check(integer_in(0, 256));
    cmd->add_option("--max_in_flight", o.max_in_flight,
                    "bound on decoded samples in memory (0: 4 x workers)")
        ->check(integer_in(0, 1'000'000));
    add_video_flags(cmd, o);
    cmd->add_option("--vae_batch_size", o.vae_batch_size, "images per VAE forward")
        ->check(integer_in(1, 4096))
        ->capture_default_str();
    cmd->add_option("--text_batch_size", o.text_batch_size, "captions per text-encoder forward")
        ->check(integer_in(1, 4096))
        ->capture_default_str();
    cmd->add_option("--max_sequence_length", o.max_sequence_length, "caption tokens kept")
        ->check(integer_in(1, 2048))
        ->capture_default_str();
    cmd->add_option("--complex_human_instruction", o.complex_human_instruction,
                    "prepend an instruction to every caption: 'default' for Sana's own, a file "
                    "(one entry per line) or the text itself; none by default, as upstream's "
                    "script");
    cmd->add_option("--validation_prompt", o.validation_prompts,
                    "a prompt to sample validation images of while training (its features are "
                    "cached with the captions); repeat it for several")
        ->allow_extra_args(false);
    cmd->add_option("--commit_batch", o.commit_batch, "records per committed transaction")
        ->check(integer_in(1, 1'000'000))
        ->capture_default_str();
    cmd->add_flag("--rebuild", o.rebuild,
                  "rebuild a stage whose fingerprint differs instead of refusing");
    cmd->add_flag(
        "--offload", o.offload,
        "keep the text encoder's weights in host memory, one layer at a time on the device");
}

// Prep's model flags; `sanaflow train` has its own of these names and hands them to prep.
void add_prep_model_flags(CLI::App* cmd, PrepOptions& o) {
    cmd->add_option("--pretrained_model_name_or_path", o.pretrained_model_name_or_path,
                    "diffusers-layout model directory (vae/, text_encoder/, tokenizer/)")
        ->check(CLI::ExistingDirectory);
    cmd->add_option("--model", o.model,
                    "built-in models when no weights are given (seeded random weights)")
        ->check(CLI::IsMember({"tiny"}))
        ->capture_default_str();
    cmd->add_option("--seed", o.seed, "seed of the built-in models' weights")
        ->check(integer_in(0, kMaxSeed))
        ->capture_default_str();
    cmd->add_option("--device", o.device, "auto, cpu, cuda or cuda:N")->capture_default_str();
    cmd->add_option("--mixed_precision", o.mixed_precision,
                    "dtype of the frozen encoders: no, fp16 or bf16")
        ->check(CLI::IsMember({"no", "fp16", "bf16"}))
        ->capture_default_str();
}

}  // namespace sf::tools

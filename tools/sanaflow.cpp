// The `sanaflow` command line. Flags keep the spelling of the diffusers Sana training scripts.
#include <fmt/format.h>
#include <torch/version.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/threads.h"
#include "pipelines/inspect.h"
#include "pipelines/models_table.h"
#include "pipelines/prep/prep.h"
#include "pipelines/train/train.h"
#include "tools/flag_check.h"
#include "tools/yaml_config.h"
#if defined(SANAFLOW_WITH_MEDIA)
#include "tools/demo_data.h"
#include "tools/demo_video.h"
#include "tools/plot.h"
#endif

namespace {

namespace fs = std::filesystem;
using sf::pipelines::PrepOptions;
using sf::pipelines::TrainOptions;

constexpr int64_t kMaxSteps = 1'000'000'000'000;  // a trillion steps: no run gets near it
constexpr int64_t kMaxSeed = INT64_MAX;

// Exit status (README, "Exit status"): 0 done; 2 a usage error (a bad flag, value or input the
// user can fix, a missing file); 3 a corrupt cache or file; 1 anything else (I/O, memory, a bug).
constexpr int kExitOk = 0, kExitError = 1, kExitUsage = 2, kExitCorrupt = 3;

int exit_code(sf::ErrorCode code) {
    switch (code) {
        case sf::ErrorCode::kInvalidArgument:
        case sf::ErrorCode::kNotFound:
            return kExitUsage;
        case sf::ErrorCode::kCorruption:
            return kExitCorrupt;
        default:
            return kExitError;
    }
}

// An integer flag's text checked before CLI11 converts it: CLI11 turns an integer that
// overflows into the largest one, and an unsigned flag takes -1 as 2^64 - 1.
CLI::Validator integer_in(int64_t lo, int64_t hi) {
    const std::string range =
        hi == INT64_MAX ? fmt::format(">= {}", lo) : fmt::format("in [{}, {}]", lo, hi);
    return CLI::Validator(
        [lo, hi, range](std::string& text) -> std::string {
            int64_t value = 0;
            const char* end = text.data() + text.size();
            const auto [ptr, ec] = std::from_chars(text.data(), end, value);
            const std::string shown = text.size() > 40 ? text.substr(0, 40) + "..." : text;
            if (ec == std::errc() && ptr == end && value >= lo && value <= hi) return "";
            if (ec == std::errc::invalid_argument || (ec == std::errc() && ptr != end)) {
                return fmt::format("{} is not an integer", shown);
            }
            return fmt::format("{} is not {}", shown, range);
        },
        "INT " + range);
}

// SANA-Video's trainer options, for caches of video windows (--vae wan).
void add_video_train_flags(CLI::App* cmd, TrainOptions& o) {
    cmd->add_option("--joint_training_interval", o.joint_training_interval,
                    "video caches: every k-th step trains on a batch of images (one-frame "
                    "windows) instead of video windows; 0 mixes them by bucket")
        ->check(integer_in(0, kMaxSteps))
        ->capture_default_str();
    cmd->add_option("--i2v_probability", o.i2v_probability,
                    "video caches: chance that a video batch is image-to-video (latent frame 0 "
                    "kept clean at timestep 0 and out of the loss)")
        ->capture_default_str();
    cmd->add_option("--ff_chunk_frames", o.ff_chunk_frames,
                    "video caches: run the feed-forward over k latent frames at a time, each "
                    "chunk recomputed in backward (its 6x-wide hidden activations never whole); "
                    "0 off")
        ->check(integer_in(0, 1'000'000))
        ->capture_default_str();
    cmd->add_option("--chunk_index", o.chunk_index,
                    "video caches: latent frames where timestep chunks start, e.g. 0,3,6 (each "
                    "chunk draws its own timestep)");
}

// What `sanaflow train` takes besides TrainOptions: flags that set several options, flags kept for
// upstream's spelling, and prep's data flags for the one-command form (--instance_data_dir).
struct TrainCommand {
    bool checkpointing = false;
    int64_t checkpointing_every = 1;
    bool full_finetune = false;
    bool cache_latents = false;
    bool upcast_before_saving = false;
    std::string optimizer = "AdamW";
    PrepOptions prep;
};

void add_train_flags(CLI::App* cmd, TrainOptions& o, TrainCommand& c) {
    cmd->add_option("--cache_dir", o.cache_dir,
                    "a cache made by sanaflow prep; with --instance_data_dir, where prep writes it "
                    "first [OUTPUT_DIR/cache]");
    cmd->add_option("--output_dir", o.output_dir,
                    "checkpoints, metrics.jsonl and the final weights")
        ->capture_default_str();
    cmd->add_option("--pretrained_model_name_or_path", o.pretrained_model_name_or_path,
                    "diffusers-layout directory (or its transformer/) to fine-tune");
    cmd->add_option("--transformer_config", o.transformer_config,
                    "a transformer config.json to train from scratch with seeded weights");
    cmd->add_option("--model", o.model, "built-in transformer when no weights are given")
        ->capture_default_str();
    cmd->add_option("--seed", o.seed, "seed of weights, data order, noise")
        ->check(integer_in(0, kMaxSeed))
        ->capture_default_str();
    cmd->add_option("--device", o.device, "auto, cpu, cuda or cuda:N")->capture_default_str();
    cmd->add_option("--mixed_precision", o.mixed_precision,
                    "autocast dtype: no, bf16 or fp16 (with loss scaling)")
        ->check(CLI::IsMember({"no", "fp16", "bf16"}))
        ->capture_default_str();
    cmd->add_flag("--allow_tf32", o.allow_tf32, "TF32 matmuls and convolutions on CUDA");
    cmd->add_flag("--gradient_checkpointing", c.checkpointing,
                  "recompute transformer blocks in backward");
    cmd->add_option("--gradient_checkpointing_every", c.checkpointing_every,
                    "with --gradient_checkpointing: recompute every k-th block")
        ->check(integer_in(1, 1'000'000))
        ->capture_default_str();
    cmd->add_option("--attention", o.attention,
                    "cross-attention: dense, chunked (exact, memory linear in tokens) or fused "
                    "(SDPA where LibTorch has it)")
        ->check(CLI::IsMember({"dense", "chunked", "fused"}))
        ->capture_default_str();
    cmd->add_flag("--fused_backward_pass", o.fused_backward_pass,
                  "update each weight as soon as its gradient is complete and free the gradient");
    cmd->add_option("--train_batch_size", o.train_batch_size,
                    "samples per micro-batch (one bucket)")
        ->check(integer_in(1, 1'000'000))
        ->capture_default_str();
    cmd->add_option("--gradient_accumulation_steps", o.gradient_accumulation_steps,
                    "micro-batches per optimizer step")
        ->check(integer_in(1, 1'000'000))
        ->capture_default_str();
    cmd->add_option("--max_train_steps", o.max_train_steps,
                    "optimizer steps; 0: --num_train_epochs over the cache")
        ->check(integer_in(0, kMaxSteps))
        ->capture_default_str();
    cmd->add_option("--num_train_epochs", o.num_train_epochs,
                    "passes over the cache when --max_train_steps is not given")
        ->check(integer_in(1, 1'000'000))
        ->capture_default_str();
    cmd->add_option("--learning_rate", o.learning_rate)->capture_default_str();
    cmd->add_flag("--scale_lr", o.scale_lr,
                  "multiply the learning rate by the batch size and the accumulation steps");
    cmd->add_option("--lr_scheduler", o.lr_scheduler,
                    "constant, constant_with_warmup, linear, cosine, cosine_with_restarts or "
                    "polynomial")
        ->capture_default_str();
    cmd->add_option("--lr_warmup_steps", o.lr_warmup_steps)
        ->check(integer_in(0, kMaxSteps))
        ->capture_default_str();
    cmd->add_option("--lr_num_cycles", o.lr_num_cycles, "cosine_with_restarts: hard restarts")
        ->check(integer_in(1, 1'000'000))
        ->capture_default_str();
    cmd->add_option("--lr_power", o.lr_power, "polynomial: the decay's power")
        ->capture_default_str();
    cmd->add_option("--max_grad_norm", o.max_grad_norm, "global-norm clipping; 0 turns it off")
        ->capture_default_str();
    cmd->add_option("--adam_weight_decay", o.adam_weight_decay)->capture_default_str();
    cmd->add_option("--adam_beta1", o.adam_beta1)->capture_default_str();
    cmd->add_option("--adam_beta2", o.adam_beta2)->capture_default_str();
    cmd->add_option("--adam_epsilon", o.adam_epsilon)->capture_default_str();
    cmd->add_option("--optimizer", c.optimizer, "AdamW (the only one built)")
        ->check(CLI::IsMember({"AdamW", "adamw"}))
        ->capture_default_str();
    cmd->add_option("--caption_dropout", o.caption_dropout,
                    "probability of training on the empty prompt")
        ->capture_default_str();
    cmd->add_option("--flow_shift", o.flow_shift, "the flow-matching schedule's shift")
        ->capture_default_str();
    cmd->add_option("--weighting_scheme", o.weighting_scheme,
                    "timestep density and loss weighting, as upstream: none (uniform), "
                    "logit_normal, mode, sigma_sqrt or cosmap")
        ->check(CLI::IsMember({"none", "logit_normal", "mode", "sigma_sqrt", "cosmap", "uniform"}))
        ->capture_default_str();
    cmd->add_option("--logit_mean", o.logit_mean, "logit_normal: the mean")->capture_default_str();
    cmd->add_option("--logit_std", o.logit_std, "logit_normal: the standard deviation")
        ->capture_default_str();
    cmd->add_option("--mode_scale", o.mode_scale, "mode: the scale")->capture_default_str();
    cmd->add_option("--rank", o.rank,
                    "LoRA rank: LoRA adapters are trained by default, as upstream; 0 (or "
                    "--full_finetune) trains every weight of the transformer")
        ->check(integer_in(0, 65536))
        ->capture_default_str();
    cmd->add_flag("--full_finetune", c.full_finetune,
                  "train every weight of the transformer (the same as --rank 0)");
    cmd->add_option("--lora_alpha", o.lora_alpha, "LoRA alpha; 0 means the rank")
        ->capture_default_str();
    cmd->add_option("--lora_layers,--lora_target_modules", o.lora_target_modules,
                    "comma-separated Linear names to adapt")
        ->capture_default_str();
    cmd->add_option("--checkpointing_steps", o.checkpointing_steps,
                    "save a resumable checkpoint every N steps (0: never)")
        ->check(integer_in(0, kMaxSteps))
        ->capture_default_str();
    cmd->add_option("--checkpoints_total_limit", o.checkpoints_total_limit,
                    "keep the newest N checkpoints (0: all)")
        ->check(integer_in(0, 1'000'000'000))
        ->capture_default_str();
    cmd->add_option("--resume_from_checkpoint", o.resume_from_checkpoint,
                    "latest, or a checkpoint directory");
    cmd->add_flag("--skip_corrupt", o.skip_corrupt,
                  "train without the samples whose cache records are damaged (counted at the end) "
                  "instead of refusing");
    cmd->add_flag("--allow_new_data", o.allow_new_data,
                  "resume on another cache than the checkpoint's (other samples, resolution or "
                  "encoder weights)");
    cmd->add_option("--log_every", o.log_every, "log the loss every N steps")
        ->check(integer_in(1, kMaxSteps))
        ->capture_default_str();
    cmd->add_option("--report_to", o.report_to,
                    "tensorboard: every step's metrics as TensorBoard events too (besides "
                    "OUTPUT_DIR/metrics.jsonl); none")
        ->capture_default_str();
    cmd->add_option("--logging_dir", o.logging_dir,
                    "where the TensorBoard events go, under OUTPUT_DIR unless absolute")
        ->capture_default_str();
    cmd->add_flag("--cache_latents", c.cache_latents,
                  "accepted for upstream's spelling: latents and caption embeddings are always "
                  "cached (by prep)");
    cmd->add_flag("--upcast_before_saving", c.upcast_before_saving,
                  "accepted for upstream's spelling: trained weights are kept and saved in fp32 "
                  "(mixed precision is autocast)");
}

std::string train_summary(const sf::pipelines::TrainReport& r) {
    auto mean = [&](size_t from, size_t to) {
        double sum = 0;
        for (size_t i = from; i < to; ++i) sum += r.losses[i];
        return to > from ? sum / static_cast<double>(to - from) : 0.0;
    };
    const size_t n = r.losses.size(), k = std::min<size_t>(5, n);
    std::string out = fmt::format(
        "trained {} steps ({} this run, {} skipped) of {} trainable parameters in {:.1f} s\n",
        r.steps, r.steps - r.first_step, r.skipped_steps, r.trainable_parameters, r.seconds);
    out += fmt::format("loss: first {} steps {:.4f}, last {} steps {:.4f}\n", k, mean(0, k), k,
                       mean(n - k, n));
    if (r.damaged_samples > 0) {
        out += fmt::format("damaged samples left out (--skip_corrupt): {}\n", r.damaged_samples);
    }
    out += "weights: " + r.weights_path + "\n";
    out += "peak memory per phase:\n" + r.phase_table;
    return out;
}

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
    cmd->add_option("--vae", o.vae_kind,
                    "dc-ae (Sana's image VAE) or wan (Wan2.1's video VAE: clips become windows of "
                    "video latents, images one-frame videos)")
        ->check(CLI::IsMember({"dc-ae", "wan"}))
        ->capture_default_str();
    // Clips: musubi-tuner's window flags.
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

#if defined(SANAFLOW_WITH_MEDIA)
int run_prep_command(const PrepOptions& o) {
    auto report = sf::pipelines::run_prep(o);
    std::cout << report.table();
    return 0;
}

#else
// Built without OpenCV/FFmpeg (a GPU machine that trains from a cache): no decoding here.
int run_prep_command(const PrepOptions&) {
    throw sf::Error::InvalidArgument(
        "this sanaflow was built with SANAFLOW_WITH_MEDIA=OFF: prep needs image decoding");
}
#endif

// `sanaflow train`. With --instance_data_dir (or --manifest) it is the whole job: prep into
// --cache_dir (OUTPUT_DIR/cache by default), then training from it, each phase loading only its
// own models; with an up-to-date cache the prep part only reads and hashes the files.
int run_train_command(TrainOptions o, const TrainCommand& c) {
    o.gradient_checkpointing = c.checkpointing ? c.checkpointing_every : 0;
    if (c.full_finetune) o.rank = 0;
    if (c.cache_latents) {
        sf::log_info("train: --cache_latents: latents are always cached (prep writes them once)");
    }
    const bool prep_first = !c.prep.instance_data_dir.empty() || !c.prep.manifest.empty();
    if (prep_first) {
        if (o.cache_dir.empty()) o.cache_dir = (fs::path(o.output_dir) / "cache").string();
        PrepOptions p = c.prep;
        p.cache_dir = o.cache_dir;
        p.pretrained_model_name_or_path = o.pretrained_model_name_or_path;
        p.model = o.model;
        p.seed = o.seed;
        p.device = o.device;
        p.mixed_precision = o.mixed_precision;
        std::cout << "== prep into " << p.cache_dir << "\n";
        run_prep_command(p);
        std::cout << "\n== train from " << o.cache_dir << "\n";
    } else if (o.cache_dir.empty()) {
        throw sf::Error::InvalidArgument(
            "give --cache_dir (a cache made by sanaflow prep) or --instance_data_dir (prep into "
            "OUTPUT_DIR/cache, then train)");
    } else if (c.prep.offload) {
        sf::log_info(
            "train: --offload: training from a cache loads no encoder, so none is offloaded");
    }
    const auto report = sf::pipelines::run_train(o);
    std::cout << train_summary(report);
#if defined(SANAFLOW_WITH_MEDIA)
    if (!report.weights_path.empty())
        std::cout << "plot: " << sf::tools::plot_metrics(o.output_dir) << "\n";
#endif
    return 0;
}

// `sanaflow plot OUTPUT_DIR`.
int run_plot_command(const std::string& output_dir) {
#if defined(SANAFLOW_WITH_MEDIA)
    std::cout << sf::tools::plot_metrics(output_dir) << "\n";
    return kExitOk;
#else
    (void)output_dir;
    throw sf::Error::InvalidArgument(
        "this sanaflow was built with SANAFLOW_WITH_MEDIA=OFF: plot needs OpenCV");
#endif
}

int run_inspect_command(const std::string& cache, bool verify) {
    auto result = sf::pipelines::inspect_cache(cache, verify);
    std::cout << result.text;
    return result.ok ? kExitOk : kExitCorrupt;
}

#if defined(SANAFLOW_WITH_MEDIA)
// The demo's video part: generated clips -> prep through the Wan VAE into 9-frame windows -> 20
// steps of the tiny SANA-Video transformer with image-to-video batches and the chunked
// feed-forward.
void run_demo_video(const fs::path& root) {
    const fs::path clips = root / "clips";
    sf::tools::write_demo_clips(clips.string(), 2, 18, /*seed=*/1234);
    PrepOptions o;
    o.instance_data_dir = clips.string();
    o.cache_dir = (root / "video-cache").string();
    o.resolution = 512;
    o.min_side = 32;
    o.vae_kind = "wan";
    o.windows.frame_extraction = sf::stages::FrameExtraction::kChunk;
    o.windows.target_frames = {9};
    std::cout << "\n== 2 generated clips of 18 frames; sanaflow prep --instance_data_dir "
              << o.instance_data_dir << " --cache_dir " << o.cache_dir
              << " --resolution 512 --min_side 32 --vae wan --frame_extraction chunk "
                 "--target_frames 9\n";
    std::cout << sf::pipelines::run_prep(o).table();

    TrainOptions t;
    t.cache_dir = o.cache_dir;
    t.output_dir = (root / "video-train").string();
    t.rank = 0;  // a full fine-tune without warmup
    t.lr_warmup_steps = 0;
    t.max_train_steps = 20;
    t.train_batch_size = 2;
    t.learning_rate = 1e-3;
    t.checkpointing_steps = 0;
    t.gradient_checkpointing = 1;
    t.i2v_probability = 0.3;
    t.ff_chunk_frames = 1;
    std::cout << "\n== sanaflow train --cache_dir " << t.cache_dir << " --output_dir "
              << t.output_dir
              << " --max_train_steps 20 --train_batch_size 2 --learning_rate 1e-3 "
                 "--gradient_checkpointing --i2v_probability 0.3 --ff_chunk_frames 1 "
                 "--checkpointing_steps 0\n";
    std::cout << train_summary(sf::pipelines::run_train(t));
}

int run_demo_command(const std::string& out_dir, int num_images) {
    const fs::path root(out_dir);
    const fs::path data = root / "data";
    const fs::path cache = root / "cache";
    sf::log_info("demo: writing {} generated images with captions to {}", num_images,
                 data.string());
    auto stats = sf::tools::write_demo_dataset(data.string(), num_images, /*seed=*/1234);
    sf::log_info("demo: {} images and {} deliberately bad files", stats.images, stats.bad_files);

    PrepOptions o;
    o.instance_data_dir = data.string();
    o.cache_dir = cache.string();
    o.resolution = 512;
    std::cout << "== sanaflow prep --instance_data_dir " << data.string() << " --cache_dir "
              << cache.string() << " --resolution 512\n";
    std::cout << sf::pipelines::run_prep(o).table();
    std::cout << "\n== the same prep again: everything is cached, nothing is decoded\n";
    std::cout << sf::pipelines::run_prep(o).table();
    std::cout << "\n== sanaflow inspect " << cache.string() << " --verify\n";
    auto result = sf::pipelines::inspect_cache(cache.string(), /*verify=*/true);
    std::cout << result.text;
    if (!result.ok) return 3;

    TrainOptions t;
    t.cache_dir = cache.string();
    t.output_dir = (root / "train").string();
    t.rank = 0;  // a full fine-tune
    t.max_train_steps = 40;
    t.train_batch_size = 2;
    t.learning_rate = 1e-3;
    t.lr_scheduler = "constant_with_warmup";
    t.lr_warmup_steps = 5;
    t.checkpointing_steps = 20;
    t.checkpoints_total_limit = 1;
    t.gradient_checkpointing = 1;
    t.attention = "chunked";
    t.caption_dropout = 0.1;
    std::cout
        << "\n== sanaflow train --cache_dir " << t.cache_dir << " --output_dir " << t.output_dir
        << " --max_train_steps 40 --train_batch_size 2 --learning_rate 1e-3 --lr_scheduler "
           "constant_with_warmup"
           " --lr_warmup_steps 5 --gradient_checkpointing --attention chunked --caption_dropout 0.1"
           " --checkpointing_steps 20 --checkpoints_total_limit 1\n";
    std::cout << train_summary(sf::pipelines::run_train(t));
    run_demo_video(root);
    std::cout << "\n== memory marks\n" << sf::mem::memory_log().table();
    return 0;
}
#else
int run_demo_command(const std::string&, int) {
    throw sf::Error::InvalidArgument(
        "this sanaflow was built with SANAFLOW_WITH_MEDIA=OFF: the demo needs image decoding");
}
#endif

// `sanaflow --version`: this build and the LibTorch it was built with.
std::string version_text() {
    return fmt::format("sanaflow {} (LibTorch {}, {})", SANAFLOW_VERSION, TORCH_VERSION,
                       sf::mem::cuda_available() ? "CUDA available" : "CPU");
}

// The leftovers of every command that ran: unknown flags, named with the nearest known flag.
std::string unknown_flags(const CLI::App& app, const sf::tools::FlagOrigins& origins) {
    std::vector<std::string> extras = app.remaining();
    std::vector<std::string> known;
    for (const CLI::App* cmd : app.get_subcommands()) {
        for (const std::string& e : cmd->remaining()) extras.push_back(e);
        for (const CLI::Option* opt : cmd->get_options()) {
            for (const std::string& name : opt->get_lnames()) known.push_back(name);
        }
    }
    for (const CLI::Option* opt : app.get_options()) {
        for (const std::string& name : opt->get_lnames()) known.push_back(name);
    }
    return sf::tools::unknown_flags_message(extras, known, origins);
}

}  // namespace

int main(int argc, char** argv) {
    sf::mem::install_counting_allocator();
    sf::set_torch_threads();

    CLI::App app{
        "sanaflow: train Sana-style diffusion transformers from a cache of latents, "
        "without running out of memory"};
    app.require_subcommand(1);
    // One line, naming the flag: "sanaflow: --resolution: 777 not in {512,1024,2048,4096}".
    app.failure_message([](const CLI::App*, const CLI::Error& e) {
        return std::string("sanaflow: ") + e.what() + " (see --help)\n";
    });
    bool quiet = false, verbose = false;
    app.add_flag("-q,--quiet", quiet, "print only errors and the final result");
    app.add_flag("-v,--verbose", verbose, "debug output");

    PrepOptions prep;
    auto* prep_cmd = app.add_subcommand("prep", "decode, bucket and cache a dataset");
    add_prep_data_flags(prep_cmd, prep);
    add_prep_model_flags(prep_cmd, prep);
    prep_cmd->add_option("--cache_dir", prep.cache_dir, "cache directory (created if absent)")
        ->required();

    std::string inspect_dir;
    bool verify = false;
    auto* inspect_cmd =
        app.add_subcommand("inspect", "show what a cache holds; --verify checks every record");
    inspect_cmd->add_option("cache", inspect_dir, "cache directory")
        ->required()
        ->check(CLI::ExistingDirectory);
    inspect_cmd->add_flag("--verify", verify, "decode every record and check its checksum");

    TrainOptions train;
    TrainCommand train_extra;
    auto* train_cmd = app.add_subcommand(
        "train",
        "train LoRA adapters (or, with --full_finetune, the transformer) from a prep cache, or "
        "with --instance_data_dir prep the data first: the whole job in one command");
    add_train_flags(train_cmd, train, train_extra);
    add_video_train_flags(train_cmd, train);
    add_prep_data_flags(train_cmd, train_extra.prep);
    // `--config FILE` is expanded into flags before parsing (tools/yaml_config.h); declared here
    // for --help only.
    std::string config_file;
    for (CLI::App* cmd : {prep_cmd, train_cmd}) {
        cmd->add_option(
            "--config", config_file,
            "a YAML file of this command's flags, key: value per line; typed flags win");
    }

    std::string plot_dir;
    auto* plot_cmd = app.add_subcommand(
        "plot",
        "draw OUTPUT_DIR/metrics.jsonl (loss, learning rate, peak memory) into metrics.png");
    plot_cmd->add_option("output_dir", plot_dir, "a training run's output directory")
        ->required()
        ->check(CLI::ExistingDirectory);

    auto* models_cmd = app.add_subcommand(
        "models", "list the built-in model configurations and their parameter counts");

    std::string demo_dir = "demo-out";
    int demo_images = 24;
    auto* demo_cmd = app.add_subcommand(
        "demo", "generate a small dataset, prep it, inspect the cache, train on it");
    demo_cmd->add_option("--output_dir", demo_dir, "where the data and the cache go")
        ->capture_default_str();
    demo_cmd->add_option("--num_images", demo_images, "images to generate")
        ->check(integer_in(1, 100'000))
        ->capture_default_str();

    // -q and -v after the subcommand too; unknown flags are collected (below), not the first one
    // alone.
    for (CLI::App* cmd : {prep_cmd, inspect_cmd, train_cmd, plot_cmd, models_cmd, demo_cmd}) {
        cmd->fallthrough();
        cmd->allow_extras();
    }
    app.allow_extras();  // what a command passes up (it falls through) is named below too
    app.set_version_flag("--version", version_text());

    try {
        sf::tools::ConfigOrigins origins;
        std::vector<std::string> args = sf::tools::expand_yaml_config(argc, argv, &origins);
        if (const auto refused = sf::tools::refused_flags(args, origins); !refused.empty()) {
            for (const std::string& line : refused)
                std::fprintf(stderr, "sanaflow: %s\n", line.c_str());
            return kExitUsage;
        }
        std::reverse(args.begin(), args.end());  // CLI11 consumes a vector from its back
        app.parse(std::move(args));
        if (const std::string unknown = unknown_flags(app, origins); !unknown.empty()) {
            std::fprintf(stderr, "sanaflow: %s (see --help)\n", unknown.c_str());
            return kExitUsage;
        }
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? kExitOk : kExitUsage;  // --help and --version are not errors
    } catch (const sf::Error& e) {
        std::fprintf(stderr, "sanaflow: %s\n", e.what());
        return kExitUsage;
    }
    if (quiet) sf::set_log_level(sf::LogLevel::kError);
    if (verbose) sf::set_log_level(sf::LogLevel::kDebug);

    try {
        if (*prep_cmd) return run_prep_command(prep);
        if (*inspect_cmd) return run_inspect_command(inspect_dir, verify);
        if (*train_cmd) return run_train_command(train, train_extra);
        if (*demo_cmd) return run_demo_command(demo_dir, demo_images);
        if (*plot_cmd) return run_plot_command(plot_dir);
        if (*models_cmd) {
            std::cout << sf::pipelines::models_table();
            return 0;
        }
    } catch (const sf::Error& e) {
        std::fprintf(stderr, "sanaflow: %s\n", e.what());
        return exit_code(e.code());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "sanaflow: error: %s\n", e.what());
        return kExitError;
    }
    return kExitOk;
}

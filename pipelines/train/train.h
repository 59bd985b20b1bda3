// The training pipeline: a prep cache -> a trained Sana transformer (or LoRA adapters).
//
// It reads latents and caption features from the cache and never loads the VAE or the text
// encoder. The transformer comes from a diffusers `transformer/` directory, from a config.json
// alone (seeded initialisation: training from scratch), or the built-in tiny configuration for
// the demo. Each step draws a batch from one aspect bucket, noises it (flow matching), and takes
// one optimizer step through train::TrainStep with the remedies the flags ask for. Checkpoints hold
// everything needed to resume exactly; the final weights are written in diffusers layout.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sf::distributed {
class World;
}  // namespace sf::distributed

namespace sf::pipelines {

// Defaults are those of diffusers' train_dreambooth_lora_sana.py (v0.33.1) where a flag means the
// same: LoRA rank 4, warmup 500, weight decay 1e-4, batch 4, one epoch.
struct TrainOptions {
    std::string cache_dir;
    std::string output_dir = "sana-dreambooth-lora";
    // A diffusers-layout root holding transformer/, or a transformer directory itself.
    std::string pretrained_model_name_or_path;
    std::string transformer_config;  // a config.json to train from scratch (seeded weights)
    std::string model = "tiny";      // the built-in configuration when neither is given
    uint64_t seed = 0;
    std::string device = "auto";

    // Remedies.
    std::string mixed_precision = "no";
    bool allow_tf32 = false;
    int64_t gradient_checkpointing = 0;  // every k-th block; 0 off
    std::string attention = "dense";     // dense, chunked, fused
    bool fused_backward_pass = false;
    int64_t ff_chunk_size = 0;  // the feed-forward over k latent rows or frames at a time; 0 off
    int64_t micro_batch_split = 1;  // each micro-batch as this many passes (train_step.h)
    int64_t blocks_to_swap = 0;     // the first N blocks' weights in host memory (block_swap.h)
    // A step that runs out of memory is run again with the next remedy (stages/train/auto_fit.h)
    // instead of ending the run.
    bool auto_fit = false;
    // The memory a run may take ("24GiB", bytes; "" none): on CPU the counting allocator's byte
    // budget, past which an allocation is out of memory; with --auto_fit what the plan before
    // the first step fits the run's settings to (stages/plan/start_plan.h).
    std::string memory_budget;
    // CUDA: the caching allocator's history over the first two steps, written to
    // OUTPUT_DIR/memory_snapshot.pickle (pytorch.org/memory_viz).
    bool memory_snapshot = false;
    // Data parallel (a torchrun or Slurm launch: stages/distributed/launch_env.h): the process
    // group's backend ("auto": NCCL on CUDA where built, else Gloo) and how long any collective
    // or the rendezvous may wait, in seconds. --train_batch_size is per rank.
    std::string ddp_backend = "auto";
    double ddp_timeout = 1800;
    // ZeRO-1: each rank keeps and updates 1/N of the optimizer state (stages/distributed/
    // zero_sharding.h); the weights stay whole on every rank. Checkpoints are the same either way.
    bool shard_optimizer_state = false;
    // The plan's calibration file; "": plan::default_calibration_file.
    std::string plan_calibration;
    int64_t plan_calibration_points = 96;  // plan::kCalibrationPoints: tiny steps per key

    // Optimisation.
    // "adamw", "adamw8bit" (the moments in 8 bits: stages/train/optim.h) or "prodigy"
    // (stages/train/prodigy.h, with the prodigy_* settings below, upstream's defaults).
    std::string optimizer = "adamw";
    double prodigy_beta3 = 0;  // 0: sqrt(adam_beta2)
    bool prodigy_decouple = true;
    bool prodigy_use_bias_correction = true;
    bool prodigy_safeguard_warmup = true;
    int64_t train_batch_size = 4;
    int64_t gradient_accumulation_steps = 1;
    bool offload_optimizer = false;  // AdamW's moments in host memory, the update run there
    int64_t max_train_steps = 0;     // 0: num_train_epochs over the cache
    int64_t num_train_epochs = 1;    // when max_train_steps is 0
    int64_t repeats = 1;             // each sample this many times per epoch (upstream's --repeats)
    double learning_rate = 1e-4;
    bool scale_lr = false;  // learning_rate x batch x accumulation (x ranks), as upstream
    std::string lr_scheduler = "constant";
    int64_t lr_warmup_steps = 500;
    int64_t lr_num_cycles = 1;  // cosine_with_restarts
    double lr_power = 1.0;      // polynomial
    double max_grad_norm = 1.0;
    double adam_beta1 = 0.9;
    double adam_beta2 = 0.999;
    double adam_epsilon = 1e-8;
    double adam_weight_decay = 1e-4;
    double caption_dropout = 0.0;
    double flow_shift = 3.0;
    // Timestep density and loss weighting: none, logit_normal, mode, sigma_sqrt or cosmap.
    std::string weighting_scheme = "none";
    double logit_mean = 0.0;
    double logit_std = 1.0;
    double mode_scale = 1.29;

    // SANA-Video's trainer, on caches of video windows (train_video_ivjoint_chunk.py):
    // every k-th step (k > 0) a batch of images (one-frame windows) instead of video windows,
    // drawn by a sampler of its own; 0 mixes them by bucket.
    int64_t joint_training_interval = 0;
    double i2v_probability = 0;  // a video batch is image-to-video (frame 0 clean) this often
    std::string chunk_index;     // "0,3,6": latent frames where timestep chunks start

    // Prior preservation (stages/train/prior_pairs.h): a cache of class images (the
    // --class_data_dir that `sanaflow train --with_prior_preservation` generates and preps into
    // OUTPUT_DIR/class_cache); "" off. Each batch pairs its samples with as many class samples,
    // and the loss adds prior_loss_weight times theirs. num_class_images: the first that many
    // class samples are used (0: all).
    std::string class_cache_dir;
    double prior_loss_weight = 1.0;
    int64_t num_class_images = 100;

    // LoRA: rank 0 trains every weight.
    int64_t rank = 4;
    double lora_alpha = 4;    // 0: = rank
    double lora_dropout = 0;  // dropout on the adapters' input in training (peft's lora_dropout)
    std::string lora_target_modules = "to_q,to_k,to_v";

    // Checkpoints.
    int64_t checkpointing_steps = 500;
    int64_t checkpoints_total_limit = 0;
    std::string resume_from_checkpoint;  // "", "latest" or a checkpoint directory
    // Resume on a cache other than the checkpoint's (other samples, resolution or encoders).
    bool allow_new_data = false;
    // Train without the samples whose records are damaged (reported), instead of refusing.
    bool skip_corrupt = false;
    int64_t log_every = 10;
    // Every step's metrics also as TensorBoard events ("tensorboard", upstream's default) or not
    // ("none"), under OUTPUT_DIR/<logging_dir>/sanaflow/ (an absolute logging_dir as it is).
    std::string report_to = "tensorboard";
    std::string logging_dir = "logs";

    // Validation (pipelines/train/validation.h): images of each prompt (prep encodes them)
    // every validation_epochs epochs, or every validation_steps steps when > 0, and at the end.
    std::vector<std::string> validation_prompts;
    int64_t num_validation_images = 4;
    int64_t validation_epochs = 50;
    int64_t validation_steps = 0;
    int64_t validation_inference_steps = 20;  // sampling steps (Sana's pipelines take 20)
    // auto: the pretrained root's scheduler/scheduler_config.json, else Sana's pipelines'
    // DPM-Solver++ 2M at --flow_shift; dpm_solver, unipc or euler: that one at --flow_shift.
    std::string validation_scheduler = "auto";
    double validation_guidance_scale = 4.5;  // Sana's pipelines' default
    bool validation_vae_tiling = false;      // --enable_vae_tiling
};

struct TrainReport {
    int64_t first_step = 0;      // steps already done when this run started (resume)
    int64_t steps = 0;           // optimizer steps done at the end
    std::vector<double> losses;  // every step's loss, from step 1 (resumed ones included)
    // Latent frames of each step's batch this run (1 for images), from report.first_step + 1:
    // what joint image-video training alternated.
    std::vector<int64_t> batch_frames;
    int64_t skipped_steps = 0;
    int64_t damaged_samples = 0;  // left out with --skip_corrupt
    double seconds = 0;
    std::string weights_path;                  // the final weights
    std::vector<std::string> validation_dirs;  // OUTPUT_DIR/validation/step-N, in order
    std::string phase_table;                   // per-phase peak memory
    std::string memory_marks;                  // the memory log of the run
    int64_t trainable_parameters = 0;
    // What --auto_fit changed: before the first step (the plan), then after each step that ran
    // out of memory, in train::relieve()'s words.
    std::vector<std::string> planned_changes, out_of_memory_changes;

    // What the command prints at the end: steps, loss at the start and the end, the weights,
    // the per-phase peaks.
    std::string summary() const;
};

// Under torchrun or Slurm (more than one rank): the ranks joined through c10d, with --ddp_backend
// and --ddp_timeout, and the log of every rank but 0 quieted to warnings; null in one process.
// run_train joins them itself when not given them; the train command joins them before when the
// ranks must work together before training (prior preservation's class images).
// kInvalidArgument for options that cannot run under a launch (--auto_fit).
std::shared_ptr<distributed::World> join_ranks(const TrainOptions& options);

// Throws sf::Error on bad options, a cache without samples, a checkpoint that does not match the
// options (naming each differing setting), or out of memory (naming the phase and the flags that
// would help). Checkpoints written before a failure stay valid. `joined`: the ranks of a launch,
// joined before (join_ranks); each rank then waits for the others before reading the caches.
TrainReport run_train(const TrainOptions& options,
                      std::shared_ptr<distributed::World> joined = nullptr);

}  // namespace sf::pipelines

#include "tools/cli/train_flags.h"

#include "tools/cli/flag_values.h"

namespace sf::tools {
namespace {

using pipelines::TrainOptions;

// The transformer to train and where its data and outputs are.
void add_model_flags(CLI::App* cmd, TrainOptions& o) {
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
}

// The memory remedies.
void add_remedy_flags(CLI::App* cmd, TrainOptions& o, TrainCommand& c) {
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
    cmd->add_option("--micro_batch_split", o.micro_batch_split,
                    "run each micro-batch of --train_batch_size as N passes over parts of it: the "
                    "same samples, noise and gradients with the activations of a part")
        ->check(integer_in(1, 1'000'000))
        ->capture_default_str();
    cmd->add_option("--blocks_to_swap", o.blocks_to_swap,
                    "keep the weights of the first N transformer blocks in host memory, each "
                    "copied to the device for its forward and its backward's recompute (always "
                    "checkpointed), its gradients back to the host for the update")
        ->check(integer_in(0, 1'000'000))
        ->capture_default_str();
    cmd->add_flag("--auto_fit", o.auto_fit,
                  "when a step runs out of memory, run it again on the same samples with the next "
                  "remedy (a doubled --micro_batch_split, then checkpointing, chunked attention, "
                  "the chunked feed-forward) instead of stopping; with --memory_budget it first "
                  "predicts the step (as sanaflow plan does) and starts with the remedies that "
                  "fit, refusing the run when none does");
    cmd->add_option("--memory_budget", o.memory_budget,
                    "the memory the run may take, e.g. 24GiB: on the CPU an allocation past it is "
                    "out of memory; with --auto_fit the run starts with settings predicted to "
                    "fit it");
    cmd->add_flag("--memory_snapshot", o.memory_snapshot,
                  "on CUDA: record the caching allocator's allocations and frees (with C++ "
                  "stacks) over the first two steps and write them with its segments to "
                  "OUTPUT_DIR/memory_snapshot.pickle, as torch.cuda.memory._dump_snapshot does "
                  "(open it at pytorch.org/memory_viz)");
    cmd->add_option("--ddp_backend", o.ddp_backend,
                    "under torchrun or Slurm: the process group of the gradient all-reduce (auto: "
                    "NCCL on CUDA where this build has it, else Gloo)")
        ->check(CLI::IsMember({"auto", "gloo", "nccl"}))
        ->capture_default_str();
    cmd->add_option("--ddp_timeout", o.ddp_timeout,
                    "under torchrun or Slurm: seconds the rendezvous or any collective may wait "
                    "before the run stops, naming the rank that is gone")
        ->check(CLI::Range(1.0, 86400.0 * 7))
        ->capture_default_str();
    cmd->add_flag("--shard_optimizer_state", o.shard_optimizer_state,
                  "under torchrun or Slurm: each rank keeps and updates 1/N of the optimizer state "
                  "(ZeRO stage 1), saving its memory; the weights stay whole on every rank and "
                  "checkpoints resume on any number of ranks");
    cmd->add_option("--plan_calibration", o.plan_calibration,
                    "the calibration file of --auto_fit's plan (default: "
                    "~/.cache/sanaflow/plan-calibration-DEVICE.json, measured once per device)");
    cmd->add_option("--plan_calibration_points", o.plan_calibration_points,
                    "tiny measured steps per remedy combination of that calibration")
        ->check(integer_in(8, 100'000))
        ->capture_default_str();
}

// Batches, steps, the learning-rate schedule and AdamW.
void add_optimizer_flags(CLI::App* cmd, TrainOptions& o) {
    cmd->add_flag("--offload_optimizer", o.offload_optimizer,
                  "keep AdamW's moments in host memory and run the update there (each weight and "
                  "gradient copied over and the weight back): the device holds no optimizer state");
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
    cmd->add_option("--repeats", o.repeats,
                    "each sample this many times per epoch, shuffled with the others (as "
                    "upstream repeats the instance images)")
        ->check(integer_in(1, 10'000))
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
    cmd->add_option("--optimizer", o.optimizer,
                    "adamw; adamw8bit: AdamW with its moments in 8 bits, blockwise as "
                    "bitsandbytes keeps them (a quarter of the optimizer state's memory); prodigy: "
                    "Adam with a step size it estimates (--learning_rate about 1.0 multiplies it)")
        ->transform(CLI::IsMember({"adamw", "adamw8bit", "prodigy"}, CLI::ignore_case))
        ->capture_default_str();
    cmd->add_option("--prodigy_beta3", o.prodigy_beta3,
                    "Prodigy's average for its step size [sqrt(--adam_beta2)]");
    // Upstream's are `type=bool` options: a value (True, False, 1, 0) or none (true).
    const std::pair<const char*, bool*> switches[] = {
        {"--prodigy_decouple", &o.prodigy_decouple},
        {"--prodigy_use_bias_correction", &o.prodigy_use_bias_correction},
        {"--prodigy_safeguard_warmup", &o.prodigy_safeguard_warmup}};
    const char* const helps[] = {"Prodigy: AdamW-style decoupled weight decay",
                                 "Prodigy: Adam's bias correction",
                                 "Prodigy: the learning rate out of the step size's denominator"};
    for (size_t i = 0; i < 3; ++i) {
        cmd->add_option(switches[i].first, *switches[i].second, helps[i])
            ->expected(0, 1)
            ->default_str("true")
            ->capture_default_str();
    }
    cmd->add_flag_callback(
        "--use_8bit_adam", [&o] { o.optimizer = "adamw8bit"; },
        "diffusers' spelling of --optimizer adamw8bit");
}

// The flow-matching objective.
void add_objective_flags(CLI::App* cmd, TrainOptions& o) {
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
}

// LoRA or the full transformer.
void add_lora_flags(CLI::App* cmd, TrainOptions& o, TrainCommand& c) {
    cmd->add_option("--rank", o.rank,
                    "LoRA rank: LoRA adapters are trained by default, as upstream; 0 (or "
                    "--full_finetune) trains every weight of the transformer")
        ->check(integer_in(0, 65536))
        ->capture_default_str();
    cmd->add_flag("--full_finetune", c.full_finetune,
                  "train every weight of the transformer (the same as --rank 0)");
    cmd->add_option("--lora_alpha", o.lora_alpha, "LoRA alpha; 0 means the rank")
        ->capture_default_str();
    cmd->add_option("--lora_dropout", o.lora_dropout,
                    "dropout on the LoRA adapters' input while training (peft's lora_dropout)")
        ->capture_default_str();
    cmd->add_option("--lora_layers,--lora_target_modules", o.lora_target_modules,
                    "comma-separated Linear names to adapt")
        ->capture_default_str();
}

// Checkpoints, resume, damaged data, logging and reporting.
void add_run_flags(CLI::App* cmd, TrainOptions& o, TrainCommand& c) {
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

// Validation images while training (the prompts are prep's data flag --validation_prompt).
void add_validation_flags(CLI::App* cmd, TrainOptions& o) {
    cmd->add_option("--num_validation_images", o.num_validation_images,
                    "images of each --validation_prompt at each validation")
        ->check(integer_in(1, 1024))
        ->capture_default_str();
    cmd->add_option("--validation_epochs", o.validation_epochs,
                    "validate at the end of every k-th epoch (epochs 0, k, 2k, ...) and at the end")
        ->check(integer_in(1, 1'000'000))
        ->capture_default_str();
    cmd->add_option("--validation_steps", o.validation_steps,
                    "validate every N steps instead (0: by --validation_epochs)")
        ->check(integer_in(0, kMaxSteps))
        ->capture_default_str();
    cmd->add_option("--validation_inference_steps", o.validation_inference_steps, "sampling steps")
        ->check(integer_in(1, 10'000))
        ->capture_default_str();
    cmd->add_option("--validation_scheduler", o.validation_scheduler,
                    "the sampler of validation and class images: auto (the pretrained root's "
                    "scheduler/scheduler_config.json, else DPM-Solver++ 2M as Sana's pipelines), "
                    "dpm_solver, unipc or euler (at --flow_shift)")
        ->check(CLI::IsMember({"auto", "dpm_solver", "unipc", "euler"}))
        ->capture_default_str();
    cmd->add_option("--validation_guidance_scale", o.validation_guidance_scale,
                    "classifier-free guidance against the empty prompt (<= 1: none)")
        ->capture_default_str();
    cmd->add_flag("--enable_vae_tiling", o.validation_vae_tiling,
                  "decode validation images in tiles (memory follows the tile)");
}

// DreamBooth's prior preservation, as upstream spells it.
void add_prior_flags(CLI::App* cmd, TrainOptions& o, TrainCommand& c) {
    cmd->add_flag("--with_prior_preservation", c.with_prior_preservation,
                  "train each batch beside as many class images (generated by the base model "
                  "from --class_prompt where --class_data_dir has too few), adding their loss x "
                  "--prior_loss_weight");
    cmd->add_option("--class_data_dir", c.classes.class_data_dir,
                    "the class images; the missing ones are generated into it");
    cmd->add_option("--class_prompt", c.classes.class_prompt,
                    "the class images' caption, and what generates them");
    cmd->add_option("--num_class_images", c.classes.num_class_images,
                    "class images to use (and to have: the missing ones are generated)")
        ->check(integer_in(1, 100'000))
        ->capture_default_str();
    cmd->add_option("--prior_loss_weight", o.prior_loss_weight, "weight of the class images' loss")
        ->capture_default_str();
    cmd->add_option("--sample_batch_size", c.classes.sample_batch_size,
                    "class images generated together")
        ->check(integer_in(1, 1024))
        ->capture_default_str();
    cmd->add_option("--prior_generation_precision", c.classes.precision,
                    "autocast while generating class images: no, fp32, fp16 or bf16 [the run's "
                    "--mixed_precision]")
        ->check(CLI::IsMember({"no", "fp32", "fp16", "bf16"}));
}

}  // namespace

void add_train_flags(CLI::App* cmd, TrainOptions& o, TrainCommand& c) {
    add_model_flags(cmd, o);
    add_remedy_flags(cmd, o, c);
    add_optimizer_flags(cmd, o);
    add_objective_flags(cmd, o);
    add_lora_flags(cmd, o, c);
    add_run_flags(cmd, o, c);
    add_validation_flags(cmd, o);
    add_prior_flags(cmd, o, c);
}

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
    cmd->add_option("--ff_chunk_size,--ff_chunk_frames", o.ff_chunk_size,
                    "run the feed-forward over k latent rows (images; each chunk reads one row "
                    "of halo on each side) or k latent frames (video) at a time, each chunk "
                    "recomputed in backward, so its wide hidden activations are never whole; 0 "
                    "off")
        ->check(integer_in(0, 1'000'000))
        ->capture_default_str();
    cmd->add_option("--chunk_index", o.chunk_index,
                    "video caches: latent frames where timestep chunks start, e.g. 0,3,6 (each "
                    "chunk draws its own timestep)");
}

}  // namespace sf::tools

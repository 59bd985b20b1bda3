#include "tools/cli/plan_flags.h"

#include "tools/cli/flag_values.h"

namespace sf::tools {

pipelines::PlanOptions PlanCommand::resolved() const {
    pipelines::PlanOptions o = options;
    o.remedies.gradient_checkpointing = checkpointing ? checkpointing_every : 0;
    if (full_finetune) o.rank = 0;
    return o;
}

namespace {

// The transformer, the shape of a step and what is trained.
void add_shape_flags(CLI::App* cmd, PlanCommand& c) {
    pipelines::PlanOptions& o = c.options;
    cmd->add_option("--pretrained_model_name_or_path", o.pretrained_model_name_or_path,
                    "diffusers-layout directory (or its transformer/): its config.json");
    cmd->add_option("--transformer_config", o.transformer_config, "a transformer config.json");
    cmd->add_option("--model", o.model, "built-in transformer (sanaflow models lists them)")
        ->capture_default_str();
    cmd->add_option("--resolution", o.resolution, "pixels of the square bucket")
        ->check(integer_in(32, 1 << 20))
        ->capture_default_str();
    cmd->add_option("--bucket", o.bucket, "an aspect bucket WIDTHxHEIGHT in pixels instead");
    cmd->add_option("--frames", o.frames,
                    "frames of a video window (1 + 4k), for a video transformer "
                    "(--model sana-video-2b-480p)")
        ->check(integer_in(1, 1 << 20))
        ->capture_default_str();
    cmd->add_option("--train_batch_size", o.train_batch_size, "samples per micro-batch")
        ->check(integer_in(1, 1 << 20))
        ->capture_default_str();
    cmd->add_flag("--with_prior_preservation", o.with_prior_preservation,
                  "each instance sample trains beside a class sample, as train's "
                  "--with_prior_preservation: twice the samples per micro-batch");
    cmd->add_option("--gradient_accumulation_steps", o.remedies.accumulation,
                    "micro-batches per step; the search keeps their product, the effective batch")
        ->check(integer_in(1, 1 << 20))
        ->capture_default_str();
    cmd->add_option("--max_sequence_length", o.max_sequence_length, "caption tokens")
        ->check(integer_in(1, 1 << 16))
        ->capture_default_str();
    cmd->add_option("--rank", o.rank, "LoRA rank; 0 (or --full_finetune): every weight")
        ->check(integer_in(0, 65536))
        ->capture_default_str();
    cmd->add_flag("--full_finetune", c.full_finetune, "train every weight (the same as --rank 0)");
    cmd->add_option("--lora_layers,--lora_target_modules", o.lora_target_modules,
                    "comma-separated Linear names to adapt")
        ->delimiter(',')
        ->capture_default_str();
}

// The remedies: the row the table shows.
void add_remedy_flags(CLI::App* cmd, PlanCommand& c) {
    pipelines::PlanOptions& o = c.options;
    cmd->add_option("--mixed_precision", o.remedies.mixed_precision, "no, bf16 or fp16")
        ->check(CLI::IsMember({"no", "fp16", "bf16"}))
        ->capture_default_str();
    cmd->add_flag("--gradient_checkpointing", c.checkpointing, "recompute blocks in backward");
    cmd->add_option("--gradient_checkpointing_every", c.checkpointing_every,
                    "with --gradient_checkpointing: every k-th block")
        ->check(integer_in(1, 1'000'000))
        ->capture_default_str();
    cmd->add_option("--attention", o.remedies.attention, "dense, chunked or fused")
        ->check(CLI::IsMember({"dense", "chunked", "fused"}))
        ->capture_default_str();
    cmd->add_option("--ff_chunk_size", o.remedies.ff_chunk_size,
                    "the feed-forward over this many latent rows at a time; 0: whole")
        ->check(integer_in(0, 1 << 20))
        ->capture_default_str();
    cmd->add_flag("--fused_backward_pass", o.remedies.fused_backward,
                  "update each weight inside the backward pass");
    cmd->add_option("--optimizer", o.remedies.optimizer,
                    "adamw, adamw8bit or prodigy (kept as given: the search varies AdamW's state "
                    "only)")
        ->transform(CLI::IsMember({"adamw", "adamw8bit", "prodigy"}, CLI::ignore_case))
        ->capture_default_str();
    cmd->add_option("--blocks_to_swap", o.remedies.blocks_to_swap,
                    "keep this many blocks' weights in host memory, each lent to the device "
                    "for its forward and its recompute")
        ->check(integer_in(0, 1 << 20))
        ->capture_default_str();
    cmd->add_flag("--offload_optimizer", o.remedies.offload_optimizer,
                  "keep AdamW's moments in host memory and update there");
}

// The budget, the search and the calibration.
void add_search_flags(CLI::App* cmd, pipelines::PlanOptions& o) {
    cmd->add_option("--memory_budget", o.memory_budget,
                    "search the remedies that fit this much (24GiB, 16GB, 800MiB): the cheapest "
                    "first, and the train command line of the best (default with --device cuda: "
                    "what the card has free)");
    cmd->add_option("--device", o.device, "where to calibrate: cpu, cuda or cuda:N")
        ->capture_default_str();
    cmd->add_option(
        "--calibration", o.calibration_file,
        "keep the measured calibration in this JSON file and reuse it next time (default: "
        "~/.cache/sanaflow/plan-calibration-DEVICE.json, shared with train --auto_fit)");
    cmd->add_flag("--calibrate", o.calibrate, "measure again even when --calibration has it");
    cmd->add_option("--search", o.search,
                    "the remedies the search may vary (the others stay as given): "
                    "mixed_precision, gradient_checkpointing, accumulation, attention, "
                    "ff_chunk_size, fused_backward, optimizer, blocks_to_swap, "
                    "offload_optimizer")
        ->delimiter(',')
        ->capture_default_str();
    cmd->add_option("--calibration_points", o.calibration_points,
                    "tiny measured steps per remedy combination")
        ->check(integer_in(8, 100'000))
        ->capture_default_str();
    cmd->add_option("--top", o.top, "rows of the search shown")
        ->check(integer_in(1, 10'000))
        ->capture_default_str();
}

}  // namespace

void add_plan_flags(CLI::App* cmd, PlanCommand& c) {
    add_shape_flags(cmd, c);
    add_remedy_flags(cmd, c);
    add_search_flags(cmd, c.options);
}

}  // namespace sf::tools

#include "pipelines/train/train.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/device_options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/timeline.h"
#include "graph/progress.h"
#include "model/common/lora.h"
#include "model/common/weights.h"
#include "pipelines/train/report/metrics_log.h"
#include "pipelines/train/report/tensorboard.h"
#include "pipelines/train/train_setup.h"
#include "pipelines/train/validation.h"
#include "stages/distributed/data_parallel_sync.h"
#include "stages/distributed/launch_env.h"
#include "stages/distributed/zero_sharding.h"
#include "stages/train/auto_fit.h"
#include "storage/atomic_file.h"
#include "storage/cache.h"
#include "storage/cache_shards.h"

namespace sf::pipelines {
namespace fs = std::filesystem;
namespace {

// `value` must be finite and in [lo, hi]: a NaN passes every comparison, and trains to NaN.
void check_number(const char* flag, double value, double lo, double hi, const char* range) {
    if (!std::isfinite(value) || value < lo || value > hi) {
        throw Error::InvalidArgument(
            fmt::format("{} must be a finite number {}, got {:g}", flag, range, value));
    }
}

// --num_train_epochs at most: a million epochs of any cache is more steps than any run takes.
constexpr int64_t kMaxEpochs = 1'000'000;

// --memory_budget in bytes; 0 when none.
int64_t memory_budget(const TrainOptions& o) {
    return o.memory_budget.empty() ? 0 : parse_bytes(o.memory_budget, "--memory_budget");
}

// The optimizer and its schedule.
void validate_optimization(const TrainOptions& o) {
    if (o.optimizer != "adamw" && o.optimizer != "adamw8bit" && o.optimizer != "prodigy") {
        throw Error::InvalidArgument(
            fmt::format("--optimizer must be adamw, adamw8bit or prodigy, got '{}'", o.optimizer));
    }
    if (o.optimizer == "prodigy" && o.learning_rate <= 0.1) {
        log_warn(
            "train: --learning_rate {:g} with --optimizer prodigy: it multiplies Prodigy's own "
            "step size, and about 1.0 is usual (as upstream warns)",
            o.learning_rate);
    }
    const double inf = std::numeric_limits<double>::infinity();
    check_number("--learning_rate", o.learning_rate, 0, inf, ">= 0");
    check_number("--adam_weight_decay", o.adam_weight_decay, 0, inf, ">= 0");
    check_number("--adam_beta1", o.adam_beta1, 0, std::nextafter(1.0, 0.0), "in [0, 1)");
    check_number("--adam_beta2", o.adam_beta2, 0, std::nextafter(1.0, 0.0), "in [0, 1)");
    check_number("--adam_epsilon", o.adam_epsilon, std::numeric_limits<double>::min(), inf, "> 0");
    check_number("--lr_power", o.lr_power, std::numeric_limits<double>::min(), inf, "> 0");
    if (o.lr_num_cycles < 1) throw Error::InvalidArgument("--lr_num_cycles must be >= 1");
    check_number("--max_grad_norm", o.max_grad_norm, 0, inf, ">= 0 (0 turns clipping off)");
}

// Also checked where a launch's ranks join before training (join_ranks).
void check_ddp_timeout(const TrainOptions& o) {
    check_number("--ddp_timeout", o.ddp_timeout, 1, 86400.0 * 7, "of seconds in [1, 604800]");
}

void validate(const TrainOptions& o) {
    validate_optimization(o);
    memory_budget(o);  // a bad size is refused before any work
    check_ddp_timeout(o);
    if (o.cache_dir.empty()) throw Error::InvalidArgument("--cache_dir is required");
    if (o.output_dir.empty()) throw Error::InvalidArgument("--output_dir is required");
    std::error_code ec;
    if (fs::exists(o.output_dir, ec) && !fs::is_directory(o.output_dir, ec)) {
        throw Error::InvalidArgument("--output_dir " + o.output_dir +
                                     " is a file, not a directory");
    }
    if (o.max_train_steps < 0)
        throw Error::InvalidArgument(
            fmt::format("--max_train_steps must be >= 1 (or 0: --num_train_epochs), got {}",
                        o.max_train_steps));
    if (o.repeats < 1 || o.repeats > 10'000)
        throw Error::InvalidArgument(
            fmt::format("--repeats must be in [1, 10000], got {}", o.repeats));
    if (o.num_train_epochs < 1 || o.num_train_epochs > kMaxEpochs)
        throw Error::InvalidArgument(fmt::format("--num_train_epochs must be in [1, {}], got {}",
                                                 kMaxEpochs, o.num_train_epochs));
    if (o.checkpointing_steps < 0)
        throw Error::InvalidArgument("--checkpointing_steps must be >= 0");
    if (o.checkpoints_total_limit < 0)
        throw Error::InvalidArgument("--checkpoints_total_limit must be >= 0");
    if (o.rank < 0)
        throw Error::InvalidArgument(fmt::format("--rank must be >= 0, got {}", o.rank));
    const double inf = std::numeric_limits<double>::infinity();
    check_number("--flow_shift", o.flow_shift, std::numeric_limits<double>::min(), inf, "> 0");
    if (o.validation_scheduler != "auto" && o.validation_scheduler != "dpm_solver" &&
        o.validation_scheduler != "unipc" && o.validation_scheduler != "euler")
        throw Error::InvalidArgument(
            fmt::format("--validation_scheduler must be auto, dpm_solver, unipc or euler, got '{}'",
                        o.validation_scheduler));
    check_number("--lora_alpha", o.lora_alpha, 0, inf, ">= 0 (0 means the rank)");
    check_number("--lora_dropout", o.lora_dropout, 0, std::nextafter(1.0, 0.0), "in [0, 1)");
    if (o.lora_dropout > 0 && o.rank == 0) {
        throw Error::InvalidArgument(
            "--lora_dropout drops the LoRA adapters' input; a full fine-tune (--rank 0) has none");
    }
    check_number("--caption_dropout", o.caption_dropout, 0, std::nextafter(1.0, 0.0), "in [0, 1)");
    if (o.log_every < 1) throw Error::InvalidArgument("--log_every must be >= 1");
    if (o.report_to != "tensorboard" && o.report_to != "none") {
        throw Error::InvalidArgument(fmt::format(
            "--report_to {}: only tensorboard (the default) and none are built; every step is in "
            "OUTPUT_DIR/metrics.jsonl too",
            o.report_to));
    }
    if (o.joint_training_interval < 0)
        throw Error::InvalidArgument("--joint_training_interval must be >= 0 (0 turns it off)");
    check_number("--i2v_probability", o.i2v_probability, 0, 1, "in [0, 1]");
    check_number("--prior_loss_weight", o.prior_loss_weight, 0, inf, ">= 0");
    if (o.num_class_images < 0)
        throw Error::InvalidArgument(
            fmt::format("--num_class_images must be >= 0, got {}", o.num_class_images));
    if (!o.class_cache_dir.empty() && o.joint_training_interval > 0)
        throw Error::InvalidArgument(
            "--with_prior_preservation pairs images with class images; --joint_training_interval "
            "is for video caches");
    if (!o.pretrained_model_name_or_path.empty() && !o.transformer_config.empty()) {
        throw Error::InvalidArgument(
            "give --pretrained_model_name_or_path or --transformer_config, not both");
    }
    if (o.pretrained_model_name_or_path.empty() && o.transformer_config.empty() &&
        o.model != "tiny") {
        throw Error::InvalidArgument(
            "--model must be 'tiny' (or give --pretrained_model_name_or_path or "
            "--transformer_config), got '" +
            o.model + "'");
    }
}

train::TrainStepOptions step_options(const TrainOptions& o) {
    train::TrainStepOptions s;
    s.mixed_precision = o.mixed_precision;
    s.gradient_checkpointing = o.gradient_checkpointing;
    s.attention = o.attention;
    s.accumulation = o.gradient_accumulation_steps;
    s.fused_backward = o.fused_backward_pass;
    s.ff_chunk_size = o.ff_chunk_size;
    s.micro_batch_split = o.micro_batch_split;
    s.blocks_to_swap = o.blocks_to_swap;
    s.max_grad_norm = o.max_grad_norm;
    s.loss_scaling = o.mixed_precision == "fp16";
    s.flow.flow_shift = o.flow_shift;
    s.flow.weighting_scheme = o.weighting_scheme;
    s.flow.logit_mean = o.logit_mean;
    s.flow.logit_std = o.logit_std;
    s.flow.mode_scale = o.mode_scale;
    s.i2v_probability = o.i2v_probability;
    s.chunk_starts = training::parse_chunk_index(o.chunk_index);
    return s;
}

// The options as this run uses them: max_train_steps from --num_train_epochs when 0 (as upstream:
// epochs x ceil(batches per epoch / accumulation)), the learning rate scaled by --scale_lr.
TrainOptions resolve_run(const TrainOptions& given, const training::Samplers& samplers) {
    TrainOptions o = given;
    if (o.max_train_steps == 0) {
        const int64_t batches = samplers.main->batches_per_epoch();
        o.max_train_steps = o.num_train_epochs * training::steps_per_epoch(o, samplers);
        log_info(
            "train: {} epoch(s) of {} batches of {} = {} optimizer steps (--max_train_steps "
            "sets them instead)",
            o.num_train_epochs, batches, o.train_batch_size, o.max_train_steps);
    }
    if (o.scale_lr) {
        o.learning_rate *= static_cast<double>(o.train_batch_size * o.gradient_accumulation_steps);
        log_info("train: --scale_lr: learning rate {} x {} x {} = {:g}", given.learning_rate,
                 o.train_batch_size, o.gradient_accumulation_steps, o.learning_rate);
    }
    return o;
}

// Final weights, in the layout diffusers loads: the adapters for LoRA, else transformer/.
std::string save_final_weights(const TrainOptions& o, model::DiffusionTransformer& transformer) {
    fs::create_directories(o.output_dir);
    if (o.rank > 0) {
        const std::string path = (fs::path(o.output_dir) / model::kLoraWeightName).string();
        model::save_lora(transformer.module(), path, {}, /*bake_scale=*/true);
        return path;
    }
    const fs::path dir = fs::path(o.output_dir) / "transformer";
    fs::create_directories(dir);
    // Weights first: a config.json says the folder is a model, so it comes once the weights are.
    const std::string path = (dir / "diffusion_pytorch_model.safetensors").string();
    model::save_weights(transformer.module(), path);
    storage::write_file_atomic((dir / "config.json").string(), transformer.config_json());
    return path;
}

// A checkpoint of the run; with LoRA it also holds the adapters as the final file does
// (pytorch_lora_weights.safetensors, alpha / rank baked in), so a pipeline loads any checkpoint.
// Every rank calls it (a sharded optimizer state is gathered from all of them); rank 0 writes it
// and returns its directory, the others "".
std::string save_run_checkpoint(const TrainOptions& o, const training::RunParts& run,
                                const std::vector<double>& losses, int64_t total_limit) {
    const mem::Span span("train", fmt::format("checkpoint at step {}", run.step.steps_done()));
    train::TrainState state = training::capture_state(run, losses);
    if (!run.step.gradient_sync().writes_files()) return {};
    train::CheckpointExtras lora;
    if (o.rank > 0) {
        lora = [&run](const std::string& dir) {
            model::save_lora(run.step.model().module(),
                             (fs::path(dir) / model::kLoraWeightName).string(), {},
                             /*bake_scale=*/true);
            return std::vector<std::string>{model::kLoraWeightName};
        };
    }
    return train::save_checkpoint(o.output_dir, std::move(state), total_limit, lora);
}

// Outside fp16 loss scaling, a step whose loss or gradient is not finite means the run has
// diverged (every later step would be skipped too): stop, naming the step. fp16's scaler skips
// such steps and lowers its scale. Nothing of the step is written, so `last_checkpoint` stays the
// good state.
void stop_if_diverged(const TrainOptions& o, const train::StepResult& r,
                      const std::optional<std::string>& last_checkpoint) {
    if (o.mixed_precision == "fp16" || (!r.skipped && std::isfinite(r.loss))) return;
    throw Error::InvalidArgument(fmt::format(
        "train: the {} became non-finite at step {} (loss {}): training diverged and nothing of "
        "this step is saved ({}); lower --learning_rate",
        std::isfinite(r.loss) ? "gradient" : "loss", r.step, r.loss,
        last_checkpoint ? "the last good checkpoint is " + *last_checkpoint
                        : "there is no checkpoint"));
}

// The final weights, written while a checkpoint of the last step exists, so a failure while
// writing them (a full disk) loses no training; a checkpoint the run did not ask for goes once
// they are in place. Every rank calls it (the checkpoint gathers); rank 0 writes.
std::string save_final_weights_safely(const TrainOptions& o,
                                      model::DiffusionTransformer& transformer,
                                      const training::RunParts& run,
                                      const std::vector<double>& losses) {
    const int64_t step = run.step.steps_done();
    const bool asked = o.checkpointing_steps > 0 && step % o.checkpointing_steps == 0;
    const std::string kept = asked ? train::checkpoint_dir(o.output_dir, step)
                                   : save_run_checkpoint(o, run, losses, /*total_limit=*/0);
    if (!run.step.gradient_sync().writes_files()) return {};
    std::string path;
    try {
        path = save_final_weights(o, transformer);
    } catch (const Error& e) {
        throw Error(e.code(), fmt::format("{}\nthe final weights were not written, but the trained "
                                          "state is safe in {}: make room and rerun the same "
                                          "command with --resume_from_checkpoint latest to write "
                                          "them",
                                          e.message(), kept));
    }
    if (!asked) fs::remove_all(kept);
    return path;
}

// OUT/training_summary.json: what the run did, every step's loss among it.
void write_summary(const TrainOptions& o, const TrainReport& report) {
    nlohmann::json summary;
    summary["steps"] = report.steps;
    summary["first_step_of_this_run"] = report.first_step;
    summary["losses"] = report.losses;
    summary["batch_frames_of_this_run"] = report.batch_frames;
    summary["skipped_steps"] = report.skipped_steps;
    summary["damaged_samples"] = report.damaged_samples;
    summary["weights"] = report.weights_path;
    storage::write_file_atomic((fs::path(o.output_dir) / "training_summary.json").string(),
                               summary.dump(2));
}

double elapsed_seconds(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A step's line of metrics.jsonl.
StepMetrics step_metrics(const train::StepResult& r, double seconds, int64_t samples,
                         const std::map<std::string, train::PhasePeak>& peaks) {
    StepMetrics m;
    m.step = r.step;
    m.loss = r.loss;
    m.lr = r.lr;
    m.grad_norm = r.grad_norm;
    m.prodigy_d_lr = r.prodigy_d_lr;
    m.loss_scale = r.loss_scale;
    m.skipped = r.skipped;
    m.seconds = seconds;
    m.samples = samples;
    for (const auto& [phase, peak] : peaks) m.peak_bytes[phase] = peak.tensor_bytes;
    return m;
}

// Where a run's step metrics go: metrics.jsonl always, TensorBoard with --report_to tensorboard;
// both empty on a rank that writes no files.
struct StepSinks {
    std::optional<MetricsLog> jsonl;
    std::optional<TensorBoardWriter> tensorboard;

    void write(const StepMetrics& m) {
        if (jsonl) jsonl->append(m);
        if (!tensorboard) return;
        std::vector<std::pair<std::string, double>> scalars = {
            {"loss", m.loss},
            {"lr", m.lr},
            {"loss_scale", m.loss_scale},
            {"step_seconds", m.seconds},
            {"samples_per_second", m.seconds > 0 ? static_cast<double>(m.samples) / m.seconds : 0}};
        if (m.grad_norm > 0) scalars.emplace_back("grad_norm", m.grad_norm);
        if (m.prodigy_d_lr > 0) scalars.emplace_back("prodigy_d_lr", m.prodigy_d_lr);
        for (const auto& [phase, bytes] : m.peak_bytes)
            scalars.emplace_back("peak_memory_mib/" + phase,
                                 static_cast<double>(bytes) / (1 << 20));
        tensorboard->add_scalars(m.step, scalars);
    }
};

// The optimizer steps from where the run stands to max_train_steps: each logged, written to the
// sinks, and checkpointed every --checkpointing_steps.
// One step of the run. With --auto_fit a step that runs out of memory is run again with the next
// remedy (stages/train/auto_fit.h) on the same samples and noise: the samplers and the generators
// are put back where the failed attempt found them.
train::StepResult fitted_step(const TrainOptions& o, const training::RunData& data,
                              training::Samplers& samplers, const training::RunParts& run,
                              TrainReport& report, int64_t& samples) {
    train::TrainStep& trainer = run.step;
    at::Generator& gen = run.data_gen;
    at::Generator global = at::detail::getDefaultCPUGenerator();
    for (;;) {
        const auto main_at = samplers.main->position();
        const auto images_at = samplers.images ? samplers.images->position() : main_at;
        const at::Tensor gen_state = o.auto_fit ? gen.get_state() : at::Tensor();
        const at::Tensor global_state = o.auto_fit ? global.get_state() : at::Tensor();
        const size_t frames = report.batch_frames.size();
        samples = 0;
        try {
            return trainer.step(
                [&](int64_t k) {
                    train::MicroBatch mb = training::draw_micro_batch(
                        o, data, samplers, trainer.steps_done(), gen, samples);
                    if (k == 0)
                        report.batch_frames.push_back(mb.latents.dim() == 5 ? mb.latents.size(2)
                                                                            : 1);
                    return mb;
                },
                gen);
        } catch (const Error& e) {
            if (!o.auto_fit || e.code() != ErrorCode::kOutOfMemory || !trainer.retryable()) throw;
            train::TrainStepOptions adapted = trainer.options();
            const int64_t micro_batch = o.train_batch_size * (data.classes != nullptr ? 2 : 1);
            const auto change =
                train::relieve(adapted, micro_batch, trainer.model().latent_rank() == 5);
            if (!change) {
                throw Error::OutOfMemory(fmt::format(
                    "{} (--auto_fit turned on every remedy it may: the micro-batch split, "
                    "checkpointing, chunked attention and feed-forward; left to try: "
                    "--mixed_precision bf16, LoRA, a smaller --resolution)",
                    e.what()));
            }
            samplers.main->seek(main_at);
            if (samplers.images) samplers.images->seek(images_at);
            gen.set_state(gen_state);
            global.set_state(global_state);
            report.batch_frames.resize(frames);
            trainer.adapt(adapted);
            report.out_of_memory_changes.push_back(*change);
            log_warn(
                "train: --auto_fit: step {} ran out of memory; from now on: {}; running it again",
                trainer.steps_done() + 1, *change);
        }
    }
}

// --memory_snapshot: the CUDA caching allocator's history over the run's first two steps (the
// second holds the optimizer state too: a run's peak), then OUTPUT_DIR/memory_snapshot.pickle
// (memory_snapshot.rank-N.pickle for rank N of a launch).
class SnapshotWindow {
public:
    SnapshotWindow(const TrainOptions& o, int64_t first_step) {
        if (!o.memory_snapshot) return;
        last_step_ = first_step + 2;
        path_ = (fs::path(o.output_dir) /
                 distributed::per_rank_name("memory_snapshot.pickle", distributed::launch_env()))
                    .string();
        mem::start_cuda_history();
    }
    void after_step(int64_t step, int64_t max_steps) {
        if (path_.empty() || (step < last_step_ && step < max_steps)) return;
        mem::write_cuda_snapshot(path_);
        log_info(
            "train: the CUDA allocator's history up to step {} is in {} (open it at "
            "pytorch.org/memory_viz)",
            step, path_);
        path_.clear();
    }

private:
    int64_t last_step_ = 0;
    std::string path_;  // empty: nothing to write
};

void run_steps(const TrainOptions& o, const training::RunData& data, training::Samplers& samplers,
               const training::RunParts& run, TrainReport& report,
               std::optional<std::string>& last_checkpoint, StepSinks& sinks,
               training::Validator& validator) {
    train::TrainStep& trainer = run.step;
    const bool writes = trainer.gradient_sync().writes_files();
    graph::Progress progress("train", o.max_train_steps - trainer.steps_done());
    SnapshotWindow snapshot(o, trainer.steps_done());
    while (trainer.steps_done() < o.max_train_steps) {
        const auto start = std::chrono::steady_clock::now();
        int64_t samples = 0;
        const train::StepResult r = fitted_step(o, data, samplers, run, report, samples);
        stop_if_diverged(o, r, last_checkpoint);
        report.losses.push_back(r.loss);
        snapshot.after_step(r.step, o.max_train_steps);
        progress.advance(1);
        sinks.write(step_metrics(r, elapsed_seconds(start), samples, trainer.phase_peaks()));
        if (r.step % o.log_every == 0 || r.step == o.max_train_steps || r.skipped) {
            log_info(
                "train: step {}/{} loss {:.5f} lr {:.3g}{}{}{}", r.step, o.max_train_steps, r.loss,
                r.lr,
                r.prodigy_d_lr > 0 ? fmt::format(" (prodigy d x lr {:.3g})", r.prodigy_d_lr) : "",
                r.grad_norm > 0 ? fmt::format(" grad norm {:.3g}", r.grad_norm) : "",
                r.skipped ? fmt::format(" (skipped: non-finite gradient, loss scale now {})",
                                        trainer.scaler().scale())
                          : "");
        }
        if (o.checkpointing_steps > 0 && r.step % o.checkpointing_steps == 0) {
            const std::string dir =
                save_run_checkpoint(o, run, report.losses, o.checkpoints_total_limit);
            if (writes) {
                last_checkpoint = dir;
                log_info("train: checkpoint {}", dir);
            }
            // Complete only when every rank reached it: no rank runs ahead of a checkpoint.
            trainer.gradient_sync().barrier(fmt::format("the checkpoint at step {}", r.step));
        }
        if (writes && validator.due(r.step)) {
            const training::ValidationResult v =
                validator.run(trainer.model(), trainer.options(), r.step);
            trainer.add_phase_peak("validation", v.peak);
            report.validation_dirs.push_back(v.dir);
        }
    }
    progress.finish();
}

// Everything after the data is open: the model, the optimizer, the steps, the final weights.
TrainReport train_loop(const TrainOptions& o, const storage::Cache& cache,
                       const training::RunData& data, training::Samplers samplers,
                       c10::Device device, std::shared_ptr<train::GradientSync> sync,
                       std::chrono::steady_clock::time_point t0) {
    const train::TrainingSet& set = data.set;
    auto& memlog = mem::memory_log();
    // Before the model: a prompt missing from the cache is refused before any work.
    training::Validator validator(o, set, cache, training::steps_per_epoch(o, samplers), device);

    mem::reset_peak();
    memlog.mark("train", "before model");
    std::string source;
    const auto transformer = training::build_transformer(o, set, source);
    train::TrainStepOptions start = step_options(o);
    std::vector<std::string> planned;
    // --auto_fit plans for --memory_budget, or on CUDA for what the card has free.
    int64_t budget = memory_budget(o);
    if (budget == 0 && o.auto_fit && device.is_cuda())
        budget = mem::cuda_free_bytes(std::max<int>(0, device.index()));
    if (o.auto_fit && budget > 0) {
        TrainOptions joined = o;  // prior preservation: each batch is twice the samples
        if (data.classes != nullptr) joined.train_batch_size *= 2;
        start =
            training::plan_start_of_run(joined, set, *transformer, start, budget, device, planned);
    }
    transformer->module().to(device);
    const training::NamedTensors trainable = model::trainable_parameters(transformer->module());
    int64_t trainable_count = 0;
    for (const auto& [name, p] : trainable) trainable_count += p.numel();
    memlog.mark("train", "after model");
    log_info("{}",
             training::resolved_config(o, *transformer, source, set, trainable_count, device));

    train::AdamWOptions adamw;
    adamw.lr = o.learning_rate;
    adamw.weight_decay = o.adam_weight_decay;
    adamw.beta1 = o.adam_beta1;
    adamw.beta2 = o.adam_beta2;
    adamw.eps = o.adam_epsilon;
    adamw.eight_bit = o.optimizer == "adamw8bit";
    adamw.offload = o.offload_optimizer;
    adamw.prodigy.enabled = o.optimizer == "prodigy";
    adamw.prodigy.beta3 = o.prodigy_beta3;
    adamw.prodigy.decouple = o.prodigy_decouple;
    adamw.prodigy.use_bias_correction = o.prodigy_use_bias_correction;
    adamw.prodigy.safeguard_warmup = o.prodigy_safeguard_warmup;
    train::TrainStep trainer(transformer, trainable, adamw,
                             train::LRSchedule(o.lr_scheduler, o.learning_rate, o.lr_warmup_steps,
                                               o.max_train_steps, o.lr_num_cycles, o.lr_power),
                             start, device, std::move(sync));
    at::Generator gen =
        at::detail::createCPUGenerator(o.seed + 1);  // noise, timesteps, caption dropout
    std::map<std::string, std::string> settings = training::run_settings(o, source, set);
    if (data.classes != nullptr) {  // the class samples are the run's data too
        settings["class_data"] = data.classes->content_hash();
        settings["num_class_images"] = std::to_string(o.num_class_images);
        settings["prior_loss_weight"] = fmt::format("{}", o.prior_loss_weight);
    }
    const training::RunParts run{trainer,  *samplers.main,        gen,   trainable,
                                 settings, samplers.images.get(), device};

    TrainReport report;
    report.trainable_parameters = trainable_count;
    report.planned_changes = planned;
    std::optional<std::string> last_checkpoint;  // the newest good one, for messages
    if (!o.resume_from_checkpoint.empty()) {
        // `latest` is verified while it is chosen; a directory named by the user is verified here.
        const bool latest = o.resume_from_checkpoint == "latest";
        last_checkpoint = latest ? train::latest_checkpoint(o.output_dir)
                                 : std::optional<std::string>(o.resume_from_checkpoint);
        if (last_checkpoint) {
            if (!latest) train::verify_checkpoint(*last_checkpoint);
            report.losses = training::restore_state(*last_checkpoint, run, o.allow_new_data);
            log_info("train: resumed from {} at step {}", *last_checkpoint, trainer.steps_done());
        } else {
            log_info("train: no checkpoint in {}: starting from step 0", o.output_dir);
        }
    }
    report.first_step = trainer.steps_done();
    const bool writes = trainer.gradient_sync().writes_files();
    // Every rank starts from rank 0's weights (they are seeded alike; this makes it so).
    std::vector<at::Tensor> weights;
    for (const auto& [name, p] : trainable) weights.push_back(p);
    trainer.gradient_sync().broadcast_parameters(weights);

    mem::release_memory(
        "train before the first step");  // what setting up held (checkpoint reads, casts)
    StepSinks sinks;
    if (writes) {
        sinks.jsonl.emplace(o.output_dir, report.first_step);
        if (o.report_to == "tensorboard")
            sinks.tensorboard.emplace(
                (fs::path(o.output_dir) / o.logging_dir / "sanaflow").string());
    }
    run_steps(o, data, samplers, run, report, last_checkpoint, sinks, validator);

    report.weights_path = save_final_weights_safely(o, *transformer, run, report.losses);
    trainer.gradient_sync().barrier("the final weights");
    memlog.mark("train", "end");
    mem::release_memory("train end");
    report.damaged_samples = set.damaged() + (data.classes ? data.classes->damaged() : 0);
    if (report.damaged_samples > 0) {
        log_warn("train: --skip_corrupt: {} damaged samples were left out", report.damaged_samples);
    }
    report.steps = trainer.steps_done();
    report.skipped_steps = trainer.scaler().skipped_steps();
    if (writes) write_summary(o, report);
    report.seconds = elapsed_seconds(t0);
    report.phase_table = trainer.phase_table();
    report.memory_marks = memlog.table();
    return report;
}

}  // namespace

std::string TrainReport::summary() const {
    const TrainReport& r = *this;
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

namespace {

// Under torchrun or Slurm (more than one rank): the other ranks joined through c10d, and this
// rank's device (cuda:LOCAL_RANK on CUDA). One process: no reduction, the device as given.
struct DataParallel {
    std::shared_ptr<train::GradientSync> sync;
    c10::Device device;
    int world_size = 1;
};

DataParallel join_data_parallel(const TrainOptions& o, c10::Device device,
                                std::shared_ptr<distributed::World> world) {
    const distributed::LaunchEnv env = distributed::launch_env();
    if (!env.distributed()) {
        if (o.shard_optimizer_state)
            log_info("train: --shard_optimizer_state has no effect in one process (no launcher)");
        return {nullptr, device, 1};
    }
    // Joined here, the ranks have all ended their prep (joining waits for every rank); joined
    // before, each waits for the others' shards to be complete.
    if (world)
        world->barrier("the ranks' prep before training");
    else
        world = join_ranks(o);
    if (device.is_cuda()) device = c10::Device(c10::kCUDA, env.local_rank);
    if (o.shard_optimizer_state)
        return {std::make_shared<distributed::ShardedStateSync>(world), device, env.world_size};
    return {std::make_shared<distributed::DataParallelSync>(world), device, env.world_size};
}

}  // namespace

std::shared_ptr<distributed::World> join_ranks(const TrainOptions& o) {
    const distributed::LaunchEnv env = distributed::launch_env();
    if (!env.distributed()) return nullptr;
    check_ddp_timeout(o);
    if (o.auto_fit) {
        throw Error::InvalidArgument(
            "--auto_fit under a data-parallel launch: a step that runs out of memory on one rank "
            "only cannot be retried on all of them yet; plan with sanaflow plan instead");
    }
    distributed::WorldOptions w;
    w.backend = o.ddp_backend;
    w.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.ddp_timeout * 1000));
    auto world = std::make_shared<distributed::World>(env, w, resolve_device(o.device).is_cuda());
    // Logs, metrics, validation and checkpoints are rank 0's; the others say only what is wrong.
    if (env.rank > 0) set_log_level(std::max(log_level(), LogLevel::kWarn));
    return world;
}

TrainReport run_train(const TrainOptions& options, std::shared_ptr<distributed::World> joined) {
    validate(options);
    const TrainOptions& o = options;  // until the samplers resolve the run's steps
    const auto t0 = std::chrono::steady_clock::now();
    // Written at the end, also when the run fails (the timeline of an out-of-memory run is the
    // one worth reading).
    const mem::TimelineFile timeline_file(
        (fs::path(o.output_dir) /
         distributed::per_rank_name(mem::kTimelineFileName, distributed::launch_env()))
            .string());
    const c10::Device device = resolve_device(o.device);
    if (o.memory_snapshot && !device.is_cuda()) {
        throw Error::InvalidArgument(fmt::format(
            "--memory_snapshot records the CUDA caching allocator: use it with --device cuda (the "
            "run is on {}; OUTPUT_DIR/{} has the counted memory of every device)",
            device.str(), mem::kTimelineFileName));
    }
    if (o.memory_snapshot) mem::require_cuda_snapshot();
    if (o.allow_tf32) {
        at::globalContext().setAllowTF32CuBLAS(true);
        at::globalContext().setAllowTF32CuDNN(true);
        if (!device.is_cuda()) log_info("train: --allow_tf32 has no effect on {}", device.str());
    }

    // On the CPU the counting allocator holds the run to --memory_budget; on CUDA the budget is
    // what --auto_fit plans for.
    const int64_t budget = memory_budget(o);
    std::optional<mem::BudgetGuard> budget_guard;
    if (budget > 0 && device.is_cpu()) budget_guard.emplace(budget);
    if (budget > 0 && !device.is_cpu() && !o.auto_fit)
        log_info("train: --memory_budget on {} is what --auto_fit plans for", device.str());

    const DataParallel ranks = join_data_parallel(o, device, std::move(joined));
    // The sampler draws global micro-batches (--train_batch_size per rank, x ranks), each rank
    // computing its share: N ranks see what one rank with N times the batch sees.
    TrainOptions global = options;
    global.train_batch_size *= ranks.world_size;
    // The cache, or every shard of a sharded prep (whatever this run's world size).
    std::vector<storage::Cache> shards;
    for (const auto& dir : storage::cache_shard_dirs(o.cache_dir))
        shards.push_back(storage::Cache::open(dir, /*create=*/false));
    const storage::Cache& cache = shards.front();
    const train::TrainingSet set = train::TrainingSet::open(shards, o.skip_corrupt);
    const std::optional<train::TrainingSet> classes = training::open_class_samples(o, set);
    training::Samplers samplers =
        training::make_samplers(global, set, classes ? &*classes : nullptr);
    const TrainOptions resolved = resolve_run(global, samplers);  // before samplers move
    return train_loop(resolved, cache, training::RunData{set, classes ? &*classes : nullptr},
                      std::move(samplers), ranks.device, ranks.sync, t0);
}

}  // namespace sf::pipelines

#include "pipelines/train/train.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "graph/progress.h"
#include "model/common/lora.h"
#include "model/sana/sana_transformer.h"
#include "model/common/weights.h"
#include "core/device_options.h"
#include "stages/train/train_data.h"
#include "stages/train/train_state.h"
#include "stages/train/train_step.h"
#include "storage/atomic_file.h"
#include "storage/cache.h"

namespace sf::pipelines {
namespace fs = std::filesystem;
namespace {

std::vector<std::string> split_csv(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream in(s);
    std::string item;
    while (std::getline(in, item, ',')) {
        if (!item.empty()) out.push_back(item);
    }
    return out;
}

void validate(const TrainOptions& o) {
    if (o.cache_dir.empty()) throw Error::InvalidArgument("--cache_dir is required");
    if (o.output_dir.empty()) throw Error::InvalidArgument("--output_dir is required");
    if (o.max_train_steps < 1) throw Error::InvalidArgument(fmt::format("--max_train_steps must be >= 1, got {}", o.max_train_steps));
    if (o.checkpointing_steps < 0) throw Error::InvalidArgument("--checkpointing_steps must be >= 0");
    if (o.checkpoints_total_limit < 0) throw Error::InvalidArgument("--checkpoints_total_limit must be >= 0");
    if (o.rank < 0) throw Error::InvalidArgument(fmt::format("--rank must be >= 0, got {}", o.rank));
    if (o.caption_dropout < 0 || o.caption_dropout >= 1) throw Error::InvalidArgument("--caption_dropout must be in [0, 1)");
    if (o.log_every < 1) throw Error::InvalidArgument("--log_every must be >= 1");
    if (!o.pretrained_model_name_or_path.empty() && !o.transformer_config.empty()) {
        throw Error::InvalidArgument("give --pretrained_model_name_or_path or --transformer_config, not both");
    }
    if (o.pretrained_model_name_or_path.empty() && o.transformer_config.empty() && o.model != "tiny") {
        throw Error::InvalidArgument("--model must be 'tiny' (or give --pretrained_model_name_or_path or --transformer_config), got '" + o.model + "'");
    }
}

// The transformer directory of --pretrained_model_name_or_path: the root's transformer/, or the
// directory itself when it holds config.json.
std::string transformer_dir(const std::string& path) {
    if (fs::exists(fs::path(path) / "transformer" / "config.json")) return (fs::path(path) / "transformer").string();
    if (fs::exists(fs::path(path) / "config.json")) return path;
    throw Error::NotFound(fmt::format("--pretrained_model_name_or_path {}: no transformer/config.json there", path));
}

// Builds the transformer the options name, checking it against what the cache holds.
model::SanaTransformer build_transformer(const TrainOptions& o, const train::TrainingSet& set, std::string& source) {
    model::SanaTransformerConfig config;
    if (!o.pretrained_model_name_or_path.empty()) {
        source = transformer_dir(o.pretrained_model_name_or_path);
        config = model::SanaTransformerConfig::from_json_file(source);
    } else if (!o.transformer_config.empty()) {
        source = o.transformer_config + " (seeded)";
        config = model::SanaTransformerConfig::from_json_file(o.transformer_config);
    } else {
        // The demo's tiny model takes its widths from the cache, whatever tiny encoders made it.
        source = "sana-tiny (seeded)";
        config = model::SanaTransformerConfig::named("sana-tiny");
        config.in_channels = config.out_channels = set.latent_channels();
        config.caption_channels = set.text_hidden();
    }
    if (config.in_channels != set.latent_channels()) {
        throw Error::InvalidArgument(fmt::format("the transformer takes {} latent channels, the cache {} holds {}",
                                                 config.in_channels, o.cache_dir, set.latent_channels()));
    }
    if (config.caption_channels != set.text_hidden()) {
        throw Error::InvalidArgument(fmt::format(
            "the transformer takes {}-wide caption features, the cache {} holds {}-wide ones (another text encoder?)",
            config.caption_channels, o.cache_dir, set.text_hidden()));
    }
    torch::manual_seed(o.seed);
    model::SanaTransformer m(config);
    if (!o.pretrained_model_name_or_path.empty()) model::load_weights(*m, source);
    return m;
}

std::map<std::string, std::string> run_settings(const TrainOptions& o, const std::string& source) {
    return {{"model", source},
            {"seed", std::to_string(o.seed)},
            {"mixed_precision", o.mixed_precision},
            {"train_batch_size", std::to_string(o.train_batch_size)},
            {"gradient_accumulation_steps", std::to_string(o.gradient_accumulation_steps)},
            {"learning_rate", fmt::format("{}", o.learning_rate)},
            {"lr_scheduler", o.lr_scheduler},
            {"lr_warmup_steps", std::to_string(o.lr_warmup_steps)},
            {"rank", std::to_string(o.rank)},
            {"lora_alpha", fmt::format("{}", o.lora_alpha)},
            {"lora_target_modules", o.lora_target_modules},
            {"caption_dropout", fmt::format("{}", o.caption_dropout)},
            {"flow_shift", fmt::format("{}", o.flow_shift)},
            {"weighting_scheme", o.weighting_scheme}};
}

}  // namespace

TrainReport run_train(const TrainOptions& o) {
    validate(o);
    const auto t0 = std::chrono::steady_clock::now();
    auto& memlog = mem::memory_log();
    const c10::Device device = resolve_device(o.device);
    if (o.allow_tf32) {
        at::globalContext().setAllowTF32CuBLAS(true);
        at::globalContext().setAllowTF32CuDNN(true);
        if (!device.is_cuda()) log_info("train: --allow_tf32 has no effect on {}", device.str());
    }

    const storage::Cache cache = storage::Cache::open(o.cache_dir, /*create=*/false);
    const train::TrainingSet set = train::TrainingSet::open(cache);
    log_info("train: {} samples in {} buckets from {}", set.samples().size(), set.buckets().size(), o.cache_dir);

    mem::reset_peak();
    memlog.mark("train", "before model");
    std::string source;
    model::SanaTransformer transformer = build_transformer(o, set, source);
    if (o.rank > 0) {
        model::LoRAConfig lora;
        lora.rank = o.rank;
        lora.alpha = o.lora_alpha > 0 ? o.lora_alpha : static_cast<double>(o.rank);
        lora.targets = split_csv(o.lora_target_modules);
        model::add_lora(*transformer, lora);
        // The frozen base needs no fp32 master copy: kept in the autocast dtype it takes half the
        // memory, and autocast would cast it to that dtype for every matmul anyway.
        if (o.mixed_precision == "bf16") model::cast_frozen(*transformer, at::kBFloat16);
    }
    transformer->to(device);
    const std::vector<std::pair<std::string, at::Tensor>> trainable = model::trainable_parameters(*transformer);
    int64_t trainable_count = 0;
    for (const auto& [name, p] : trainable) trainable_count += p.numel();
    memlog.mark("train", "after model");

    train::TrainStepOptions step_options;
    step_options.mixed_precision = o.mixed_precision;
    step_options.gradient_checkpointing = o.gradient_checkpointing;
    step_options.attention = o.attention;
    step_options.accumulation = o.gradient_accumulation_steps;
    step_options.fused_backward = o.fused_backward_pass;
    step_options.max_grad_norm = o.max_grad_norm;
    step_options.loss_scaling = o.mixed_precision == "fp16";
    step_options.flow.flow_shift = o.flow_shift;
    step_options.flow.weighting_scheme = o.weighting_scheme;
    train::AdamWOptions adamw;
    adamw.lr = o.learning_rate;
    adamw.weight_decay = o.adam_weight_decay;
    train::TrainStep trainer(transformer, trainable, adamw, train::LRSchedule(o.lr_scheduler, o.learning_rate, o.lr_warmup_steps, o.max_train_steps),
                      step_options, device);
    train::BucketSampler sampler(set.buckets(), o.train_batch_size, o.seed);
    at::Generator gen = at::detail::createCPUGenerator(o.seed + 1);  // noise, timesteps, caption dropout

    // The settings a checkpoint must share with this run for the resumed run to be the same run.
    const std::map<std::string, std::string> settings = run_settings(o, source);
    TrainReport report;
    report.trainable_parameters = trainable_count;
    if (!o.resume_from_checkpoint.empty()) {
        std::optional<std::string> dir = o.resume_from_checkpoint == "latest" ? train::latest_checkpoint(o.output_dir)
                                                                            : std::optional<std::string>(o.resume_from_checkpoint);
        if (!dir) {
            log_info("train: no checkpoint in {}: starting from step 0", o.output_dir);
        } else {
            train::TrainState state = train::load_checkpoint(*dir);
            const auto diff = train::settings_diff(state.settings, settings);
            if (!diff.empty()) {
                throw Error::InvalidArgument(fmt::format("--resume_from_checkpoint {}: the checkpoint was made with other settings:\n  {}",
                                                         *dir, fmt::join(diff, "\n  ")));
            }
            torch::NoGradGuard no_grad;
            std::map<std::string, at::Tensor> saved(state.trainable.begin(), state.trainable.end());
            for (const auto& [name, p] : trainable) {
                auto it = saved.find(name);
                if (it == saved.end() || !it->second.sizes().equals(p.sizes())) {
                    throw Error::Corruption(fmt::format("{}: trainable tensor {} missing or misshaped", *dir, name));
                }
                p.copy_(it->second);
            }
            trainer.optimizer().load_state(state.optimizer);
            trainer.scaler().load_state(state.scaler);
            trainer.set_steps_done(state.step);
            sampler.seek({state.sampler_epoch, state.sampler_batch});
            at::Generator global = at::detail::getDefaultCPUGenerator();  // a handle: shares the state
            global.set_state(state.rng.at("default"));
            gen.set_state(state.rng.at("data"));
            report.losses = state.losses;
            log_info("train: resumed from {} at step {}", *dir, state.step);
        }
    }
    report.first_step = trainer.steps_done();

    auto save = [&] {
        train::TrainState state;
        state.step = trainer.steps_done();
        const auto pos = sampler.position();
        state.sampler_epoch = pos.epoch;
        state.sampler_batch = pos.batch;
        state.scaler = trainer.scaler().state();
        state.settings = settings;
        state.trainable = trainable;
        state.optimizer = trainer.optimizer().state();
        at::Generator global = at::detail::getDefaultCPUGenerator();  // a handle: shares the state
        state.rng["default"] = global.get_state();
        state.rng["data"] = gen.get_state();
        state.losses = report.losses;
        const std::string path = train::save_checkpoint(o.output_dir, state, o.checkpoints_total_limit);
        log_info("train: checkpoint {}", path);
    };

    mem::release_memory("train before the first step");  // what setting up held (checkpoint reads, casts)
    graph::Progress progress("train", o.max_train_steps - trainer.steps_done());
    while (trainer.steps_done() < o.max_train_steps) {
        const train::StepResult r = trainer.step(
            [&](int64_t) {
                const train::TrainingBatch b = set.load(sampler.next(), o.caption_dropout, gen);
                return train::MicroBatch{b.latents, b.prompt_embeds, b.prompt_mask};
            },
            gen);
        report.losses.push_back(r.loss);
        progress.advance(1);
        if (r.step % o.log_every == 0 || r.step == o.max_train_steps || r.skipped) {
            log_info("train: step {}/{} loss {:.5f} lr {:.3g}{}{}", r.step, o.max_train_steps, r.loss, r.lr,
                     r.grad_norm > 0 ? fmt::format(" grad norm {:.3g}", r.grad_norm) : "",
                     r.skipped ? fmt::format(" (skipped: non-finite gradient, loss scale now {})", trainer.scaler().scale()) : "");
        }
        if (o.checkpointing_steps > 0 && r.step % o.checkpointing_steps == 0) save();
    }
    progress.finish();

    // Final weights, in the layout diffusers loads.
    fs::create_directories(o.output_dir);
    if (o.rank > 0) {
        report.weights_path = (fs::path(o.output_dir) / "pytorch_lora_weights.safetensors").string();
        model::save_lora(*transformer, report.weights_path);
    } else {
        const fs::path dir = fs::path(o.output_dir) / "transformer";
        fs::create_directories(dir);
        storage::write_file_atomic((dir / "config.json").string(), transformer->config().to_json());
        report.weights_path = (dir / "diffusion_pytorch_model.safetensors").string();
        model::save_weights(*transformer, report.weights_path);
    }
    memlog.mark("train", "end");
    mem::release_memory("train end");
    nlohmann::json summary;
    summary["steps"] = trainer.steps_done();
    summary["first_step_of_this_run"] = report.first_step;
    summary["losses"] = report.losses;
    summary["skipped_steps"] = trainer.scaler().skipped_steps();
    summary["weights"] = report.weights_path;
    storage::write_file_atomic((fs::path(o.output_dir) / "training_summary.json").string(), summary.dump(2));
    report.steps = trainer.steps_done();
    report.skipped_steps = trainer.scaler().skipped_steps();
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    report.phase_table = trainer.phase_table();
    report.memory_marks = memlog.table();
    return report;
}

}  // namespace sf::pipelines

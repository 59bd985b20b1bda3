// The transformer a training run trains, and the settings and configuration it prints and keeps.
#include <fmt/format.h>
#include <torch/torch.h>

#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "core/memory.h"
#include "model/common/config_json.h"
#include "model/common/lora.h"
#include "model/common/weights.h"
#include "model/sana/sana_transformer.h"
#include "model/sana_video/sana_video_transformer.h"
#include "pipelines/train/train_setup.h"
#include "stages/train/flow_matching.h"

namespace sf::pipelines::training {
namespace {

namespace fs = std::filesystem;

}  // namespace

std::vector<std::string> split_csv(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream in(s);
    std::string item;
    while (std::getline(in, item, ',')) {
        if (!item.empty()) out.push_back(item);
    }
    return out;
}

namespace {

// The transformer directory of --pretrained_model_name_or_path: the root's transformer/, or the
// directory itself when it holds config.json.
std::string transformer_dir(const std::string& path) {
    if (fs::exists(fs::path(path) / "transformer" / "config.json"))
        return (fs::path(path) / "transformer").string();
    if (fs::exists(fs::path(path) / "config.json")) return path;
    throw Error::NotFound(
        fmt::format("--pretrained_model_name_or_path {}: no transformer/config.json there", path));
}

constexpr const char* kVideoClass = "SanaVideoTransformer3DModel";

// The widths a transformer takes must be the widths the cache holds.
template <typename Config>
void check_widths(const Config& config, const TrainOptions& o, const train::TrainingSet& set) {
    if (config.in_channels != set.latent_channels()) {
        throw Error::InvalidArgument(
            fmt::format("the transformer takes {} latent channels, the cache {} holds {}",
                        config.in_channels, o.cache_dir, set.latent_channels()));
    }
    if (config.caption_channels != set.text_hidden()) {
        throw Error::InvalidArgument(
            fmt::format("the transformer takes {}-wide caption features, the cache {} holds "
                        "{}-wide ones (another text encoder?)",
                        config.caption_channels, o.cache_dir, set.text_hidden()));
    }
}

// Builds the model of `config`: seeded weights, replaced by the pretrained ones when `weights`
// names a directory.
template <typename Model, typename Config>
std::shared_ptr<model::DiffusionTransformer> build(const Config& config, const TrainOptions& o,
                                                   const train::TrainingSet& set,
                                                   const std::string& weights) {
    check_widths(config, o, set);
    torch::manual_seed(o.seed);
    Model m(config);
    if (!weights.empty()) model::load_weights(*m, weights);
    return m.ptr();
}

// The image transformer (SanaTransformer2DModel) for [C, h, w] latents, the video one
// (SanaVideoTransformer3DModel) for [C, f, h, w] windows: the cache decides, and a config of the
// other class is refused.
std::shared_ptr<model::DiffusionTransformer> build_base(const TrainOptions& o,
                                                        const train::TrainingSet& set,
                                                        std::string& source) {
    const bool video = set.latent_rank() == 4;
    std::string config_file, weights;  // none: the built-in tiny model sized to the cache
    if (!o.pretrained_model_name_or_path.empty()) {
        source = weights = config_file = transformer_dir(o.pretrained_model_name_or_path);
    } else if (!o.transformer_config.empty()) {
        source = o.transformer_config + " (seeded)";
        config_file = o.transformer_config;
    }
    if (!config_file.empty() &&
        (model::config_class(config_file, "transformer config") == kVideoClass) != video) {
        throw Error::InvalidArgument(fmt::format(
            "{} is a {}, but the cache {} holds {}: train the {} on it", config_file,
            video ? "SanaTransformer2DModel (images)" : kVideoClass, o.cache_dir,
            video ? "video windows [C, f, h, w] (from --vae wan)" : "image latents [C, h, w]",
            video ? kVideoClass : "SanaTransformer2DModel"));
    }
    if (video) {
        model::SanaVideoTransformerConfig config;
        if (config_file.empty()) {
            source = "sana-video-tiny (seeded)";
            config = model::SanaVideoTransformerConfig::named("sana-video-tiny");
            config.in_channels = config.out_channels = set.latent_channels();
            config.caption_channels = set.text_hidden();
        } else {
            config = model::SanaVideoTransformerConfig::from_json_file(config_file);
        }
        return build<model::SanaVideoTransformer>(config, o, set, weights);
    }
    model::SanaTransformerConfig config;
    if (config_file.empty()) {
        // The demo's tiny model takes its widths from the cache, whatever tiny encoders made it.
        source = "sana-tiny (seeded)";
        config = model::SanaTransformerConfig::named("sana-tiny");
        config.in_channels = config.out_channels = set.latent_channels();
        config.caption_channels = set.text_hidden();
    } else {
        config = model::SanaTransformerConfig::from_json_file(config_file);
    }
    return build<model::SanaTransformer>(config, o, set, weights);
}

}  // namespace

std::shared_ptr<model::DiffusionTransformer> build_transformer(const TrainOptions& o,
                                                               const train::TrainingSet& set,
                                                               std::string& source) {
    std::shared_ptr<model::DiffusionTransformer> transformer = build_base(o, set, source);
    if (o.rank > 0) {
        model::LoRAConfig lora;
        lora.rank = o.rank;
        lora.alpha = o.lora_alpha > 0 ? o.lora_alpha : static_cast<double>(o.rank);
        lora.targets = split_csv(o.lora_target_modules);
        lora.dropout = o.lora_dropout;
        model::add_lora(transformer->module(), lora);
        // The frozen base needs no fp32 master copy: kept in the autocast dtype it takes half the
        // memory, and autocast would cast it to that dtype for every matmul anyway.
        if (o.mixed_precision == "bf16") model::cast_frozen(transformer->module(), at::kBFloat16);
    }
    return transformer;
}

std::vector<int64_t> parse_chunk_index(const std::string& text) {
    std::vector<int64_t> starts;
    for (const std::string& item : split_csv(text)) {
        size_t used = 0;
        int64_t v = -1;
        try {
            v = std::stoll(item, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used != item.size() || v < 0) {
            throw Error::InvalidArgument(fmt::format(
                "--chunk_index must list latent frame numbers (e.g. 0,3,6), got '{}'", text));
        }
        starts.push_back(v);
    }
    train::check_chunk_starts(starts);
    return starts;
}

std::map<std::string, std::string> run_settings(const TrainOptions& o, const std::string& source,
                                                const train::TrainingSet& set) {
    std::map<std::string, std::string> settings = {
        {"model", source},
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
        {"weighting_scheme", o.weighting_scheme},

        {kDataSetting, set.content_hash()},
        {kDataSizeSetting,
         fmt::format("{} samples in {} buckets", set.samples().size(), set.buckets().size())}};
    // SANA-Video's options, where set (so checkpoints made before they existed still resume).
    if (o.joint_training_interval > 0)
        settings["joint_training_interval"] = std::to_string(o.joint_training_interval);
    if (o.i2v_probability > 0) settings["i2v_probability"] = fmt::format("{}", o.i2v_probability);
    if (!o.chunk_index.empty()) settings["chunk_index"] = o.chunk_index;
    if (o.lora_dropout > 0) settings["lora_dropout"] = fmt::format("{}", o.lora_dropout);
    if (o.repeats != 1) settings["repeats"] = std::to_string(o.repeats);
    // The optimizer's and schedules' later settings, where not their defaults (likewise).
    if (o.weighting_scheme == "logit_normal") {
        settings["logit_mean"] = fmt::format("{}", o.logit_mean);
        settings["logit_std"] = fmt::format("{}", o.logit_std);
    }
    if (o.weighting_scheme == "mode") settings["mode_scale"] = fmt::format("{}", o.mode_scale);
    if (o.optimizer != "adamw") settings["optimizer"] = o.optimizer;
    if (o.optimizer == "prodigy") {
        settings["prodigy_beta3"] = fmt::format("{}", o.prodigy_beta3);
        settings["prodigy_decouple"] = o.prodigy_decouple ? "true" : "false";
        settings["prodigy_use_bias_correction"] = o.prodigy_use_bias_correction ? "true" : "false";
        settings["prodigy_safeguard_warmup"] = o.prodigy_safeguard_warmup ? "true" : "false";
    }
    if (o.adam_beta1 != 0.9) settings["adam_beta1"] = fmt::format("{}", o.adam_beta1);
    if (o.adam_beta2 != 0.999) settings["adam_beta2"] = fmt::format("{}", o.adam_beta2);
    if (o.adam_epsilon != 1e-8) settings["adam_epsilon"] = fmt::format("{}", o.adam_epsilon);
    if (o.lr_scheduler == "cosine_with_restarts")
        settings["lr_num_cycles"] = std::to_string(o.lr_num_cycles);
    if (o.lr_scheduler == "polynomial") settings["lr_power"] = fmt::format("{}", o.lr_power);
    // A decaying schedule is a curve over max_train_steps (resolved from the epochs when 0):
    // another total changes it.
    if (o.lr_scheduler != "constant" && o.lr_scheduler != "constant_with_warmup")
        settings["max_train_steps"] = std::to_string(o.max_train_steps);
    return settings;
}

std::string resolved_config(const TrainOptions& o, model::DiffusionTransformer& model,
                            const std::string& source, const train::TrainingSet& set,
                            int64_t trainable_count, c10::Device device) {
    int64_t total = 0;
    for (const auto& p : model.module().parameters()) total += p.numel();
    const std::vector<std::pair<std::string, std::string>> rows = {
        {"model", fmt::format("{} from {}", model.class_name(), source)},
        {"parameters", fmt::format("{} ({} blocks)", total, model.blocks().size())},
        {"trainable",
         fmt::format("{} ({:.2f}%){}", trainable_count,
                     total > 0
                         ? 100.0 * static_cast<double>(trainable_count) / static_cast<double>(total)
                         : 0.0,
                     o.rank > 0 ? fmt::format(", LoRA rank {} on {}", o.rank, o.lora_target_modules)
                                : ", full fine-tune")},
        {"data", fmt::format("{} samples in {} buckets from {}", set.samples().size(),
                             set.buckets().size(), o.cache_dir)},
        {"device", device.str()},
        {"mixed_precision", o.mixed_precision + (o.allow_tf32 ? ", tf32" : "")},
        {"batch", fmt::format("{} x {} accumulation = {} per step", o.train_batch_size,
                              o.gradient_accumulation_steps,
                              o.train_batch_size * o.gradient_accumulation_steps)},
        {"steps",
         fmt::format(
             "{} (checkpoint every {}, keep {})", o.max_train_steps, o.checkpointing_steps,
             o.checkpoints_total_limit > 0 ? std::to_string(o.checkpoints_total_limit) : "all")},
        {"optimizer", fmt::format("{} lr {} weight decay {}, {} schedule, {} warmup steps, clip {}",
                                  o.optimizer == "adamw8bit" ? "AdamW (8-bit moments)"
                                  : o.optimizer == "prodigy" ? "Prodigy (x its own step size)"
                                                             : "AdamW",
                                  o.learning_rate, o.adam_weight_decay, o.lr_scheduler,
                                  o.lr_warmup_steps, o.max_grad_norm)},
        {"objective", fmt::format("flow matching, {} timesteps, shift {}, caption dropout {}",
                                  o.weighting_scheme, o.flow_shift, o.caption_dropout)},
        {"remedies",
         fmt::format("checkpointing {}, attention {}, fused backward {}, feed-forward chunk {}",
                     o.gradient_checkpointing > 0
                         ? fmt::format("every {}", o.gradient_checkpointing)
                         : "off",
                     o.attention, o.fused_backward_pass ? "on" : "off",
                     o.ff_chunk_size > 0 ? fmt::format("{} latent {}", o.ff_chunk_size,
                                                       model.latent_rank() == 5 ? "frames" : "rows")
                                         : "off")},
        {"output", o.output_dir},
    };
    std::string out = "train: resolved configuration";
    for (const auto& [key, value] : rows) out += fmt::format("\n  {:<16} {}", key, value);
    return out;
}

}  // namespace sf::pipelines::training

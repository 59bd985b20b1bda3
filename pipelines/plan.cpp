#include "pipelines/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/device_options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "model/common/config_json.h"
#include "stages/plan/calibration.h"
#include "stages/plan/remedy_search.h"

namespace sf::pipelines {
namespace {

namespace fs = std::filesystem;
using plan::PlanRemedies;

// The config file the flags name ("" for a built-in name).
std::string config_file(const PlanOptions& o) {
    if (!o.transformer_config.empty()) return o.transformer_config;
    if (o.pretrained_model_name_or_path.empty()) return "";
    const fs::path dir = o.pretrained_model_name_or_path;
    const fs::path sub = dir / "transformer" / "config.json";
    return fs::exists(sub) ? sub.string() : dir.string();
}

// The transformer and the latent grid of the bucket: DC-AE's 32x downsampling for the image
// transformer; the Wan VAE's 8x, and 4x over frames (1 + 4k frames), for the video one.
plan::PlanShape resolve_shape(const PlanOptions& o) {
    plan::PlanShape s;
    const std::string file = config_file(o);
    const auto& video_names = model::SanaVideoTransformerConfig::names();
    const bool video =
        file.empty()
            ? std::find(video_names.begin(), video_names.end(), o.model) != video_names.end()
            : model::config_class(file, "transformer config") == "SanaVideoTransformer3DModel";
    if (video) {
        s.video = file.empty() ? model::SanaVideoTransformerConfig::named(o.model)
                               : model::SanaVideoTransformerConfig::from_json_file(file);
    } else {
        s.config = file.empty() ? model::SanaTransformerConfig::named(o.model)
                                : model::SanaTransformerConfig::from_json_file(file);
    }
    int64_t w = o.resolution, h = o.resolution;
    if (!o.bucket.empty()) {
        const size_t x = o.bucket.find('x');
        try {
            if (x == std::string::npos) throw std::invalid_argument("no x");
            w = std::stoll(o.bucket.substr(0, x));
            h = std::stoll(o.bucket.substr(x + 1));
        } catch (const std::exception&) {
            throw Error::InvalidArgument(fmt::format(
                "--bucket: {} is not WIDTHxHEIGHT in pixels (e.g. 1024x768)", o.bucket));
        }
    }
    const int64_t down = video ? 8 : 32;
    const int64_t patch = video ? s.video->patch_size[1] : s.config.patch_size;
    const int64_t step = down * patch;
    if (w < step || h < step || w % step != 0 || h % step != 0) {
        throw Error::InvalidArgument(fmt::format(
            "--resolution/--bucket: {}x{} pixels is not a positive multiple of {} (the latent "
            "grid is pixels / {}, in patches of {})",
            w, h, step, down, patch));
    }
    if (video) {
        if (o.frames < 1 || (o.frames - 1) % 4 != 0) {
            throw Error::InvalidArgument(fmt::format(
                "--frames {}: the Wan VAE encodes 1 + 4k frames (1, 5, ..., 81)", o.frames));
        }
        s.latent_frames = 1 + (o.frames - 1) / 4;
        if (s.latent_frames % s.video->patch_size[0] != 0) {
            throw Error::InvalidArgument(
                fmt::format("--frames {}: {} latent frames are not a multiple of the patch's {}",
                            o.frames, s.latent_frames, s.video->patch_size[0]));
        }
    }
    s.latent_width = w / down;
    s.latent_height = h / down;
    s.samples_per_item = o.with_prior_preservation ? 2 : 1;
    s.batch = s.samples_per_item * o.train_batch_size * o.remedies.accumulation;  // kept
    s.caption_tokens = o.max_sequence_length;
    s.lora_rank = o.rank;
    s.lora_targets = o.lora_target_modules;
    return s;
}

// The combinations that fit, cheapest first, and the train command line of the best.
std::string search_table(const PlanOptions& o, const plan::PlanShape& shape,
                         const plan::SearchResult& found) {
    std::string out;
    const int64_t items = shape.batch / shape.samples_per_item;  // --train_batch_size counts these
    out += fmt::format("  {:>12} {:>12} {:>9}  {}\n", "peak", "host", "time",
                       "flags (micro-batch x accumulation: the same effective batch)");
    for (size_t i = 0; i < found.fitting.size() && static_cast<int64_t>(i) < o.top; ++i) {
        const plan::Candidate& c = found.fitting[i];
        out += fmt::format("  {:>12} {:>12} {:>8.2f}x  --train_batch_size {} {}\n",
                           format_bytes(c.footprint.peak),
                           c.footprint.host > 0 ? format_bytes(c.footprint.host) : "-", c.cost,
                           items / c.remedies.accumulation, c.remedies.flags());
    }
    out +=
        "time: the step time over no remedies', measured on the calibration's steps; host: what "
        "block swap and optimizer offload keep in host memory (their copies are not in the time, "
        "so these rows come last)\n";
    const std::string model_flag =
        !o.pretrained_model_name_or_path.empty()
            ? "--pretrained_model_name_or_path " + o.pretrained_model_name_or_path
        : !o.transformer_config.empty() ? "--transformer_config " + o.transformer_config
                                        : "--model " + o.model;
    const plan::PlanRemedies& best = found.fitting.front().remedies;
    // A video cache decides its windows: no --resolution for the video transformer.
    const std::string resolution =
        shape.video ? ""
                    : fmt::format(" --resolution {}",
                                  std::max(shape.latent_width, shape.latent_height) * 32);
    out += fmt::format("best: sanaflow train {}{} --train_batch_size {} {} {}{}\n", model_flag,
                       resolution, items / best.accumulation,
                       o.rank > 0 ? fmt::format("--rank {}", o.rank) : "--full_finetune",
                       best.flags(), o.with_prior_preservation ? " --with_prior_preservation" : "");
    if (o.with_prior_preservation)
        out += "  (with the run's --class_data_dir and --class_prompt)\n";
    return out;
}

}  // namespace

PlanReport run_plan(const PlanOptions& o) {
    if (o.train_batch_size < 1) throw Error::InvalidArgument("--train_batch_size must be >= 1");
    if (o.remedies.accumulation < 1)
        throw Error::InvalidArgument("--gradient_accumulation_steps must be >= 1");
    const plan::PlanShape shape = resolve_shape(o);
    const plan::Structure st = plan::structure_of(shape);
    if (o.with_prior_preservation && st.video)
        throw Error::InvalidArgument(
            "--with_prior_preservation: train pairs class images with image caches only, not "
            "with the video transformer's");
    if (o.remedies.blocks_to_swap > st.layers) {
        throw Error::InvalidArgument(
            fmt::format("--blocks_to_swap {}: the transformer has {} blocks",
                        o.remedies.blocks_to_swap, st.layers));
    }
    if (o.remedies.blocks_to_swap > 0 && o.remedies.fused_backward) {
        throw Error::InvalidArgument(
            "--blocks_to_swap with --fused_backward_pass: the trainer refuses the two together");
    }
    const c10::Device device = resolve_device(o.device);
    const bool lora = o.rank > 0;
    const std::string file =
        o.calibration_file.empty() ? plan::default_calibration_file(device) : o.calibration_file;
    plan::CalibrationStore store(device, file, o.calibrate, o.calibration_points);
    const plan::ParameterCensus census = plan::count_parameters(shape);

    PlanReport report;
    std::string& out = report.text;
    const std::string latents =
        st.video
            ? fmt::format("{}x{}x{}", shape.latent_frames, shape.latent_height, shape.latent_width)
            : fmt::format("{}x{}", shape.latent_height, shape.latent_width);
    out += fmt::format(
        "plan: {}{} blocks of width {}, {} parameters ({} trainable: {}), latents {} ({} tokens), "
        "batch {} in micro-batches of {}{}, captions of {} tokens, calibrated on {}\n",
        st.video ? "video transformer, " : "", st.layers, st.inner, census.total, census.trainable,
        lora ? fmt::format("LoRA rank {}", o.rank) : "full fine-tune", latents, st.tokens(),
        shape.batch, shape.batch / o.remedies.accumulation,
        o.with_prior_preservation ? " (instance and class samples in pairs)" : "",
        shape.caption_tokens, device.str());
    const plan::Footprint given =
        plan::predict_footprint(shape, o.remedies, census, store.phases(shape, o.remedies));
    const std::string given_flags = o.remedies.flags();
    out += fmt::format("predicted peak with {}: {} (in the {} phase)\n",
                       given_flags.empty() ? "no remedies" : given_flags, format_bytes(given.peak),
                       given.peak_phase);
    out += plan::footprint_table(given);
    // No budget given: on CUDA what the card has free, else no search.
    const int64_t free =
        device.is_cuda() ? mem::cuda_free_bytes(std::max<int>(0, device.index())) : 0;
    if (o.memory_budget.empty() && free <= 0) {
        store.save();
        return report;
    }
    const int64_t budget =
        o.memory_budget.empty() ? free : parse_bytes(o.memory_budget, "--memory_budget");
    if (o.memory_budget.empty())
        out += fmt::format("\n{} has {} free\n", device.str(), format_bytes(free));
    const std::set<std::string> vary(o.search.begin(), o.search.end());
    const plan::SearchResult found = plan::search_remedies(shape, o.remedies, vary, budget, store);
    store.save();
    out += fmt::format("\nbudget {}: {} of {} combinations fit\n", format_bytes(budget),
                       found.fitting.size(), found.tried);
    report.fits = !found.fitting.empty();
    if (found.fitting.empty()) {
        out +=
            "nothing fits: a smaller --train_batch_size, bucket or LoRA rank, or a larger "
            "budget\n";
        return report;
    }
    out += search_table(o, shape, found);
    return report;
}

}  // namespace sf::pipelines

#include "pipelines/train/validation.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#if defined(SANAFLOW_WITH_MEDIA)
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "stages/video/clip_writer.h"
#endif

#include "core/check.h"
#include "core/device_options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/timeline.h"
#include "graph/device_lease.h"
#include "model/common/autocast.h"
#include "model/common/diffusion_transformer.h"
#include "stages/sample/decode_latents.h"
#include "stages/sample/flow_sampler.h"
#include "storage/cache_schema.h"

namespace sf::pipelines::training {
namespace fs = std::filesystem;
namespace schema = storage::schema;
namespace {

// Validation videos play at SANA-Video's rate (the cache does not keep the clips' own).
constexpr int kVideoFps = 16;

// The bucket with the most samples (the first by name among equals): the shape the run trains on.
train::Bucket largest_bucket(const train::TrainingSet& set) {
    const train::Bucket* best = nullptr;
    size_t most = 0;
    for (const auto& [bucket, indices] : set.buckets()) {
        if (indices.size() > most) most = indices.size(), best = &bucket;
    }
    SF_CHECK(best != nullptr, "a training set without buckets");
    return *best;
}

#if defined(SANAFLOW_WITH_MEDIA)
// [3, H, W] uint8 RGB -> an OpenCV BGR image (its own copy).
cv::Mat to_bgr(const at::Tensor& rgb) {
    const at::Tensor hwc = rgb.permute({1, 2, 0}).contiguous();
    cv::Mat image(static_cast<int>(hwc.size(0)), static_cast<int>(hwc.size(1)), CV_8UC3,
                  hwc.data_ptr<uint8_t>());
    cv::Mat bgr;
    cv::cvtColor(image, bgr, cv::COLOR_RGB2BGR);
    return bgr;
}

void write_png(const std::string& path, const cv::Mat& image) {
    if (!cv::imwrite(path, image))
        throw Error::IOError(fmt::format("validation: could not write {}", path));
}

// [3, T, H, W] uint8 RGB frames -> an MPEG-4 clip at `path`.
void write_video(const std::string& path, const at::Tensor& frames) {
    const at::Tensor thwc = frames.permute({1, 2, 3, 0}).contiguous();  // [T, H, W, 3]
    const int height = static_cast<int>(thwc.size(1)), width = static_cast<int>(thwc.size(2));
    stages::ClipWriter clip(path, width, height, kVideoFps);
    for (int64_t t = 0; t < thwc.size(0); ++t)
        clip.push_rgb(thwc[t].data_ptr<uint8_t>(), width * 3);
    clip.finish();
}

// A video's cell of the grid: its first, middle and last frames side by side (BGR).
cv::Mat frame_strip(const at::Tensor& frames) {
    const int64_t last = frames.size(1) - 1;
    std::vector<cv::Mat> picked;
    for (const int64_t t : {int64_t{0}, last / 2, last})
        picked.push_back(to_bgr(frames.select(1, t)));
    cv::Mat strip;
    cv::hconcat(picked, strip);
    return strip;
}
#endif

}  // namespace

stages::ModelSource cache_vae(const TrainOptions& o, bool video) {
    const std::string& root = o.pretrained_model_name_or_path;
    if (!root.empty() && fs::is_directory(fs::path(root) / "vae")) return {root, "", o.seed};
    return {"", video ? "wan-vae-tiny" : "dc-ae-tiny", o.seed};
}

sample::SamplerSpec validation_sampler(const TrainOptions& o) {
    sample::SamplerSpec spec;
    const fs::path config =
        fs::path(o.pretrained_model_name_or_path) / "scheduler" / "scheduler_config.json";
    if (o.validation_scheduler == "auto" && !o.pretrained_model_name_or_path.empty() &&
        fs::is_regular_file(config)) {
        spec = sample::read_scheduler_config(config.string());
    } else {
        spec.kind = o.validation_scheduler == "euler"   ? sample::SamplerSpec::Kind::kEuler
                    : o.validation_scheduler == "unipc" ? sample::SamplerSpec::Kind::kUniPc
                                                        : sample::SamplerSpec::Kind::kDpmSolver;
        spec.shift = o.flow_shift;
    }
    try {
        sample::check_sampler(spec, o.validation_inference_steps);
    } catch (const Error& e) {
        throw Error::InvalidArgument(
            fmt::format("--validation_inference_steps {} with --validation_scheduler {}: {}",
                        o.validation_inference_steps, o.validation_scheduler, e.what()));
    }
    return spec;
}

void check_cache_vae(storage::Cache cache, const stages::ModelSource& vae, bool video,
                     const std::string& flag) {
    const auto stored =
        cache.fingerprint(video ? schema::kEncodeVideoVAEStage : schema::kEncodeVAEStage);
    const std::string weights = stages::weights_fingerprint(vae, "vae");
    if (!stored || stored->count("weights") == 0 || stored->at("weights") != weights) {
        throw Error::InvalidArgument(fmt::format(
            "{}: the cache's latents were encoded by another VAE than {} (the one that would "
            "decode them): give --pretrained_model_name_or_path the diffusers root whose vae/ "
            "prep used",
            flag, vae.is_pretrained() ? vae.pretrained + "/vae" : "the built-in " + vae.builtin));
    }
}

Validator::Validator(const TrainOptions& o, const train::TrainingSet& set, storage::Cache cache,
                     int64_t steps_per_epoch, c10::Device device)
    : o_(o),
      prompts_(o.validation_prompts),
      steps_per_epoch_(std::max<int64_t>(1, steps_per_epoch)),
      device_(device) {
    if (prompts_.empty()) return;
#if !defined(SANAFLOW_WITH_MEDIA)
    throw Error::InvalidArgument(
        "--validation_prompt: this sanaflow was built with SANAFLOW_WITH_MEDIA=OFF, without the "
        "PNG writer");
#endif
    if (o.num_validation_images < 1)
        throw Error::InvalidArgument("--num_validation_images must be >= 1");
    if (o.validation_epochs < 1) throw Error::InvalidArgument("--validation_epochs must be >= 1");
    if (o.validation_steps < 0)
        throw Error::InvalidArgument("--validation_steps must be >= 0 (0: by --validation_epochs)");
    sampler_ = validation_sampler(o);
    if (!std::isfinite(o.validation_guidance_scale) || o.validation_guidance_scale < 0)
        throw Error::InvalidArgument(
            fmt::format("--validation_guidance_scale must be a finite number >= 0, got {:g}",
                        o.validation_guidance_scale));
    video_ = set.latent_rank() == 4;
    for (const auto& prompt : prompts_) {
        at::Tensor f = set.validation_prompt(prompt);
        if (!f.defined()) {
            throw Error::InvalidArgument(fmt::format(
                "--validation_prompt \"{}\" is not in the cache {}: prep encodes it (sanaflow prep "
                "--validation_prompt, or train with --instance_data_dir, which preps first)",
                prompt, cache.dir()));
        }
        features_.push_back(f.to(at::kFloat));
    }
    empty_ = set.empty_prompt();
    if (!empty_.defined() && o.validation_guidance_scale > 1)
        throw Error::InvalidArgument(
            "--validation_guidance_scale > 1 needs the empty prompt's features: rerun prep");
    if (empty_.defined()) empty_ = empty_.to(at::kFloat);

    vae_ = cache_vae(o, video_);
    check_cache_vae(cache, vae_, video_, "--validation_prompt");
    const train::Bucket bucket = largest_bucket(set);
    at::Generator gen = at::detail::createCPUGenerator(0);
    const train::TrainingBatch one = set.load({set.buckets().at(bucket).front()}, 0, gen);
    noise_sizes_ = one.latents.sizes().vec();  // one sample: [1, C, (f,) h, w]
    log_info(
        "train: validation: {} {}(s) of {} prompt(s) at {}{}x{}, {} steps of {}, guidance {:g}",
        o.num_validation_images, video_ ? "video" : "image", prompts_.size(),
        video_ ? fmt::format("{} frames of ", bucket.frames) : "", bucket.height, bucket.width,
        o.validation_inference_steps, sample::describe(sampler_), o.validation_guidance_scale);
}

bool Validator::due(int64_t step) const {
    if (prompts_.empty()) return false;
    if (step == o_.max_train_steps) return true;
    if (o_.validation_steps > 0) return step % o_.validation_steps == 0;
    if (step % steps_per_epoch_ != 0) return false;
    const int64_t epoch = step / steps_per_epoch_ - 1;  // the 0-based epoch just ended
    return epoch % o_.validation_epochs == 0;
}

ValidationResult Validator::run(model::DiffusionTransformer& model,
                                const train::TrainStepOptions& options, int64_t step) {
    const mem::Span span("train", fmt::format("validation at step {}", step));
    mem::release_memory("validation start");  // what the last step left cached
    mem::reset_peak();
    auto lease = graph::device_lease().acquire("validation");
    ValidationResult result;
    result.dir = (fs::path(o_.output_dir) / "validation" / fmt::format("step-{}", step)).string();
    fs::create_directories(result.dir);

    // Sampling: the transformer as it is now, in eval mode, each image alone.
    std::vector<at::Tensor> latents;
    {
        model.module().eval();
        model.set_gradient_checkpointing(0);  // nothing is saved for a backward here
        const bool autocast = options.mixed_precision != "no";
        model::AutocastGuard guard(
            device_.type(), autocast ? resolve_dtype(options.mixed_precision) : at::kBFloat16,
            autocast);
        at::Generator gen = at::detail::createCPUGenerator(o_.seed);
        const at::Tensor empty = empty_.defined() ? empty_.to(device_) : at::Tensor();
        for (const at::Tensor& f : features_) {
            const at::Tensor caption = f.unsqueeze(0).to(device_);
            const at::Tensor mask =
                torch::ones({1, f.size(0)}, at::TensorOptions(at::kLong)).to(device_);
            const sample::Velocity v =
                sample::guided_velocity(model, caption, mask, empty, o_.validation_guidance_scale);
            for (int64_t i = 0; i < o_.num_validation_images; ++i) {
                const at::Tensor noise =
                    at::randn(noise_sizes_, gen, at::TensorOptions(at::kFloat));
                latents.push_back(sample::sample_flow(v, noise.to(device_),
                                                      o_.validation_inference_steps, sampler_)
                                      .to(at::kCPU));
            }
        }
        model.set_gradient_checkpointing(options.gradient_checkpointing);
        model.module().train();
    }
    mem::release_memory("validation after sampling");

#if defined(SANAFLOW_WITH_MEDIA)
    // Decoding: the VAE's decoder on the device for this moment only.
    std::vector<cv::Mat> rows;
    {
        sample::LatentDecoder decoder(
            vae_, device_,
            video_ ? sample::LatentDecoder::Kind::kWan : sample::LatentDecoder::Kind::kDcAe);
        const size_t n = static_cast<size_t>(o_.num_validation_images);
        for (size_t p = 0; p < features_.size(); ++p) {
            std::vector<cv::Mat> row;
            for (size_t i = 0; i < n; ++i) {
                const at::Tensor pixels =
                    decoder.decode(latents[p * n + i], o_.validation_vae_tiling)[0];
                const std::string path =
                    (fs::path(result.dir) / fmt::format("prompt-{}-{}-{}.{}", p,
                                                        video_ ? "video" : "image", i,
                                                        video_ ? "mp4" : "png"))
                        .string();
                if (video_) {
                    write_video(path, pixels);
                    row.push_back(frame_strip(pixels));
                } else {
                    row.push_back(to_bgr(pixels));
                    write_png(path, row.back());
                }
                result.images.push_back(path);
            }
            cv::Mat joined;
            cv::hconcat(row, joined);
            rows.push_back(joined);
        }
    }
    cv::Mat grid;
    cv::vconcat(rows, grid);
    write_png((fs::path(result.dir) / "grid.png").string(), grid);
#endif
    result.peak = {device_.is_cuda() ? mem::cuda_stats(std::max<int>(0, device_.index())).peak
                                     : mem::cpu_stats().peak,
                   mem::peak_rss_bytes()};
    mem::release_memory("validation end");
    log_info("train: validation at step {}: {} {}(s) in {} (peak {})", step, result.images.size(),
             video_ ? "video" : "image", result.dir, format_bytes(result.peak.tensor_bytes));
    return result;
}

}  // namespace sf::pipelines::training

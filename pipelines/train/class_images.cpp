#include "pipelines/train/class_images.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "core/device_options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/timeline.h"
#include "graph/device_lease.h"
#include "graph/progress.h"
#include "model/common/autocast.h"
#include "model/common/diffusion_transformer.h"
#include "pipelines/train/train_setup.h"
#include "pipelines/train/validation.h"
#include "stages/distributed/world.h"
#include "stages/image/dataset.h"
#include "stages/sample/decode_latents.h"
#include "stages/sample/flow_sampler.h"
#include "storage/atomic_file.h"
#include "storage/cache.h"
#include "storage/cache_shards.h"
#include "storage/xxh3.h"

namespace sf::pipelines {
namespace fs = std::filesystem;
namespace {

constexpr int kJpegQuality = 95;
// Most images --num_class_images may ask for (upstream's default is 100).
constexpr int64_t kMostClassImages = 100'000;

}  // namespace

void check_class_image_options(const TrainOptions& o, const ClassImageOptions& c) {
    if (c.class_data_dir.empty())
        throw Error::InvalidArgument(
            "--with_prior_preservation needs --class_data_dir (where the class images are)");
    if (c.class_prompt.empty())
        throw Error::InvalidArgument(
            "--with_prior_preservation needs --class_prompt (the class images' caption)");
    if (c.num_class_images < 1 || c.num_class_images > kMostClassImages)
        throw Error::InvalidArgument(fmt::format("--num_class_images must be in [1, {}], got {}",
                                                 kMostClassImages, c.num_class_images));
    if (c.sample_batch_size < 1)
        throw Error::InvalidArgument(
            fmt::format("--sample_batch_size must be >= 1, got {}", c.sample_batch_size));
    training::validation_sampler(o);  // a scheduler config it cannot run, before any work
    static const char* const precisions[] = {"", "no", "fp32", "fp16", "bf16"};
    if (std::find(std::begin(precisions), std::end(precisions), c.precision) ==
        std::end(precisions))
        throw Error::InvalidArgument(fmt::format(
            "--prior_generation_precision must be no, fp32, fp16 or bf16, got '{}'", c.precision));
    const std::string precision = c.precision.empty() ? o.mixed_precision : c.precision;
    if (precision == "fp16" || precision == "bf16") {
        const c10::Device device = resolve_device(o.device);
        try {
            model::AutocastGuard probe(device.type(), resolve_dtype(precision));
        } catch (const Error& e) {
            throw Error::InvalidArgument(fmt::format(
                "class images are generated under {} autocast ({}) on {}, which this LibTorch "
                "refuses ({}): give --prior_generation_precision bf16 or fp32",
                precision,
                c.precision.empty() ? "the run's --mixed_precision"
                                    : "--prior_generation_precision",
                device.str(), e.message()));
        }
    }
}

namespace {

// The noise of class image `index`: its own generator, from the seed and the index alone.
at::Tensor class_noise(uint64_t seed, int64_t index, at::IntArrayRef sizes) {
    at::Generator gen = at::detail::createCPUGenerator((seed + 1) * 0x9E3779B97F4A7C15ULL +
                                                       static_cast<uint64_t>(index));
    return at::randn(sizes, gen, at::TensorOptions(at::kFloat));
}

// [3, H, W] uint8 RGB -> JPEG bytes.
std::string encode_jpeg(const at::Tensor& rgb) {
    const at::Tensor hwc = rgb.permute({1, 2, 0}).contiguous();
    const cv::Mat image(static_cast<int>(hwc.size(0)), static_cast<int>(hwc.size(1)), CV_8UC3,
                        hwc.data_ptr<uint8_t>());
    cv::Mat bgr;
    cv::cvtColor(image, bgr, cv::COLOR_RGB2BGR);
    std::vector<uchar> bytes;
    if (!cv::imencode(".jpg", bgr, bytes, {cv::IMWRITE_JPEG_QUALITY, kJpegQuality}))
        throw Error::IOError("class images: the JPEG encoder failed");
    return std::string(bytes.begin(), bytes.end());
}

// The instance samples' buckets, one per sample, taken round-robin over the buckets (in name
// order): every bucket in the first (number of buckets) entries, then each in proportion.
std::vector<train::Bucket> bucket_order(const train::TrainingSet& set) {
    size_t total = 0;
    for (const auto& [bucket, indices] : set.buckets()) total += indices.size();
    std::vector<train::Bucket> order;
    for (size_t round = 0; order.size() < total; ++round) {
        for (const auto& [bucket, indices] : set.buckets())
            if (round < indices.size()) order.push_back(bucket);
    }
    return order;
}

// Which images to make, by bucket: image i (found <= i < wanted) at entry i mod n of
// bucket_order, so the first images cover every bucket. kInvalidArgument when none is there yet
// and fewer are wanted than there are buckets.
std::map<train::Bucket, std::vector<int64_t>> plan_class_images(const train::TrainingSet& set,
                                                                int64_t found, int64_t wanted) {
    const auto buckets = static_cast<int64_t>(set.buckets().size());
    if (found == 0 && wanted < buckets) {
        throw Error::InvalidArgument(fmt::format(
            "--num_class_images {} cannot cover the {} aspect buckets of the instance images (a "
            "batch pairs instance and class images of one shape): raise it to {} or more, or use "
            "--center_crop (one square bucket)",
            wanted, buckets, buckets));
    }
    const std::vector<train::Bucket> order = bucket_order(set);
    std::map<train::Bucket, std::vector<int64_t>> by_bucket;
    for (int64_t i = found; i < wanted; ++i)
        by_bucket[order[static_cast<size_t>(i) % order.size()]].push_back(i);
    return by_bucket;
}

// A launch's rank's share of `by_bucket`: the indices i with i mod `size` == `rank`.
std::map<train::Bucket, std::vector<int64_t>> share_of_rank(
    const std::map<train::Bucket, std::vector<int64_t>>& by_bucket, int rank, int size) {
    std::map<train::Bucket, std::vector<int64_t>> share;
    for (const auto& [bucket, indices] : by_bucket)
        for (const int64_t i : indices)
            if (i % size == rank) share[bucket].push_back(i);
    return share;
}

// The base transformer (no adapters) on the device for this only: each bucket's images sampled
// --sample_batch_size at a time with `sampler`. Index -> latent [1, C, h, w] on the CPU.
std::map<int64_t, at::Tensor> sample_class_latents(
    const TrainOptions& o, const ClassImageOptions& c, const sample::SamplerSpec& sampler,
    const train::TrainingSet& set, const at::Tensor& prompt,
    const std::map<train::Bucket, std::vector<int64_t>>& by_bucket, c10::Device device,
    graph::Progress& progress) {
    auto lease = graph::device_lease().acquire("generate_class_images");
    TrainOptions base = o;
    base.rank = 0;
    base.lora_dropout = 0;
    std::string source;
    const auto transformer = training::build_transformer(base, set, source);
    transformer->module().to(device);
    transformer->module().eval();
    at::NoGradGuard no_grad;
    const std::string precision = c.precision.empty() ? o.mixed_precision : c.precision;
    const bool autocast = precision == "fp16" || precision == "bf16";
    model::AutocastGuard guard(device.type(), autocast ? resolve_dtype(precision) : at::kBFloat16,
                               autocast);
    const at::Tensor empty = set.empty_prompt().to(device, at::kFloat);
    const at::Tensor caption = prompt.to(device, at::kFloat).unsqueeze(0);
    const int64_t down = set.latent_downsample();
    const auto batch = static_cast<size_t>(c.sample_batch_size);
    std::map<int64_t, at::Tensor> latents;
    for (const auto& [bucket, indices] : by_bucket) {
        for (size_t first = 0; first < indices.size(); first += batch) {
            const size_t last = std::min(indices.size(), first + batch);
            const auto n = static_cast<int64_t>(last - first);
            std::vector<at::Tensor> noise;
            for (size_t k = first; k < last; ++k)
                noise.push_back(class_noise(
                    o.seed, indices[k],
                    {1, set.latent_channels(), bucket.height / down, bucket.width / down}));
            const at::Tensor mask =
                torch::ones({n, prompt.size(0)}, at::TensorOptions(at::kLong)).to(device);
            const sample::Velocity v =
                sample::guided_velocity(*transformer, caption.expand({n, -1, -1}), mask, empty,
                                        o.validation_guidance_scale);
            const at::Tensor x = sample::sample_flow(v, at::cat(noise).to(device),
                                                     o.validation_inference_steps, sampler);
            for (size_t k = first; k < last; ++k)
                latents[indices[k]] =
                    x.narrow(0, static_cast<int64_t>(k - first), 1).to(at::kCPU, at::kFloat);
            progress.advance(n);
        }
    }
    return latents;
}

// The VAE's decoder on the device for this only: each latent decoded and written atomically as
// DIR/<index>-<hash>.jpg. The paths, in index order.
std::vector<std::string> write_class_images(const stages::ModelSource& vae, c10::Device device,
                                            const std::map<int64_t, at::Tensor>& latents,
                                            const std::string& dir) {
    auto lease = graph::device_lease().acquire("decode_class_images");
    sample::LatentDecoder decoder(vae, device);
    std::vector<std::string> written;
    for (const auto& [index, latent] : latents) {
        const std::string jpeg = encode_jpeg(decoder.decode(latent)[0]);
        const std::string path =
            (fs::path(dir) / fmt::format("{}-{}.jpg", index, storage::xxh3_128_hex(jpeg))).string();
        storage::write_file_atomic(path, jpeg);
        written.push_back(path);
    }
    return written;
}

}  // namespace

int64_t count_class_images(const std::string& dir) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return 0;
    // What prep's scan would find there (its extensions, dot names skipped, a metadata.jsonl
    // read), every image captioned alike.
    stages::DatasetConfig scan;
    scan.instance_data_dir = dir;
    scan.instance_prompt = "class";
    return static_cast<int64_t>(stages::scan_dataset(scan).samples.size());
}

ClassImageReport generate_class_images(const TrainOptions& o, const ClassImageOptions& c,
                                       distributed::World* ranks) {
    check_class_image_options(o, c);
    std::error_code ec;
    fs::create_directories(c.class_data_dir, ec);
    if (ec || !fs::is_directory(c.class_data_dir))
        throw Error::IOError(fmt::format("--class_data_dir {}: cannot create it: {}",
                                         c.class_data_dir, ec.message()));
    ClassImageReport report;
    report.found = count_class_images(c.class_data_dir);
    // Every rank has counted before any writes: they agree on the indices that are missing.
    if (ranks != nullptr) ranks->barrier("counting the class images");
    if (report.found >= c.num_class_images) {
        log_info("train: prior preservation: {} class images in {} (--num_class_images {})",
                 report.found, c.class_data_dir, c.num_class_images);
        return report;
    }
    const mem::Span span("train", "class images");
    std::vector<storage::Cache> shards;  // the cache, or every shard of a sharded prep
    for (const auto& dir : storage::cache_shard_dirs(o.cache_dir))
        shards.push_back(storage::Cache::open(dir, /*create=*/false));
    const storage::Cache& cache = shards.front();
    const train::TrainingSet set = train::TrainingSet::open(shards, o.skip_corrupt);
    if (set.latent_rank() != 3) {
        throw Error::InvalidArgument(
            "--with_prior_preservation is for images (DC-AE latents): the cache " + o.cache_dir +
            " holds video latents");
    }
    const at::Tensor prompt = set.validation_prompt(c.class_prompt);
    if (!prompt.defined() || !set.empty_prompt().defined())
        throw Error::InvalidArgument(fmt::format(
            "--class_prompt \"{}\" or the empty prompt is not in the cache {}: prep encodes them "
            "(train with --instance_data_dir, which preps first)",
            c.class_prompt, o.cache_dir));
    const stages::ModelSource vae = training::cache_vae(o, /*video=*/false);
    training::check_cache_vae(cache, vae, /*video=*/false, "--with_prior_preservation");

    std::map<train::Bucket, std::vector<int64_t>> by_bucket =
        plan_class_images(set, report.found, c.num_class_images);
    c10::Device device = resolve_device(o.device);
    if (ranks != nullptr) {
        by_bucket = share_of_rank(by_bucket, ranks->rank(), ranks->size());
        if (device.is_cuda()) device = c10::Device(c10::kCUDA, ranks->env().local_rank);
    }
    int64_t mine = 0;
    for (const auto& [bucket, indices] : by_bucket) mine += static_cast<int64_t>(indices.size());
    const sample::SamplerSpec sampler = training::validation_sampler(o);
    log_info(
        "train: prior preservation: {} class images in {}; generating {} of \"{}\" in {} steps of "
        "{}{}",
        report.found, c.class_data_dir, c.num_class_images - report.found, c.class_prompt,
        o.validation_inference_steps, sample::describe(sampler),
        ranks != nullptr ? fmt::format(" ({} ranks, {} on this one)", ranks->size(), mine) : "");
    if (mine > 0) {
        graph::Progress progress("class images", mine);
        const std::map<int64_t, at::Tensor> latents =
            sample_class_latents(o, c, sampler, set, prompt, by_bucket, device, progress);
        mem::release_memory("class images after sampling");
        report.written = write_class_images(vae, device, latents, c.class_data_dir);
        progress.finish();
        mem::release_memory("class images end");
    }
    // Every image is on disk before any rank preps them.
    if (ranks != nullptr) ranks->barrier("writing the class images");
    log_info("train: prior preservation: wrote {} class images to {}{}", report.written.size(),
             c.class_data_dir, ranks != nullptr ? " (this rank's; the others wrote theirs)" : "");
    return report;
}

}  // namespace sf::pipelines

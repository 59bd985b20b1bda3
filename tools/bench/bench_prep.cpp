// Prep pipeline benchmark with the built-in tiny models: items/s of the whole prep, and how much
// the pipeline overlaps its stages. Three runs on the same generated images, side by side:
//   pipelined   sanaflow's prep: decode workers run while the VAE encodes (one cache)
//   sequential  the same work one stage after another: prep without the VAE (index, text,
//               decode), then the VAE over the already decoded images (another cache)
// The last line is ratio=<pipelined wall time / sequential sum>: below 1 means overlap.
//
//   bench_prep [--images N] [--workers N]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <opencv2/core/utility.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <string>
#include <vector>

#include "core/log.h"
#include "core/memory.h"
#include "core/threads.h"
#include "pipelines/prep/prep.h"
#include "stages/encode/encode_vae.h"
#include "stages/image/decode_image.h"

namespace fs = std::filesystem;

namespace {

double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

void write_images(const fs::path& dir, int n) {
    fs::create_directories(dir);
    const int sizes[][2] = {{600, 600}, {640, 480}, {480, 640}, {720, 540}};
    for (int i = 0; i < n; ++i) {
        const auto& s = sizes[i % 4];
        cv::Mat img(s[0], s[1], CV_8UC3, cv::Scalar(i * 37 % 255, i * 91 % 255, i * 53 % 255));
        cv::circle(img, {s[1] / 2, s[0] / 2}, 60 + i % 90, cv::Scalar(20, 200 - i % 100, 90),
                   cv::FILLED);
        cv::randn(img(cv::Rect(0, 0, s[1] / 4, s[0] / 4)), 128,
                  40);  // some texture for the JPEG coder
        const std::string stem = (dir / ("img_" + std::to_string(i))).string();
        cv::imwrite(stem + ".jpg", img);
        std::FILE* f = std::fopen((stem + ".txt").c_str(), "w");
        std::fprintf(f, "benchmark picture %d with a circle", i);
        std::fclose(f);
    }
}

}  // namespace

int main(int argc, char** argv) {
    int images = 32, workers = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string flag = argv[i];
        if (flag == "--images")
            images = std::atoi(argv[i + 1]);
        else if (flag == "--workers")
            workers = std::atoi(argv[i + 1]);
        else {
            std::fprintf(stderr, "bench_prep: unknown flag %s (flags: --images N --workers N)\n",
                         flag.c_str());
            return 2;
        }
    }
    if (images < 1 || workers < 1) {
        std::fprintf(stderr, "bench_prep: --images and --workers must be >= 1\n");
        return 2;
    }
    sf::mem::install_counting_allocator();
    const int threads = sf::set_torch_threads();
    sf::set_log_level(sf::LogLevel::kWarn);
    const fs::path root =
        fs::temp_directory_path() / ("sanaflow_bench_prep_" + std::to_string(::getpid()));
    fs::remove_all(root);
    write_images(root / "data", images);

    sf::pipelines::PrepOptions o;
    o.instance_data_dir = (root / "data").string();
    o.resolution = 512;
    o.min_side = 128;
    o.workers = workers;
    o.device = "cpu";

    // Warm-up on a few other images, so that one-time costs (the tokenizer, oneDNN's kernels, the
    // allocator's pool) fall on neither of the measured runs.
    write_images(root / "warmup", 4);
    o.instance_data_dir = (root / "warmup").string();
    o.cache_dir = (root / "warmup_cache").string();
    sf::pipelines::run_prep(o);
    o.instance_data_dir = (root / "data").string();

    // Pipelined.
    o.cache_dir = (root / "pipelined").string();
    double t = now_seconds();
    const auto pipelined = sf::pipelines::run_prep(o);
    const double pipelined_s = now_seconds() - t;

    // Sequential: everything but the VAE, then the VAE alone over pre-decoded images.
    o.cache_dir = (root / "sequential").string();
    o.vae = false;
    t = now_seconds();
    sf::pipelines::run_prep(o);
    const double without_vae_s = now_seconds() - t;

    sf::stages::DecodeImageConfig dc;
    dc.resolution = o.resolution;
    dc.min_side = o.min_side;
    dc.output_uint8 = true;
    const sf::stages::DecodeImageStage decoder(dc);
    std::vector<sf::stages::DecodedImage> decoded;
    for (int i = 0; i < images; ++i) {
        decoded.push_back(
            decoder.run((root / "data" / ("img_" + std::to_string(i) + ".jpg")).string()));
    }
    // Grouped by bucket, as the pipeline orders its work, so both halves encode the same batches.
    std::stable_sort(decoded.begin(), decoded.end(),
                     [](const sf::stages::DecodedImage& a, const sf::stages::DecodedImage& b) {
                         return std::make_pair(a.bucket_h, a.bucket_w) <
                                std::make_pair(b.bucket_h, b.bucket_w);
                     });
    sf::stages::EncodeVAEConfig vc;
    vc.model = {"", "dc-ae-tiny", o.seed};
    vc.device = "cpu";
    t = now_seconds();
    {
        auto vae = sf::stages::EncodeVAEStage(vc).open();
        // Batches of one bucket, as the pipeline makes them.
        for (size_t i = 0; i < decoded.size();) {
            std::vector<at::Tensor> batch;
            size_t j = i;
            while (j < decoded.size() && batch.size() < static_cast<size_t>(o.vae_batch_size) &&
                   decoded[j].bucket_h == decoded[i].bucket_h &&
                   decoded[j].bucket_w == decoded[i].bucket_w) {
                batch.push_back(decoded[j++].pixels);
            }
            vae->encode(batch);
            i = j;
        }
    }
    const double vae_s = now_seconds() - t;
    const double sequential_s = without_vae_s + vae_s;
    fs::remove_all(root);

    std::printf(
        "prep benchmark: %d generated JPEGs (480x640 to 720x540), 512-px buckets, tiny models, "
        "%d decode workers, %d torch threads\n",
        images, workers, threads);
    std::printf("%-34s %9.2f s %8.2f items/s\n", "pipelined prep (all phases)", pipelined_s,
                images / pipelined_s);
    std::printf("%-34s %9.2f s\n", "sequential: prep without the VAE", without_vae_s);
    std::printf("%-34s %9.2f s\n", "sequential: VAE alone", vae_s);
    std::printf("%-34s %9.2f s %8.2f items/s\n", "sequential sum", sequential_s,
                images / sequential_s);
    std::printf("pipelined run, per stage:\n%s", pipelined.table().c_str());
    std::printf("pipelined run: %lld samples, %lld latents, %lld texts written\n",
                static_cast<long long>(pipelined.written),
                static_cast<long long>(pipelined.latents_written),
                static_cast<long long>(pipelined.texts_written));
    std::printf("ratio=%.3f\n", pipelined_s / sequential_s);
    return 0;
}

// The `sanaflow` command line. Flags keep the spelling of the diffusers Sana training scripts.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/threads.h"
#include "pipelines/inspect.h"
#include "pipelines/models_table.h"
#include "pipelines/prep.h"
#if defined(SANAFLOW_WITH_MEDIA)
#include "tools/demo_data.h"
#endif

namespace {

namespace fs = std::filesystem;
using sf::pipelines::PrepOptions;

void add_prep_flags(CLI::App* cmd, PrepOptions& o) {
    cmd->add_option("--instance_data_dir", o.instance_data_dir,
                    "folder of images with same-stem .txt captions")
        ->check(CLI::ExistingDirectory);
    cmd->add_option("--manifest", o.manifest, "JSONL manifest: one {\"file\": ..., \"caption\": ...} per line")
        ->check(CLI::ExistingFile);
    cmd->add_option("--instance_prompt", o.instance_prompt, "caption for every image (DreamBooth style)");
    cmd->add_option("--resolution", o.resolution, "bucket table: 512, 1024, 2048 or 4096")
        ->check(CLI::IsMember({512, 1024, 2048, 4096}))
        ->capture_default_str();
    cmd->add_option("--min_side", o.min_side, "reject images with a smaller side (0: resolution / 4)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    cmd->add_option("--dataloader_num_workers", o.workers, "parallel decode workers")
        ->check(CLI::Range(1, 256))
        ->capture_default_str();
    cmd->add_option("--max_in_flight", o.max_in_flight, "bound on decoded samples in memory (0: 4 x workers)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--pretrained_model_name_or_path", o.pretrained_model_name_or_path,
                    "diffusers-layout model directory (vae/, text_encoder/, tokenizer/)")
        ->check(CLI::ExistingDirectory);
    cmd->add_option("--model", o.model, "built-in models when no weights are given (seeded random weights)")
        ->check(CLI::IsMember({"tiny"}))
        ->capture_default_str();
    cmd->add_option("--seed", o.seed, "seed of the built-in models' weights")->capture_default_str();
    cmd->add_option("--device", o.device, "auto, cpu, cuda or cuda:N")->capture_default_str();
    cmd->add_option("--mixed_precision", o.mixed_precision, "dtype of the frozen encoders: no, fp16 or bf16")
        ->check(CLI::IsMember({"no", "fp16", "bf16"}))
        ->capture_default_str();
    cmd->add_option("--vae_batch_size", o.vae_batch_size, "images per VAE forward")
        ->check(CLI::Range(1, 4096))
        ->capture_default_str();
    cmd->add_option("--text_batch_size", o.text_batch_size, "captions per text-encoder forward")
        ->check(CLI::Range(1, 4096))
        ->capture_default_str();
    cmd->add_option("--commit_batch", o.commit_batch, "records per committed transaction")
        ->check(CLI::Range(1, 1000000))
        ->capture_default_str();
    cmd->add_flag("--rebuild", o.rebuild, "rebuild a stage whose fingerprint differs instead of refusing");
}

#if defined(SANAFLOW_WITH_MEDIA)
int run_prep_command(const PrepOptions& o) {
    auto report = sf::pipelines::run_prep(o);
    std::cout << report.table();
    return 0;
}

#else
// Built without OpenCV/FFmpeg (a GPU machine that trains from a cache): no decoding here.
int run_prep_command(const PrepOptions&) {
    throw sf::Error::InvalidArgument("this sanaflow was built with SANAFLOW_WITH_MEDIA=OFF: prep needs image decoding");
}
#endif

int run_inspect_command(const std::string& cache, bool verify) {
    auto result = sf::pipelines::inspect_cache(cache, verify);
    std::cout << result.text;
    return result.ok ? 0 : 3;
}

#if defined(SANAFLOW_WITH_MEDIA)
int run_demo_command(const std::string& out_dir, int num_images) {
    const fs::path root(out_dir);
    const fs::path data = root / "data";
    const fs::path cache = root / "cache";
    sf::log_info("demo: writing {} generated images with captions to {}", num_images, data.string());
    auto stats = sf::tools::write_demo_dataset(data.string(), num_images, /*seed=*/1234);
    sf::log_info("demo: {} images and {} deliberately bad files", stats.images, stats.bad_files);

    PrepOptions o;
    o.instance_data_dir = data.string();
    o.cache_dir = cache.string();
    o.resolution = 512;
    std::cout << "== sanaflow prep --instance_data_dir " << data.string() << " --cache_dir "
              << cache.string() << " --resolution 512\n";
    std::cout << sf::pipelines::run_prep(o).table();
    std::cout << "\n== the same prep again: everything is cached, nothing is decoded\n";
    std::cout << sf::pipelines::run_prep(o).table();
    std::cout << "\n== sanaflow inspect " << cache.string() << " --verify\n";
    auto result = sf::pipelines::inspect_cache(cache.string(), /*verify=*/true);
    std::cout << result.text;
    std::cout << "\n== memory\n" << sf::mem::memory_log().table();
    return result.ok ? 0 : 3;
}
#else
int run_demo_command(const std::string&, int) {
    throw sf::Error::InvalidArgument("this sanaflow was built with SANAFLOW_WITH_MEDIA=OFF: the demo needs image decoding");
}
#endif

}  // namespace

int main(int argc, char** argv) {
    sf::mem::install_counting_allocator();
    sf::set_torch_threads();

    CLI::App app{"sanaflow: train Sana-style diffusion transformers from a cache of latents, "
                 "without running out of memory"};
    app.require_subcommand(1);
    // One line, naming the flag: "sanaflow: --resolution: 777 not in {512,1024,2048,4096}".
    app.failure_message([](const CLI::App*, const CLI::Error& e) {
        return std::string("sanaflow: ") + e.what() + " (see --help)\n";
    });
    bool quiet = false, verbose = false;
    app.add_flag("-q,--quiet", quiet, "only warnings and errors");
    app.add_flag("-v,--verbose", verbose, "debug output");

    PrepOptions prep;
    auto* prep_cmd = app.add_subcommand("prep", "decode, bucket and cache a dataset");
    add_prep_flags(prep_cmd, prep);
    prep_cmd->add_option("--cache_dir", prep.cache_dir, "cache directory (created if absent)")->required();

    std::string inspect_dir;
    bool verify = false;
    auto* inspect_cmd = app.add_subcommand("inspect", "show what a cache holds; --verify checks every record");
    inspect_cmd->add_option("cache", inspect_dir, "cache directory")->required()->check(CLI::ExistingDirectory);
    inspect_cmd->add_flag("--verify", verify, "decode every record and check its checksum");

    auto* models_cmd = app.add_subcommand("models", "list the built-in model configurations and their parameter counts");

    std::string demo_dir = "demo-out";
    int demo_images = 24;
    auto* demo_cmd = app.add_subcommand("demo", "generate a small dataset, prep it, inspect the cache");
    demo_cmd->add_option("--output_dir", demo_dir, "where the data and the cache go")->capture_default_str();
    demo_cmd->add_option("--num_images", demo_images, "images to generate")
        ->check(CLI::Range(1, 100000))
        ->capture_default_str();

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    if (quiet) sf::set_log_level(sf::LogLevel::kWarn);
    if (verbose) sf::set_log_level(sf::LogLevel::kDebug);

    try {
        if (*prep_cmd) return run_prep_command(prep);
        if (*inspect_cmd) return run_inspect_command(inspect_dir, verify);
        if (*demo_cmd) return run_demo_command(demo_dir, demo_images);
        if (*models_cmd) {
            std::cout << sf::pipelines::models_table();
            return 0;
        }
    } catch (const sf::Error& e) {
        std::fprintf(stderr, "sanaflow: %s\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "sanaflow: error: %s\n", e.what());
        return 1;
    }
    return 0;
}

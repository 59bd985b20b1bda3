// The `sanaflow` command line. Flags keep the spelling of the diffusers Sana training scripts.
#include <fmt/format.h>
#include <torch/version.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/threads.h"
#include "core/timeline.h"
#include "pipelines/inspect.h"
#include "pipelines/models_table.h"
#include "pipelines/plan.h"
#include "pipelines/prep/prep.h"
#include "pipelines/train/train.h"
#include "stages/distributed/launch_env.h"
#include "stages/distributed/local_launch.h"
#include "tools/cli/flag_check.h"
#include "tools/cli/flag_values.h"
#include "tools/cli/plan_flags.h"
#include "tools/cli/prep_flags.h"
#include "tools/cli/train_flags.h"
#include "tools/cli/yaml_config.h"
#if defined(SANAFLOW_WITH_MEDIA)
#include "tools/demo/demo.h"
#include "tools/plot.h"
#endif

namespace {

namespace fs = std::filesystem;
using sf::pipelines::PrepOptions;
using sf::pipelines::TrainOptions;
using sf::tools::integer_in;
using sf::tools::TrainCommand;

// Exit status (README, "Exit status"): 0 done; 2 a usage error (a bad flag, value or input the
// user can fix, a missing file); 3 a corrupt cache or file; 1 anything else (I/O, memory, a bug).
constexpr int kExitOk = 0, kExitError = 1, kExitUsage = 2, kExitCorrupt = 3;

int exit_code(sf::ErrorCode code) {
    switch (code) {
        case sf::ErrorCode::kInvalidArgument:
        case sf::ErrorCode::kNotFound:
            return kExitUsage;
        case sf::ErrorCode::kCorruption:
            return kExitCorrupt;
        default:
            return kExitError;
    }
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
    throw sf::Error::InvalidArgument(
        "this sanaflow was built with SANAFLOW_WITH_MEDIA=OFF: prep needs image decoding");
}
#endif

// --with_prior_preservation needs its class flags (upstream raises the same); the class flags
// without it are only warned about, as upstream does.
void check_prior_flags(const TrainOptions& o, const TrainCommand& c, bool prep_first) {
    const sf::pipelines::ClassImageOptions& k = c.classes;
    if (!c.with_prior_preservation) {
        if (!k.class_data_dir.empty())
            sf::log_warn("train: --class_data_dir has no effect without --with_prior_preservation");
        if (!k.class_prompt.empty())
            sf::log_warn("train: --class_prompt has no effect without --with_prior_preservation");
        return;
    }
#if defined(SANAFLOW_WITH_MEDIA)
    sf::pipelines::check_class_image_options(o, k);
#endif
    if (!prep_first)
        throw sf::Error::InvalidArgument(
            "--with_prior_preservation preps the class images beside the instance images: give "
            "--instance_data_dir (a cache of them already made is found and reused)");
    // Generated images must not land among the instance images (the next prep would train on
    // them as the subject), nor the instances among the class images.
    if (!c.prep.instance_data_dir.empty()) {
        std::error_code ec;
        const fs::path a = fs::weakly_canonical(c.prep.instance_data_dir, ec);
        const fs::path b = fs::weakly_canonical(k.class_data_dir, ec);
        auto inside = [](const fs::path& outer, const fs::path& inner) {
            const auto rel = inner.lexically_relative(outer);
            return !rel.empty() && *rel.begin() != "..";
        };
        if (inside(a, b) || inside(b, a)) {
            throw sf::Error::InvalidArgument(fmt::format(
                "--class_data_dir {} and --instance_data_dir {} overlap: the class images would "
                "be trained as the subject, or the subject as the class; give separate folders",
                k.class_data_dir, c.prep.instance_data_dir));
        }
    }
    if (c.prep.vae_kind != "dc-ae")
        throw sf::Error::InvalidArgument(
            "--with_prior_preservation is for images (--vae dc-ae), not video latents");
}

#if defined(SANAFLOW_WITH_MEDIA)
// The class images: the missing ones generated from the instance cache's class prompt, then all
// of them prepped, captioned by --class_prompt, into OUTPUT_DIR/class_cache. Under a launch
// (`ranks`) each rank makes its share and preps its shard.
void prep_class_images(TrainOptions& o, const TrainCommand& c, const PrepOptions& instances,
                       sf::distributed::World* ranks) {
    std::cout << "\n== class images in " << c.classes.class_data_dir << "\n";
    sf::pipelines::generate_class_images(o, c.classes, ranks);
    PrepOptions p = instances;
    p.instance_data_dir = c.classes.class_data_dir;
    p.manifest.clear();
    p.caption_column.clear();
    p.instance_prompt = c.classes.class_prompt;
    p.validation_prompts.clear();
    p.random_flip = false;  // upstream flips instance images only
    p.cache_dir = (fs::path(o.output_dir) / "class_cache").string();
    std::cout << "\n== prep the class images into " << p.cache_dir << "\n";
    run_prep_command(p);
    o.class_cache_dir = p.cache_dir;
    o.num_class_images = c.classes.num_class_images;
}
#else
void prep_class_images(TrainOptions&, const TrainCommand&, const PrepOptions&,
                       sf::distributed::World*) {
    throw sf::Error::InvalidArgument(
        "this sanaflow was built with SANAFLOW_WITH_MEDIA=OFF: class images need image writing");
}
#endif

// `sanaflow train`. With --instance_data_dir (or --manifest) it is the whole job: prep into
// --cache_dir (OUTPUT_DIR/cache by default), then training from it, each phase loading only its
// own models; with an up-to-date cache the prep part only reads and hashes the files.
int run_train_command(TrainOptions o, const TrainCommand& c) {
    o.gradient_checkpointing = c.checkpointing ? c.checkpointing_every : 0;
    if (c.full_finetune) o.rank = 0;
    o.validation_prompts = c.prep.validation_prompts;
    if (c.cache_latents) {
        sf::log_info("train: --cache_latents: latents are always cached (prep writes them once)");
    }
    const bool prep_first = !c.prep.instance_data_dir.empty() || !c.prep.manifest.empty();
    // Around prep and train both, so OUTPUT_DIR's timeline shows the whole job; written when
    // training ends, before it is drawn.
    std::optional<sf::mem::TimelineFile> timeline;
    timeline.emplace(
        (fs::path(o.output_dir) /
         sf::distributed::per_rank_name(sf::mem::kTimelineFileName, sf::distributed::launch_env()))
            .string());
    check_prior_flags(o, c, prep_first);
    // Under a launch the ranks join before training, or before the class images when they work
    // on those together.
    std::shared_ptr<sf::distributed::World> ranks;
    if (prep_first) {
        if (o.cache_dir.empty()) o.cache_dir = (fs::path(o.output_dir) / "cache").string();
        PrepOptions p = c.prep;
        p.cache_dir = o.cache_dir;
        p.pretrained_model_name_or_path = o.pretrained_model_name_or_path;
        p.model = o.model;
        p.seed = o.seed;
        p.device = o.device;
        p.mixed_precision = o.mixed_precision;
        // The class images are generated from the class prompt's features: prep encodes them.
        if (c.with_prior_preservation) p.validation_prompts.push_back(c.classes.class_prompt);
        std::cout << "== prep into " << p.cache_dir << "\n";
        run_prep_command(p);
        if (c.with_prior_preservation) {
            ranks = sf::pipelines::join_ranks(o);
            prep_class_images(o, c, p, ranks.get());
        }
        std::cout << "\n== train from " << o.cache_dir << "\n";
    } else if (o.cache_dir.empty()) {
        throw sf::Error::InvalidArgument(
            "give --cache_dir (a cache made by sanaflow prep) or --instance_data_dir (prep into "
            "OUTPUT_DIR/cache, then train)");
    } else if (c.prep.offload) {
        sf::log_info(
            "train: --offload: training from a cache loads no encoder, so none is offloaded");
    }
    const auto report = sf::pipelines::run_train(o, ranks);
    timeline.reset();
    if (sf::distributed::launch_env().rank > 0) return 0;  // rank 0 reports for every rank
    std::cout << report.summary();
#if defined(SANAFLOW_WITH_MEDIA)
    if (!report.weights_path.empty()) {
        std::cout << "plot: " << sf::tools::plot_metrics(o.output_dir) << "\n";
        try {
            std::cout << "plot: " << sf::tools::plot_memory_timeline(o.output_dir) << "\n";
        } catch (const sf::Error& e) {
            sf::log_warn("{}", e.what());  // the weights are what matters; they are written
        }
    }
#endif
    return 0;
}

// `sanaflow plot DIR`: a run's metrics and memory timeline, or a cache's timeline alone.
int run_plot_command(const std::string& output_dir) {
#if defined(SANAFLOW_WITH_MEDIA)
    const bool metrics = fs::exists(fs::path(output_dir) / "metrics.jsonl");
    const bool timeline = fs::exists(fs::path(output_dir) / sf::mem::kTimelineFileName);
    if (metrics || !timeline) std::cout << sf::tools::plot_metrics(output_dir) << "\n";
    if (timeline) std::cout << sf::tools::plot_memory_timeline(output_dir) << "\n";
    return kExitOk;
#else
    (void)output_dir;
    throw sf::Error::InvalidArgument(
        "this sanaflow was built with SANAFLOW_WITH_MEDIA=OFF: plot needs OpenCV");
#endif
}

int run_inspect_command(const std::string& cache, bool verify) {
    auto result = sf::pipelines::inspect_cache(cache, verify);
    std::cout << result.text;
    return result.ok ? kExitOk : kExitCorrupt;
}

int run_demo_command(const std::string& out_dir, int num_images) {
#if defined(SANAFLOW_WITH_MEDIA)
    return sf::tools::run_demo(out_dir, num_images);
#else
    (void)out_dir, (void)num_images;
    throw sf::Error::InvalidArgument(
        "this sanaflow was built with SANAFLOW_WITH_MEDIA=OFF: the demo needs image decoding");
#endif
}

// `sanaflow --version`: this build and the LibTorch it was built with.
std::string version_text() {
    return fmt::format("sanaflow {} (LibTorch {}, {})", SANAFLOW_VERSION, TORCH_VERSION,
                       sf::mem::cuda_available() ? "CUDA available" : "CPU");
}

// The leftovers of every command that ran: unknown flags, named with the nearest known flag.
std::string unknown_flags(const CLI::App& app, const sf::tools::FlagOrigins& origins) {
    std::vector<std::string> extras = app.remaining();
    std::vector<std::string> known;
    for (const CLI::App* cmd : app.get_subcommands()) {
        for (const std::string& e : cmd->remaining()) extras.push_back(e);
        for (const CLI::Option* opt : cmd->get_options()) {
            for (const std::string& name : opt->get_lnames()) known.push_back(name);
        }
    }
    for (const CLI::Option* opt : app.get_options()) {
        for (const std::string& name : opt->get_lnames()) known.push_back(name);
    }
    return sf::tools::unknown_flags_message(extras, known, origins);
}

// Every command's flags and where they land.
struct Cli {
    CLI::App app{
        "sanaflow: train Sana-style diffusion transformers from a cache of latents, "
        "without running out of memory"};
    bool quiet = false, verbose = false;
    PrepOptions prep;
    TrainOptions train;
    TrainCommand train_extra;
    sf::tools::PlanCommand plan;
    std::string inspect_dir, plot_dir, config_file, demo_dir = "demo-out";
    bool verify = false;
    int demo_images = 24;
    int nproc_per_node = 1;         // prep and train: ranks this process starts itself
    int local_rank = -1;            // prep and train: the legacy launcher's --local_rank
    std::vector<std::string> argv;  // as given, for those ranks
    CLI::App *prep_cmd = nullptr, *inspect_cmd = nullptr, *train_cmd = nullptr, *plot_cmd = nullptr,
             *models_cmd = nullptr, *demo_cmd = nullptr, *plan_cmd = nullptr;
};

// The flags prep and train share: --config, and how the job's ranks are started. `--config FILE`
// is expanded into flags before parsing (tools/cli/yaml_config.h); declared here for --help only.
void add_job_flags(CLI::App* cmd, Cli& c) {
    cmd->add_option("--config", c.config_file,
                    "a YAML file of this command's flags (sections, lists, null); typed "
                    "flags win");
    cmd->add_option("--nproc_per_node", c.nproc_per_node,
                    "run as this many data-parallel ranks on this machine, each a process "
                    "started with torchrun's variables (as torchrun --standalone "
                    "--nproc_per_node N --no-python would); ignored by a rank that a "
                    "launcher started")
        ->check(integer_in(1, 1024))
        ->capture_default_str();
    cmd->add_option("--local_rank,--local-rank", c.local_rank,
                    "this process's rank on its machine, as torch.distributed.launch passes "
                    "it; LOCAL_RANK in the environment wins, as upstream (torchrun sets it)")
        ->check(integer_in(-1, 1 << 20))
        ->capture_default_str();
}

void define_commands(Cli& c) {
    CLI::App& app = c.app;
    app.require_subcommand(1);
    // One line, naming the flag: "sanaflow: --mixed_precision: fp32 not in {no,fp16,bf16}".
    app.failure_message([](const CLI::App*, const CLI::Error& e) {
        return std::string("sanaflow: ") + e.what() + " (see --help)\n";
    });
    app.add_flag("-q,--quiet", c.quiet, "print only errors and the final result");
    app.add_flag("-v,--verbose", c.verbose, "debug output");

    c.prep_cmd = app.add_subcommand("prep", "decode, bucket and cache a dataset");
    sf::tools::add_prep_data_flags(c.prep_cmd, c.prep);
    sf::tools::add_prep_model_flags(c.prep_cmd, c.prep);
    c.prep_cmd->add_option("--cache_dir", c.prep.cache_dir, "cache directory (created if absent)")
        ->required();

    c.inspect_cmd =
        app.add_subcommand("inspect", "show what a cache holds; --verify checks every record");
    c.inspect_cmd->add_option("cache", c.inspect_dir, "cache directory")
        ->required()
        ->check(CLI::ExistingDirectory);
    c.inspect_cmd->add_flag("--verify", c.verify, "decode every record and check its checksum");

    c.train_cmd = app.add_subcommand(
        "train",
        "train LoRA adapters (or, with --full_finetune, the transformer) from a prep cache, or "
        "with --instance_data_dir prep the data first: the whole job in one command");
    sf::tools::add_train_flags(c.train_cmd, c.train, c.train_extra);
    sf::tools::add_video_train_flags(c.train_cmd, c.train);
    sf::tools::add_prep_data_flags(c.train_cmd, c.train_extra.prep);
    for (CLI::App* cmd : {c.prep_cmd, c.train_cmd}) add_job_flags(cmd, c);

    c.plot_cmd = app.add_subcommand(
        "plot",
        "draw OUTPUT_DIR/metrics.jsonl (loss, learning rate, peak memory) into metrics.png and "
        "memory_timeline.json (memory over time with the phases and models; also a cache's) into "
        "memory_timeline.png");
    c.plot_cmd->add_option("output_dir", c.plot_dir, "a training run's output directory")
        ->required()
        ->check(CLI::ExistingDirectory);

    c.models_cmd = app.add_subcommand(
        "models", "list the built-in model configurations and their parameter counts");

    c.plan_cmd = app.add_subcommand(
        "plan",
        "predict the peak memory of a training step per phase, calibrated by tiny measured steps "
        "on the device; with --memory_budget, the remedies that fit it, cheapest first");
    sf::tools::add_plan_flags(c.plan_cmd, c.plan);

    c.demo_cmd = app.add_subcommand(
        "demo", "generate a small dataset, prep it, inspect the cache, train on it");
    c.demo_cmd->add_option("--output_dir", c.demo_dir, "where the data and the cache go")
        ->capture_default_str();
    c.demo_cmd->add_option("--num_images", c.demo_images, "images to generate")
        ->check(integer_in(1, 100'000))
        ->capture_default_str();

    // -q and -v after the subcommand too; unknown flags are collected (parse()), not the first
    // one alone.
    for (CLI::App* cmd : {c.prep_cmd, c.inspect_cmd, c.train_cmd, c.plot_cmd, c.models_cmd,
                          c.demo_cmd, c.plan_cmd}) {
        cmd->fallthrough();
        cmd->allow_extras();
    }
    app.allow_extras();  // what a command passes up (it falls through) is named too
    app.set_version_flag("--version", version_text());
}

// The command line, its --config files expanded; the exit status when it is not to run (a usage
// error, --help, --version), else nothing.
std::optional<int> parse(Cli& c, int argc, char** argv) {
    try {
        sf::tools::ConfigOrigins origins;
        std::vector<std::string> args = sf::tools::expand_yaml_config(argc, argv, &origins);
        if (const auto refused = sf::tools::refused_flags(args, origins); !refused.empty()) {
            for (const std::string& line : refused)
                std::fprintf(stderr, "sanaflow: %s\n", line.c_str());
            return kExitUsage;
        }
        std::reverse(args.begin(), args.end());  // CLI11 consumes a vector from its back
        c.app.parse(std::move(args));
        if (const std::string unknown = unknown_flags(c.app, origins); !unknown.empty()) {
            std::fprintf(stderr, "sanaflow: %s (see --help)\n", unknown.c_str());
            return kExitUsage;
        }
    } catch (const CLI::ParseError& e) {
        return c.app.exit(e) == 0 ? kExitOk : kExitUsage;  // --help and --version: not errors
    } catch (const sf::Error& e) {
        std::fprintf(stderr, "sanaflow: %s\n", e.what());
        return kExitUsage;
    }
    return std::nullopt;
}

// --local_rank as upstream's scripts read it: a LOCAL_RANK in the environment wins; without one,
// the flag is the local rank (the rest of the launch comes from RANK, WORLD_SIZE and MASTER_*).
void apply_local_rank(int local_rank) {
    const std::string flag = std::to_string(local_rank);
    if (const char* env = std::getenv("LOCAL_RANK"); env != nullptr && *env != '\0') {
        if (flag != env)
            sf::log_info("--local_rank {}: LOCAL_RANK={} wins, as upstream", flag, env);
        return;
    }
    ::setenv("LOCAL_RANK", flag.c_str(), /*overwrite=*/1);  // unset or empty: the flag's
}

int run(const Cli& c) {
    if (c.local_rank >= 0) apply_local_rank(c.local_rank);
    if (c.nproc_per_node > 1 && (*c.prep_cmd || *c.train_cmd)) {
        if (!sf::distributed::launch_env().distributed())
            return sf::distributed::run_local_ranks(c.argv, c.nproc_per_node);
        sf::log_debug("--nproc_per_node: this rank was started by a launcher; ignored");
    }
    if (*c.prep_cmd) return run_prep_command(c.prep);
    if (*c.inspect_cmd) return run_inspect_command(c.inspect_dir, c.verify);
    if (*c.train_cmd) return run_train_command(c.train, c.train_extra);
    if (*c.demo_cmd) return run_demo_command(c.demo_dir, c.demo_images);
    if (*c.plot_cmd) return run_plot_command(c.plot_dir);
    if (*c.models_cmd) std::cout << sf::pipelines::models_table();
    if (*c.plan_cmd) {
        const auto report = sf::pipelines::run_plan(c.plan.resolved());
        std::cout << report.text;
        return report.fits ? kExitOk : kExitError;
    }
    return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
    sf::mem::install_counting_allocator();
    sf::set_torch_threads();
    Cli cli;
    define_commands(cli);
    cli.argv.assign(argv, argv + argc);
    if (const auto status = parse(cli, argc, argv)) return *status;
    if (cli.quiet) sf::set_log_level(sf::LogLevel::kError);
    if (cli.verbose) sf::set_log_level(sf::LogLevel::kDebug);
    try {
        return run(cli);
    } catch (const sf::Error& e) {
        std::fprintf(stderr, "sanaflow: %s\n", e.what());
        return exit_code(e.code());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "sanaflow: error: %s\n", e.what());
        return kExitError;
    }
}

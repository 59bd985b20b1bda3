// How close `sanaflow plan` comes to what a step measures: for every row of the memory ablation
// (grids 32, 64, 128; the baseline, each remedy alone, all together) and two other shapes, the
// planner's predicted peak beside the peak the ablation measures (counted tensor bytes on the
// CPU; the CUDA allocator's on a GPU), each measured by memory_ablation in a process of its own.
//
//   plan_accuracy [--grids 32,64,128] [--batch 4] [--caption_len 300] [--device cpu|cuda]
//                 [--variants baseline,all,...] [--points 96]
//
// The planner is calibrated here first, on tiny configurations only (stages/plan/calibration.h);
// the ablation's model is never part of its fit. The last line is
// ratio=<worst |predicted - measured| / measured>.
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "core/device_options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/threads.h"
#include "stages/plan/calibration.h"
#include "stages/plan/memory_model.h"
#include "tools/bench/bench_configs.h"

namespace {

struct Row {
    std::string variant;
    int64_t grid = 0, batch = 0, caption_len = 0;
};

// What memory_ablation's variant turns on (its options_for()).
sf::plan::PlanRemedies remedies_of(const std::string& v, int64_t batch) {
    sf::plan::PlanRemedies r;
    const bool all = v == "all";
    if (all || v == "mixed_precision") r.mixed_precision = "bf16";
    if (all || v == "gradient_checkpointing") r.gradient_checkpointing = 1;
    if (all || v == "accumulation") r.accumulation = batch;
    if (all || v == "chunked_attention") r.attention = "fused";
    if (all || v == "chunked_ff") r.ff_chunk_size = sf::bench::kImageFFRows;
    if (all || v == "fused_backward") r.fused_backward = true;
    return r;
}

// The ablation's peak for one row, from its own process; 0 when it did not fit.
int64_t measure(const Row& row, const std::string& device) {
    const std::string exe =
        (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "memory_ablation")
            .string();
    std::vector<std::string> argv = {exe,
                                     "--variant",
                                     row.variant,
                                     "--grid",
                                     std::to_string(row.grid),
                                     "--batch",
                                     std::to_string(row.batch),
                                     "--caption_len",
                                     std::to_string(row.caption_len),
                                     "--steps",
                                     "1",
                                     "--device",
                                     device};
    int fds[2];
    if (::pipe(fds) != 0) throw sf::Error::IOError("pipe failed");
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::dup2(fds[1], 1);
        ::close(fds[0]);
        std::vector<char*> args;
        for (auto& s : argv) args.push_back(s.data());
        args.push_back(nullptr);
        ::execv(exe.c_str(), args.data());
        ::_exit(127);
    }
    ::close(fds[1]);
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    ::close(fds[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    std::istringstream lines(out);
    std::string line;
    while (std::getline(lines, line)) {
        if (line.rfind("peak_tensor_bytes=", 0) == 0) return std::stoll(line.substr(18));
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<int64_t> grids = {32, 64, 128};
    int64_t batch = 4, caption_len = 300;
    std::string device_name = "cpu";
    std::vector<std::string> variants = {
        "baseline",          "mixed_precision", "gradient_checkpointing", "accumulation",
        "chunked_attention", "chunked_ff",      "fused_backward",         "all"};
    bool other_shapes = true;  // off when --variants names a subset
    int64_t points = sf::plan::kCalibrationPoints;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (i + 1 >= argc) {
            std::fprintf(stderr, "plan_accuracy: %s needs a value\n", flag.c_str());
            return 2;
        }
        const std::string value = argv[++i];
        if (flag == "--grids") {
            grids = sf::bench::parse_list(value);
        } else if (flag == "--batch") {
            batch = std::stoll(value);
        } else if (flag == "--caption_len") {
            caption_len = std::stoll(value);
        } else if (flag == "--device") {
            device_name = value;
        } else if (flag == "--variants") {
            variants.clear();
            std::stringstream in(value);
            for (std::string v; std::getline(in, v, ',');) variants.push_back(v);
            other_shapes = false;
        } else if (flag == "--points") {
            points = std::stoll(value);
        } else {
            std::fprintf(stderr,
                         "plan_accuracy: unknown flag %s (flags: --grids --batch --caption_len "
                         "--device --variants --points)\n",
                         flag.c_str());
            return 2;
        }
    }
    sf::mem::install_counting_allocator();
    sf::set_torch_threads();
    const c10::Device device = sf::resolve_device(device_name);

    std::vector<Row> rows;
    for (int64_t g : grids) {
        for (const auto& v : variants) rows.push_back({v, g, batch, caption_len});
    }
    if (other_shapes) {
        // Two shapes the ablation does not run: another batch and caption length, each end.
        rows.push_back({"all", 48, 2, 120});
        rows.push_back({"baseline", 40, 3, 77});
    }

    sf::plan::Calibration cal;
    const sf::model::SanaTransformerConfig config = sf::bench::ablation_config();
    std::printf(
        "plan accuracy: 4 blocks of width 512 (Sana block structure) on %s; the planner "
        "calibrated on tiny configurations only; each measurement is memory_ablation --steps 1 "
        "in a process of its own\n",
        device.str().c_str());
    std::printf("%-6s %-24s %6s %8s %14s %14s %9s\n", "grid", "variant", "batch", "caption",
                "predicted MiB", "measured MiB", "error");
    double worst = 0;
    for (Row row : rows) {
        // Where a row does not fit this machine (the baseline at 4096 px needs more than 24 GB at
        // batch 4), its batch is halved, as the ablation's table does.
        int64_t measured = measure(row, device_name);
        while (measured == 0 && row.batch > 1) {
            row.batch /= 2;
            measured = measure(row, device_name);
        }
        const sf::plan::PlanRemedies r = remedies_of(row.variant, row.batch);
        sf::plan::PlanShape shape;
        shape.config = config;
        shape.latent_height = shape.latent_width = row.grid;
        shape.batch = row.batch;
        shape.caption_tokens = row.caption_len;
        const std::string key = sf::plan::calibration_key(shape, r);
        if (!cal.keys.count(key)) sf::plan::calibrate(cal, shape, r, device, points);
        const auto predicted = sf::plan::predict_footprint(
            shape, r, sf::plan::count_parameters(shape), cal.keys.at(key));
        if (measured == 0) {
            std::printf("%-6lld %-24s %6lld %8lld %14.1f  does not fit here\n",
                        static_cast<long long>(row.grid), row.variant.c_str(),
                        static_cast<long long>(row.batch), static_cast<long long>(row.caption_len),
                        static_cast<double>(predicted.peak) / (1 << 20));
            continue;
        }
        const double error = std::abs(static_cast<double>(predicted.peak - measured)) /
                             static_cast<double>(measured);
        worst = std::max(worst, error);
        std::printf(
            "%-6lld %-24s %6lld %8lld %14.1f %14.1f %+8.1f%%\n", static_cast<long long>(row.grid),
            row.variant.c_str(), static_cast<long long>(row.batch),
            static_cast<long long>(row.caption_len),
            static_cast<double>(predicted.peak) / (1 << 20),
            static_cast<double>(measured) / (1 << 20),
            100.0 * static_cast<double>(predicted.peak - measured) / static_cast<double>(measured));
        std::fflush(stdout);
    }
    std::printf("ratio=%.3f\n", worst);
    return 0;
}

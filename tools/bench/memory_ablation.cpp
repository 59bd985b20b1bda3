// Memory ablation: what each remedy saves in one full training step (forward, backward, AdamW)
// of a Sana transformer, measured in a fresh process per variant.
//
//   memory_ablation [--config CONFIG.json] [--grids 32,64,128] [--batch 4] [--caption_len 300]
//                   [--steps 3] [--device cpu|cuda] [--ff_rows 8] [--variant NAME --grid G]
//                   [--trace TRACE.json]
//   memory_ablation --video [--grids 5,13,21] [--latent 60x104] [--batch 1] ...
//
// --video runs the SANA-Video transformer (4 blocks of width 512 with its block structure by
// default) on windows of `grids` latent frames (5, 13, 21: 17, 49, 81 frames) of 60 x 104
// latents (480 x 832 pixels); its chunked_ff runs the feed-forward 2 latent frames at a time, its
// chunked attention takes one frame's tokens per chunk, and online_encoding is left out. Its last
// lines say how the all-remedies peak grows with the window, and ratio= compares all remedies with
// the baseline at the longest window.
//
// Variants: baseline (fp32, no checkpointing, dense cross-attention, the whole effective batch in
// one micro-batch: how the unoptimised scripts run), each remedy alone (mixed_precision,
// gradient_checkpointing, accumulation, chunked_attention, chunked_ff: the Mix-FFN over
// --ff_rows latent rows at a time, fused_backward), all of them together at the same effective
// batch, and online_encoding: the baseline with the VAE and the text encoder resident and
// encoding the step's batch, as training without a cache does.
//
// Each variant runs one warm-up step and then --steps steps (default 3): the time is their
// median (the warm-up pays for AdamW's state and the first touch of every page), the memory the
// peak over all of them.
//
// `--variant all-REMEDY` is every remedy but that one (all-chunked_ff: what the chunked
// feed-forward costs inside `all`); `--variant A+B+C` is those remedies together
// (mixed_precision+gradient_checkpointing+accumulation: upstream's three).
//
// --trace writes the autograd profiler's record of every operator of one variant's run (warm-up
// included; Chrome trace format, for Perfetto or tools/bench/trace_ops.py).
//
// With --variant and --grid, one variant runs in this process and the last two lines are
// peak_rss_bytes=<n> and step_seconds=<x>. Without, every variant runs in a child process per
// grid and a table is printed; the last line is ratio=<all / baseline peak resident memory at the
// largest grid>. A variant that does not fit (the byte budget, set below this machine's free
// memory) is reported as such; where the baseline does not fit, the batch is halved for both.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/wait.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/device_options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/threads.h"
#include "model/common/lora.h"
#include "model/dc_ae/autoencoder_dc.h"
#include "model/dc_ae/autoencoder_dc_config.h"
#include "model/gemma/gemma2.h"
#include "model/sana/sana_transformer.h"
#include "model/sana_video/sana_video_transformer.h"
#include "stages/plan/step_probe.h"
#include "stages/train/train_step.h"
#include "tools/bench/bench_configs.h"

namespace {

const std::vector<std::string> kVariants = {
    "baseline",          "mixed_precision", "gradient_checkpointing", "accumulation",
    "chunked_attention", "chunked_ff",      "fused_backward",         "all",
    "online_encoding"};

struct Args {
    std::string config;
    std::vector<int64_t> grids = {32, 64, 128};
    int64_t batch = 4;
    int64_t caption_len = 300;
    std::string variant;
    int64_t grid = 0;
    int64_t budget = 0;          // bytes; 0: from the free memory
    std::string device = "cpu";  // on "cuda" the peaks compared are the CUDA allocator's
    std::string trace;           // the autograd profiler's trace of one variant, when set
    bool video = false;          // the video transformer; `grid` is then latent frames
    int64_t latent_h = 60, latent_w = 104;
    int64_t ff_rows = sf::bench::kImageFFRows;  // the image chunked feed-forward's rows
    int64_t steps = 3;                          // timed steps after the warm-up
};

// Whether variant `v` runs in this mode: chunked_ff is the video transformer's, online_encoding
// the image pipeline's, accumulation needs a batch to split.
bool applies(const Args& a, const std::string& v, int64_t batch) {
    if (v == "online_encoding") return !a.video;
    if (v == "accumulation") return batch > 1;
    return true;
}

// The video transformer at the same scale: 4 blocks of width 512 (heads of 32), SANA-Video's
// blocks (GLUMBTempConv 3x, q/k RMSNorm, rotary), 16-channel Wan latents, patch 1x2x2.
sf::model::SanaVideoTransformerConfig default_video_config() {
    auto c = sf::model::SanaVideoTransformerConfig::named("sana-video-2b-480p");
    c.num_attention_heads = 16;
    c.attention_head_dim = 32;
    c.num_cross_attention_heads = 8;
    c.cross_attention_head_dim = 64;
    c.cross_attention_dim = 512;
    c.num_layers = 4;
    return c;
}

int64_t mem_available() {
    std::ifstream in("/proc/meminfo");
    std::string key;
    int64_t kb = 0;
    std::string unit;
    while (in >> key >> kb >> unit) {
        if (key == "MemAvailable:") return kb * 1024;
    }
    return int64_t{8} << 30;
}

// "a+b+c" -> {a, b, c}; one item for a name without '+'.
std::vector<std::string> split_plus(const std::string& v) {
    std::vector<std::string> out;
    size_t begin = 0;
    for (size_t end; (end = v.find('+', begin)) != std::string::npos; begin = end + 1)
        out.push_back(v.substr(begin, end - begin));
    out.push_back(v.substr(begin));
    return out;
}

// Whether variant `v` has `remedy`: alone, as one of all's, of all-REMEDY's or of A+B+C's.
bool has_remedy(const std::string& v, const std::string& remedy) {
    if (v == "all") return true;
    if (v.rfind("all-", 0) == 0) return v.substr(4) != remedy;
    const auto parts = split_plus(v);
    return std::find(parts.begin(), parts.end(), remedy) != parts.end();
}

// Whether `v` names a variant: one of kVariants, all-REMEDY, or REMEDY+REMEDY+... .
bool known_variant(const std::string& v) {
    const auto is_remedy = [](const std::string& name) {
        return std::find(kVariants.begin(), kVariants.end(), name) != kVariants.end() &&
               name != "baseline" && name != "all" && name != "online_encoding";
    };
    if (v.rfind("all-", 0) == 0) return is_remedy(v.substr(4));
    if (v.find('+') != std::string::npos) {
        const auto parts = split_plus(v);
        return std::all_of(parts.begin(), parts.end(), is_remedy);
    }
    return std::find(kVariants.begin(), kVariants.end(), v) != kVariants.end();
}

sf::train::TrainStepOptions options_for(const Args& a, const std::string& v, int64_t batch) {
    sf::train::TrainStepOptions o;
    o.mark_steps = 0;
    const auto on = [&](const std::string& remedy) { return has_remedy(v, remedy); };
    if (on("mixed_precision")) o.mixed_precision = "bf16";
    if (on("gradient_checkpointing")) o.gradient_checkpointing = 1;
    if (on("accumulation")) o.accumulation = batch;
    if (on("chunked_attention") && a.video) {
        // One frame's tokens per chunk: the score matrix stays one frame's at any window length.
        o.attention = "chunked";
        o.attention_chunk = (a.latent_h / 2) * (a.latent_w / 2);
    } else if (on("chunked_attention")) {
        o.attention = "fused";  // SDPA where it exists, else chunked
    }
    if (on("chunked_ff")) o.ff_chunk_size = a.video ? 2 : a.ff_rows;
    if (on("fused_backward")) o.fused_backward = true;
    if (!o.fused_backward) o.max_grad_norm = 1.0;
    return o;
}

// Online encoding: the encoders resident in the training process, encoding the step's batch
// (the VAE on the images, Gemma-2 on the captions), frozen and without gradients.
struct OnlineEncoders {
    sf::model::AutoencoderDC vae{nullptr};
    sf::model::Gemma2Model text{nullptr};
    OnlineEncoders() {
        vae = sf::model::AutoencoderDC(sf::model::AutoencoderDCConfig::named("dc-ae-f32c32"),
                                       /*with_decoder=*/false);
        text = sf::model::Gemma2Model(sf::model::Gemma2Config::named("gemma-2-2b"));
        vae->eval();
        text->eval();
        for (auto& p : vae->parameters()) p.requires_grad_(false);
        for (auto& p : text->parameters()) p.requires_grad_(false);
    }
    void encode(int64_t batch, int64_t pixels, int64_t caption_len, c10::Device device) {
        torch::NoGradGuard no_grad;
        vae->to(device);
        text->to(device);
        for (int64_t i = 0; i < batch; ++i)
            vae->encode(torch::rand({1, 3, pixels, pixels}).to(device) * 2 - 1);
        auto ids = torch::randint(0, 1000, {batch, caption_len}, torch::kLong).to(device);
        text->forward(ids, torch::ones({batch, caption_len}, torch::kLong).to(device));
    }
};

// The model and the clean latents of one step.
struct Workload {
    std::shared_ptr<sf::model::DiffusionTransformer> model;
    at::Tensor latents;  // [B, C, g, g] images, [B, C, f, h, w] windows
    int64_t caption_channels = 0;
};

Workload make_workload(const Args& a) {
    Workload w;
    if (a.video) {
        const auto c = a.config.empty()
                           ? default_video_config()
                           : sf::model::SanaVideoTransformerConfig::from_json_file(a.config);
        w.model = sf::model::SanaVideoTransformer(c).ptr();
        w.latents = torch::randn({a.batch, c.in_channels, a.grid, a.latent_h, a.latent_w});
        w.caption_channels = c.caption_channels;
        return w;
    }
    const auto c = a.config.empty() ? sf::bench::ablation_config()
                                    : sf::model::SanaTransformerConfig::from_json_file(a.config);
    w.model = sf::model::SanaTransformer(c).ptr();
    w.latents = torch::randn({a.batch, c.in_channels, a.grid, a.grid});
    w.caption_channels = c.caption_channels;
    return w;
}

int run_one(const Args& a) {
    sf::mem::install_counting_allocator();
    sf::set_torch_threads();
    sf::set_log_level(sf::LogLevel::kWarn);
    const int64_t budget = a.budget > 0 ? a.budget : mem_available() - (int64_t{3} << 29);
    sf::mem::set_cpu_budget(budget);
    try {
        std::unique_ptr<OnlineEncoders> online;
        if (a.variant == "online_encoding") online = std::make_unique<OnlineEncoders>();
        const c10::Device device = sf::resolve_device(a.device);
        torch::manual_seed(0);
        const Workload w = make_workload(a);
        w.model->module().to(device);
        const sf::train::TrainStepOptions o = options_for(a, a.variant, a.batch);
        sf::plan::ProbeInput in;
        in.latents = w.latents;
        in.caption_tokens = a.caption_len;
        in.caption_channels = w.caption_channels;
        in.steps = a.steps;
        if (online) {
            in.before_step = [&] { online->encode(a.batch, a.grid * 32, a.caption_len, device); };
        }
        std::optional<torch::autograd::profiler::RecordProfile> trace;
        if (!a.trace.empty()) trace.emplace(a.trace);
        const sf::plan::ProbeResult r = sf::plan::probe_step(w.model, in, o, device);
        trace.reset();
        const int64_t peak_tensors = r.peak_tensor_bytes, peak_rss = r.peak_rss_bytes;
        const double seconds = r.step_seconds;
        std::printf("variant=%s grid=%lld batch=%lld micro_batch=%lld steps=%lld loss=%.5f\n",
                    a.variant.c_str(), static_cast<long long>(a.grid),
                    static_cast<long long>(a.batch), static_cast<long long>(r.micro_batch),
                    static_cast<long long>(a.steps), r.loss);
        std::printf("%s", r.phase_table.c_str());
        std::printf("peak_tensor_bytes=%lld\n", static_cast<long long>(peak_tensors));
        std::printf("peak_rss_bytes=%lld\n", static_cast<long long>(peak_rss));
        std::printf("step_seconds=%.3f\n", seconds);
        return 0;
    } catch (const std::exception& e) {
        const bool oom = sf::train::is_out_of_memory(e);
        std::printf("does_not_fit=%d budget=%lld error=%s\n", oom ? 1 : 0,
                    static_cast<long long>(budget), e.what());
        return oom ? 3 : 1;
    }
}

struct Result {
    bool fits = false;
    int64_t peak_rss = 0, peak_tensors = 0;
    double seconds = 0;
    std::string note;
};

// Runs one variant in a child process (this program with --variant), parsing its last lines.
Result run_child(const Args& a, const std::string& variant, int64_t grid, int64_t batch) {
    std::vector<std::string> argv = {"memory_ablation",
                                     "--variant",
                                     variant,
                                     "--grid",
                                     std::to_string(grid),
                                     "--batch",
                                     std::to_string(batch),
                                     "--caption_len",
                                     std::to_string(a.caption_len),
                                     "--steps",
                                     std::to_string(a.steps),
                                     "--device",
                                     a.device,
                                     "--ff_rows",
                                     std::to_string(a.ff_rows)};
    if (!a.config.empty()) argv.insert(argv.end(), {"--config", a.config});
    if (a.video) {
        argv.insert(argv.end(),
                    {"--video", "--latent", fmt::format("{}x{}", a.latent_h, a.latent_w)});
    }
    if (a.budget > 0) argv.insert(argv.end(), {"--budget", std::to_string(a.budget)});
    int fds[2];
    if (::pipe(fds) != 0) throw sf::Error::IOError("pipe failed");
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::dup2(fds[1], 1);
        ::close(fds[0]);
        std::vector<char*> args;
        for (auto& s : argv) args.push_back(s.data());
        args.push_back(nullptr);
        ::execv("/proc/self/exe", args.data());
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
    Result r;
    std::istringstream lines(out);
    std::string line;
    while (std::getline(lines, line)) {
        if (line.rfind("peak_rss_bytes=", 0) == 0) r.peak_rss = std::stoll(line.substr(15));
        if (line.rfind("peak_tensor_bytes=", 0) == 0) r.peak_tensors = std::stoll(line.substr(18));
        if (line.rfind("step_seconds=", 0) == 0) r.seconds = std::stod(line.substr(13));
        if (line.rfind("does_not_fit=", 0) == 0) r.note = line;
    }
    r.fits = WIFEXITED(status) && WEXITSTATUS(status) == 0 && r.peak_rss > 0;
    if (!r.fits && r.note.empty())
        r.note =
            WIFSIGNALED(status) ? fmt::format("killed by signal {}", WTERMSIG(status)) : "failed";
    return r;
}

std::string gib(int64_t bytes) {
    return fmt::format("{:.2f}", static_cast<double>(bytes) / (1 << 30));
}

// How the all-remedies peak grows along the grids (`peaks`: grid, peak): the slope between the
// ends, and each middle point against the straight line through them (above 1: faster than
// linear).
void print_growth(const std::vector<std::pair<int64_t, double>>& peaks, bool video) {
    if (peaks.size() < 2) return;
    const auto& [g0, p0] = peaks.front();
    const auto& [g1, p1] = peaks.back();
    const double slope = (p1 - p0) / static_cast<double>(g1 - g0);
    std::string middle;
    for (size_t i = 1; i + 1 < peaks.size(); ++i) {
        const auto& [g, p] = peaks[i];
        middle += fmt::format("{}{} at {:.3f}x", middle.empty() ? "" : ", ", g,
                              p / (p0 + slope * static_cast<double>(g - g0)));
    }
    std::printf(
        "all remedies: %.3f GiB per %s from %lld to %lld; against the straight line through the "
        "ends: %s (above 1: faster than linear)\n",
        slope / (1 << 30), video ? "latent frame" : "grid step", static_cast<long long>(g0),
        static_cast<long long>(g1), middle.empty() ? "no middle point" : middle.c_str());
}

int run_table(const Args& a) {
    const std::string model =
        !a.config.empty() ? a.config
        : a.video         ? fmt::format(
                                "4 blocks of width 512 (SANA-Video block structure), windows of "
                                        "{} x {} latents",
                                a.latent_h, a.latent_w)
                  : "4 blocks of width 512 (Sana block structure)";
    std::printf(
        "memory ablation: %s, batch %lld, captions of %lld tokens; per variant a fresh process, "
        "one warm-up step and %lld more (time: their median; memory: the peak of all)\n",
        model.c_str(), static_cast<long long>(a.batch), static_cast<long long>(a.caption_len),
        static_cast<long long>(a.steps));
    std::printf("%-8s %-24s %6s %14s %14s %10s %10s %10s\n", "grid", "variant", "batch",
                "peak rss GiB", "tensors GiB", "peak/base", "step s", "time/base");
    // The memory compared: resident on the CPU; on a GPU the device's, the CUDA allocator's peak.
    const bool cuda = a.device.rfind("cuda", 0) == 0;
    auto peak_of = [cuda](const Result& r) {
        return static_cast<double>(cuda ? r.peak_tensors : r.peak_rss);
    };
    std::map<std::string, Result> last_grid;
    std::vector<std::pair<int64_t, double>> all_peaks;  // (grid, all remedies' peak)
    int64_t last_batch = a.batch;
    for (size_t gi = 0; gi < a.grids.size(); ++gi) {
        const int64_t grid = a.grids[gi];
        int64_t batch = a.batch;
        Result base = run_child(a, "baseline", grid, batch);
        while (!base.fits && batch > 1) {
            std::printf(
                "%-8lld baseline does not fit at batch %lld (%s): halving the batch for every "
                "variant\n",
                static_cast<long long>(grid), static_cast<long long>(batch), base.note.c_str());
            batch /= 2;
            base = run_child(a, "baseline", grid, batch);
        }
        for (const auto& v : kVariants) {
            // The encoders alone take ~11 GB; their line is measured at the smallest grid only.
            if (!applies(a, v, batch) || (v == "online_encoding" && gi != 0)) continue;
            const Result r = v == "baseline" ? base : run_child(a, v, grid, batch);
            if (v == "all" && r.fits) all_peaks.emplace_back(grid, peak_of(r));
            const std::string label = a.video ? fmt::format("{}f ({})", grid, 4 * (grid - 1) + 1)
                                              : fmt::format("{} ({}px)", grid, grid * 32);
            if (!r.fits) {
                std::printf("%-8s %-24s %6lld  does not fit: %s\n", label.c_str(), v.c_str(),
                            static_cast<long long>(batch), r.note.c_str());
            } else {
                std::printf(
                    "%-8s %-24s %6lld %14s %14s %10s %10.2f %10s\n", label.c_str(), v.c_str(),
                    static_cast<long long>(batch), gib(r.peak_rss).c_str(),
                    gib(r.peak_tensors).c_str(),
                    base.fits ? fmt::format("{:.3f}", peak_of(r) / peak_of(base)).c_str() : "-",
                    r.seconds,
                    base.fits ? fmt::format("{:.2f}", r.seconds / base.seconds).c_str() : "-");
            }
            std::fflush(stdout);
            if (gi + 1 == a.grids.size()) last_grid[v] = r;
        }
        last_batch = batch;
    }
    print_growth(all_peaks, a.video);
    const Result& base = last_grid["baseline"];
    const Result& all = last_grid["all"];
    if (!base.fits || !all.fits) {
        std::printf(
            "ratio=nan (baseline or all does not fit at the largest grid even at batch 1)\n");
        return 1;
    }
    const double all_peak = peak_of(all), base_peak = peak_of(base);
    std::printf(
        "at the largest grid, batch %lld: all remedies %.2f GiB vs baseline %.2f GiB %s, step "
        "%.2fx the baseline's time\n",
        static_cast<long long>(last_batch), all_peak / (1 << 30), base_peak / (1 << 30),
        cuda ? "CUDA allocator peak" : "resident", all.seconds / base.seconds);
    std::printf("ratio=%.3f\n", all_peak / base_peak);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Args a;
    bool grids_given = false, batch_given = false;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "memory_ablation: %s needs a value\n", flag.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (flag == "--config")
            a.config = value();
        else if (flag == "--grids") {
            a.grids = sf::bench::parse_list(value());
            grids_given = true;
        } else if (flag == "--batch") {
            a.batch = std::stoll(value());
            batch_given = true;
        } else if (flag == "--steps")
            a.steps = std::stoll(value());
        else if (flag == "--caption_len")
            a.caption_len = std::stoll(value());
        else if (flag == "--ff_rows")
            a.ff_rows = std::stoll(value());
        else if (flag == "--variant")
            a.variant = value();
        else if (flag == "--grid")
            a.grid = std::stoll(value());
        else if (flag == "--budget")
            a.budget = std::stoll(value());
        else if (flag == "--device")
            a.device = value();
        else if (flag == "--trace")
            a.trace = value();
        else if (flag == "--video")
            a.video = true;
        else if (flag == "--latent") {
            const std::string v = value();
            const size_t x = v.find('x');
            a.latent_h = x == std::string::npos ? 0 : std::stoll(v.substr(0, x));
            a.latent_w = x == std::string::npos ? 0 : std::stoll(v.substr(x + 1));
        } else {
            std::fprintf(stderr,
                         "memory_ablation: unknown flag %s (flags: --config --grids --batch "
                         "--caption_len --steps --variant --grid --budget --device --video "
                         "--latent --ff_rows --trace)\n",
                         flag.c_str());
            return 2;
        }
    }
    if (a.video && !grids_given) a.grids = {5, 13, 21};  // latent frames: 17, 49, 81 frames
    if (a.video && !batch_given) a.batch = 1;
    if (a.video && (a.latent_h < 2 || a.latent_w < 2 || a.latent_h % 2 || a.latent_w % 2)) {
        std::fprintf(stderr, "memory_ablation: --latent wants HxW, even numbers (e.g. 60x104)\n");
        return 2;
    }
    if (a.batch < 1 || a.caption_len < 1 || a.grids.empty() || a.steps < 0 || a.ff_rows < 1) {
        std::fprintf(stderr,
                     "memory_ablation: --batch, --caption_len, --grids and --ff_rows must be "
                     "positive, --steps at least 0\n");
        return 2;
    }
    if (!a.trace.empty() && a.variant.empty()) {
        std::fprintf(stderr, "memory_ablation: --trace records one variant: give --variant\n");
        return 2;
    }
    if (!a.variant.empty()) {
        if (!known_variant(a.variant)) {
            std::fprintf(
                stderr,
                "memory_ablation: unknown variant %s (known: %s, all-REMEDY, REMEDY+REMEDY)\n",
                a.variant.c_str(), fmt::format("{}", fmt::join(kVariants, " ")).c_str());
            return 2;
        }
        if (a.grid <= 0) a.grid = a.grids.back();
        return run_one(a);
    }
    return run_table(a);
}

// Video prep benchmark with the built-in tiny models (Wan VAE, tiny text encoder): one clip at
// 1x, 4x and 16x length, cut into fixed windows (`chunk` mode), each prep run in a child process
// of its own so that its peak RSS is its own (wait4). 1x is two windows: the least that fills the
// pipeline (one window decoded while the other is encoded; a one-window clip never has two in
// flight, measured 0.89x the RSS of two, flat from there on). Prints per length the windows,
// frames/s, the video phase's peak counted tensor bytes and the process's peak RSS; then
// decode-only frames/s of sanaflow's streamed decoder against the `ffmpeg` program decoding the
// same clip with the same thread count (`ffmpeg -threads 1 -i clip -f null -`, and with the scaling
// to the bucket that sanaflow does). The last line is ratio=<peak RSS at 16x / peak RSS at 1x>
// (target: 1.1 or lower).
//
//   bench_video_prep [--window N] [--fps N]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/log.h"
#include "core/memory.h"
#include "core/threads.h"
#include "pipelines/prep/prep.h"
#include "stages/video/decode_video.h"

namespace fs = std::filesystem;

namespace {

double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

void run(const std::string& cmd) {
    if (std::system(cmd.c_str()) != 0) {
        std::fprintf(stderr, "bench_video_prep: failed: %s\n", cmd.c_str());
        std::exit(2);
    }
}

// A 320 x 180 test-pattern clip (H.264) of `frames` frames at `fps`.
void make_clip(const fs::path& path, int frames, int fps) {
    run("ffmpeg -loglevel error -y -f lavfi -i testsrc2=size=320x180:rate=" + std::to_string(fps) +
        " -frames:v " + std::to_string(frames) + " -c:v libx264 -pix_fmt yuv420p -g 24 '" +
        path.string() + "'");
}

struct Result {
    int64_t windows = 0;
    double seconds = 0;
    int64_t tensor_peak = 0;
    long rss_peak_kb = 0;
};

// run_prep in a child: its numbers come back through a pipe, its peak RSS from wait4.
Result prep_in_child(const fs::path& dir, int window) {
    int fds[2];
    if (::pipe(fds) != 0) std::exit(2);
    const pid_t child = ::fork();
    if (child == 0) {
        ::close(fds[0]);
        sf::pipelines::PrepOptions o;
        o.instance_data_dir = (dir / "data").string();
        o.cache_dir = (dir / "cache").string();
        o.resolution = 512;
        o.min_side = 32;
        o.vae_kind = "wan";
        o.instance_prompt = "a test pattern";
        o.windows.frame_extraction = sf::stages::FrameExtraction::kChunk;
        o.windows.target_frames = {window};
        const double t0 = now_seconds();
        const auto report = sf::pipelines::run_prep(o);
        Result r;
        r.seconds = now_seconds() - t0;
        r.windows = report.windows_planned;
        for (const auto& s : report.stages) {
            if (s.name == "video") r.tensor_peak = s.peak_bytes;
        }
        if (::write(fds[1], &r, sizeof r) != static_cast<ssize_t>(sizeof r)) ::_exit(3);
        ::_exit(0);
    }
    ::close(fds[1]);
    Result r;
    const ssize_t n = ::read(fds[0], &r, sizeof r);
    ::close(fds[0]);
    int status = 0;
    struct rusage usage {};
    ::wait4(child, &status, 0, &usage);
    if (n != static_cast<ssize_t>(sizeof r) || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "bench_video_prep: the prep child failed\n");
        std::exit(2);
    }
    r.rss_peak_kb = usage.ru_maxrss;
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    int window = 5, fps = 8;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string flag = argv[i];
        if (flag == "--window") {
            window = std::atoi(argv[i + 1]);
        } else if (flag == "--fps") {
            fps = std::atoi(argv[i + 1]);
        } else {
            std::fprintf(stderr, "usage: bench_video_prep [--window N (1 + 4k)] [--fps N]\n");
            return 2;
        }
    }
    if (window < 1 || (window - 1) % 4 != 0 || fps < 1) {
        std::fprintf(stderr, "bench_video_prep: --window must be 1 + 4k, --fps positive\n");
        return 2;
    }
    sf::set_log_level(sf::LogLevel::kWarn);
    sf::mem::install_counting_allocator();
    sf::set_torch_threads();
    const fs::path root =
        fs::temp_directory_path() / ("sf_bench_video_" + std::to_string(::getpid()));

    std::printf("prep of one clip, %d-frame windows (chunk), tiny Wan VAE, %d torch threads\n",
                window, sf::torch_threads());
    std::printf("%-7s %8s %8s %10s %14s %14s\n", "length", "frames", "windows", "frames/s",
                "tensor peak", "peak RSS");
    long rss_1x = 0, rss_16x = 0;
    fs::path longest;
    for (int times : {1, 4, 16}) {
        const fs::path dir = root / ("x" + std::to_string(times));
        fs::create_directories(dir / "data");
        const int frames = 2 * window * times;
        make_clip(dir / "data" / "clip.mp4", frames, fps);
        const Result r = prep_in_child(dir, window);
        std::printf("%-7s %8d %8lld %10.1f %14s %11.1f MiB\n",
                    (std::to_string(times) + "x").c_str(), frames,
                    static_cast<long long>(r.windows), frames / r.seconds,
                    sf::format_bytes(r.tensor_peak).c_str(), r.rss_peak_kb / 1024.0);
        if (times == 1) rss_1x = r.rss_peak_kb;
        if (times == 16) rss_16x = r.rss_peak_kb;
        longest = dir / "data" / "clip.mp4";
    }

    // Decode only: the whole longest clip as one window, one decoder thread, against ffmpeg.
    sf::stages::DecodeVideoConfig config;
    config.resolution = 512;
    config.min_side = 32;
    config.windows.frame_extraction = sf::stages::FrameExtraction::kFull;
    config.windows.max_frames = 100001;
    const sf::stages::DecodeVideoStage decoder(config);
    const auto info = decoder.probe(longest.string());
    const auto windows = decoder.plan(info);
    int64_t delivered = 0;
    double t0 = now_seconds();
    decoder.decode(longest.string(), windows,
                   [&](size_t, int64_t, const at::Tensor&) { ++delivered; });
    const double ours = static_cast<double>(delivered) / (now_seconds() - t0);
    t0 = now_seconds();
    run("ffmpeg -loglevel error -threads 1 -i '" + longest.string() + "' -f null -");
    const double plain = static_cast<double>(info.frame_count) / (now_seconds() - t0);
    t0 = now_seconds();
    run("ffmpeg -loglevel error -threads 1 -i '" + longest.string() +
        "' -vf scale=" + std::to_string(info.bucket.width) + ":" +
        std::to_string(info.bucket.height) + ":flags=bicubic -pix_fmt rgb24 -f null -");
    const double scaled = static_cast<double>(info.frame_count) / (now_seconds() - t0);
    std::printf(
        "decode only (%lld frames to %dx%d RGB, 1 thread): sanaflow %.0f frames/s; ffmpeg -f null "
        "%.0f frames/s (ratio %.2f), ffmpeg with the same scaling %.0f frames/s (ratio %.2f)\n",
        static_cast<long long>(delivered), info.bucket.width, info.bucket.height, ours, plain,
        ours / plain, scaled, ours / scaled);

    std::error_code ec;
    fs::remove_all(root, ec);
    std::printf("ratio=%.3f\n", static_cast<double>(rss_16x) / static_cast<double>(rss_1x));
    return 0;
}

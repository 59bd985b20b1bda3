// Shared by the integration tests: generated datasets and clips, and the program's path.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "pipelines/prep/prep.h"
#include "pipelines/train/train.h"
#include "test_util.h"

namespace sf::test {

inline const std::string kSanaflow = std::string(SANAFLOW_BINARY_DIR) + "/sanaflow";

// `o` run in OUTPUT_DIR `output_dir` up to step `stop` (a checkpoint of o's there), then resumed
// from its latest checkpoint up to o.max_train_steps: the resumed run's report.
inline sf::pipelines::TrainReport train_stopped_and_resumed(sf::pipelines::TrainOptions o,
                                                            const std::string& output_dir,
                                                            int64_t stop) {
    const int64_t end = o.max_train_steps;
    o.output_dir = output_dir;
    o.max_train_steps = stop;
    sf::pipelines::run_train(o);
    o.max_train_steps = end;
    o.resume_from_checkpoint = "latest";
    return sf::pipelines::run_train(o);
}

// Writes image i of a dataset: sizes and colors vary so several buckets are used.
inline void write_image(const std::filesystem::path& dir, int i, const std::string& caption) {
    const int sizes[][2] = {{300, 300}, {320, 240}, {240, 320}, {200, 400}};
    const auto& s = sizes[i % 4];
    cv::Mat img(s[0], s[1], CV_8UC3, cv::Scalar(i * 7 % 255, i * 13 % 255, i * 29 % 255));
    cv::circle(img, {s[1] / 2, s[0] / 2}, 40 + i % 50, cv::Scalar(255 - i % 255, 80, 20),
               cv::FILLED);
    const std::string stem = (dir / ("img_" + std::to_string(i))).string();
    ASSERT_TRUE(cv::imwrite(stem + (i % 3 == 0 ? ".png" : ".jpg"), img));
    write_file(stem + ".txt", caption);
}

inline void write_dataset(const std::filesystem::path& dir, int first, int count) {
    std::filesystem::create_directories(dir);
    for (int i = first; i < first + count; ++i)
        write_image(dir, i, "picture number " + std::to_string(i));
}

inline sf::pipelines::PrepOptions options_for(const TempDir& tmp) {
    sf::pipelines::PrepOptions o;
    o.instance_data_dir = tmp.file("data");
    o.cache_dir = tmp.file("cache");
    o.resolution = 512;
    o.min_side = 128;
    o.commit_batch = 4;
    return o;
}

inline bool have_ffmpeg() { return std::system("ffmpeg -version >/dev/null 2>&1") == 0; }

#define REQUIRE_FFMPEG()                                         \
    if (!sf::test::have_ffmpeg())                                \
    GTEST_SKIP() << "the ffmpeg program is needed to make test " \
                    "clips"

// A test-pattern clip of `seconds` at `fps`, 64 x 48, encoded with `codec` into `path`.
inline void make_clip(const std::filesystem::path& path, double seconds, int fps,
                      const std::string& codec, const std::string& extra = "") {
    const std::string cmd =
        "ffmpeg -loglevel error -y -f lavfi -i testsrc=size=64x48:rate=" + std::to_string(fps) +
        " -t " + std::to_string(seconds) + " -c:v " + codec + " " + extra + " -f " +
        (codec == "mpeg4"        ? "avi"
         : codec == "libvpx-vp9" ? "webm"
                                 : "mp4") +
        " '" + path.string() + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// Prep of 64 x 48 clips through the Wan VAE into 5-frame chunk windows.
inline sf::pipelines::PrepOptions video_options(const TempDir& tmp) {
    sf::pipelines::PrepOptions o = options_for(tmp);
    o.vae_kind = "wan";
    o.min_side = 32;  // the clips are 64 x 48
    o.windows.frame_extraction = sf::stages::FrameExtraction::kChunk;
    o.windows.target_frames = {5};
    o.commit_batch = 1;
    return o;
}

// Starts the program with `args` (args[0] is its name) in a child process; returns its pid.
inline pid_t start_sanaflow(const std::vector<std::string>& args) {
    const pid_t pid = ::fork();
    if (pid == 0) {
        std::vector<char*> argv;
        for (const auto& s : args) argv.push_back(const_cast<char*>(s.c_str()));
        argv.push_back(nullptr);
        ::execv(kSanaflow.c_str(), argv.data());
        ::_exit(127);
    }
    return pid;
}

// The child's wait status.
inline int wait_for(pid_t pid) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    return status;
}

// The mean of v[from, to).
// The highest forward or backward peak of a run's steps, as its metrics.jsonl records them.
inline int64_t step_peak(const std::filesystem::path& output_dir) {
    int64_t peak = 0;
    std::istringstream lines(read_file(output_dir / "metrics.jsonl"));
    for (std::string line; std::getline(lines, line);) {
        const auto bytes = nlohmann::json::parse(line).at("peak_bytes");
        for (const char* phase : {"forward", "backward"})
            peak = std::max(peak, bytes.at(phase).get<int64_t>());
    }
    return peak;
}

// Every step's loss of a finished run, from its training_summary.json.
inline std::vector<double> losses_in(const std::string& output_dir) {
    const auto j = nlohmann::json::parse(
        read_file(std::filesystem::path(output_dir) / "training_summary.json"));
    return j.at("losses").get<std::vector<double>>();
}

inline double mean(const std::vector<double>& v, size_t from, size_t to) {
    double s = 0;
    for (size_t i = from; i < to; ++i) s += v[i];
    return s / static_cast<double>(to - from);
}

}  // namespace sf::test

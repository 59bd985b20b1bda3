// Prep over clips (issue: video prep): folders mixing images and clips (sorted by content, not by
// extension) become a verified cache of video-window latents through the Wan VAE; clips without
// the video VAE, truncated and corrupt clips are handled with their reasons; a clip ten times
// longer does not raise the phase's peak memory; a killed run resumes at the first window not
// committed; an unchanged rerun loads no model. Clips are made by the `ffmpeg` program.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "integration_util.h"
#include "pipelines/inspect.h"
#include "pipelines/prep/prep.h"
#include "storage/cache.h"
#include "storage/cache_reader.h"
#include "storage/cache_schema.h"
#include "storage/tensor_convert.h"

namespace {

namespace fs = std::filesystem;
using sf::pipelines::PrepOptions;
using sf::pipelines::run_prep;
using sf::test::have_ffmpeg;
using sf::test::make_clip;
using sf::test::TempDir;
using sf::test::video_options;
namespace schema = sf::storage::schema;

int64_t count(const std::string& cache_dir, const char* db) {
    return static_cast<int64_t>(
        sf::storage::CacheReader(sf::storage::Cache::open(cache_dir), db).count());
}

// The sample records of `cache_dir` whose source is `path`.
std::vector<schema::SampleRecord> windows_of(const std::string& cache_dir, const fs::path& path) {
    const sf::storage::CacheReader samples(sf::storage::Cache::open(cache_dir), schema::kSamplesDb);
    std::vector<std::string> keys;
    samples.snapshot().for_each(
        [&](std::string_view key, std::string_view) { keys.emplace_back(key); });
    std::vector<schema::SampleRecord> out;
    for (const auto& key : keys) {
        auto s = schema::SampleRecord::from_record(*samples.get(key), key);
        if (s.source == path.string()) out.push_back(s);
    }
    return out;
}

TEST(VideoPrepIntegration, MixedFolderBecomesAVerifiedCacheOfWindowsAndRerunsLoadNothing) {
    REQUIRE_FFMPEG();
    TempDir tmp("sf_video_prep");
    const fs::path data = tmp.path() / "data";
    sf::test::write_dataset(data, 0, 2);
    make_clip(data / "a.mp4", 3, 8, "libx264", "-pix_fmt yuv420p");  // 24 frames: 4 windows
    make_clip(data / "b.jpg", 2, 8, "libx264", "-pix_fmt yuv420p");  // a clip named .jpg: 3
    sf::test::write_file(data / "a.txt", "a test pattern");
    sf::test::write_file(data / "b.txt", "another test pattern");
    const PrepOptions o = video_options(tmp);

    const auto report = run_prep(o);
    EXPECT_EQ(report.clips, 2);
    EXPECT_EQ(report.windows_planned, 7);
    EXPECT_EQ(report.written, 2 + 7);
    EXPECT_EQ(report.latents_written, 2 + 7);
    EXPECT_EQ(report.rejected, 0);
    const auto windows = windows_of(o.cache_dir, data / "a.mp4");
    ASSERT_EQ(windows.size(), 4u);
    std::set<std::string> ranges;
    for (const auto& w : windows) {
        ranges.insert(w.frames);
        EXPECT_EQ(w.bucket.frames, 5);
        EXPECT_EQ(w.stage, schema::kDecodeVideoStage);
        // The latent of a 5-frame window: 2 latent frames at 1/8 of the bucket.
        auto latent =
            sf::storage::CacheReader(sf::storage::Cache::open(o.cache_dir), schema::kLatentsDb)
                .get(w.latent_key);
        ASSERT_TRUE(latent);
        const auto t = sf::storage::from_tensor_data(latent->tensors.at(schema::kLatent));
        EXPECT_EQ(t.sizes(), (std::vector<int64_t>{8, 2, w.bucket.height / 8, w.bucket.width / 8}));
        EXPECT_EQ(latent->metadata.at(schema::kLatentForm), schema::kLatentNormalizedMean);
        EXPECT_EQ(latent->metadata.at(schema::kFrames), w.frames);
    }
    EXPECT_EQ(ranges, (std::set<std::string>{"0:5", "5:5", "10:5", "15:5"}));
    EXPECT_EQ(windows_of(o.cache_dir, data / "b.jpg").size(), 3u);

    const auto inspect = sf::pipelines::inspect_cache(o.cache_dir, /*verify=*/true);
    EXPECT_TRUE(inspect.ok) << inspect.text;
    EXPECT_NE(inspect.text.find("5x"), std::string::npos) << inspect.text;  // video buckets
    EXPECT_NE(inspect.text.find("windows per clip"), std::string::npos) << inspect.text;

    const auto again = run_prep(o);
    EXPECT_EQ(again.cached, 9);
    EXPECT_EQ(again.written, 0);
    EXPECT_TRUE(again.models_loaded.empty());
}

TEST(VideoPrepIntegration, ClipsNeedTheVideoVAEAndBadClipsAreRejectedWithTheirReason) {
    REQUIRE_FFMPEG();
    TempDir tmp("sf_video_bad");
    const fs::path data = tmp.path() / "data";
    sf::test::write_dataset(data, 0, 2);
    make_clip(data / "clip.mp4", 1, 8, "libx264", "-pix_fmt yuv420p");
    sf::test::write_file(data / "clip.txt", "a clip");
    PrepOptions o = sf::test::options_for(tmp);  // the DC-AE
    const auto dc_ae = run_prep(o);
    EXPECT_EQ(dc_ae.written, 2);
    EXPECT_EQ(dc_ae.rejected, 1);
    const auto listed = sf::pipelines::inspect_cache(o.cache_dir, false).text;
    EXPECT_NE(listed.find("--vae wan"), std::string::npos) << listed;

    // A clip cut in half keeps the windows before the cut; random bytes in an MP4 box are
    // rejected naming the file; the rest is cached.
    TempDir tmp2("sf_video_cut");
    const fs::path data2 = tmp2.path() / "data";
    fs::create_directories(data2);
    make_clip(data2 / "long.avi", 4, 8, "mpeg4", "-q:v 2");  // 32 frames: 6 windows
    std::string bytes = sf::test::read_file(data2 / "long.avi");
    bytes.resize(bytes.size() / 2);
    sf::test::write_file(data2 / "long.avi", bytes);
    std::string junk(
        "\0\0\0\x18"
        "ftypisom\0\0\0\0isomiso2",
        24);
    junk += std::string(5000, '\x5a');
    sf::test::write_file(data2 / "junk.mp4", junk);
    make_clip(data2 / "good.webm", 1, 8, "libvpx-vp9");  // 8 frames: 1 window
    for (const char* stem : {"long", "junk", "good"}) {
        sf::test::write_file(data2 / (std::string(stem) + ".txt"), stem);
    }
    const PrepOptions v = video_options(tmp2);
    const auto report = run_prep(v);
    EXPECT_EQ(report.clips_truncated, 1);
    EXPECT_EQ(report.rejected, 2);  // junk, and the truncated clip's lost windows
    const auto kept = windows_of(v.cache_dir, data2 / "long.avi");
    EXPECT_GE(kept.size(), 1u);
    EXPECT_LT(kept.size(), 6u);
    EXPECT_EQ(windows_of(v.cache_dir, data2 / "good.webm").size(), 1u);
    const auto text = sf::pipelines::inspect_cache(v.cache_dir, true).text;
    EXPECT_NE(text.find("junk.mp4"), std::string::npos) << text;
    EXPECT_NE(text.find("truncated"), std::string::npos) << text;
}

TEST(VideoPrepIntegration, AClipTenTimesLongerDoesNotRaiseThePeakMemory) {
    REQUIRE_FFMPEG();
    auto peak_for = [](double seconds) {
        TempDir tmp("sf_video_mem");
        const fs::path data = tmp.path() / "data";
        fs::create_directories(data);
        make_clip(data / "clip.mp4", seconds, 5, "libx264", "-pix_fmt yuv420p");
        sf::test::write_file(data / "clip.txt", "a clip");
        const auto report = run_prep(video_options(tmp));
        int64_t peak = 0;
        for (const auto& s : report.stages) {
            if (s.name == "video") peak = s.peak_bytes;
        }
        // The video phase's bound, as its log line says (the image phase had nothing to do).
        EXPECT_GE(report.max_in_flight, 1);
        EXPECT_LE(report.max_in_flight, 4);
        return std::make_pair(report.written, peak);
    };
    const auto [short_windows, short_peak] = peak_for(1);  // 5 frames: one window
    const auto [long_windows, long_peak] = peak_for(10);   // 50 frames: ten
    EXPECT_EQ(short_windows, 1);
    EXPECT_EQ(long_windows, 10);
    std::printf("video phase peak (counted tensor bytes): 1 window %lld, 10 windows %lld\n",
                static_cast<long long>(short_peak), static_cast<long long>(long_peak));
    EXPECT_GT(short_peak, 0);
    EXPECT_LE(static_cast<double>(long_peak), 1.1 * static_cast<double>(short_peak));
}

TEST(VideoPrepIntegration, AKilledRunResumesAtTheFirstWindowNotCommitted) {
    REQUIRE_FFMPEG();
    TempDir tmp("sf_video_kill");
    const fs::path data = tmp.path() / "data";
    fs::create_directories(data);
    make_clip(data / "clip.mp4", 12, 5, "libx264", "-pix_fmt yuv420p -g 10");  // 12 windows
    sf::test::write_file(data / "clip.txt", "a long clip");
    const PrepOptions o = video_options(tmp);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        ::execl(sf::test::kSanaflow.c_str(), "sanaflow", "-q", "prep", "--instance_data_dir",
                o.instance_data_dir.c_str(), "--cache_dir", o.cache_dir.c_str(), "--resolution",
                "512", "--min_side", "32", "--vae", "wan", "--frame_extraction", "chunk",
                "--target_frames", "5", "--commit_batch", "1", static_cast<char*>(nullptr));
        ::_exit(127);
    }
    int64_t seen = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
        if (fs::exists(fs::path(o.cache_dir) / "data.mdb")) {
            try {
                seen = count(o.cache_dir, schema::kSamplesDb);
            } catch (const sf::Error&) {
                seen = 0;  // the child may not have created the db yet
            }
        }
        if (seen >= 3) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the child finished before it could be killed";
    const int64_t committed = count(o.cache_dir, schema::kSamplesDb);
    ASSERT_GE(committed, 3);
    ASSERT_LT(committed, 12);
    EXPECT_TRUE(sf::pipelines::inspect_cache(o.cache_dir, true).ok);

    const auto rerun = run_prep(o);
    // Each committed sample's latent was committed before it (same order, one record per
    // transaction), so those windows are cached and never decoded again.
    EXPECT_EQ(rerun.cached, committed);
    EXPECT_EQ(rerun.written, 12 - committed);
    EXPECT_EQ(rerun.latents_written, 12 - committed);
    EXPECT_EQ(count(o.cache_dir, schema::kSamplesDb), 12);
}

}  // namespace

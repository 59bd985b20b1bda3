// The memory timeline: spans, marks and counter samples written as a Chrome trace that parses, a
// peak between two samples kept, recording bounded, and the file written when a run fails.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include "core/memory.h"
#include "core/timeline.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using sf::mem::Timeline;

// The events of `trace` whose "ph" is `ph` (and name `name` where given).
std::vector<json> events(const json& trace, const std::string& ph, const std::string& name = "") {
    std::vector<json> out;
    for (const auto& e : trace.at("traceEvents")) {
        if (e.at("ph") == ph && (name.empty() || e.value("name", "") == name)) out.push_back(e);
    }
    return out;
}

TEST(MemoryTimeline, WritesSpansMarksAndCountersAsAChromeTrace) {
    Timeline t;
    const double t0 = sf::mem::process_seconds();
    t.add_span("train", "step 1 forward", t0, t0 + 0.25);
    t.add_span("models", "encode_vae", t0, t0 + 1.0);
    sf::mem::Mark m;
    m.stage = "encode_vae";
    m.point = "after load";
    m.seconds = t0 + 0.5;
    m.cpu = {123, 456};
    t.add_mark(m);
    t.sample();
    const json trace = json::parse(t.chrome_trace());

    const auto spans = events(trace, "X", "step 1 forward");
    ASSERT_EQ(spans.size(), 1u);
    EXPECT_EQ(spans[0].at("dur").get<int64_t>(), 250'000);  // microseconds
    EXPECT_EQ(spans[0].at("cat"), "train");
    // Each lane is a named track: the span's tid carries the lane's thread_name.
    bool lane_named = false;
    for (const auto& e : events(trace, "M", "thread_name")) {
        if (e.at("tid") == spans[0].at("tid")) lane_named = e.at("args").at("name") == "train";
    }
    EXPECT_TRUE(lane_named);
    ASSERT_EQ(events(trace, "X", "encode_vae").size(), 1u);

    const auto marks = events(trace, "i", "encode_vae/after load");
    ASSERT_EQ(marks.size(), 1u);
    EXPECT_EQ(marks[0].at("args").at("tensor_bytes"), 123);
    EXPECT_EQ(marks[0].at("args").at("tensor_peak_bytes"), 456);
    EXPECT_EQ(marks[0].at("ts").get<int64_t>(), static_cast<int64_t>((t0 + 0.5) * 1e6));

    // One sample from the mark, one asked for: each with its tensor and RSS counters.
    EXPECT_EQ(t.sample_count(), 2u);
    const auto rss = events(trace, "C", "rss bytes");
    ASSERT_EQ(rss.size(), 2u);
    EXPECT_GT(rss[1].at("args").at("bytes").get<int64_t>(), 0);
    EXPECT_EQ(events(trace, "C", "tensor bytes").size(), 2u);
    EXPECT_TRUE(events(trace, "C", "cuda bytes").empty()) << "no GPU, no CUDA counters";
}

TEST(MemoryTimeline, KeepsAPeakThatCameAndWentBetweenTwoSamples) {
    Timeline t;
    t.sample();
    const int64_t before = sf::mem::cpu_stats().current;
    {
        const at::Tensor big = torch::ones({16 << 20}, torch::kFloat);  // 64 MiB, freed at once
        EXPECT_EQ(big.sum().item<float>(), float(16 << 20));
    }
    t.sample();
    const json trace = json::parse(t.chrome_trace());
    const auto current = events(trace, "C", "tensor bytes");
    const auto peak = events(trace, "C", "tensor peak bytes");
    ASSERT_EQ(peak.size(), 2u);
    EXPECT_LT(current[1].at("args").at("bytes").get<int64_t>(), before + (32 << 20));
    EXPECT_GE(peak[1].at("args").at("bytes").get<int64_t>(), before + (64 << 20));
}

TEST(MemoryTimeline, SamplesOnItsOwnThreadWhileRecording) {
    Timeline t;
    t.start(std::chrono::milliseconds(2));
    EXPECT_TRUE(t.recording());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (t.sample_count() < 5 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    t.stop();
    EXPECT_FALSE(t.recording());
    const size_t after_stop = t.sample_count();
    EXPECT_GE(after_stop, 5u);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(t.sample_count(), after_stop) << "the sampler went on after stop()";
}

TEST(MemoryTimeline, RecordingIsBoundedAndKeepsThePeaks) {
    Timeline t(/*max_samples=*/8, /*max_spans=*/3);
    for (int i = 0; i < 5; ++i) t.add_span("train", "step", 0, 1);
    EXPECT_EQ(t.span_count(), 3u);
    const int64_t before = sf::mem::cpu_stats().current;
    for (int i = 0; i < 7; ++i) t.sample();
    {
        const at::Tensor big = torch::ones({8 << 20}, torch::kFloat);  // 32 MiB between samples
    }
    t.sample();  // the 8th: the samples are merged pairwise
    EXPECT_EQ(t.sample_count(), 4u);
    const json trace = json::parse(t.chrome_trace());
    EXPECT_EQ(trace.at("otherData").at("dropped_spans"), 2);
    const auto peak = events(trace, "C", "tensor peak bytes");
    ASSERT_EQ(peak.size(), 4u);
    EXPECT_GE(peak.back().at("args").at("bytes").get<int64_t>(), before + (32 << 20))
        << "merging lost the peak";
}

TEST(MemoryTimeline, FileIsWrittenWhenTheRunFailsAndNestedFilesShareOneRecording) {
    const fs::path dir = fs::temp_directory_path() / "sanaflow-timeline-test";
    fs::remove_all(dir);
    const fs::path outer = dir / "run" / sf::mem::kTimelineFileName;
    const fs::path inner = dir / "cache" / sf::mem::kTimelineFileName;
    try {
        const sf::mem::TimelineFile run(outer.string());
        {
            const sf::mem::TimelineFile prep(inner.string());
            const sf::mem::Span span("prep", "image");
        }
        EXPECT_TRUE(sf::mem::timeline().recording()) << "the inner file stopped the recording";
        const sf::mem::Span span("train", "step 1");
        throw std::runtime_error("out of memory");
    } catch (const std::runtime_error&) {
    }
    EXPECT_FALSE(sf::mem::timeline().recording());
    auto read = [](const fs::path& p) {
        std::ifstream in(p);
        return json::parse(in);
    };
    ASSERT_TRUE(fs::exists(inner));
    ASSERT_TRUE(fs::exists(outer));
    EXPECT_EQ(events(read(inner), "X", "image").size(), 1u);
    EXPECT_TRUE(events(read(inner), "X", "step 1").empty());
    const json whole = read(outer);
    EXPECT_EQ(events(whole, "X", "image").size(), 1u);
    EXPECT_EQ(events(whole, "X", "step 1").size(), 1u) << "the span left by the exception";
    EXPECT_FALSE(fs::exists(outer.string() + ".tmp"));
    fs::remove_all(dir);
}

TEST(MemoryTimeline, ARunThatRecordedNothingLeavesNoFile) {
    // A run refused before any phase, model or mark (a bad flag, a missing cache) leaves
    // OUTPUT_DIR as it was.
    const fs::path dir = fs::temp_directory_path() / "sanaflow-timeline-empty-test";
    fs::remove_all(dir);
    const fs::path path = dir / sf::mem::kTimelineFileName;
    try {
        const sf::mem::TimelineFile job(path.string());
        throw std::runtime_error("give --cache_dir");
    } catch (const std::runtime_error&) {
    }
    EXPECT_FALSE(fs::exists(dir)) << "a refused run made its output folder";
    {
        const sf::mem::TimelineFile job(path.string());
        sf::mem::memory_log().mark("prep", "start");
    }
    EXPECT_TRUE(fs::exists(path)) << "a run with one mark wrote nothing";
    fs::remove_all(dir);
}

TEST(MemoryTimeline, AFileInsideOneOfTheSamePathLeavesTheWritingToIt) {
    // `sanaflow train` keeps OUTPUT_DIR's file around prep and training, and training opens it
    // again: written and logged once, at the outer end.
    const fs::path dir = fs::temp_directory_path() / "sanaflow-timeline-same-path-test";
    fs::remove_all(dir);
    const fs::path path = dir / sf::mem::kTimelineFileName;
    {
        const sf::mem::TimelineFile job(path.string());
        {
            const sf::mem::TimelineFile train(path.string());
            const sf::mem::Span span("train", "step 1");
        }
        EXPECT_FALSE(fs::exists(path)) << "the inner file wrote what the outer one writes again";
        EXPECT_TRUE(sf::mem::timeline().recording());
        const sf::mem::Span span("train", "final weights");
    }
    EXPECT_FALSE(sf::mem::timeline().recording());
    ASSERT_TRUE(fs::exists(path));
    std::ifstream in(path);
    const json whole = json::parse(in);
    EXPECT_EQ(events(whole, "X", "step 1").size(), 1u);
    EXPECT_EQ(events(whole, "X", "final weights").size(), 1u);
    fs::remove_all(dir);
}

}  // namespace

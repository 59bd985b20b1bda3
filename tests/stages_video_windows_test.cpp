// frame_windows: musubi-tuner's five frame_extraction modes, planned from a frame count alone;
// the flags are checked naming themselves; video buckets come from the image table.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "stages/video/frame_windows.h"
#include "tests/test_util.h"

namespace sf::stages {
namespace {

using Windows = std::vector<FrameWindow>;

FrameWindowConfig windows_config(FrameExtraction mode, std::vector<int> targets, int stride = 1,
                                 int sample = 1, int max_frames = 129) {
    FrameWindowConfig c;
    c.frame_extraction = mode;
    c.target_frames = std::move(targets);
    c.frame_stride = stride;
    c.frame_sample = sample;
    c.max_frames = max_frames;
    validate_frame_window_config(c);
    return c;
}

Windows plan(int64_t count, const FrameWindowConfig& c) { return plan_frame_windows(count, c); }

std::string text(const Windows& windows) {
    std::string out;
    for (const FrameWindow& w : windows) {
        out += "(" + std::to_string(w.start) + "," + std::to_string(w.length) + ")";
    }
    return out;
}

TEST(VideoWindows, ModeNamesRoundTripAndUnknownNamesTheFlag) {
    for (const char* name : {"head", "chunk", "slide", "uniform", "full"}) {
        EXPECT_STREQ(frame_extraction_name(parse_frame_extraction(name)), name);
    }
    test::expect_error([] { parse_frame_extraction("random"); }, ErrorCode::kInvalidArgument,
                       "--frame_extraction: unknown mode \"random\"");
}

TEST(VideoWindows, ConfigIsValidatedNamingTheFlag) {
    auto expect_refused = [](FrameWindowConfig c, const std::string& text) {
        test::expect_error([&] { validate_frame_window_config(c); }, ErrorCode::kInvalidArgument,
                           text);
    };
    FrameWindowConfig c;
    c.target_frames = {1, 25, 24};
    expect_refused(c, "--target_frames: 24 is not 4k+1");
    c.target_frames = {0};
    expect_refused(c, "--target_frames: 0 is not 4k+1");
    c.target_frames = {};
    expect_refused(c, "--target_frames: at least one");
    c = {};
    c.frame_stride = 0;
    expect_refused(c, "--frame_stride must be at least 1, got 0");
    c = {};
    c.frame_sample = -1;
    expect_refused(c, "--frame_sample must be at least 1, got -1");
    c = {};
    c.max_frames = 0;
    expect_refused(c, "--max_frames must be at least 1");
    c = {};
    c.target_frames = {1, 5, 9, 25, 45, 81, 121};
    EXPECT_NO_THROW(validate_frame_window_config(c));
    // full ignores target_frames, so an empty list is fine there.
    c.frame_extraction = FrameExtraction::kFull;
    c.target_frames = {};
    EXPECT_NO_THROW(validate_frame_window_config(c));
}

TEST(VideoWindows, HeadIsTheFirstWindowOfEachLengthThatFits) {
    const auto c = windows_config(FrameExtraction::kHead, {81, 1, 45, 25, 25});
    EXPECT_EQ(text(plan(100, c)), "(0,1)(0,25)(0,45)(0,81)");  // sorted, duplicates once
    EXPECT_EQ(text(plan(81, c)), "(0,1)(0,25)(0,45)(0,81)");
    EXPECT_EQ(text(plan(80, c)), "(0,1)(0,25)(0,45)");
    EXPECT_EQ(text(plan(1, c)), "(0,1)");
    EXPECT_EQ(text(plan(0, c)), "");
    EXPECT_EQ(text(plan(-3, c)), "");
}

TEST(VideoWindows, ChunkCutsConsecutiveWindowsAndDropsThePartialTail) {
    const auto c = windows_config(FrameExtraction::kChunk, {25});
    EXPECT_EQ(text(plan(50, c)), "(0,25)(25,25)");
    EXPECT_EQ(text(plan(74, c)), "(0,25)(25,25)");
    EXPECT_EQ(text(plan(75, c)), "(0,25)(25,25)(50,25)");
    EXPECT_EQ(text(plan(24, c)), "");
    const auto two = windows_config(FrameExtraction::kChunk, {5, 1});
    EXPECT_EQ(text(plan(11, two)),
              "(0,1)(1,1)(2,1)(3,1)(4,1)(5,1)(6,1)(7,1)(8,1)(9,1)(10,1)"
              "(0,5)(5,5)");
}

TEST(VideoWindows, SlideStartsAWindowEveryStride) {
    EXPECT_EQ(text(plan(30, windows_config(FrameExtraction::kSlide, {25}, 2))),
              "(0,25)(2,25)(4,25)");  // range(0, 30 - 25 + 1, 2)
    EXPECT_EQ(text(plan(30, windows_config(FrameExtraction::kSlide, {25}, 1))),
              "(0,25)(1,25)(2,25)(3,25)(4,25)(5,25)");
    EXPECT_EQ(text(plan(30, windows_config(FrameExtraction::kSlide, {25}, 10))), "(0,25)");
    EXPECT_EQ(text(plan(20, windows_config(FrameExtraction::kSlide, {25}, 10))), "");
    EXPECT_EQ(text(plan(12, windows_config(FrameExtraction::kSlide, {9, 5}, 3))),
              "(0,5)(3,5)(6,5)(0,9)(3,9)");
}

TEST(VideoWindows, UniformSpreadsStartsLikeNumpyLinspace) {
    // numpy.linspace(0, 75, 4) = 0, 25, 50, 75
    EXPECT_EQ(text(plan(100, windows_config(FrameExtraction::kUniform, {25}, 1, 4))),
              "(0,25)(25,25)(50,25)(75,25)");
    // linspace(0, 5, 4) = 0, 1.67, 3.33, 5 -> truncated 0, 1, 3, 5
    EXPECT_EQ(text(plan(30, windows_config(FrameExtraction::kUniform, {25}, 1, 4))),
              "(0,25)(1,25)(3,25)(5,25)");
    // linspace(0, 97, 7): steps of 16.17 -> 0 16 32 48 64 80 97
    EXPECT_EQ(text(plan(98, windows_config(FrameExtraction::kUniform, {1}, 1, 7))),
              "(0,1)(16,1)(32,1)(48,1)(64,1)(80,1)(97,1)");
    // linspace(0, 1, 4) = 0, 0.33, 0.67, 1 -> 0, 0, 0, 1: one window per distinct start.
    EXPECT_EQ(text(plan(26, windows_config(FrameExtraction::kUniform, {25}, 1, 4))),
              "(0,25)(1,25)");
    EXPECT_EQ(text(plan(25, windows_config(FrameExtraction::kUniform, {25}, 1, 4))), "(0,25)");
    // frame_sample 1 is head (musubi-tuner switches the mode; the windows are the same).
    const auto one = windows_config(FrameExtraction::kUniform, {1, 25, 45}, 1, 1);
    const auto head = windows_config(FrameExtraction::kHead, {1, 25, 45});
    for (int64_t n : {0, 1, 30, 44, 45, 200}) EXPECT_EQ(plan(n, one), plan(n, head)) << n;
}

TEST(VideoWindows, FullIsTheWholeClipCutTo4kPlus1AndCapped) {
    const auto c = windows_config(FrameExtraction::kFull, {1});
    EXPECT_EQ(text(plan(100, c)), "(0,97)");
    EXPECT_EQ(text(plan(97, c)), "(0,97)");
    EXPECT_EQ(text(plan(129, c)), "(0,129)");
    EXPECT_EQ(text(plan(1000, c)), "(0,129)");  // max_frames 129, musubi-tuner's default
    EXPECT_EQ(text(plan(4, c)), "(0,1)");
    EXPECT_EQ(text(plan(5, c)), "(0,5)");
    EXPECT_EQ(text(plan(0, c)), "");
    // A cap that is not 4k+1 is rounded down too.
    EXPECT_EQ(text(plan(1000, windows_config(FrameExtraction::kFull, {1}, 1, 1, 100))), "(0,97)");
}

// Every mode for every clip length up to 300: windows lie inside the clip, have a target length
// (4k+1 for full), are listed once, and come ordered by length then start; per mode, the counts
// musubi-tuner's loops give.
TEST(VideoWindows, EveryModeForManyClipLengths) {
    const std::vector<int> targets = {1, 25, 45, 81};
    for (int64_t n = 0; n <= 300; ++n) {
        for (int m = 0; m < 5; ++m) {
            const auto mode = static_cast<FrameExtraction>(m);
            const auto c = windows_config(mode, targets, 7, 5, 129);
            const Windows w = plan(n, c);
            std::set<std::pair<int64_t, int64_t>> seen;
            for (size_t i = 0; i < w.size(); ++i) {
                ASSERT_GE(w[i].start, 0);
                ASSERT_LE(w[i].end(), n) << frame_extraction_name(mode) << " n=" << n;
                ASSERT_EQ((w[i].length - 1) % 4, 0);
                ASSERT_TRUE(seen.insert({w[i].length, w[i].start}).second);
                if (i > 0) {
                    ASSERT_LE(std::make_pair(w[i - 1].length, w[i - 1].start),
                              std::make_pair(w[i].length, w[i].start));
                }
            }
            int64_t expected = 0;
            for (int t : targets) {
                if (t > n) continue;
                switch (mode) {
                    case FrameExtraction::kHead:
                        expected += 1;
                        break;
                    case FrameExtraction::kChunk:
                        expected += n / t;
                        break;
                    case FrameExtraction::kSlide:
                        expected += (n - t) / 7 + 1;
                        break;
                    case FrameExtraction::kUniform:
                        expected += std::min<int64_t>(5, n - t + 1);
                        break;
                    case FrameExtraction::kFull:
                        break;
                }
            }
            if (mode == FrameExtraction::kFull) expected = n > 0 ? 1 : 0;
            ASSERT_EQ(static_cast<int64_t>(w.size()), expected)
                << frame_extraction_name(mode) << " n=" << n;
        }
    }
}

TEST(VideoWindows, FingerprintNamesTheModeAndOnlyTheParametersItReads) {
    EXPECT_EQ(frame_windows_fingerprint(windows_config(FrameExtraction::kSlide, {25, 1}, 4, 9)),
              "slide:targets=1,25;stride=4");
    EXPECT_EQ(frame_windows_fingerprint(windows_config(FrameExtraction::kUniform, {25}, 4, 9)),
              "uniform:targets=25;sample=9");
    EXPECT_EQ(frame_windows_fingerprint(windows_config(FrameExtraction::kHead, {25}, 4, 9)),
              "head:targets=25");
    EXPECT_EQ(frame_windows_fingerprint(windows_config(FrameExtraction::kFull, {25}, 4, 9, 81)),
              "full:max_frames=81");
}

TEST(VideoWindows, VideoBucketIsTheImageBucketWithTheWindowLength) {
    const VideoBucket landscape = video_bucket(512, 48, 64, 25);  // 4:3 -> 0.72 (first of a tie)
    EXPECT_EQ(landscape.width, 576);
    EXPECT_EQ(landscape.height, 416);
    EXPECT_EQ(landscape.frames, 25);
    EXPECT_STREQ(landscape.ratio, "0.72");
    const VideoBucket portrait = video_bucket(1024, 1920, 1080, 81);  // 16:9 portrait
    EXPECT_EQ(portrait.height, 1344);
    EXPECT_EQ(portrait.width, 768);
    EXPECT_EQ(portrait.frames, 81);
    test::expect_error([] { video_bucket(640, 10, 10, 1); }, ErrorCode::kInvalidArgument, "640");
}

}  // namespace
}  // namespace sf::stages

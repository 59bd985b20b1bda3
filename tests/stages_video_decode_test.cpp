// decode_video: clips made by the ffmpeg program (H.264/MP4, VP9/WebM, MPEG-4/AVI, odd sizes,
// rotation, variable rate, a start offset) decode to the right frames, chosen by timestamp; bad
// files are rejected naming the file; a truncated clip keeps its good windows; seeking gives the
// frames of a decode from the start; the stage never holds more than a frame or two. Clips written
// by ClipWriter read back as written.
#if defined(SANAFLOW_WITH_MEDIA)

#include <ATen/ops/empty.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "stages/video/clip_reader.h"
#include "stages/video/clip_writer.h"
#include "stages/video/decode_video.h"
#include "tests/test_util.h"

namespace sf::stages {
namespace {

bool have_ffmpeg() {
    static const bool found = test::run_command("ffmpeg -version").exit_code == 0;
    return found;
}

// Clips shared by the tests, made once: ffmpeg takes a fraction of a second for each.
class VideoClips : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        if (have_ffmpeg()) dir_ = std::make_unique<test::TempDir>("sf_video");
    }
    static void TearDownTestSuite() { dir_.reset(); }
    void SetUp() override {
        if (!have_ffmpeg()) GTEST_SKIP() << "the ffmpeg program is not installed";
    }

    // `dir/name`, made by `ffmpeg -v error -y <args> dir/name` on first use.
    static std::string clip(const std::string& name, const std::string& args) {
        const std::string path = dir_->file(name);
        if (!std::filesystem::exists(path)) {
            const auto made = test::run_command("ffmpeg -v error -y " + args + " " + path);
            EXPECT_EQ(made.exit_code, 0) << made.output;
        }
        return path;
    }
    static std::string file(const std::string& name) { return dir_->file(name); }

    // testsrc, 64x48 at 24 fps, a keyframe every 12 frames.
    static std::string testsrc(const std::string& name, const std::string& codec, double seconds) {
        return clip(name, "-f lavfi -i testsrc=size=64x48:rate=24 -t " + std::to_string(seconds) +
                              " -g 12 -pix_fmt yuv420p " + codec);
    }
    // Frame N is gray at luma 16 + 8 N (lossless H.264), so a decoded frame names its source.
    static std::string numbered(const std::string& name, int rate, int frames,
                                const std::string& extra = "") {
        return clip(name, "-f lavfi -i \"color=c=black:s=64x48:r=" + std::to_string(rate) +
                              ",format=yuv420p,geq=lum='16+8*N':cb=128:cr=128\" -frames:v " +
                              std::to_string(frames) + " -c:v libx264 -qp 0 -g 12 " + extra);
    }

    static std::unique_ptr<test::TempDir> dir_;
};
std::unique_ptr<test::TempDir> VideoClips::dir_;

DecodeVideoConfig video_config(double fps = 0, FrameExtraction mode = FrameExtraction::kHead,
                               std::vector<int> targets = {1}) {
    DecodeVideoConfig c;
    c.video_fps = fps;
    c.min_side = 16;
    c.windows.frame_extraction = mode;
    c.windows.target_frames = std::move(targets);
    return c;
}

// The source frame number of a gray frame made by numbered(): BT.601 limited range, so
// R = 8 N * 255 / 219.
int source_frame(const at::Tensor& rgb) {
    const double r = rgb[0].to(at::kDouble).mean().item<double>();
    return static_cast<int>(std::lround(r * 219.0 / 255.0 / 8.0));
}

// Every frame delivered, keyed by (window, frame in window).
struct Collected {
    std::map<std::pair<size_t, int64_t>, at::Tensor> frames;
    DecodeVideoResult result;
};
Collected decode_all(const DecodeVideoStage& stage, const std::string& path,
                     const std::vector<FrameWindow>& windows) {
    Collected out;
    out.result = stage.decode(path, windows, [&](size_t w, int64_t k, const at::Tensor& rgb) {
        EXPECT_TRUE(out.frames.emplace(std::make_pair(w, k), rgb).second) << w << "/" << k;
    });
    return out;
}

// The source frame chosen for each output frame of one window covering `count` frames.
std::vector<int> chosen_sources(const DecodeVideoStage& stage, const std::string& path,
                                int64_t count, DecodeVideoResult* result = nullptr) {
    std::vector<int> sources;
    const DecodeVideoResult r =
        stage.decode(path, {{0, count}}, [&](size_t, int64_t k, const at::Tensor& rgb) {
            EXPECT_EQ(k, static_cast<int64_t>(sources.size()));
            sources.push_back(source_frame(rgb));
        });
    if (result != nullptr) *result = r;
    return sources;
}

std::string reject_reason(const DecodeVideoStage& stage, const std::string& path) {
    try {
        stage.probe(path);
    } catch (const Reject& r) {
        return r.reason();
    }
    return "";
}

TEST(VideoDecodeConfig, IsValidatedNamingTheField) {
    auto message_for = [](DecodeVideoConfig c) {
        return test::error_of([&] { DecodeVideoStage s(c); });
    };
    DecodeVideoConfig c;
    c.resolution = 768;
    EXPECT_NE(message_for(c).find("resolution 768"), std::string::npos);
    c = {};
    c.video_fps = -1;
    EXPECT_NE(message_for(c).find("video_fps"), std::string::npos);
    c = {};
    c.windows.target_frames = {1, 16};
    EXPECT_NE(message_for(c).find("--target_frames: 16 is not 4k+1"), std::string::npos);
    c = {};
    c.threads = -2;
    EXPECT_NE(message_for(c).find("threads"), std::string::npos);
    c = {};
    c.min_side = 0;
    EXPECT_NE(message_for(c).find("min_side"), std::string::npos);
    EXPECT_EQ(message_for(DecodeVideoConfig{}), "(no error)");
}

TEST(VideoDecodeConfig, FingerprintChangesWithWhatChangesTheFrames) {
    const std::string base = DecodeVideoStage(video_config()).fingerprint();
    EXPECT_NE(DecodeVideoStage(video_config(16)).fingerprint(), base);
    EXPECT_NE(DecodeVideoStage(video_config(0, FrameExtraction::kChunk)).fingerprint(), base);
    EXPECT_NE(DecodeVideoStage(video_config(0, FrameExtraction::kHead, {1, 25})).fingerprint(),
              base);
    DecodeVideoConfig c = video_config();
    c.resolution = 1024;
    EXPECT_NE(DecodeVideoStage(c).fingerprint(), base);
    c = video_config();
    c.threads = 0;
    c.seek = false;
    c.min_side = 99;
    EXPECT_EQ(DecodeVideoStage(c).fingerprint(), base);  // speed and rejects only
    EXPECT_NE(base.find("sana-ar512-"), std::string::npos);
}

TEST_F(VideoClips, ProbeReadsEveryContainer) {
    const DecodeVideoStage stage(video_config());
    for (const auto& [name, codec, expect_codec] :
         std::vector<std::tuple<std::string, std::string, std::string>>{
             {"h264.mp4", "-c:v libx264", "h264"},
             {"vp9.webm", "-c:v libvpx-vp9", "vp9"},
             {"mpeg4.avi", "-c:v mpeg4", "mpeg4"}}) {
        const ClipInfo info = stage.probe(testsrc(name, codec, 2));
        EXPECT_EQ(info.width, 64) << name;
        EXPECT_EQ(info.height, 48) << name;
        EXPECT_EQ(info.rotation, 0) << name;
        EXPECT_EQ(info.fps_num, 24) << name;
        EXPECT_EQ(info.fps_den, 1) << name;
        EXPECT_NEAR(info.duration_s, 2.0, 1e-3) << name;
        EXPECT_EQ(info.frame_count, 48) << name;
        EXPECT_EQ(info.ends_early, "") << name;
        EXPECT_EQ(info.codec.rfind(expect_codec, 0), 0u) << info.codec;  // "vp9" or "libvpx-vp9"
        EXPECT_EQ(info.bucket.width, 576) << name;
        EXPECT_EQ(info.bucket.height, 416) << name;
        EXPECT_EQ(stage.plan(info), (std::vector<FrameWindow>{{0, 1}}));
    }
    const ClipInfo at16 = DecodeVideoStage(video_config(16)).probe(file("h264.mp4"));
    EXPECT_EQ(at16.frame_count, 32);
    EXPECT_EQ(at16.source_fps_num, 24);
}

// The fuzzer reads clips from memory; the reader must see there what it sees in the file.
TEST_F(VideoClips, ClipsReadFromMemoryProbeAsFromTheirFile) {
    const DecodeVideoConfig config = video_config();
    for (const auto& [name, codec] :
         std::vector<std::pair<std::string, std::string>>{{"h264.mp4", "-c:v libx264"},
                                                          {"vp9.webm", "-c:v libvpx-vp9"},
                                                          {"mpeg4.avi", "-c:v mpeg4"}}) {
        const std::string path = testsrc(name, codec, 2);
        const std::string bytes = test::read_file(path);
        const ClipInfo from_file = DecodeVideoStage(config).probe(path);
        const ClipReader reader(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                "memory", config, /*open_decoder=*/false);
        EXPECT_EQ(reader.info().frame_count, from_file.frame_count) << name;
        EXPECT_EQ(reader.info().codec, from_file.codec) << name;
        EXPECT_EQ(reader.info().width, from_file.width) << name;
        EXPECT_NEAR(reader.info().duration_s, from_file.duration_s, 1e-9) << name;
    }
    const std::string noise(300, 'x');
    test::expect_error(
        [&] {
            ClipReader(reinterpret_cast<const uint8_t*>(noise.data()), noise.size(), "memory",
                       config, false);
        },
        ErrorCode::kInvalidArgument, "memory: not a video file");
}

// Found by tools/fuzz (fuzz_clip): an mp4 whose start time and duration put the end scan's seek
// target past int64's ends. Read or refused, never undefined (the ASan + UBSan build aborts on
// the overflow: tools/test.sh --asan).
TEST(VideoFuzzFindings, AnEndScanNearTheEndsOfInt64IsReadOrRefused) {
    const std::string bytes =
        test::read_file(std::string(SANAFLOW_TEST_DATA) + "/fuzz/clip-end-scan-overflow.mp4");
    DecodeVideoConfig config;
    config.min_side = 1;
    try {
        const ClipReader reader(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                "crafted.mp4", config, /*open_decoder=*/false);
        EXPECT_GE(reader.info().duration_s, 0);
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("crafted.mp4"), std::string::npos) << e.what();
    }
}

TEST_F(VideoClips, EveryCodecDecodesEveryFrameAtTheBucketSize) {
    const DecodeVideoStage stage(video_config(0, FrameExtraction::kChunk, {1, 25}));
    for (const std::string name : {"h264.mp4", "vp9.webm", "mpeg4.avi"}) {
        const std::string path = file(name);
        const std::vector<FrameWindow> windows = stage.plan(stage.probe(path));
        ASSERT_EQ(windows.size(), 48u + 1u) << name;  // 48 single frames, one of 25
        const Collected got = decode_all(stage, path, windows);
        EXPECT_FALSE(got.result.truncated) << got.result.truncation_reason;
        EXPECT_EQ(got.result.frames_reached, 48) << name;
        for (bool done : got.result.completed) EXPECT_TRUE(done) << name;
        ASSERT_EQ(got.frames.size(), 48u + 25u) << name;
        for (const auto& [key, rgb] : got.frames) {
            ASSERT_EQ(rgb.sizes(), (std::vector<int64_t>{3, 416, 576})) << name;
            ASSERT_EQ(rgb.scalar_type(), at::kByte);
            ASSERT_TRUE(rgb.is_contiguous());
        }
        // The window of 25 is frames 0..24: the same pictures as the single-frame windows.
        for (int64_t k = 0; k < 25; ++k) {
            EXPECT_TRUE(got.frames.at({48, k}).equal(got.frames.at({size_t(k), 0}))) << name;
        }
        // A window past the clip's real end is reported as not produced, and the clip is whole.
        const Collected past = decode_all(stage, path, {{40, 5}, {45, 5}});
        EXPECT_TRUE(past.result.completed[0]) << name;
        EXPECT_FALSE(past.result.completed[1]) << name;
        EXPECT_EQ(past.result.frames_reached, 48) << name;
        EXPECT_FALSE(past.result.truncated) << past.result.truncation_reason;
        // testsrc moves: consecutive frames differ.
        EXPECT_FALSE(got.frames.at({0, 0}).equal(got.frames.at({1, 0}))) << name;
    }
}

TEST_F(VideoClips, FramesAreChosenByNearestTimestamp) {
    const std::string ten = numbered("ten.mkv", 10, 20);  // source frame N at N / 10 s
    // At the source rate every frame once (the 1 ms Matroska time base is exact at 10 fps).
    EXPECT_EQ(
        chosen_sources(DecodeVideoStage(video_config()), ten, 20),
        (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}));
    // Up to 24 fps: output i at i / 24 s takes the nearest N = i * 10 / 24, the earlier one on a
    // tie (i = 6: 2.5 -> 2); the last frame lasts until 2 s, so 48 frames.
    DecodeVideoResult result;
    const DecodeVideoStage up(video_config(24));
    EXPECT_EQ(up.probe(ten).frame_count, 48);
    const std::vector<int> at24 = chosen_sources(up, ten, 48, &result);
    ASSERT_EQ(at24.size(), 48u);
    for (int i = 0; i < 48; ++i) {
        const int twice = i * 20 / 24;  // floor(2 * i * 10 / 24)
        const bool tie = (i * 20) % 24 == 0 && twice % 2 == 1;
        // The last source frame (19) lasts until 2 s.
        const int expected =
            std::min(19, tie ? twice / 2 : static_cast<int>(std::lround(i * 10.0 / 24.0)));
        EXPECT_EQ(at24[i], expected) << "output frame " << i;
    }
    EXPECT_EQ(at24[6], 2);
    EXPECT_FALSE(result.truncated) << result.truncation_reason;
    // Down to 4 fps: N = 2.5 i -> 0, 2 (tie), 5, 7 (tie), 10, 12, 15, 17.
    EXPECT_EQ(chosen_sources(DecodeVideoStage(video_config(4)), ten, 8),
              (std::vector<int>{0, 2, 5, 7, 10, 12, 15, 17}));
    // 24 fps in Matroska: frames at 0, 42, 83, 125 ms, so frame 1 is after T_1 = 41.67 ms. The
    // nearest frame is still frame 1: no frame is doubled or dropped.
    const std::string ms = numbered("24.mkv", 24, 20);
    const std::vector<int> at_source = chosen_sources(DecodeVideoStage(video_config()), ms, 20);
    for (int i = 0; i < 20; ++i) EXPECT_EQ(at_source[i], i);
}

TEST_F(VideoClips, VariableFrameRateIsResampledByTimestamp) {
    // 5 frames at 5 fps (0, 0.2, ..., 0.8 s), then 20 at 20 fps (1.0, 1.05, ..., 1.95 s): pts in
    // the source's 1/20 s time base, integers so that no float rounding moves a frame.
    const std::string vfr = clip(
        "vfr.mkv",
        "-f lavfi -i \"color=c=black:s=64x48:r=20,format=yuv420p,geq=lum='16+8*N':cb=128:cr=128,"
        "setpts='if(lt(N,5),4*N,15+N)'\" -frames:v 25 -fps_mode passthrough "
        "-c:v libx264 -qp 0");
    std::vector<double> times;  // the source frames' times, as libav reads them
    for (int n = 0; n < 25; ++n) times.push_back(n < 5 ? n * 0.2 : 1 + (n - 5) * 0.05);
    const DecodeVideoStage stage(video_config(10));
    const ClipInfo info = stage.probe(vfr);
    EXPECT_EQ(info.frame_count, 20);
    const std::vector<int> chosen = chosen_sources(stage, vfr, 20);
    ASSERT_EQ(chosen.size(), 20u);
    for (int i = 0; i < 20; ++i) {
        const double t = i / 10.0;
        int nearest = 0;  // the earlier frame wins a tie
        for (int n = 1; n < 25; ++n) {
            if (std::abs(times[n] - t) < std::abs(times[nearest] - t) - 1e-9) nearest = n;
        }
        EXPECT_EQ(chosen[i], nearest) << "output frame " << i << " at " << t << " s";
    }
    EXPECT_EQ(chosen[1], 0);   // 0.1 s: halfway between 0 and 0.2, the earlier
    EXPECT_EQ(chosen[10], 5);  // 1.0 s: the first 20 fps frame
    EXPECT_EQ(chosen[11], 7);  // 1.1 s
}

TEST_F(VideoClips, NonZeroStartTimeIsSubtracted) {
    const DecodeVideoStage stage(video_config());
    for (const std::string ext : {"mp4", "mkv"}) {
        const std::string path = numbered("offset." + ext, 10, 20, "-output_ts_offset 10");
        const ClipInfo info = stage.probe(path);
        EXPECT_NEAR(info.start_time_s, 10.0, 1e-3) << ext;
        EXPECT_NEAR(info.duration_s, 2.0, 1e-3) << ext;  // not 12: Matroska's end is scanned
        EXPECT_EQ(info.frame_count, 20) << ext;
        EXPECT_EQ(info.ends_early, "") << ext;  // Matroska's 12 s counts from zero
        const std::vector<int> chosen = chosen_sources(stage, path, 20);
        ASSERT_EQ(chosen.size(), 20u) << ext;
        for (int i = 0; i < 20; ++i) EXPECT_EQ(chosen[i], i) << ext;
    }
}

TEST_F(VideoClips, OddSizesKeepColourToTheEdges) {
    const DecodeVideoStage stage(video_config());
    // VP9 keeps odd sides in 4:2:0 (libx264 refuses them); the source is RGB, so that the colour
    // source does not round the size to even.
    const std::string odd = clip("odd-red.webm",
                                 "-f lavfi -i \"color=c=red:size=65x49:rate=24,format=rgb24\" -t 1 "
                                 "-c:v libvpx-vp9 -pix_fmt yuv420p");
    const ClipInfo info = stage.probe(odd);
    EXPECT_EQ(info.width, 65);
    EXPECT_EQ(info.height, 49);
    EXPECT_STREQ(info.bucket.ratio, "0.78");  // 49 / 65 = 0.754
    const Collected got = decode_all(stage, odd, {{0, 1}, {23, 1}});
    ASSERT_EQ(got.frames.size(), 2u);
    for (const auto& [key, rgb] : got.frames) {
        ASSERT_EQ(rgb.sizes(), (std::vector<int64_t>{3, 448, 576}));
        // Red everywhere, first and last rows and columns included.
        const at::Tensor r = rgb[0].to(at::kInt), g = rgb[1].to(at::kInt), b = rgb[2].to(at::kInt);
        EXPECT_GT(r.min().item<int>(), 235);
        EXPECT_LT(g.max().item<int>(), 20);
        EXPECT_LT(b.max().item<int>(), 20);
    }
    // testsrc at odd sizes, in every container.
    for (const auto& [name, codec] : std::vector<std::pair<std::string, std::string>>{
             {"odd.webm", "-c:v libvpx-vp9"}, {"odd.avi", "-c:v mpeg4"}}) {
        const std::string path = clip(name, "-f lavfi -i testsrc=size=65x49:rate=24 -t 1 " + codec);
        const Collected frames = decode_all(stage, path, {{0, 5}});
        EXPECT_TRUE(frames.result.completed[0]) << name;
        EXPECT_EQ(frames.frames.size(), 5u) << name;
    }
}

// One colour through every conversion path: BT.601 (untagged SD), BT.709 (tagged HD), full-range
// JPEG-style YUV (MJPEG's yuvj420p), packed BGRA (GIF) and a palette (PAL8 PNG, unpacked before
// cropping). A wrong matrix or range is off by 10-30 levels. ffmpeg writes the palette clips
// dithered (its fixed palette lacks pure red: 216 and 252 alternate), so there the channel means
// are compared with the ffmpeg program's own decode of the same file.
TEST_F(VideoClips, ColourIsRightForEveryMatrixRangeAndLayout) {
    const std::string blue = "-f lavfi -i color=c=0x3366CC:size=64x48:rate=10 -t 0.5 ";
    const std::string red = "-f lavfi -i color=c=red:size=64x48:rate=10 -t 0.5 ";
    struct Case {
        std::string name, args;
        int rgb[3];
        bool dithered = false;
    };
    const std::vector<Case> cases = {
        {"sd.mp4", blue + "-c:v libx264 -pix_fmt yuv420p", {0x33, 0x66, 0xCC}},
        {"hd.mp4",
         "-f lavfi -i color=c=0x3366CC:size=1280x720:rate=10 -t 0.3 -vf "
         "scale=out_color_matrix=bt709:out_range=tv,format=yuv420p -colorspace bt709 -c:v libx264 "
         "-preset ultrafast",
         {0x33, 0x66, 0xCC}},
        {"mjpeg.avi", blue + "-c:v mjpeg", {0x33, 0x66, 0xCC}},
        {"bgra.gif", red, {255, 0, 0}, true},
        {"pal8.mkv", red + "-c:v png -pix_fmt pal8", {255, 0, 0}, true},
    };
    const DecodeVideoStage stage(video_config());
    for (const Case& c : cases) {
        const Collected got = decode_all(stage, clip(c.name, c.args), {{0, 2}});
        ASSERT_EQ(got.frames.size(), 2u) << c.name;
        const at::Tensor& rgb = got.frames.at({0, 1});
        if (c.dithered) {
            const std::string raw = file(c.name + ".rgb");
            ASSERT_EQ(test::run_command("ffmpeg -v error -y -i " + file(c.name) +
                                        " -frames:v 1 -f rawvideo -pix_fmt rgb24 " + raw)
                          .exit_code,
                      0);
            const std::string bytes = test::read_file(raw);
            ASSERT_EQ(bytes.size(), 64u * 48u * 3u);
            for (int k = 0; k < 3; ++k) {
                double sum = 0;
                for (size_t i = k; i < bytes.size(); i += 3) sum += static_cast<uint8_t>(bytes[i]);
                const double reference = sum / (64 * 48);
                EXPECT_NEAR(rgb[k].to(at::kDouble).mean().item<double>(), reference, 3.0)
                    << c.name << " channel " << k;
            }
            continue;
        }
        for (int k = 0; k < 3; ++k) {
            const at::Tensor channel = rgb[k].to(at::kInt);
            EXPECT_NEAR(channel.min().item<int>(), c.rgb[k], 5) << c.name << " channel " << k;
            EXPECT_NEAR(channel.max().item<int>(), c.rgb[k], 5) << c.name << " channel " << k;
        }
    }
}

// Where the red marker (top-left of the stored picture) lies, as fractions of width and height.
std::pair<double, double> red_centroid_chw(const at::Tensor& rgb) {
    const at::Tensor red = rgb[0].to(at::kInt).gt(160).logical_and(rgb[2].to(at::kInt).lt(100));
    const at::Tensor where = red.nonzero().to(at::kDouble);  // [n, 2]: (y, x)
    EXPECT_GT(where.size(0), 0);
    return {where.select(1, 1).mean().item<double>() / rgb.size(2),
            where.select(1, 0).mean().item<double>() / rgb.size(1)};
}

TEST_F(VideoClips, DisplayRotationIsAppliedAsFFmpegDoes) {
    const std::string plain =
        clip("marker.mp4",
             "-f lavfi -i color=c=blue:size=64x48:rate=24 -vf "
             "drawbox=x=0:y=0:w=16:h=12:color=red:t=fill -t 1 -c:v libx264 -pix_fmt yuv420p");
    const DecodeVideoStage stage(video_config());
    for (int tag : {90, 180, 270}) {
        const std::string path =
            clip("rotate" + std::to_string(tag) + ".mp4",
                 "-i " + plain + " -c copy -metadata:s:v rotate=" + std::to_string(tag));
        const ClipInfo info = stage.probe(path);
        const bool transposed = info.rotation == 90 || info.rotation == 270;
        EXPECT_EQ(info.width, transposed ? 48 : 64) << tag;
        EXPECT_EQ(info.height, transposed ? 64 : 48) << tag;
        EXPECT_NE(info.rotation, 0) << tag;
        // The ffmpeg program's own autorotated first frame is the reference.
        const int w = info.width, h = info.height;
        const std::string raw = file("rotate" + std::to_string(tag) + ".rgb");
        ASSERT_EQ(test::run_command("ffmpeg -v error -y -i " + path +
                                    " -frames:v 1 -f rawvideo -pix_fmt rgb24 " + raw)
                      .exit_code,
                  0);
        const std::string bytes = test::read_file(raw);
        ASSERT_EQ(bytes.size(), size_t(w) * h * 3) << tag;
        at::Tensor reference = at::empty({h, w, 3}, at::kByte);
        std::memcpy(reference.data_ptr(), bytes.data(), bytes.size());
        reference = reference.permute({2, 0, 1}).contiguous();
        const Collected got = decode_all(stage, path, {{0, 1}});
        ASSERT_EQ(got.frames.size(), 1u);
        const at::Tensor& ours = got.frames.begin()->second;
        EXPECT_EQ(ours.size(1), info.bucket.height);
        EXPECT_EQ(ours.size(2), info.bucket.width);
        const auto [ref_x, ref_y] = red_centroid_chw(reference);
        const auto [x, y] = red_centroid_chw(ours);
        EXPECT_NEAR(x, ref_x, 0.05) << "rotate=" << tag;
        EXPECT_NEAR(y, ref_y, 0.05) << "rotate=" << tag;
    }
}

TEST_F(VideoClips, TruncatedClipKeepsTheWindowsBeforeTheBreak) {
    const DecodeVideoConfig config = video_config(0, FrameExtraction::kChunk, {5});
    const DecodeVideoStage stage(config);
    for (const auto& [name, codec] : std::vector<std::pair<std::string, std::string>>{
             {"long.mp4", "-c:v libx264 -movflags +faststart"},
             {"long.avi", "-c:v mpeg4"},
             {"long.webm", "-c:v libvpx-vp9"}}) {
        const std::string whole = testsrc(name, codec, 4);
        const std::vector<FrameWindow> windows = stage.plan(stage.probe(whole));
        ASSERT_EQ(windows.size(), 19u);  // 96 frames in chunks of 5
        const Collected reference = decode_all(stage, whole, windows);
        ASSERT_FALSE(reference.result.truncated) << reference.result.truncation_reason;

        const std::string bytes = test::read_file(whole);
        const std::string cut = file("cut-" + name);
        test::write_file(cut, bytes.substr(0, bytes.size() / 2));
        const Collected got = decode_all(stage, cut, windows);
        // WebM has no index to lose: the cut file reads as a shorter clip, except that the
        // container still declares 4 s.
        if (name == "long.webm") {
            EXPECT_NE(stage.probe(cut).ends_early, "");
        }
        EXPECT_TRUE(got.result.truncated) << name;
        EXPECT_EQ(got.result.truncation_reason.rfind(cut + ": ", 0), 0u)
            << got.result.truncation_reason;
        // A prefix of the windows is complete, and each frame is the whole file's.
        size_t completed = 0;
        while (completed < windows.size() && got.result.completed[completed]) ++completed;
        for (size_t w = completed; w < windows.size(); ++w) EXPECT_FALSE(got.result.completed[w]);
        EXPECT_GE(completed, 3u) << name;
        EXPECT_LT(completed, windows.size()) << name;
        for (size_t w = 0; w < completed; ++w) {
            for (int64_t k = 0; k < 5; ++k) {
                EXPECT_TRUE(got.frames.at({w, k}).equal(reference.frames.at({w, k})))
                    << name << " window " << w << " frame " << k;
            }
        }
    }
}

TEST_F(VideoClips, BadFilesAreRejectedNamingTheFileAndTheReason) {
    const DecodeVideoStage stage(video_config());
    const std::string missing = file("missing.mp4");
    EXPECT_EQ(reject_reason(stage, missing).rfind(missing + ": cannot read file", 0), 0u);
    EXPECT_EQ(reject_reason(stage, dir_->path().string()),
              dir_->path().string() + ": cannot read file (not a regular file)");
    const std::string empty = file("empty.mp4");
    test::write_file(empty, "");
    EXPECT_EQ(reject_reason(stage, empty), empty + ": not a video file (empty file)");
    std::string random(20000, '\0');
    for (size_t i = 0; i < random.size(); ++i) random[i] = static_cast<char>(i * 7919 % 251);
    const std::string noise = file("noise.mp4");
    test::write_file(noise, random);
    EXPECT_EQ(reject_reason(stage, noise).rfind(noise + ": not a video file", 0), 0u)
        << reject_reason(stage, noise);
    const std::string text = file("notes.mp4");
    test::write_file(text, "These are my holiday notes, not a video.\n");
    EXPECT_EQ(reject_reason(stage, text).rfind(text + ": not a video file", 0), 0u)
        << reject_reason(stage, text);
    // A playlist would make libav open whatever it names: refused by the demuxer whitelist.
    const std::string playlist = file("list.mp4");
    test::write_file(playlist, "ffconcat version 1.0\nfile '" + file("h264.mp4") + "'\n");
    EXPECT_EQ(reject_reason(stage, playlist).rfind(playlist + ": not a video file", 0), 0u);
    const std::string audio = clip("audio.m4a", "-f lavfi -i sine=duration=1 -c:a aac");
    EXPECT_EQ(reject_reason(stage, audio), audio + ": no video stream");
    // Declared size and file size limits, before decoding.
    const std::string video = testsrc("h264.mp4", "-c:v libx264", 2);
    DecodeVideoConfig c = video_config();
    c.max_pixels = 64 * 48 - 1;
    EXPECT_EQ(reject_reason(DecodeVideoStage(c), video),
              video +
                  ": declared dimensions 64x48 exceed the limit of 3071 pixels "
                  "(decompression bomb?)");
    c = video_config();
    c.min_side = 50;
    EXPECT_EQ(reject_reason(DecodeVideoStage(c), video),
              video + ": video too small: 64x48, minimum side is 50");
    c = video_config();
    c.max_file_bytes = 100;
    EXPECT_NE(reject_reason(DecodeVideoStage(c), video).find("(max_file_bytes)"),
              std::string::npos);
    // decode() rejects the same way.
    EXPECT_THROW(stage.decode(noise, {{0, 1}}, [](size_t, int64_t, const at::Tensor&) {}), Reject);
}

TEST_F(VideoClips, SeekingGivesTheFramesOfADecodeFromTheStart) {
    DecodeVideoConfig config = video_config(0, FrameExtraction::kChunk, {9});
    const DecodeVideoStage seeking(config);
    config.seek = false;
    const DecodeVideoStage from_start(config);
    for (const auto& [name, codec] : std::vector<std::pair<std::string, std::string>>{
             {"long.mp4", "-c:v libx264 -movflags +faststart"},
             {"long.webm", "-c:v libvpx-vp9"},
             {"long.avi", "-c:v mpeg4"}}) {
        const std::string path = testsrc(name, codec, 4);
        const std::vector<FrameWindow> all = seeking.plan(seeking.probe(path));
        ASSERT_EQ(all.size(), 10u) << name;
        // Resume: windows 0..4 are committed, only 5..9 are asked for (starts 45..81).
        const std::vector<FrameWindow> rest(all.begin() + 5, all.end());
        const Collected sought = decode_all(seeking, path, rest);
        const Collected reference = decode_all(from_start, path, rest);
        EXPECT_TRUE(sought.result.seeked) << name;
        EXPECT_FALSE(reference.result.seeked) << name;
        ASSERT_EQ(sought.frames.size(), 45u) << name;
        ASSERT_EQ(reference.frames.size(), 45u) << name;
        for (const auto& [key, rgb] : reference.frames) {
            EXPECT_TRUE(sought.frames.at(key).equal(rgb))
                << name << " window " << key.first << " frame " << key.second;
        }
        for (bool done : sought.result.completed) EXPECT_TRUE(done) << name;
    }
    // A numbered clip names the frames: the sought window starts exactly at source frame 21.
    const std::string ten = numbered("ten-long.mp4", 10, 30, "-movflags +faststart");
    std::vector<int> sources;
    const DecodeVideoResult r =
        DecodeVideoStage(video_config())
            .decode(ten, {{21, 5}}, [&](size_t, int64_t, const at::Tensor& rgb) {
                sources.push_back(source_frame(rgb));
            });
    EXPECT_TRUE(r.seeked);
    EXPECT_EQ(sources, (std::vector<int>{21, 22, 23, 24, 25}));
}

TEST_F(VideoClips, OverlappingWindowsShareFramesAndDecodingStopsWhenAllAreDone) {
    const DecodeVideoStage stage(video_config(0, FrameExtraction::kSlide, {5}));
    const std::string path = testsrc("long.mp4", "-c:v libx264 -movflags +faststart", 4);
    std::vector<std::pair<size_t, int64_t>> order;
    std::map<std::pair<size_t, int64_t>, const void*> data;
    const DecodeVideoResult r =
        stage.decode(path, {{0, 5}, {2, 5}}, [&](size_t w, int64_t k, const at::Tensor& rgb) {
            order.emplace_back(w, k);
            data[{w, k}] = rgb.data_ptr();
        });
    // Output frames 2..4 go to both windows, in window order, as the same tensor.
    const std::vector<std::pair<size_t, int64_t>> expected = {
        {0, 0}, {0, 1}, {0, 2}, {1, 0}, {0, 3}, {1, 1}, {0, 4}, {1, 2}, {1, 3}, {1, 4}};
    EXPECT_EQ(order, expected);
    EXPECT_EQ(data[std::make_pair(size_t{0}, int64_t{3})],
              data[std::make_pair(size_t{1}, int64_t{1})]);
    EXPECT_EQ(r.frames_reached, 7);  // of 96: nothing after the last wanted frame is timed
    EXPECT_FALSE(r.truncated);
}

TEST_F(VideoClips, DecoderThreadsGiveTheSameFrames) {
    DecodeVideoConfig config = video_config(0, FrameExtraction::kChunk, {25});
    const std::string path = testsrc("long.mp4", "-c:v libx264 -movflags +faststart", 4);
    const Collected one = decode_all(DecodeVideoStage(config), path, {{0, 25}, {50, 25}});
    config.threads = 4;
    const Collected four = decode_all(DecodeVideoStage(config), path, {{0, 25}, {50, 25}});
    ASSERT_EQ(one.frames.size(), 50u);
    ASSERT_EQ(four.frames.size(), 50u);
    for (const auto& [key, rgb] : one.frames) EXPECT_TRUE(four.frames.at(key).equal(rgb));
}

// A 10 s clip is 240 frames of 576x416x3 (172 MB if held); the stage holds one converted frame.
TEST_F(VideoClips, MemoryStaysAtAFrameOrTwoWhateverTheClipLength) {
    ASSERT_TRUE(mem::counting_allocator_installed());
    const std::string path = clip("ten-seconds.mp4",
                                  "-f lavfi -i testsrc=size=64x48:rate=24 -t 10 -c:v libx264 "
                                  "-pix_fmt yuv420p");
    const DecodeVideoStage stage(video_config(0, FrameExtraction::kFull));
    const std::vector<FrameWindow> windows = stage.plan(stage.probe(path));
    ASSERT_EQ(windows, (std::vector<FrameWindow>{{0, 129}}));
    const int64_t frame_bytes = 3 * 576 * 416;
    const int64_t before = mem::cpu_stats().current;
    int64_t most = 0, calls = 0;
    const DecodeVideoResult r =
        stage.decode(path, windows, [&](size_t, int64_t, const at::Tensor&) {
            most = std::max(most, mem::cpu_stats().current - before);
            ++calls;
        });
    EXPECT_EQ(calls, 129);
    EXPECT_TRUE(r.completed[0]);
    EXPECT_LE(most, 2 * frame_bytes) << "tensor bytes live in the callback";
    EXPECT_LE(mem::cpu_stats().current - before, 0) << "tensor bytes left after decode";
}

// ClipWriter (validation videos, the demo's clips): frames pushed as RGB read back through the
// decoder at their number, rate, size and colour in every container its extension names; bad
// sizes, an unknown extension and a frame after finish() are refused naming the file.
TEST(ClipWriter, RgbFramesReadBackAtTheirCountRateAndColourInEveryContainer) {
    test::TempDir dir("sf_clip_writer");
    constexpr int kWidth = 64, kHeight = 48, kFrames = 9;
    auto colour = [](int t) { return std::array<int, 3>{30 + 20 * t, 100, 200 - 10 * t}; };
    const DecodeVideoStage stage(video_config(0, FrameExtraction::kChunk, {kFrames}));
    for (const std::string name : {"a.mp4", "a.avi", "a.mkv"}) {
        SCOPED_TRACE(name);
        const std::string path = dir.file(name);
        {
            ClipWriter clip(path, kWidth, kHeight, 16);
            std::vector<uint8_t> rgb(kWidth * kHeight * 3);
            for (int t = 0; t < kFrames; ++t) {
                for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = colour(t)[i % 3];
                clip.push_rgb(rgb.data(), kWidth * 3);
            }
            clip.finish();
            EXPECT_EQ(clip.frames(), kFrames);
            EXPECT_THROW(clip.push_rgb(rgb.data(), kWidth * 3), Error);
        }
        const ClipInfo info = stage.probe(path);
        EXPECT_EQ(info.width, kWidth);
        EXPECT_EQ(info.height, kHeight);
        EXPECT_EQ(info.frame_count, kFrames);
        EXPECT_EQ(static_cast<double>(info.source_fps_num) / info.source_fps_den, 16.0);
        const Collected got = decode_all(stage, path, {{0, kFrames}});
        ASSERT_EQ(got.frames.size(), static_cast<size_t>(kFrames));
        for (int t = 0; t < kFrames; ++t) {
            const at::Tensor rgb = got.frames.at({0, t}).to(at::kDouble);
            for (int c = 0; c < 3; ++c) {
                // YUV 4:2:0 and MPEG-4's quantiser: a few levels off at most (measured: 2).
                EXPECT_NEAR(rgb[c].mean().item<double>(), colour(t)[c], 6.0)
                    << "frame " << t << " channel " << c;
            }
        }
    }
    test::expect_error([&] { ClipWriter(dir.file("odd.mp4"), 63, 48, 16); },
                       ErrorCode::kInvalidArgument, "odd.mp4");
    test::expect_error([&] { ClipWriter(dir.file("slow.mp4"), 64, 48, 0); },
                       ErrorCode::kInvalidArgument, "slow.mp4");
    test::expect_error([&] { ClipWriter(dir.file("clip.nope"), 64, 48, 16); }, ErrorCode::kIOError,
                       "clip.nope");
    test::expect_error([&] { ClipWriter(dir.file("missing/dir/clip.mp4"), 64, 48, 16); },
                       ErrorCode::kIOError, "missing/dir/clip.mp4");
}

}  // namespace
}  // namespace sf::stages

#endif  // SANAFLOW_WITH_MEDIA

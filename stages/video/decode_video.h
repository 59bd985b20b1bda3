// decode_video: one clip file -> frames at a target fps, streamed into 4k+1-frame windows.
//
//   probe:  open, pick the video stream, check declared size and limits, read the display
//           rotation and timing -> ClipInfo (display size, rate, duration, frame count at the
//           target fps, bucket); nothing is decoded
//   plan:   plan_frame_windows(frame_count, config.windows) (frame_windows.h)
//   decode: demux + decode one frame at a time; for each output time i / fps take the decoded
//           frame whose presentation time is nearest; colour-convert, scale and center-crop it
//           to the bucket in one swscale pass, rotate for display -> on_frame(window, k, rgb)
//
// Memory does not depend on the clip's length: the stage holds at most two decoded frames (the
// candidate and the next one) and one converted RGB frame, whatever the window or the clip. A bad
// clip throws sf::Reject("<name>: <reason>"); a clip that breaks part-way (truncated, damaged) is
// not rejected: decode() reports the windows completed before the break and why it stopped. The
// stage has no mutable state: probe() and decode() may run on many threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "stages/video/frame_windows.h"

// Only named by reference here, so the header needs no LibTorch (and clip_reader.cpp, which the
// fuzzer builds without it, can include it); a callback that reads the frames includes ATen.
namespace at {
class Tensor;
}  // namespace at

namespace sf::stages {

struct DecodeVideoConfig {
    // Selects the image bucket table: 512, 1024, 2048 or 4096.
    int resolution = 512;
    // Output frame rate; 0 keeps the clip's own (average) rate. Frames are chosen by timestamp,
    // so a variable-rate clip comes out at a constant rate.
    double video_fps = 0;
    FrameWindowConfig windows;
    // Clips whose shorter displayed side is smaller are rejected: upscaling teaches blur.
    int min_side = 64;
    // Declared width x height above this is rejected before decoding (the image stage's limit).
    int64_t max_pixels = 178956970;
    // Files larger than this are rejected unread.
    int64_t max_file_bytes = int64_t{1} << 36;
    // Decoder threads (AVCodecContext::thread_count). 1 by default: prep decodes many clips in
    // parallel nodes, so threads inside one decoder would only compete for the same cores and add
    // frames of latency and memory per decoder; 0 lets libav choose. libav's frame and slice
    // threading produce bit-identical frames (a test pins it), so this is not in the fingerprint.
    int threads = 1;
    // decode() of windows that start late seeks to a keyframe before the first one instead of
    // decoding from the start. The frames are the same either way (a test pins it); off is for
    // files whose seeking is suspect.
    bool seek = true;
};

struct ClipInfo {
    int width = 0;  // as displayed: after the rotation
    int height = 0;
    int coded_width = 0;  // as stored in the stream
    int coded_height = 0;
    int rotation = 0;        // clockwise degrees applied for display: 0, 90, 180 or 270
    int source_fps_num = 0;  // the stream's average frame rate
    int source_fps_den = 1;
    int fps_num = 0;  // the output rate (video_fps, or the source's)
    int fps_den = 1;
    double duration_s = 0;    // of the video stream, from its first frame
    double start_time_s = 0;  // the video stream's first timestamp (subtracted everywhere)
    int64_t frame_count = 0;  // frames at the output rate: i / fps < duration. An estimate
                              // from the container; decode() reports what was reached.
    // Set when the container declares more than the stream holds: a file cut short where the
    // container has no index (Matroska, WebM). The frames that are there are decoded, and
    // decode() reports the clip truncated, with this reason, when it reaches their end.
    std::string ends_early;
    std::string codec;   // the decoder's name, e.g. "h264"
    VideoBucket bucket;  // frames = 0: the spatial bucket only
};

// Called once per (window, frame of that window), in output-frame order; a frame inside two
// overlapping windows is delivered to each, in window order, as the same tensor. `rgb` is uint8
// [3, bucket.height, bucket.width], contiguous, CPU, freshly allocated per source frame: the
// callee may keep it, and must not write to it.
using VideoFrameCallback =
    std::function<void(size_t window_index, int64_t frame_in_window, const at::Tensor& rgb)>;

struct DecodeVideoResult {
    ClipInfo info;
    // One per requested window: every frame was delivered. A window not completed was cut by a
    // break, or lies beyond the frames that the clip really has.
    std::vector<bool> completed;
    // Output frames timed up to where decoding stopped (early, once every window was complete).
    int64_t frames_reached = 0;
    // The stream broke: a read or decode error, or it ended well short of its declared length.
    // Windows completed before the break are still good.
    bool truncated = false;
    std::string truncation_reason;  // "<name>: <reason>" when truncated
    bool seeked = false;  // decoding started from a seek (false also when a seek was undone)
};

class DecodeVideoStage {
public:
    // Throws sf::Error kInvalidArgument naming the bad field or flag.
    explicit DecodeVideoStage(DecodeVideoConfig config);

    // Throws sf::Reject("<path>: <reason>") for an unreadable file, no video stream, no decoder,
    // a size over the limits, a clip too small, or an unknown frame rate.
    ClipInfo probe(const std::string& path) const;
    // The windows of a probed clip (plan_frame_windows with this stage's config).
    std::vector<FrameWindow> plan(const ClipInfo& info) const;
    // Decodes `windows` (any subset of plan()'s, in any order; indices passed to on_frame are
    // positions in this vector) and stops once all are complete. Rejects as probe() does; an
    // exception from on_frame propagates.
    DecodeVideoResult decode(const std::string& path, const std::vector<FrameWindow>& windows,
                             const VideoFrameCallback& on_frame) const;

    const DecodeVideoConfig& config() const { return config_; }
    // Changes whenever the frames for the same clip and window would: bucket table, output fps,
    // window plan, frame choice, scaling and colour conversion. min_side, the limits, threads and
    // seek only decide what is rejected, or how fast, and are left out.
    std::string fingerprint() const;

private:
    DecodeVideoConfig config_;
};

}  // namespace sf::stages

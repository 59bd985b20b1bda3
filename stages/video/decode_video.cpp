#include "stages/video/decode_video.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

#include "core/error.h"
#include "stages/image/aspect_buckets.h"
#include "stages/video/clip_reader.h"

namespace sf::stages {
namespace {

// Timestamps are compared as exact rationals: products of a timestamp, a time base and a frame
// rate can pass 2^63 for long clips with fine time bases.
using Wide = __int128;

// The frame in display orientation: converted in stored orientation, then turned.
at::Tensor to_display_tensor(FrameConverter& converter, const AVFrame* frame, int rotation) {
    at::Tensor stored =
        at::empty({3, converter.stored_height(), converter.stored_width()}, at::kByte);
    converter.convert(frame, stored.data_ptr<uint8_t>());
    switch (rotation) {
        case 90:  // clockwise: display(y, x) = stored(H - 1 - x, y)
            return stored.transpose(1, 2).flip({2}).contiguous();
        case 180:
            return stored.flip({1, 2}).contiguous();
        case 270:  // counterclockwise: display(y, x) = stored(x, W - 1 - y)
            return stored.transpose(1, 2).flip({1}).contiguous();
        default:
            return stored;
    }
}

// Output frame i is at time i / fps; in stream ticks T_i = i * a / b. All comparisons are exact.
class OutputClock {
public:
    OutputClock(const ClipInfo& info, AVRational tb)
        : a_(Wide{info.fps_den} * tb.den), b_(Wide{info.fps_num} * tb.num) {}
    // T_i is at least as near p as q (p < q): ties go to the earlier frame.
    bool nearer_first(int64_t i, int64_t p, int64_t q) const {
        return 2 * i * a_ <= Wide{p + q} * b_;
    }
    bool before(int64_t i, int64_t ticks) const { return i * a_ < ticks * b_; }         // T_i < t
    bool at_or_before(int64_t i, int64_t ticks) const { return i * a_ <= ticks * b_; }  // T_i <= t
    bool after(int64_t ticks, int64_t i) const { return ticks * b_ > i * a_; }          // t > T_i
    int64_t ticks_floor(int64_t i) const { return static_cast<int64_t>(i * a_ / b_); }

private:
    Wide a_;
    Wide b_;
};

struct PassOutcome {
    ClipReader::Status status = ClipReader::Status::kEnd;
    std::string reason;
    int64_t next = 0;  // the first output frame not timed
    bool seeked = false;
    bool retry_from_start = false;
};

// One decoding pass. Frame choice: for output time T_i the decoded frame whose timestamp is
// nearest (the earlier on a tie), not the latest one at or before T_i: containers round
// timestamps to their time base (WebM: 1 ms, so a 24 fps frame sits at 42 ms, after T_1 =
// 41.67 ms), and "latest <= T" would then show frame 0 twice and drop frame 1. Deciding T_i
// needs the frame after the candidate, so at most two decoded frames are held.
PassOutcome decode_pass(const std::string& path, const DecodeVideoConfig& config,
                        const ClipInfo& info, const std::vector<FrameWindow>& windows,
                        int64_t first, int64_t stop, const VideoFrameCallback& on_frame,
                        bool use_seek) {
    PassOutcome out;
    ClipReader reader(path, config, /*open_decoder=*/true);
    const OutputClock clock(info, reader.time_base());
    int64_t origin = reader.origin();
    if (use_seek && first > 0 && origin != AV_NOPTS_VALUE &&
        reader.seek(origin + clock.ticks_floor(first))) {
        out.seeked = true;
        out.next = first;
    }
    FrameConverter converter(info, path);
    AVFramePtr held(av_frame_alloc());
    if (!held) throw Error::OutOfMemory("decode_video: av_frame_alloc");
    bool holding = false;
    int64_t held_pts = 0;  // ticks from the origin
    at::Tensor held_rgb;   // converted once, when first delivered
    bool delivered = false;
    auto deliver = [&](int64_t i) {
        if (i < first) return;  // before every wanted window: never converted
        for (size_t w = 0; w < windows.size(); ++w) {
            if (i < windows[w].start || i >= windows[w].end()) continue;
            if (!held_rgb.defined()) {
                held_rgb = to_display_tensor(converter, held.get(), info.rotation);
            }
            on_frame(w, i - windows[w].start, held_rgb);
            delivered = true;
        }
    };
    bool checking_seek = out.seeked;
    while (out.next < stop) {
        out.status = reader.next();
        if (out.status != ClipReader::Status::kFrame) break;
        AVFrame* frame = reader.frame();
        int64_t ts = frame->best_effort_timestamp;
        if (ts == AV_NOPTS_VALUE) {  // no timestamp at all: one tick after the previous frame
            ts = holding ? origin + held_pts + 1 : (origin == AV_NOPTS_VALUE ? 0 : origin);
        }
        if (origin == AV_NOPTS_VALUE) origin = ts;
        const int64_t pts = ts - origin;
        if (checking_seek) {
            checking_seek = false;
            // The frame nearest T_first is this one or a later one only if this one is not
            // after T_first; otherwise the seek went too far and the frame before is unknown.
            if (clock.after(pts, first)) {
                out.retry_from_start = true;
                return out;
            }
        }
        // A repeated or backward timestamp (broken muxing): the earlier frame keeps its place.
        if (holding && pts <= held_pts) {
            av_frame_unref(frame);
            continue;
        }
        if (holding) {
            while (out.next < stop && clock.nearer_first(out.next, held_pts, pts))
                deliver(out.next++);
        }
        av_frame_unref(held.get());
        av_frame_move_ref(held.get(), frame);
        holding = true;
        held_pts = pts;
        held_rgb = at::Tensor();
    }
    if (out.next < stop && out.status == ClipReader::Status::kBroken && out.seeked && !delivered) {
        out.retry_from_start = true;  // perhaps the seek itself; a pass from the start decides
        return out;
    }
    if (out.next < stop && holding) {
        if (out.status == ClipReader::Status::kEnd) {
            // The last frame lasts its own duration, else one frame at the average rate.
            int64_t duration = frame_duration(held.get());
            if (duration <= 0 && info.source_fps_num > 0) {
                duration =
                    av_rescale_q(1, {info.source_fps_den, info.source_fps_num}, reader.time_base());
            }
            const int64_t end = held_pts + std::max<int64_t>(1, duration);
            while (out.next < stop && clock.before(out.next, end)) deliver(out.next++);
        } else {
            // After a break the next frame is unknown: only times up to the last one are sure.
            while (out.next < stop && clock.at_or_before(out.next, held_pts)) deliver(out.next++);
        }
    }
    out.reason = reader.reason();
    return out;
}

}  // namespace

DecodeVideoStage::DecodeVideoStage(DecodeVideoConfig config) : config_(std::move(config)) {
    if (!is_bucket_resolution(config_.resolution)) {
        throw Error::InvalidArgument("decode_video: resolution " +
                                     std::to_string(config_.resolution) +
                                     " has no bucket table; use 512, 1024, 2048 or 4096");
    }
    if (!std::isfinite(config_.video_fps) || config_.video_fps < 0 || config_.video_fps > 1000) {
        throw Error::InvalidArgument(
            "decode_video: video_fps must be in [0, 1000] (0: the clip's "
            "own rate), got " +
            std::to_string(config_.video_fps));
    }
    validate_frame_window_config(config_.windows);
    if (config_.min_side < 1) {
        throw Error::InvalidArgument("decode_video: min_side must be at least 1, got " +
                                     std::to_string(config_.min_side));
    }
    if (config_.max_pixels < 1) {
        throw Error::InvalidArgument("decode_video: max_pixels must be at least 1, got " +
                                     std::to_string(config_.max_pixels));
    }
    if (config_.max_file_bytes < 1) {
        throw Error::InvalidArgument("decode_video: max_file_bytes must be at least 1, got " +
                                     std::to_string(config_.max_file_bytes));
    }
    if (config_.threads < 0 || config_.threads > 64) {
        throw Error::InvalidArgument(
            "decode_video: threads must be in [0, 64] (0: libav "
            "chooses), got " +
            std::to_string(config_.threads));
    }
}

std::string DecodeVideoStage::fingerprint() const {
    char fps[64];
    if (config_.video_fps > 0) {
        const AVRational q = av_d2q(config_.video_fps, 1000000);
        std::snprintf(fps, sizeof(fps), "fps=%d/%d", q.num, q.den);
    } else {
        std::snprintf(fps, sizeof(fps), "fps=source");
    }
    return "decode_video/v1;" + bucket_table_fingerprint(config_.resolution) + ";" + fps + ";" +
           frame_windows_fingerprint(config_.windows) +
           ";nearest-pts;display-matrix;center-crop;sws-area-down,bicubic-up,accurate-rnd,"
           "full-chroma;bt709>=720p-else-601;rgb-u8";
}

ClipInfo DecodeVideoStage::probe(const std::string& path) const {
    return ClipReader(path, config_, /*open_decoder=*/false).info();
}

std::vector<FrameWindow> DecodeVideoStage::plan(const ClipInfo& info) const {
    return plan_frame_windows(info.frame_count, config_.windows);
}

DecodeVideoResult DecodeVideoStage::decode(const std::string& path,
                                           const std::vector<FrameWindow>& windows,
                                           const VideoFrameCallback& on_frame) const {
    DecodeVideoResult result;
    result.info = probe(path);
    result.completed.assign(windows.size(), false);
    if (windows.empty()) return result;
    int64_t first = std::numeric_limits<int64_t>::max(), stop = 0;
    for (const FrameWindow& w : windows) {
        if (w.start < 0 || w.length < 1) {
            throw Error::InvalidArgument("decode_video: window (start " + std::to_string(w.start) +
                                         ", length " + std::to_string(w.length) + ") is empty");
        }
        first = std::min(first, w.start);
        stop = std::max(stop, w.end());
    }
    PassOutcome pass =
        decode_pass(path, config_, result.info, windows, first, stop, on_frame, config_.seek);
    if (pass.retry_from_start) {
        pass = decode_pass(path, config_, result.info, windows, first, stop, on_frame, false);
    }
    result.frames_reached = pass.next;
    result.seeked = pass.seeked;
    for (size_t w = 0; w < windows.size(); ++w) result.completed[w] = windows[w].end() <= pass.next;
    if (pass.next < stop && pass.status == ClipReader::Status::kBroken) {
        result.truncated = true;
        result.truncation_reason =
            path + ": " + pass.reason + " after " + std::to_string(pass.next) + " frames";
    } else if (pass.next < stop && !result.info.ends_early.empty()) {
        result.truncated = true;
        result.truncation_reason = path + ": " + result.info.ends_early;
    } else if (pass.next < stop && result.info.frame_count - pass.next > 1) {
        // One frame of slack: the container's duration may round its last frame either way.
        result.truncated = true;
        result.truncation_reason = path + ": the stream ended after " + std::to_string(pass.next) +
                                   " of the " + std::to_string(result.info.frame_count) +
                                   " frames its container declares";
    }
    return result;
}

}  // namespace sf::stages

// frame_windows: which runs of frames of a clip become training samples, and their buckets.
//
// A clip, resampled to the target fps, has `frame_count` frames; the planner cuts it into windows
// of 4k+1 frames (the Wan VAE encodes the first frame alone, then 4-frame chunks). The modes and
// their meaning are musubi-tuner's (`frame_extraction` in its dataset config), so a dataset config
// written for it plans the same windows here:
//   head     the first window of each target length;
//   chunk    consecutive, non-overlapping windows of each target length (a partial tail dropped);
//   slide    a window of each target length every `frame_stride` frames;
//   uniform  `frame_sample` windows of each target length, starts spread evenly from the first
//            frame to the last start that fits (numpy.linspace(0, count - length, n) truncated);
//   full     one window from frame 0: the whole clip capped at `max_frames`, cut down to 4k+1.
// A target longer than the clip gives no window. Windows come ordered by target length (ascending),
// then by start. A pure function: no file, no libav, no torch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sf::stages {

enum class FrameExtraction { kHead, kChunk, kSlide, kUniform, kFull };

// "head", "chunk", "slide", "uniform", "full". Throws sf::Error kInvalidArgument naming
// --frame_extraction for any other spelling.
FrameExtraction parse_frame_extraction(const std::string& name);
const char* frame_extraction_name(FrameExtraction mode);

struct FrameWindowConfig {
    FrameExtraction frame_extraction = FrameExtraction::kHead;
    // Window lengths; each must be 4k+1 (1 is a single-frame sample, an image). Duplicates and
    // order do not matter: the planner uses them sorted and once each. Unused by `full`.
    std::vector<int> target_frames = {1};
    int frame_stride = 1;  // slide: frames between the starts of consecutive windows
    int frame_sample = 1;  // uniform: windows per target length (1 gives the same as head)
    int max_frames = 129;  // full: the longest window (musubi-tuner's default); any value >= 1
};

// Throws sf::Error kInvalidArgument naming the flag at fault (--target_frames, --frame_stride,
// --frame_sample, --max_frames).
void validate_frame_window_config(const FrameWindowConfig& config);

// Start and length in frames at the target fps; frame `start` is the window's first.
struct FrameWindow {
    int64_t start = 0;
    int64_t length = 0;
    int64_t end() const { return start + length; }  // one past the last frame
    bool operator==(const FrameWindow& o) const { return start == o.start && length == o.length; }
};

// The windows of a clip of `frame_count` frames. The config must be valid (validate first). The
// same (start, length) is never listed twice: uniform sampling of a short clip can hit one start
// several times, and musubi-tuner writes those to one cache file (its name is start and length).
std::vector<FrameWindow> plan_frame_windows(int64_t frame_count, const FrameWindowConfig& config);

// The part of a stage fingerprint that the windows depend on: the mode and only the parameters
// that mode reads, e.g. "slide:targets=1,25;stride=4".
std::string frame_windows_fingerprint(const FrameWindowConfig& config);

// A video bucket: the image bucket table's spatial bucket for the clip as displayed (after
// rotation) at `resolution`, and the window's length. (width, height, frames), musubi-tuner's
// batch key order.
struct VideoBucket {
    int width = 0;
    int height = 0;
    int frames = 0;
    const char* ratio = "";  // the image table's key, e.g. "0.57"
    bool operator==(const VideoBucket& o) const {
        return width == o.width && height == o.height && frames == o.frames;
    }
};
// Throws sf::Error kInvalidArgument for a resolution without a table (aspect_buckets.h).
VideoBucket video_bucket(int resolution, int display_height, int display_width, int frames);

}  // namespace sf::stages

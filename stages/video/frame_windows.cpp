#include "stages/video/frame_windows.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "stages/image/aspect_buckets.h"

namespace sf::stages {
namespace {

constexpr const char* kModeNames[] = {"head", "chunk", "slide", "uniform", "full"};

std::vector<int> sorted_unique(std::vector<int> values) {
    std::sort(values.begin(), values.end());
    values.erase(std::unique(values.begin(), values.end()), values.end());
    return values;
}

// musubi-tuner's round_down_frame_count for a VAE with temporal stride 4: 1 + 4 * floor((n-1)/4).
int64_t round_down_to_4k_plus_1(int64_t n) { return 1 + (n - 1) / 4 * 4; }

// numpy.linspace(0, stop, num, dtype=int): float64 steps, the last point exactly `stop`, then
// truncated toward zero (all points are >= 0 here, so truncation is floor).
std::vector<int64_t> linspace_int(int64_t stop, int num) {
    std::vector<int64_t> points;
    if (num == 1) return {0};
    const double step = static_cast<double>(stop) / (num - 1);
    for (int i = 0; i < num; ++i) {
        points.push_back(i == num - 1 ? stop : static_cast<int64_t>(std::floor(i * step)));
    }
    return points;
}

}  // namespace

FrameExtraction parse_frame_extraction(const std::string& name) {
    for (int i = 0; i < 5; ++i) {
        if (name == kModeNames[i]) return static_cast<FrameExtraction>(i);
    }
    throw Error::InvalidArgument("--frame_extraction: unknown mode \"" + name +
                                 "\"; use head, chunk, slide, uniform or full");
}

const char* frame_extraction_name(FrameExtraction mode) {
    return kModeNames[static_cast<int>(mode)];
}

void validate_frame_window_config(const FrameWindowConfig& config) {
    const int mode = static_cast<int>(config.frame_extraction);
    if (mode < 0 || mode > 4) {
        throw Error::InvalidArgument("--frame_extraction: unknown mode " + std::to_string(mode));
    }
    if (config.frame_extraction != FrameExtraction::kFull && config.target_frames.empty()) {
        throw Error::InvalidArgument("--target_frames: at least one window length is needed");
    }
    for (int frames : config.target_frames) {
        // The Wan VAE turns T frames into 1 + (T-1)/4 latent frames; any other length would be
        // cut silently by the encoder. musubi-tuner rounds down with a warning; refusing makes
        // the user say what they mean.
        if (frames < 1 || (frames - 1) % 4 != 0) {
            throw Error::InvalidArgument("--target_frames: " + std::to_string(frames) +
                                         " is not 4k+1 (1, 5, 9, ..., 81, ...)");
        }
    }
    if (config.frame_stride < 1) {
        throw Error::InvalidArgument("--frame_stride must be at least 1, got " +
                                     std::to_string(config.frame_stride));
    }
    if (config.frame_sample < 1) {
        throw Error::InvalidArgument("--frame_sample must be at least 1, got " +
                                     std::to_string(config.frame_sample));
    }
    if (config.max_frames < 1) {
        throw Error::InvalidArgument("--max_frames must be at least 1, got " +
                                     std::to_string(config.max_frames));
    }
}

std::vector<FrameWindow> plan_frame_windows(int64_t frame_count, const FrameWindowConfig& config) {
    std::vector<FrameWindow> windows;
    if (frame_count < 1) return windows;
    if (config.frame_extraction == FrameExtraction::kFull) {
        const int64_t length =
            round_down_to_4k_plus_1(std::min<int64_t>(frame_count, config.max_frames));
        windows.push_back({0, length});
        return windows;
    }
    for (const int target : sorted_unique(config.target_frames)) {
        const int64_t length = target;
        if (length > frame_count) continue;
        const int64_t last_start = frame_count - length;
        switch (config.frame_extraction) {
            case FrameExtraction::kHead:
                windows.push_back({0, length});
                break;
            case FrameExtraction::kChunk:
                for (int64_t start = 0; start <= last_start; start += length) {
                    windows.push_back({start, length});
                }
                break;
            case FrameExtraction::kSlide:
                for (int64_t start = 0; start <= last_start; start += config.frame_stride) {
                    windows.push_back({start, length});
                }
                break;
            case FrameExtraction::kUniform: {
                // Points are non-decreasing, so a repeat is always the previous one.
                int64_t previous = -1;
                for (const int64_t start : linspace_int(last_start, config.frame_sample)) {
                    if (start != previous) windows.push_back({start, length});
                    previous = start;
                }
                break;
            }
            case FrameExtraction::kFull:
                break;
        }
    }
    return windows;
}

std::string frame_windows_fingerprint(const FrameWindowConfig& config) {
    std::string out = frame_extraction_name(config.frame_extraction);
    if (config.frame_extraction == FrameExtraction::kFull) {
        return out + ":max_frames=" + std::to_string(config.max_frames);
    }
    out += ":targets=";
    const std::vector<int> targets = sorted_unique(config.target_frames);
    for (size_t i = 0; i < targets.size(); ++i) {
        out += (i ? "," : "") + std::to_string(targets[i]);
    }
    if (config.frame_extraction == FrameExtraction::kSlide) {
        out += ";stride=" + std::to_string(config.frame_stride);
    } else if (config.frame_extraction == FrameExtraction::kUniform) {
        out += ";sample=" + std::to_string(config.frame_sample);
    }
    return out;
}

VideoBucket video_bucket(int resolution, int display_height, int display_width, int frames) {
    const AspectBucket& spatial = closest_aspect_bucket(resolution, display_height, display_width);
    VideoBucket bucket;
    bucket.width = spatial.width;
    bucket.height = spatial.height;
    bucket.frames = frames;
    bucket.ratio = spatial.ratio;
    return bucket;
}

}  // namespace sf::stages

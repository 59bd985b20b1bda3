// Writing clips with libav: MPEG-4 Part 2 (FFmpeg's own encoder, in every build) in the container
// that the path's extension names (.mp4, .avi, .mkv), one frame at a time. Validation writes its
// sampled videos with it and the demo its generated clips. Include-free of libav.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace sf::stages {

class ClipWriter {
public:
    // Opens `path` for frames of width x height pixels (even, positive) at `fps` frames a second.
    // kInvalidArgument for a bad size or rate; kIOError naming the path when the container, the
    // encoder or the file cannot be opened.
    ClipWriter(const std::string& path, int width, int height, int fps);
    // A clip not finished is closed as far as it got (its file may lack the trailer).
    ~ClipWriter();
    ClipWriter(const ClipWriter&) = delete;
    ClipWriter& operator=(const ClipWriter&) = delete;

    // One frame of packed RGB24 rows, `stride` bytes apart, converted to YUV 4:2:0.
    void push_rgb(const uint8_t* rgb, int stride);
    // One frame drawn straight into the encoder's YUV 4:2:0 planes: `fill(planes, linesizes)`
    // writes Y (width x height), then U and V (half each way).
    using YuvFill = std::function<void(uint8_t* const* planes, const int* linesizes)>;
    void push_yuv(const YuvFill& fill);
    // Flushes the encoder and writes the trailer; the clip is complete after it. kIOError naming
    // the path on a failed write.
    void finish();

    int frames() const;

private:
    struct State;
    std::unique_ptr<State> s_;
};

}  // namespace sf::stages

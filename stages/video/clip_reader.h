// The libav side of decode_video, kept free of LibTorch so that the clip fuzzer
// (tools/fuzz/fuzz_clip.cpp) runs it as it is: ClipReader opens a clip (a file or bytes in
// memory), probes it and decodes one frame at a time; FrameConverter turns a decoded frame into
// planar RGB at the bucket size. For use inside stages/video/ (and the fuzzer) only: the stage's
// interface is decode_video.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "stages/video/av_ptr.h"
#include "stages/video/decode_video.h"

namespace sf::stages {

// A frame's duration in its stream's time base (0 when unknown), across libavutil versions.
inline int64_t frame_duration(const AVFrame* frame) {
#if LIBAVUTIL_VERSION_INT >= AV_VERSION_INT(57, 30, 100)
    return frame->duration;
#else
    return frame->pkt_duration;
#endif
}

// One opened clip: the container, its video stream and (for decoding) the decoder. The
// constructor does every check of DecodeVideoStage::probe and throws its sf::Reject.
class ClipReader {
public:
    enum class Status { kFrame, kEnd, kBroken };

    // `open_decoder` false: probe only (reads the real end of the stream when only the container
    // declares a duration); true: ready to decode from the start.
    ClipReader(const std::string& path, const DecodeVideoConfig& config, bool open_decoder);
    // The same over `size` bytes in memory, which must outlive the reader; `name` prefixes every
    // reject reason.
    ClipReader(const uint8_t* data, size_t size, const std::string& name,
               const DecodeVideoConfig& config, bool open_decoder);

    const ClipInfo& info() const { return info_; }
    AVRational time_base() const { return stream_->time_base; }
    // The stream's first timestamp, or AV_NOPTS_VALUE when the container does not say.
    int64_t origin() const { return stream_->start_time; }

    // The next decoded frame (in frame()), the end of the stream, or a break (reason()).
    Status next();
    AVFrame* frame() { return frame_.get(); }
    const std::string& reason() const { return reason_; }
    // Seeks to the keyframe at or before `timestamp` (stream time base). False: not done.
    bool seek(int64_t timestamp);

    struct MemoryInput {
        const uint8_t* data = nullptr;
        size_t size = 0;
        size_t position = 0;
    };

private:
    void open(const std::string* path, const DecodeVideoConfig& config, bool open_decoder);
    void open_container(const std::string* path, const DecodeVideoConfig& config);
    void choose_stream();
    void read_geometry_and_timing(const DecodeVideoConfig& config);
    int64_t scan_end_ticks();
    void note_early_end();
    void open_codec(const DecodeVideoConfig& config);

    std::string name_;
    // Declared before format_, which reads through them: destroyed after it.
    std::unique_ptr<MemoryInput> memory_;
    AVIOContextPtr io_;
    AVFormatContextPtr format_;
    AVStream* stream_ = nullptr;
    const AVCodec* decoder_ = nullptr;
    AVCodecContextPtr codec_;
    AVPacketPtr packet_;
    AVFramePtr frame_;
    bool draining_ = false;
    std::string read_error_;
    std::string reason_;
    int64_t duration_ticks_ = 0;
    bool stream_declares_duration_ = false;
    int64_t max_pixels_ = 0;
    ClipInfo info_;
};

// Colour conversion, scale and center-crop of decoded frames to the bucket, in the stored
// orientation (the bucket turned back for a 90 or 270 degree clip; the caller turns the result).
// Holds its swscale contexts and scratch frames between frames.
class FrameConverter {
public:
    FrameConverter(const ClipInfo& info, const std::string& name) : info_(info), name_(name) {}
    int stored_height() const { return transposed() ? info_.bucket.width : info_.bucket.height; }
    int stored_width() const { return transposed() ? info_.bucket.height : info_.bucket.width; }
    // Writes planar RGB [3, stored_height(), stored_width()] to `rgb`.
    void convert(const AVFrame* frame, uint8_t* rgb);

private:
    bool transposed() const { return info_.rotation == 90 || info_.rotation == 270; }
    const AVFrame* to_croppable(const AVFrame* frame);
    void scale_into_scratch(const AVFrame* frame, int target_h, int target_w);

    const ClipInfo& info_;
    const std::string& name_;
    SwsContextPtr scale_;
    SwsContextPtr unpack_;
    AVFramePtr scratch_;  // GBRP at the (stored-orientation) bucket size
    AVFramePtr planar_;   // GBRP at the source size, for formats that cannot be cropped in place
    const SwsContext* detailed_ = nullptr;  // the context whose colour details were last set
    int detailed_space_ = -1;
    int detailed_range_ = -1;
};

}  // namespace sf::stages

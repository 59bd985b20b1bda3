#include "stages/video/clip_writer.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "stages/video/av_ptr.h"

namespace sf::stages {
namespace {

[[noreturn]] void fail(const std::string& path, const char* what, int code) {
    char text[AV_ERROR_MAX_STRING_SIZE] = {};
    av_strerror(code, text, sizeof(text));
    throw Error::IOError(fmt::format("{}: {}: {}", path, what, text));
}

// An output container whose file is closed and context freed on every path.
struct Output {
    AVFormatContext* context = nullptr;
    ~Output() {
        if (context != nullptr && context->pb != nullptr) avio_closep(&context->pb);
        avformat_free_context(context);
    }
};

}  // namespace

struct ClipWriter::State {
    std::string path;
    Output out;
    AVCodecContextPtr codec;
    AVStream* stream = nullptr;
    AVFramePtr frame;
    SwsContextPtr rgb_to_yuv;
    int frames = 0;
    bool finished = false;

    // Sends `f` (null: flush) and writes every packet the encoder has ready.
    void encode(const AVFrame* f) {
        int rc = avcodec_send_frame(codec.get(), f);
        if (rc < 0) fail(path, "encoding", rc);
        AVPacketPtr packet(av_packet_alloc());
        while ((rc = avcodec_receive_packet(codec.get(), packet.get())) >= 0) {
            // Every frame lasts one tick of 1 / fps. The encoder leaves it 0, and an MP4 then
            // ends at the last frame's start: its rate reads high (9 frames at 16 fps as 18).
            if (packet->duration == 0) packet->duration = 1;
            av_packet_rescale_ts(packet.get(), codec->time_base, stream->time_base);
            packet->stream_index = stream->index;
            rc = av_interleaved_write_frame(out.context, packet.get());
            if (rc < 0) fail(path, "writing a packet", rc);
        }
        if (rc != AVERROR(EAGAIN) && rc != AVERROR_EOF) fail(path, "encoding", rc);
    }
};

ClipWriter::ClipWriter(const std::string& path, int width, int height, int fps)
    : s_(std::make_unique<State>()) {
    if (width < 2 || height < 2 || width % 2 != 0 || height % 2 != 0 || fps < 1) {
        throw Error::InvalidArgument(fmt::format(
            "{}: a clip needs an even width and height and a positive rate, got {}x{} at {} fps",
            path, width, height, fps));
    }
    State& s = *s_;
    s.path = path;
    int rc = avformat_alloc_output_context2(&s.out.context, nullptr, nullptr, path.c_str());
    if (rc < 0) fail(path, "choosing a container by the extension", rc);
    const AVCodec* mpeg4 = avcodec_find_encoder(AV_CODEC_ID_MPEG4);
    if (mpeg4 == nullptr) throw Error::IOError(path + ": this FFmpeg has no MPEG-4 encoder");
    s.codec.reset(avcodec_alloc_context3(mpeg4));
    s.codec->width = width;
    s.codec->height = height;
    s.codec->pix_fmt = AV_PIX_FMT_YUV420P;
    s.codec->time_base = {1, fps};
    s.codec->framerate = {fps, 1};
    // Near-lossless for the small frames of a validation clip or the demo's.
    s.codec->bit_rate = std::max<int64_t>(400000, int64_t{width} * height * fps * 2);
    if (s.out.context->oformat->flags & AVFMT_GLOBALHEADER)
        s.codec->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    if ((rc = avcodec_open2(s.codec.get(), mpeg4, nullptr)) < 0)
        fail(path, "opening the encoder", rc);
    s.stream = avformat_new_stream(s.out.context, nullptr);
    if (s.stream == nullptr) throw Error::IOError(path + ": no stream");
    avcodec_parameters_from_context(s.stream->codecpar, s.codec.get());
    s.stream->time_base = s.codec->time_base;
    if ((rc = avio_open(&s.out.context->pb, path.c_str(), AVIO_FLAG_WRITE)) < 0)
        fail(path, "opening", rc);
    if ((rc = avformat_write_header(s.out.context, nullptr)) < 0)
        fail(path, "writing the header", rc);
    s.frame.reset(av_frame_alloc());
    s.frame->format = AV_PIX_FMT_YUV420P;
    s.frame->width = width;
    s.frame->height = height;
    if ((rc = av_frame_get_buffer(s.frame.get(), 0)) < 0) fail(path, "allocating a frame", rc);
}

ClipWriter::~ClipWriter() = default;

void ClipWriter::push_yuv(const YuvFill& fill) {
    State& s = *s_;
    if (s.finished) throw Error::InvalidArgument(s.path + ": a frame after finish()");
    const int rc = av_frame_make_writable(s.frame.get());
    if (rc < 0) fail(s.path, "a frame", rc);
    fill(s.frame->data, s.frame->linesize);
    s.frame->pts = s.frames++;
    s.encode(s.frame.get());
}

void ClipWriter::push_rgb(const uint8_t* rgb, int stride) {
    State& s = *s_;
    const int width = s.codec->width, height = s.codec->height;
    if (!s.rgb_to_yuv) {
        s.rgb_to_yuv.reset(sws_getContext(width, height, AV_PIX_FMT_RGB24, width, height,
                                          AV_PIX_FMT_YUV420P, SWS_BICUBIC, nullptr, nullptr,
                                          nullptr));
        if (!s.rgb_to_yuv) throw Error::IOError(s.path + ": no RGB to YUV conversion");
    }
    push_yuv([&](uint8_t* const* planes, const int* linesizes) {
        const uint8_t* const source[1] = {rgb};
        const int source_stride[1] = {stride};
        sws_scale(s.rgb_to_yuv.get(), source, source_stride, 0, height, planes, linesizes);
    });
}

void ClipWriter::finish() {
    State& s = *s_;
    if (s.finished) return;
    s.encode(nullptr);
    const int rc = av_write_trailer(s.out.context);
    if (rc < 0) fail(s.path, "writing the trailer", rc);
    s.finished = true;
}

int ClipWriter::frames() const { return s_->frames; }

}  // namespace sf::stages

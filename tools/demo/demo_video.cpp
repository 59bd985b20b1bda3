#include "tools/demo/demo_video.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "stages/video/av_ptr.h"

namespace sf::tools {
namespace {

using stages::AVCodecContextPtr;
using stages::AVFramePtr;
using stages::AVPacketPtr;

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

// Sends `frame` (null: flush) and writes every packet the encoder has ready.
void encode(AVCodecContext* codec, AVFormatContext* out, AVStream* stream, const AVFrame* frame,
            const std::string& path) {
    int rc = avcodec_send_frame(codec, frame);
    if (rc < 0) fail(path, "encoding", rc);
    AVPacketPtr packet(av_packet_alloc());
    while ((rc = avcodec_receive_packet(codec, packet.get())) >= 0) {
        av_packet_rescale_ts(packet.get(), codec->time_base, stream->time_base);
        packet->stream_index = stream->index;
        rc = av_interleaved_write_frame(out, packet.get());
        if (rc < 0) fail(path, "writing a packet", rc);
    }
    if (rc != AVERROR(EAGAIN) && rc != AVERROR_EOF) fail(path, "encoding", rc);
}

void write_clip(const std::string& path, int frames, unsigned seed) {
    constexpr int kWidth = 64, kHeight = 48, kFps = 8;
    Output out;
    int rc = avformat_alloc_output_context2(&out.context, nullptr, "avi", path.c_str());
    if (rc < 0) fail(path, "creating the container", rc);
    const AVCodec* mpeg4 = avcodec_find_encoder(AV_CODEC_ID_MPEG4);
    if (mpeg4 == nullptr) throw Error::IOError(path + ": this FFmpeg has no MPEG-4 encoder");
    AVCodecContextPtr codec(avcodec_alloc_context3(mpeg4));
    codec->width = kWidth;
    codec->height = kHeight;
    codec->pix_fmt = AV_PIX_FMT_YUV420P;
    codec->time_base = {1, kFps};
    codec->framerate = {kFps, 1};
    codec->bit_rate = 400000;
    if (out.context->oformat->flags & AVFMT_GLOBALHEADER)
        codec->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    if ((rc = avcodec_open2(codec.get(), mpeg4, nullptr)) < 0)
        fail(path, "opening the encoder", rc);
    AVStream* stream = avformat_new_stream(out.context, nullptr);
    if (stream == nullptr) throw Error::IOError(path + ": no stream");
    avcodec_parameters_from_context(stream->codecpar, codec.get());
    stream->time_base = codec->time_base;
    if ((rc = avio_open(&out.context->pb, path.c_str(), AVIO_FLAG_WRITE)) < 0)
        fail(path, "opening", rc);
    if ((rc = avformat_write_header(out.context, nullptr)) < 0)
        fail(path, "writing the header", rc);

    AVFramePtr frame(av_frame_alloc());
    frame->format = AV_PIX_FMT_YUV420P;
    frame->width = kWidth;
    frame->height = kHeight;
    if ((rc = av_frame_get_buffer(frame.get(), 0)) < 0) fail(path, "allocating a frame", rc);
    for (int i = 0; i < frames; ++i) {
        if ((rc = av_frame_make_writable(frame.get())) < 0) fail(path, "a frame", rc);
        // A diagonal gradient sliding by 3 pixels a frame, tinted per clip.
        for (int y = 0; y < kHeight; ++y) {
            for (int x = 0; x < kWidth; ++x) {
                frame->data[0][y * frame->linesize[0] + x] =
                    static_cast<uint8_t>((x + y + 3 * i + seed * 37) % 220 + 16);
            }
        }
        for (int y = 0; y < kHeight / 2; ++y) {
            for (int x = 0; x < kWidth / 2; ++x) {
                frame->data[1][y * frame->linesize[1] + x] =
                    static_cast<uint8_t>(64 + seed * 29 % 128);
                frame->data[2][y * frame->linesize[2] + x] =
                    static_cast<uint8_t>(192 - 2 * i % 128);
            }
        }
        frame->pts = i;
        encode(codec.get(), out.context, stream, frame.get(), path);
    }
    encode(codec.get(), out.context, stream, nullptr, path);
    if ((rc = av_write_trailer(out.context)) < 0) fail(path, "writing the trailer", rc);
}

}  // namespace

void write_demo_clips(const std::string& dir, int count, int frames, unsigned seed) {
    std::filesystem::create_directories(dir);
    for (int i = 0; i < count; ++i) {
        const std::string stem = fmt::format("{}/clip_{}", dir, i);
        write_clip(stem + ".avi", frames, seed + static_cast<unsigned>(i));
        std::ofstream(stem + ".txt") << "a sliding gradient, clip number " << i << "\n";
    }
}

}  // namespace sf::tools

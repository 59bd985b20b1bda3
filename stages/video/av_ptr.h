// Owned libav handles: one unique_ptr type per handle, each with the libav call that frees it
// (ggml-cpp.h's pattern), so no error path can leak a context or a frame. Include only from .cpp
// files: the libav headers stay out of the stage headers.
#pragma once

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavformat/avio.h>
#include <libavutil/frame.h>
#include <libavutil/mem.h>
#include <libswscale/swscale.h>
}

#include <memory>

namespace sf::stages {

struct AVFormatContextDeleter {
    // For a context opened with avformat_open_input; a custom AVIOContext (AVFMT_FLAG_CUSTOM_IO)
    // is not freed here and must outlive this one.
    void operator()(AVFormatContext* context) const { avformat_close_input(&context); }
};
struct AVCodecContextDeleter {
    void operator()(AVCodecContext* context) const { avcodec_free_context(&context); }
};
struct AVFrameDeleter {
    void operator()(AVFrame* frame) const { av_frame_free(&frame); }
};
struct AVPacketDeleter {
    void operator()(AVPacket* packet) const { av_packet_free(&packet); }
};
struct SwsContextDeleter {
    void operator()(SwsContext* context) const { sws_freeContext(context); }
};
struct AVIOContextDeleter {
    // The buffer handed to avio_alloc_context may have been replaced by libav: free the current.
    void operator()(AVIOContext* context) const {
        if (context != nullptr) av_freep(&context->buffer);
        avio_context_free(&context);
    }
};

using AVFormatContextPtr = std::unique_ptr<AVFormatContext, AVFormatContextDeleter>;
using AVCodecContextPtr = std::unique_ptr<AVCodecContext, AVCodecContextDeleter>;
using AVFramePtr = std::unique_ptr<AVFrame, AVFrameDeleter>;
using AVPacketPtr = std::unique_ptr<AVPacket, AVPacketDeleter>;
using SwsContextPtr = std::unique_ptr<SwsContext, SwsContextDeleter>;
using AVIOContextPtr = std::unique_ptr<AVIOContext, AVIOContextDeleter>;

}  // namespace sf::stages

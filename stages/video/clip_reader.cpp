#include "stages/video/clip_reader.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <system_error>
#include <utility>

extern "C" {
#include <libavutil/display.h>
#include <libavutil/pixdesc.h>
}

#include "core/error.h"
#include "stages/image/aspect_buckets.h"

namespace sf::stages {
namespace {

// Timestamps are compared as exact rationals: products of a timestamp, a time base and a frame
// rate can pass 2^63 for long clips with fine time bases.
using Wide = __int128;

// Demuxers for self-contained media files. Left to itself libavformat would also accept
// playlists (HLS, concat, ...) that open further files or URLs named inside the "clip".
constexpr const char* kFormatWhitelist =
    "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm,avi,flv,mpegts,mpeg,mpegvideo,asf,ogg,gif,h264,hevc,"
    "m4v,ivf,nut,mxf,yuv4mpegpipe,dv,rawvideo";

[[noreturn]] void reject(const std::string& name, const std::string& reason) {
    throw Reject(name + ": " + reason);
}

std::string av_error_text(int code) {
    char text[AV_ERROR_MAX_STRING_SIZE] = {};
    av_strerror(code, text, sizeof(text));
    return text;
}

std::string seconds_text(double seconds) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.3f s", seconds);
    return text;
}

const int32_t* display_matrix(const AVStream* stream) {
#if LIBAVCODEC_VERSION_INT >= AV_VERSION_INT(60, 31, 102)
    const AVPacketSideData* side =
        av_packet_side_data_get(stream->codecpar->coded_side_data,
                                stream->codecpar->nb_coded_side_data, AV_PKT_DATA_DISPLAYMATRIX);
    if (side == nullptr || side->size < 9 * sizeof(int32_t)) return nullptr;
    return reinterpret_cast<const int32_t*>(side->data);
#else
    size_t size = 0;
    const uint8_t* data = av_stream_get_side_data(stream, AV_PKT_DATA_DISPLAYMATRIX, &size);
    if (data == nullptr || size < 9 * sizeof(int32_t)) return nullptr;
    return reinterpret_cast<const int32_t*>(data);
#endif
}

// Clockwise degrees to turn the stored picture for display, as the ffmpeg program's own
// autorotation computes them (fftools get_rotation): av_display_rotation_get() is the
// counterclockwise angle of the matrix. Mirrored matrices are shown unmirrored, as FFmpeg 5.1
// does. Other angles than multiples of 90 are refused rather than shown crooked.
int display_rotation(const AVStream* stream, const std::string& name) {
    const int32_t* matrix = display_matrix(stream);
    if (matrix == nullptr) return 0;
    const double counterclockwise = av_display_rotation_get(matrix);
    if (std::isnan(counterclockwise)) return 0;
    double clockwise = -std::round(counterclockwise);
    clockwise -= 360 * std::floor(clockwise / 360 + 0.9 / 360);
    const long degrees = std::lround(clockwise);
    if (degrees % 90 != 0) {
        reject(name, "unsupported display rotation of " + std::to_string(degrees) + " degrees");
    }
    return static_cast<int>(degrees % 360);
}

// The size of a regular file; rejects what cannot be read.
int64_t file_size(const std::string& path, const std::string& name) {
    struct stat file_info {};
    if (::stat(path.c_str(), &file_info) != 0) {
        reject(name, "cannot read file (" +
                         std::error_code(errno, std::generic_category()).message() + ")");
    }
    if (!S_ISREG(file_info.st_mode)) reject(name, "cannot read file (not a regular file)");
    return file_info.st_size;
}

// AVIOContext callbacks over ClipReader::MemoryInput.
int read_memory(void* opaque, uint8_t* buffer, int capacity) {
    auto* in = static_cast<ClipReader::MemoryInput*>(opaque);
    const size_t left = in->size - in->position;
    if (left == 0) return AVERROR_EOF;
    const size_t n = std::min(left, static_cast<size_t>(capacity));
    std::memcpy(buffer, in->data + in->position, n);
    in->position += n;
    return static_cast<int>(n);
}

int64_t seek_memory(void* opaque, int64_t offset, int whence) {
    auto* in = static_cast<ClipReader::MemoryInput*>(opaque);
    if (whence & AVSEEK_SIZE) return static_cast<int64_t>(in->size);
    whence &= ~AVSEEK_FORCE;
    const int64_t base = whence == SEEK_CUR   ? static_cast<int64_t>(in->position)
                         : whence == SEEK_END ? static_cast<int64_t>(in->size)
                                              : 0;
    if (offset < -base || offset > static_cast<int64_t>(in->size) - base) return AVERROR(EINVAL);
    in->position = static_cast<size_t>(base + offset);
    return base + offset;
}

bool valid_rate(AVRational rate) { return rate.num > 0 && rate.den > 0; }

// The format with the same memory layout and its range: the deprecated yuvj* formats are
// full-range yuv*, which swscale wants said through its colour details instead.
std::pair<AVPixelFormat, bool> unjpeg(AVPixelFormat format) {
    switch (format) {
        case AV_PIX_FMT_YUVJ420P:
            return {AV_PIX_FMT_YUV420P, true};
        case AV_PIX_FMT_YUVJ422P:
            return {AV_PIX_FMT_YUV422P, true};
        case AV_PIX_FMT_YUVJ444P:
            return {AV_PIX_FMT_YUV444P, true};
        case AV_PIX_FMT_YUVJ440P:
            return {AV_PIX_FMT_YUV440P, true};
        case AV_PIX_FMT_YUVJ411P:
            return {AV_PIX_FMT_YUV411P, true};
        default:
            return {format, false};
    }
}

}  // namespace

ClipReader::ClipReader(const std::string& path, const DecodeVideoConfig& config, bool open_decoder)
    : name_(path), max_pixels_(config.max_pixels) {
    open(&path, config, open_decoder);
}

ClipReader::ClipReader(const uint8_t* data, size_t size, const std::string& name,
                       const DecodeVideoConfig& config, bool open_decoder)
    : name_(name), memory_(new MemoryInput{data, size, 0}), max_pixels_(config.max_pixels) {
    open(nullptr, config, open_decoder);
}

void ClipReader::open(const std::string* path, const DecodeVideoConfig& config, bool open_decoder) {
    open_container(path, config);
    choose_stream();
    read_geometry_and_timing(config);
    // Only the container's duration is known (Matroska, WebM): it may include other streams or
    // count from time zero rather than from the first frame, so the probe reads the real end.
    // The decoding reader skips this: it takes the ClipInfo of a probe.
    if (!open_decoder && !stream_declares_duration_) {
        const int64_t end = scan_end_ticks();
        if (end > 0) {
            duration_ticks_ = end;
            note_early_end();
        }
    }
    const AVRational tb = stream_->time_base;
    info_.duration_s = duration_ticks_ * av_q2d(tb);
    // Output frame i exists when i / fps < duration: ceil(duration * fps), exactly.
    const Wide numerator = Wide{duration_ticks_} * tb.num * info_.fps_num;
    const Wide denominator = Wide{tb.den} * info_.fps_den;
    info_.frame_count = static_cast<int64_t>((numerator + denominator - 1) / denominator);
    if (open_decoder) open_codec(config);
}

void ClipReader::open_container(const std::string* path, const DecodeVideoConfig& config) {
    const int64_t size =
        path != nullptr ? file_size(*path, name_) : static_cast<int64_t>(memory_->size);
    if (size == 0) reject(name_, "not a video file (empty file)");
    if (size > config.max_file_bytes) {
        reject(name_, "file is " + std::to_string(size) + " bytes, over the limit of " +
                          std::to_string(config.max_file_bytes) + " (max_file_bytes)");
    }
    AVFormatContext* raw = avformat_alloc_context();
    if (raw == nullptr) throw Error::OutOfMemory("decode_video: avformat_alloc_context");
    raw->format_whitelist = av_strdup(kFormatWhitelist);
    if (memory_) {
        constexpr int kBufferBytes = 1 << 16;
        auto* buffer = static_cast<uint8_t*>(av_malloc(kBufferBytes));
        io_.reset(avio_alloc_context(buffer, kBufferBytes, 0, memory_.get(), &read_memory, nullptr,
                                     &seek_memory));
        if (!io_) {
            av_free(buffer);
            avformat_free_context(raw);
            throw Error::OutOfMemory("decode_video: avio_alloc_context");
        }
        raw->pb = io_.get();
        raw->flags |= AVFMT_FLAG_CUSTOM_IO;
    }
    AVDictionary* options = nullptr;
    av_dict_set(&options, "protocol_whitelist", "file", 0);
    // On failure avformat_open_input frees the context itself.
    const int opened =
        avformat_open_input(&raw, path != nullptr ? path->c_str() : "", nullptr, &options);
    av_dict_free(&options);
    if (opened < 0) {
        reject(name_, "not a video file or unsupported container (" + av_error_text(opened) + ")");
    }
    format_.reset(raw);
    const int found = avformat_find_stream_info(format_.get(), nullptr);
    if (found < 0) {
        reject(name_,
               "truncated or corrupt video (no stream information: " + av_error_text(found) + ")");
    }
}

void ClipReader::choose_stream() {
    const AVCodec* best_decoder = nullptr;
    const int best =
        av_find_best_stream(format_.get(), AVMEDIA_TYPE_VIDEO, -1, -1, &best_decoder, 0);
    // A cover picture (an MP3's or M4A's artwork) is a one-frame "video" stream: not a clip.
    auto usable = [this](unsigned i) {
        const AVStream* s = format_->streams[i];
        return s->codecpar->codec_type == AVMEDIA_TYPE_VIDEO &&
               (s->disposition & AV_DISPOSITION_ATTACHED_PIC) == 0;
    };
    int chosen = -1;
    if (best >= 0 && usable(static_cast<unsigned>(best))) {
        chosen = best;
    } else {
        for (unsigned i = 0; i < format_->nb_streams && chosen < 0; ++i) {
            if (usable(i)) chosen = static_cast<int>(i);
        }
    }
    if (chosen < 0) {
        bool cover = false;
        for (unsigned i = 0; i < format_->nb_streams; ++i) {
            cover |= format_->streams[i]->codecpar->codec_type == AVMEDIA_TYPE_VIDEO;
        }
        reject(name_, cover ? "no video stream (only a cover picture)" : "no video stream");
    }
    stream_ = format_->streams[chosen];
    decoder_ = avcodec_find_decoder(stream_->codecpar->codec_id);
    if (decoder_ == nullptr) {
        reject(name_, std::string("no decoder for the video codec ") +
                          avcodec_get_name(stream_->codecpar->codec_id));
    }
    // Packets of the other streams are still demuxed but dropped unread.
    for (unsigned i = 0; i < format_->nb_streams; ++i) {
        if (static_cast<int>(i) != chosen) format_->streams[i]->discard = AVDISCARD_ALL;
    }
}

void ClipReader::read_geometry_and_timing(const DecodeVideoConfig& config) {
    const AVCodecParameters* par = stream_->codecpar;
    const int64_t width = par->width, height = par->height;
    auto size_text = [](int64_t w, int64_t h) {
        return std::to_string(w) + "x" + std::to_string(h);
    };
    if (width <= 0 || height <= 0) {
        reject(name_,
               "truncated or corrupt video (the stream declares " + size_text(width, height) + ")");
    }
    if (width > config.max_pixels / height) {
        reject(name_, "declared dimensions " + size_text(width, height) + " exceed the limit of " +
                          std::to_string(config.max_pixels) + " pixels (decompression bomb?)");
    }
    info_.coded_width = static_cast<int>(width);
    info_.coded_height = static_cast<int>(height);
    info_.rotation = display_rotation(stream_, name_);
    const bool transposed = info_.rotation == 90 || info_.rotation == 270;
    info_.width = transposed ? info_.coded_height : info_.coded_width;
    info_.height = transposed ? info_.coded_width : info_.coded_height;
    if (std::min(info_.width, info_.height) < config.min_side) {
        reject(name_, "video too small: " + size_text(info_.width, info_.height) +
                          ", minimum side is " + std::to_string(config.min_side));
    }
    info_.codec = decoder_->name;
    info_.bucket = video_bucket(config.resolution, info_.height, info_.width, 0);

    // The average rate, not r_frame_rate: for a variable-rate clip the latter is the finest
    // rate that represents all timestamps, often far above any real frame rate.
    AVRational source = stream_->avg_frame_rate;
    if (!valid_rate(source)) source = stream_->r_frame_rate;
    if (!valid_rate(source) && config.video_fps <= 0) reject(name_, "unknown frame rate");
    if (valid_rate(source)) {
        info_.source_fps_num = source.num;
        info_.source_fps_den = source.den;
    }
    const AVRational out = config.video_fps > 0 ? av_d2q(config.video_fps, 1000000) : source;
    info_.fps_num = out.num;
    info_.fps_den = out.den;

    const AVRational tb = stream_->time_base;
    info_.start_time_s =
        stream_->start_time == AV_NOPTS_VALUE ? 0 : stream_->start_time * av_q2d(tb);
    stream_declares_duration_ = stream_->duration != AV_NOPTS_VALUE && stream_->duration > 0;
    if (stream_declares_duration_) {
        duration_ticks_ = stream_->duration;
    } else if (format_->duration != AV_NOPTS_VALUE && format_->duration > 0) {
        // INT64_MIN where the ticks do not fit in int64 (a crafted time base): then unknown.
        duration_ticks_ = std::max<int64_t>(0, av_rescale_q(format_->duration, AV_TIME_BASE_Q, tb));
    }
}

// Writers differ on whether a Matroska duration counts from zero or from the first timestamp,
// and other streams (audio) may run a little longer: the stream ends early only when its end is
// before the declared duration even counted from zero, by more than half a second and two frames.
void ClipReader::note_early_end() {
    if (format_->duration == AV_NOPTS_VALUE || format_->duration <= 0) return;
    const double declared = format_->duration / static_cast<double>(AV_TIME_BASE);
    const double end = info_.start_time_s + duration_ticks_ * av_q2d(stream_->time_base);
    const double frame = info_.source_fps_num > 0
                             ? info_.source_fps_den / static_cast<double>(info_.source_fps_num)
                             : 0;
    if (end + std::max(0.5, 2 * frame) < declared) {
        info_.ends_early = "the stream ends at " + seconds_text(end) + ", its container declares " +
                           seconds_text(declared);
    }
}

// The end of the video stream, read from its last packets: for containers that only declare a
// duration for the whole file. 0 when seeking there fails. Leaves the demuxer at the end.
int64_t ClipReader::scan_end_ticks() {
    const AVRational tb = stream_->time_base;
    const int64_t origin = stream_->start_time == AV_NOPTS_VALUE ? 0 : stream_->start_time;
    constexpr Wide kMax = std::numeric_limits<int64_t>::max();
    // Back from the declared end by a few seconds: seeking lands on a keyframe before that. Wide:
    // a crafted start time and duration reach the ends of int64 (found by tools/fuzz).
    const Wide target = Wide{origin} + duration_ticks_ - av_rescale_q(5, {1, 1}, tb);
    if (av_seek_frame(format_.get(), stream_->index,
                      static_cast<int64_t>(std::clamp<Wide>(target, origin, kMax)),
                      AVSEEK_FLAG_BACKWARD) < 0) {
        return 0;
    }
    AVPacketPtr packet(av_packet_alloc());
    if (!packet) throw Error::OutOfMemory("decode_video: av_packet_alloc");
    Wide end = 0;
    // Bounded: a demuxer that could not really seek would otherwise read the whole file here.
    for (int read = 0; read < 20000 && av_read_frame(format_.get(), packet.get()) >= 0; ++read) {
        if (packet->stream_index == stream_->index) {
            const int64_t ts = packet->pts != AV_NOPTS_VALUE ? packet->pts : packet->dts;
            if (ts != AV_NOPTS_VALUE)
                end = std::max(end, Wide{ts} + std::max<int64_t>(0, packet->duration));
        }
        av_packet_unref(packet.get());
    }
    return end > origin ? static_cast<int64_t>(std::min(end - origin, kMax)) : 0;
}

void ClipReader::open_codec(const DecodeVideoConfig& config) {
    codec_.reset(avcodec_alloc_context3(decoder_));
    packet_.reset(av_packet_alloc());
    frame_.reset(av_frame_alloc());
    if (!codec_ || !packet_ || !frame_) throw Error::OutOfMemory("decode_video: libav alloc");
    if (avcodec_parameters_to_context(codec_.get(), stream_->codecpar) < 0) {
        reject(name_, "cannot set up the " + info_.codec + " decoder");
    }
    codec_->pkt_timebase = stream_->time_base;
    codec_->thread_count = config.threads;
    const int opened = avcodec_open2(codec_.get(), decoder_, nullptr);
    if (opened < 0) {
        reject(name_,
               "cannot open the " + info_.codec + " decoder (" + av_error_text(opened) + ")");
    }
}

ClipReader::Status ClipReader::next() {
    for (;;) {
        const int received = avcodec_receive_frame(codec_.get(), frame_.get());
        if (received == 0) {
            // The declared size was checked before decoding; a stream may still change size.
            if (frame_->width <= 0 || frame_->height <= 0 ||
                frame_->width > max_pixels_ / frame_->height) {
                reason_ = "a frame of " + std::to_string(frame_->width) + "x" +
                          std::to_string(frame_->height) + " exceeds the limit of " +
                          std::to_string(max_pixels_) + " pixels";
                return Status::kBroken;
            }
            // A frame the decoder patched over damage: not a picture to train on.
            if (frame_->decode_error_flags != 0 || (frame_->flags & AV_FRAME_FLAG_CORRUPT) != 0) {
                reason_ = "decode error (damaged frame at " +
                          seconds_text(frame_->best_effort_timestamp * av_q2d(time_base())) + ")";
                return Status::kBroken;
            }
            return Status::kFrame;
        }
        if (received == AVERROR_EOF) {
            reason_ = read_error_;
            return read_error_.empty() ? Status::kEnd : Status::kBroken;
        }
        if (received != AVERROR(EAGAIN)) {
            reason_ = "decode error (" + av_error_text(received) + ")";
            return Status::kBroken;
        }
        if (draining_) {  // cannot happen after a flush packet; treated as the end
            reason_ = read_error_;
            return read_error_.empty() ? Status::kEnd : Status::kBroken;
        }
        const int read = av_read_frame(format_.get(), packet_.get());
        if (read < 0) {
            // A read error (a truncated file) still leaves whole packets inside the decoder:
            // drain them. A decode error, below, does not: the decoder's state is suspect.
            if (read != AVERROR_EOF) {
                read_error_ = "truncated or unreadable data (" + av_error_text(read) + ")";
            }
            avcodec_send_packet(codec_.get(), nullptr);
            draining_ = true;
            continue;
        }
        if (packet_->stream_index != stream_->index) {
            av_packet_unref(packet_.get());
            continue;
        }
        const int sent = avcodec_send_packet(codec_.get(), packet_.get());
        av_packet_unref(packet_.get());
        // Every frame is received before the next packet is sent, so EAGAIN cannot occur.
        if (sent < 0) {
            reason_ = "decode error (" + av_error_text(sent) + ")";
            return Status::kBroken;
        }
    }
}

bool ClipReader::seek(int64_t timestamp) {
    if (av_seek_frame(format_.get(), stream_->index, timestamp, AVSEEK_FLAG_BACKWARD) < 0) {
        return false;
    }
    avcodec_flush_buffers(codec_.get());
    return true;
}

namespace {

// Source cropping moves the data pointers; that needs whole bytes per pixel and no palette.
bool croppable(const AVPixFmtDescriptor* desc) {
    return (desc->flags &
            (AV_PIX_FMT_FLAG_BITSTREAM | AV_PIX_FMT_FLAG_PAL | AV_PIX_FMT_FLAG_HWACCEL)) == 0;
}

AVFramePtr alloc_frame(AVPixelFormat format, int width, int height) {
    AVFramePtr frame(av_frame_alloc());
    if (!frame) throw Error::OutOfMemory("decode_video: av_frame_alloc");
    frame->format = format;
    frame->width = width;
    frame->height = height;
    // Aligned and padded rows: swscale's SIMD paths may write past the last pixel of a row.
    if (av_frame_get_buffer(frame.get(), 0) < 0) {
        throw Error::OutOfMemory("decode_video: av_frame_get_buffer");
    }
    return frame;
}

}  // namespace

// The rare formats with a palette or packed bits are first unpacked to planar RGB at full size.
const AVFrame* FrameConverter::to_croppable(const AVFrame* frame) {
    const auto format = static_cast<AVPixelFormat>(frame->format);
    const AVPixFmtDescriptor* desc = av_pix_fmt_desc_get(format);
    if (desc == nullptr) reject(name_, "decoder produced an unknown pixel format");
    if (croppable(desc)) return frame;
    if (!planar_ || planar_->width != frame->width || planar_->height != frame->height) {
        planar_ = alloc_frame(AV_PIX_FMT_GBRP, frame->width, frame->height);
    }
    unpack_.reset(sws_getCachedContext(unpack_.release(), frame->width, frame->height, format,
                                       frame->width, frame->height, AV_PIX_FMT_GBRP, SWS_POINT,
                                       nullptr, nullptr, nullptr));
    if (!unpack_) reject(name_, std::string("unsupported pixel format ") + desc->name);
    sws_scale(unpack_.get(), frame->data, frame->linesize, 0, frame->height, planar_->data,
              planar_->linesize);
    return planar_.get();
}

void FrameConverter::scale_into_scratch(const AVFrame* frame, int target_h, int target_w) {
    const auto [format, full_range_format] = unjpeg(static_cast<AVPixelFormat>(frame->format));
    const AVPixFmtDescriptor* desc = av_pix_fmt_desc_get(format);
    const bool rgb = (desc->flags & AV_PIX_FMT_FLAG_RGB) != 0;
    const SourceCrop crop = plan_cover_crop(frame->height, frame->width, target_h, target_w);
    // Chroma planes hold one sample per 2^log2_chroma pixels: the crop starts on a chroma sample
    // (at most one pixel left of or above the centered position) so every plane moves by whole
    // samples.
    const int x = rgb ? crop.x : crop.x & ~((1 << desc->log2_chroma_w) - 1);
    const int y = rgb ? crop.y : crop.y & ~((1 << desc->log2_chroma_h) - 1);
    const uint8_t* source[4] = {};
    int source_lines[4] = {};
    for (int plane = 0; plane < 4 && frame->data[plane] != nullptr; ++plane) {
        // The first component stored in this plane gives its bytes per pixel and subsampling.
        int step = 0, shift_w = 0, shift_h = 0;
        for (int c = 0; c < desc->nb_components; ++c) {
            if (desc->comp[c].plane != plane) continue;
            step = desc->comp[c].step;
            const bool chroma = !rgb && (c == 1 || c == 2);
            shift_w = chroma ? desc->log2_chroma_w : 0;
            shift_h = chroma ? desc->log2_chroma_h : 0;
            break;
        }
        source[plane] = frame->data[plane] +
                        static_cast<ptrdiff_t>(y >> shift_h) * frame->linesize[plane] +
                        static_cast<ptrdiff_t>(x >> shift_w) * step;
        source_lines[plane] = frame->linesize[plane];
    }
    // Area averaging when shrinking (no aliasing), bicubic when enlarging, as the image stage
    // does with OpenCV. Accurate rounding and full chroma interpolation: no half-pixel chroma
    // shift and no +-1 level dither between runs.
    const bool shrinking = crop.width >= target_w && crop.height >= target_h;
    const int flags = (shrinking ? SWS_AREA : SWS_BICUBIC) | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT;
    scale_.reset(sws_getCachedContext(scale_.release(), crop.width, crop.height, format, target_w,
                                      target_h, AV_PIX_FMT_GBRP, flags, nullptr, nullptr, nullptr));
    if (!scale_) reject(name_, std::string("unsupported pixel format ") + desc->name);
    if (!rgb) {
        // Untagged video is BT.709 from 720 lines up and BT.601 below, the usual guess (and what
        // encoders of untagged sources assume); limited range unless tagged full.
        int space = frame->colorspace;
        if (space == AVCOL_SPC_UNSPECIFIED) {
            space = frame->height >= 720 ? AVCOL_SPC_BT709 : AVCOL_SPC_BT470BG;
        }
        const int range = full_range_format || frame->color_range == AVCOL_RANGE_JPEG ? 1 : 0;
        if (detailed_ != scale_.get() || space != detailed_space_ || range != detailed_range_) {
            sws_setColorspaceDetails(scale_.get(), sws_getCoefficients(space), range,
                                     sws_getCoefficients(SWS_CS_DEFAULT), 1, 0, 1 << 16, 1 << 16);
            detailed_ = scale_.get();
            detailed_space_ = space;
            detailed_range_ = range;
        }
    }
    if (!scratch_ || scratch_->width != target_w || scratch_->height != target_h) {
        scratch_ = alloc_frame(AV_PIX_FMT_GBRP, target_w, target_h);
    }
    sws_scale(scale_.get(), source, source_lines, 0, crop.height, scratch_->data,
              scratch_->linesize);
}

void FrameConverter::convert(const AVFrame* frame, uint8_t* rgb) {
    scale_into_scratch(to_croppable(frame), stored_height(), stored_width());
    const int height = stored_height(), width = stored_width();
    const int64_t plane_bytes = int64_t{height} * width;
    // GBRP keeps G, B, R in planes 0, 1, 2.
    const int plane_of_channel[3] = {2, 0, 1};
    for (int channel = 0; channel < 3; ++channel) {
        const int plane = plane_of_channel[channel];
        for (int row = 0; row < height; ++row) {
            std::memcpy(
                rgb + channel * plane_bytes + int64_t{row} * width,
                scratch_->data[plane] + static_cast<ptrdiff_t>(row) * scratch_->linesize[plane],
                static_cast<size_t>(width));
        }
    }
}

}  // namespace sf::stages

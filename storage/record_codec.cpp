// The cache's record form: a safetensors buffer inside one zstd frame with content size and
// content checksum. zstd verifies the checksum while decompressing, so a record read back is either
// the bytes that were written or a kCorruption error.
#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_getFrameHeader
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "storage/tensor_record.h"

namespace sf::storage {
namespace {

// The first output buffer of a decode; it doubles as the frame's blocks actually produce bytes.
constexpr uint64_t kFirstOutputBytes = uint64_t{1} << 20;

struct CCtxDeleter {
    void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DCtxDeleter {
    void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

// Contexts are reused per thread: creating one costs more than compressing a small record.
ZSTD_CCtx* thread_cctx() {
    thread_local std::unique_ptr<ZSTD_CCtx, CCtxDeleter> cctx(ZSTD_createCCtx());
    if (!cctx) throw Error::OutOfMemory("cannot create a zstd compression context");
    return cctx.get();
}

ZSTD_DCtx* thread_dctx() {
    thread_local std::unique_ptr<ZSTD_DCtx, DCtxDeleter> dctx(ZSTD_createDCtx());
    if (!dctx) throw Error::OutOfMemory("cannot create a zstd decompression context");
    return dctx.get();
}

Error corrupt(const std::string& key, const std::string& what) {
    return Error::Corruption("record " + key + ": " + what);
}

// Checks that `frame` is exactly one record frame and returns its content size.
uint64_t check_frame(std::string_view frame, const std::string& key, uint64_t max_bytes) {
    ZSTD_frameHeader header;
    size_t rc = ZSTD_getFrameHeader(&header, frame.data(), frame.size());
    if (ZSTD_isError(rc)) {
        throw corrupt(key, std::string("not a zstd frame: ") + ZSTD_getErrorName(rc));
    }
    if (rc > 0)
        throw corrupt(key, std::to_string(frame.size()) + " bytes, a truncated frame header");
    if (header.frameType != ZSTD_frame) throw corrupt(key, "a skippable frame, not a record");
    if (!header.checksumFlag) throw corrupt(key, "the frame has no content checksum");
    if (header.frameContentSize == ZSTD_CONTENTSIZE_UNKNOWN ||
        header.frameContentSize == ZSTD_CONTENTSIZE_ERROR) {
        throw corrupt(key, "the frame does not declare its content size");
    }
    if (header.frameContentSize > max_bytes) {
        throw corrupt(key, "the frame declares " + std::to_string(header.frameContentSize) +
                               " bytes, over the " + std::to_string(max_bytes) +
                               "-byte limit of its kind of record");
    }
    return header.frameContentSize;
}

}  // namespace

std::string encode_record(const Record& record, int zstd_level) {
    std::string plain = encode_safetensors(record);
    ZSTD_CCtx* cctx = thread_cctx();
    ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, zstd_level);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1);
    std::string out(ZSTD_compressBound(plain.size()), '\0');
    size_t n = ZSTD_compress2(cctx, out.data(), out.size(), plain.data(), plain.size());
    if (ZSTD_isError(n)) {
        throw Error::IOError(std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
    }
    out.resize(n);
    return out;
}

uint64_t record_content_size(std::string_view frame, const std::string& key_for_errors,
                             uint64_t max_bytes) {
    return check_frame(frame, key_for_errors, max_bytes);
}

namespace {

// The verified content of a record frame. Buffers are left uninitialized: zero-filling would
// touch every page for nothing.
struct Plain {
    std::unique_ptr<char[]> data;
    size_t size = 0;
    std::string_view view() const { return {data.get(), size}; }
};

// Decodes in steps into a buffer that grows with the bytes the frame's blocks really produce, so a
// header that declares gigabytes costs no more memory than its blocks make. The buffer has one
// byte more than the declared size: a frame that fills it produces more than it declares.
Plain decompress(std::string_view frame, const std::string& key, uint64_t max_bytes) {
    const uint64_t content_size = check_frame(frame, key, max_bytes);
    size_t frame_size = ZSTD_findFrameCompressedSize(frame.data(), frame.size());
    if (ZSTD_isError(frame_size)) {
        throw corrupt(key,
                      std::string("damaged or truncated frame: ") + ZSTD_getErrorName(frame_size));
    }
    if (frame_size != frame.size()) {
        throw corrupt(
            key, std::to_string(frame.size() - frame_size) + " bytes follow the end of the frame");
    }
    const uint64_t room = content_size + 1;
    uint64_t capacity = std::min(room, kFirstOutputBytes);
    Plain out{std::unique_ptr<char[]>(new char[capacity]), 0};
    ZSTD_DCtx* dctx = thread_dctx();
    ZSTD_DCtx_reset(dctx, ZSTD_reset_session_only);  // a failed frame may leave state behind
    ZSTD_inBuffer in{frame.data(), frame.size(), 0};
    for (;;) {
        ZSTD_outBuffer buffer{out.data.get(), capacity, out.size};
        const size_t before_in = in.pos;
        const size_t rc = ZSTD_decompressStream(dctx, &buffer, &in);
        if (ZSTD_isError(rc)) throw corrupt(key, std::string("zstd: ") + ZSTD_getErrorName(rc));
        const bool progressed = buffer.pos != out.size || in.pos != before_in;
        out.size = buffer.pos;
        if (out.size > content_size) {
            throw corrupt(key, "decompresses to more than the " + std::to_string(content_size) +
                                   " bytes the frame declares");
        }
        if (rc == 0) break;  // the frame is complete and its checksum matched
        if (out.size == capacity) {
            const uint64_t grown = std::min(room, 2 * capacity);
            std::unique_ptr<char[]> bigger(new char[grown]);
            std::memcpy(bigger.get(), out.data.get(), out.size);
            out.data = std::move(bigger);
            capacity = grown;
        } else if (!progressed) {
            throw corrupt(key, "the frame ends before its last block");
        }
    }
    if (out.size != content_size) {
        throw corrupt(key, "decompressed to " + std::to_string(out.size) +
                               " bytes, the frame declares " + std::to_string(content_size));
    }
    return out;
}

}  // namespace

std::string decompress_record(std::string_view frame, const std::string& key_for_errors,
                              uint64_t max_bytes) {
    return std::string(decompress(frame, key_for_errors, max_bytes).view());
}

Record decode_record(std::string_view frame, const std::string& key_for_errors,
                     uint64_t max_bytes) {
    Plain plain = decompress(frame, key_for_errors, max_bytes);
    return decode_safetensors(plain.view(), "record " + key_for_errors);
}

}  // namespace sf::storage

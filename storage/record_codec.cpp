// The cache's record form: a safetensors buffer inside one zstd frame with content size and
// content checksum. zstd verifies the checksum while decompressing, so a record read back is either
// the bytes that were written or a kCorruption error.
#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_getFrameHeader, ZSTD_decompressBound
#include <zstd.h>

#include <memory>

#include "core/error.h"
#include "storage/tensor_record.h"

namespace sf::storage {
namespace {

// A record larger than this is refused before allocating: a corrupt content size must not turn
// into a huge allocation.
constexpr uint64_t kMaxRecordBytes = uint64_t{16} << 30;

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
uint64_t check_frame(std::string_view frame, const std::string& key) {
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
    if (header.frameContentSize > kMaxRecordBytes) {
        throw corrupt(key, "the frame declares " + std::to_string(header.frameContentSize) +
                               " bytes, over the record limit");
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

uint64_t record_content_size(std::string_view frame, const std::string& key_for_errors) {
    return check_frame(frame, key_for_errors);
}

namespace {

// The verified content of a record frame. The buffer is left uninitialized before decompressing:
// zero-filling a size read from a damaged header would touch every page of it for nothing.
struct Plain {
    std::unique_ptr<char[]> data;
    size_t size = 0;
    std::string_view view() const { return {data.get(), size}; }
};

Plain decompress(std::string_view frame, const std::string& key) {
    uint64_t content_size = check_frame(frame, key);
    size_t frame_size = ZSTD_findFrameCompressedSize(frame.data(), frame.size());
    if (ZSTD_isError(frame_size)) {
        throw corrupt(key,
                      std::string("damaged or truncated frame: ") + ZSTD_getErrorName(frame_size));
    }
    if (frame_size != frame.size()) {
        throw corrupt(
            key, std::to_string(frame.size() - frame_size) + " bytes follow the end of the frame");
    }
    // The blocks bound what the frame can produce; a content size above it is a damaged header.
    unsigned long long bound = ZSTD_decompressBound(frame.data(), frame.size());
    if (bound == ZSTD_CONTENTSIZE_ERROR || content_size > bound) {
        throw corrupt(key, "the declared content size does not fit the frame's blocks");
    }
    Plain out{std::unique_ptr<char[]>(new char[content_size > 0 ? content_size : 1]), content_size};
    ZSTD_DCtx* dctx = thread_dctx();
    ZSTD_DCtx_reset(dctx, ZSTD_reset_session_only);  // a failed frame may leave state behind
    size_t n = ZSTD_decompressDCtx(dctx, out.data.get(), out.size, frame.data(), frame.size());
    if (ZSTD_isError(n)) throw corrupt(key, std::string("zstd: ") + ZSTD_getErrorName(n));
    if (n != content_size) {
        throw corrupt(key, "decompressed to " + std::to_string(n) + " bytes, the frame declares " +
                               std::to_string(content_size));
    }
    return out;
}

}  // namespace

std::string decompress_record(std::string_view frame, const std::string& key_for_errors) {
    return std::string(decompress(frame, key_for_errors).view());
}

Record decode_record(std::string_view frame, const std::string& key_for_errors) {
    Plain plain = decompress(frame, key_for_errors);
    return decode_safetensors(plain.view(), "record " + key_for_errors);
}

}  // namespace sf::storage

#include "stages/image/decode_image.h"

#include <ATen/ops/empty.h>
#include <sys/stat.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <system_error>
#include <utility>

#include "core/check.h"
#include "core/error.h"
#include "stages/image/aspect_buckets.h"
#include "stages/image/image_header.h"
#include "storage/xxh3.h"

namespace sf::stages {
namespace {

const std::string kCorrupt = "truncated or corrupt image data";
// OpenCV's own per-side limit (CV_IO_MAX_IMAGE_WIDTH / HEIGHT defaults); also keeps sides in int.
constexpr int64_t kMaxSide = int64_t{1} << 20;

[[noreturn]] void reject(const std::string& name, const std::string& reason) {
    throw Reject(name + ": " + reason);
}

std::string size_text(int64_t width, int64_t height) {
    return std::to_string(width) + "x" + std::to_string(height);
}

// Transparent pixels become white, not black: a cut-out product shot on black would teach the
// model black backgrounds that no one drew. out = c * a + 255 * (1 - a), rounded.
cv::Mat composite_on_white(const cv::Mat& src) {
    const int channels = src.channels();  // 2 (gray, alpha) or 4 (B, G, R, alpha)
    cv::Mat out(src.size(), CV_8UC3);
    for (int y = 0; y < src.rows; ++y) {
        const uint8_t* s = src.ptr<uint8_t>(y);
        uint8_t* d = out.ptr<uint8_t>(y);
        for (int x = 0; x < src.cols; ++x, s += channels, d += 3) {
            const int alpha = s[channels - 1];
            const int white = 255 * (255 - alpha) + 127;
            for (int c = 0; c < 3; ++c) {
                const int value = channels == 4 ? s[c] : s[0];
                d[c] = static_cast<uint8_t>((value * alpha + white) / 255);
            }
        }
    }
    return out;
}

// Any layout OpenCV's IMREAD_UNCHANGED returns -> 8-bit BGR. (OpenCV already turns CMYK and
// YCCK JPEGs into BGR, and palette images into BGR or BGRA.)
cv::Mat to_bgr8(const cv::Mat& decoded, const std::string& name) {
    cv::Mat eight_bit;
    switch (decoded.depth()) {
        case CV_8U:
            eight_bit = decoded;
            break;
        case CV_16U:
            decoded.convertTo(eight_bit, CV_8U, 1.0 / 257.0);
            break;  // 65535 -> 255
        case CV_32F:
            decoded.convertTo(eight_bit, CV_8U, 255.0);
            break;  // TIFF in [0, 1]
        default:
            reject(name, "unsupported pixel depth (OpenCV depth " +
                             std::to_string(decoded.depth()) + ")");
    }
    switch (eight_bit.channels()) {
        case 3:
            return eight_bit;
        case 1: {
            cv::Mat bgr;
            cv::cvtColor(eight_bit, bgr, cv::COLOR_GRAY2BGR);
            return bgr;
        }
        case 2:
        case 4:
            return composite_on_white(eight_bit);
        default:
            break;
    }
    reject(name, "unsupported channel count " + std::to_string(eight_bit.channels()));
}

// EXIF orientations 5..8 swap width and height.
bool transposes(int orientation) { return orientation >= 5 && orientation <= 8; }

// Orientations whose transform includes a left-right mirror of the stored rows.
bool mirrors_columns(int orientation) {
    return orientation == 2 || orientation == 3 || orientation == 6 || orientation == 7;
}

// The same transform as OpenCV's ApplyExifOrientation and PIL's ImageOps.exif_transpose.
cv::Mat apply_orientation(const cv::Mat& image, int orientation) {
    cv::Mat out;
    switch (orientation) {
        case 2:
            cv::flip(image, out, 1);
            break;  // mirrored left-right
        case 3:
            cv::flip(image, out, -1);
            break;  // rotated 180
        case 4:
            cv::flip(image, out, 0);
            break;  // mirrored top-bottom
        case 5:
            cv::transpose(image, out);
            break;
        case 6:
            cv::transpose(image, out), cv::flip(out, out, 1);
            break;  // rotate 90 CW
        case 7:
            cv::transpose(image, out), cv::flip(out, out, -1);
            break;
        case 8:
            cv::transpose(image, out), cv::flip(out, out, 0);
            break;  // rotate 90 CCW
        default:
            return image;
    }
    return out;
}

// x / 127.5 - 1 for every byte, computed in double so 0 -> -1 and 255 -> +1 exactly.
const std::array<float, 256>& normalize_table() {
    static const std::array<float, 256> table = [] {
        std::array<float, 256> t{};
        for (int i = 0; i < 256; ++i) t[i] = static_cast<float>(i / 127.5 - 1.0);
        return t;
    }();
    return table;
}

// Interleaved BGR rows -> planar RGB [3, H, W] tensor.
at::Tensor to_tensor(const cv::Mat& bgr, bool output_uint8, const at::Tensor& reuse) {
    const int64_t height = bgr.rows, width = bgr.cols, plane = height * width;
    const at::ScalarType dtype = output_uint8 ? at::kByte : at::kFloat;
    const auto bytes = static_cast<size_t>(3 * plane * (output_uint8 ? 1 : 4));
    at::Tensor pixels;
    if (reuse.defined() && reuse.device().is_cpu() && reuse.scalar_type() == dtype &&
        reuse.is_contiguous() && reuse.storage_offset() == 0 && reuse.storage().nbytes() >= bytes) {
        pixels = reuse;
        pixels.resize_({3, height, width});  // within capacity: no reallocation
    } else {
        pixels = at::empty({3, height, width}, dtype);
    }
    if (output_uint8) {
        uint8_t* r = pixels.data_ptr<uint8_t>();
        for (int64_t y = 0; y < height; ++y) {
            const uint8_t* s = bgr.ptr<uint8_t>(static_cast<int>(y));
            uint8_t* row = r + y * width;
            for (int64_t x = 0; x < width; ++x, s += 3) {
                row[x] = s[2], row[x + plane] = s[1], row[x + 2 * plane] = s[0];
            }
        }
    } else {
        const std::array<float, 256>& lut = normalize_table();
        float* r = pixels.data_ptr<float>();
        for (int64_t y = 0; y < height; ++y) {
            const uint8_t* s = bgr.ptr<uint8_t>(static_cast<int>(y));
            float* row = r + y * width;
            for (int64_t x = 0; x < width; ++x, s += 3) {
                row[x] = lut[s[2]], row[x + plane] = lut[s[1]], row[x + 2 * plane] = lut[s[0]];
            }
        }
    }
    return pixels;
}

// JPEG can be decoded at 1/2, 1/4 or 1/8 scale inside libjpeg's inverse DCT, three to eight
// times faster than a full decode (a 12-megapixel photo: 158 ms -> 44 ms at 1/2). The largest
// factor is used that still leaves at least the bucket's size, so the final INTER_AREA step
// still only shrinks; a scaled IDCT is itself a proper low-pass downscale (PIL's draft mode).
int jpeg_reduction(const SourceCrop& crop, const AspectBucket& bucket) {
    for (int k : {8, 4, 2}) {
        if (crop.height >= k * bucket.height && crop.width >= k * bucket.width) return k;
    }
    return 1;
}

int reduced_flags(int reduce) {
    // IGNORE_ORIENTATION: the stage orients the result itself, as for every other path.
    const int base = reduce == 8   ? cv::IMREAD_REDUCED_COLOR_8
                     : reduce == 4 ? cv::IMREAD_REDUCED_COLOR_4
                                   : cv::IMREAD_REDUCED_COLOR_2;
    return base | cv::IMREAD_IGNORE_ORIENTATION;
}

}  // namespace

DecodeImageStage::DecodeImageStage(DecodeImageConfig config) : config_(config) {
    if (config_.square_side < 0 || config_.square_side % 32 != 0 || config_.square_side > 8192) {
        throw Error::InvalidArgument(
            "decode_image: square_side (--center_crop's --resolution) "
            "must be a multiple of 32 up to 8192, got " +
            std::to_string(config_.square_side));
    }
    if (!is_bucket_resolution(config_.resolution)) {
        throw Error::InvalidArgument("decode_image: resolution " +
                                     std::to_string(config_.resolution) +
                                     " has no bucket table; use 512, 1024, 2048 or 4096");
    }
    if (config_.min_side < 1) {
        throw Error::InvalidArgument("decode_image: min_side must be at least 1, got " +
                                     std::to_string(config_.min_side));
    }
    if (config_.max_pixels < 1) {
        throw Error::InvalidArgument("decode_image: max_pixels must be at least 1, got " +
                                     std::to_string(config_.max_pixels));
    }
    // OpenCV takes the encoded buffer's length as an int.
    if (config_.max_file_bytes < 1 || config_.max_file_bytes > INT32_MAX) {
        throw Error::InvalidArgument("decode_image: max_file_bytes must be in [1, 2^31 - 1], got " +
                                     std::to_string(config_.max_file_bytes));
    }
}

std::string DecodeImageStage::fingerprint() const {
    // The two options add to the fingerprint only when on: caches made without them still match.
    return "decode_image/v1;" + bucket_table_fingerprint(config_.resolution) +
           ";exif-orientation;alpha-on-white;16bit/257;area-down,cubic-up;center-crop;" +
           (config_.jpeg_reduced_decode ? "jpeg-dct-reduce;" : "") +
           (config_.output_uint8 ? "rgb-u8" : "rgb-f32[-1,1]") +
           (config_.square_side > 0 ? ";square-" + std::to_string(config_.square_side) : "") +
           (config_.random_flip ? ";hflip-half-by-xxh3" : "");
}

AspectBucket DecodeImageStage::bucket_for(int height, int width) const {
    if (config_.square_side > 0) return {"1.0", 1.0, config_.square_side, config_.square_side};
    return closest_aspect_bucket(config_.resolution, height, width);
}

bool DecodeImageStage::flips(const std::string& bytes) const {
    return config_.random_flip && (storage::xxh3_128_hex(bytes).back() - '0') % 2 == 1;
}

DecodedImage DecodeImageStage::run(const std::string& path, at::Tensor reuse) const {
    auto errno_text = [] { return std::error_code(errno, std::generic_category()).message(); };
    std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
    if (!file) reject(path, "cannot read file (" + errno_text() + ")");
    struct stat info {};
    if (fstat(fileno(file.get()), &info) != 0)
        reject(path, "cannot read file (" + errno_text() + ")");
    if (!S_ISREG(info.st_mode)) reject(path, "cannot read file (not a regular file)");
    if (info.st_size > config_.max_file_bytes) {
        reject(path, "file is " + std::to_string(info.st_size) + " bytes, over the limit of " +
                         std::to_string(config_.max_file_bytes) + " (max_file_bytes)");
    }
    std::string bytes(static_cast<size_t>(info.st_size), '\0');
    if (!bytes.empty() && std::fread(bytes.data(), 1, bytes.size(), file.get()) != bytes.size()) {
        reject(path, "cannot read file (" + errno_text() + ")");
    }
    return run_bytes(bytes, path, std::move(reuse));
}

namespace {

// Everything that can be refused from the bytes and the header alone, before any decoder
// runs: the decoder allocates the declared size up front, so a bomb must not reach it.
ImageHeader checked_header(const std::string& bytes, const std::string& name,
                           const DecodeImageConfig& config) {
    if (static_cast<int64_t>(bytes.size()) > config.max_file_bytes) {
        reject(name, "file is " + std::to_string(bytes.size()) + " bytes, over the limit of " +
                         std::to_string(config.max_file_bytes) + " (max_file_bytes)");
    }
    const ImageHeader header =
        read_image_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    if (header.format == ImageFormat::kUnknown) {
        reject(name, "not an image or unsupported format" +
                         std::string(bytes.empty() ? " (empty file)" : ""));
    }
    if (!header.error.empty()) reject(name, kCorrupt + " (" + header.error + ")");
    const int64_t width = header.width, height = header.height;
    if (width <= 0 || height <= 0) {
        reject(name, kCorrupt + " (" + image_format_name(header.format) + " declares " +
                         size_text(width, height) + ")");
    }
    if (width > config.max_pixels / height) {
        reject(name, "declared dimensions " + size_text(width, height) + " exceed the limit of " +
                         std::to_string(config.max_pixels) + " pixels (decompression bomb?)");
    }
    if (std::max(width, height) > kMaxSide) {
        reject(name, "declared dimensions " + size_text(width, height) + " exceed the limit of " +
                         std::to_string(kMaxSide) + " pixels per side");
    }
    if (std::min(width, height) < config.min_side) {
        reject(name, "image too small: " + size_text(width, height) + ", minimum side is " +
                         std::to_string(config.min_side));
    }
    if (!header.truncated.empty()) reject(name, kCorrupt + " (" + header.truncated + ")");
    return header;
}

}  // namespace

DecodedImage DecodeImageStage::run_bytes(const std::string& bytes,
                                         const std::string& name_for_errors,
                                         at::Tensor reuse) const {
    const std::string& name = name_for_errors;
    const ImageHeader header = checked_header(bytes, name, config_);
    const int64_t width = header.width, height = header.height;
    const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());

    // Geometry is planned from the header, in the orientation the image is shown in, and
    // carried out in the one it is stored in, so only the small result is flipped or
    // transposed. Every EXIF transform maps a centered crop to a centered crop, with height
    // and width swapped for 5..8.
    const bool transposed = transposes(header.orientation);
    const int shown_h = static_cast<int>(transposed ? width : height);
    const int shown_w = static_cast<int>(transposed ? height : width);
    const AspectBucket bucket = bucket_for(shown_h, shown_w);
    const SourceCrop crop = plan_cover_crop(shown_h, shown_w, bucket.height, bucket.width);
    // OpenCV's TIFF reader applies the Orientation tag itself, even under IMREAD_UNCHANGED
    // (pinned by a test), except that tiled 8-bit files with a mirrored orientation come out
    // scrambled tile by tile: those are refused rather than trained on.
    const bool decoder_orients = header.format == ImageFormat::kTIFF;
    if (decoder_orients && header.tiled && mirrors_columns(header.orientation)) {
        reject(name, "unsupported: tiled TIFF with orientation " +
                         std::to_string(header.orientation) + " (OpenCV decodes it scrambled)");
    }
    const int orientation = decoder_orients ? 1 : header.orientation;  // left for us to apply
    const bool stored_transposed = transposes(orientation);
    const int stored_h = stored_transposed ? shown_w : shown_h;  // as the decoder returns it
    const int stored_w = stored_transposed ? shown_h : shown_w;
    const int reduce = config_.jpeg_reduced_decode && header.format == ImageFormat::kJPEG
                           ? jpeg_reduction(crop, bucket)
                           : 1;

    cv::Mat decoded;
    try {
        const cv::Mat buffer(1, static_cast<int>(bytes.size()), CV_8U, const_cast<uint8_t*>(data));
        // UNCHANGED keeps alpha and 16 bits for us to convert properly; it also makes OpenCV
        // skip EXIF orientation, which apply_orientation() below does instead.
        decoded = cv::imdecode(buffer, reduce == 1 ? cv::IMREAD_UNCHANGED : reduced_flags(reduce));
    } catch (const cv::Exception& e) {
        reject(name, kCorrupt + " (OpenCV: " + e.msg + ")");
    }
    if (decoded.empty()) {
        reject(name, kCorrupt + " (the " + image_format_name(header.format) + " decoder failed)");
    }
    // libjpeg's scaled output is ceil(side / reduce).
    if (decoded.cols != (stored_w + reduce - 1) / reduce ||
        decoded.rows != (stored_h + reduce - 1) / reduce) {
        reject(name, kCorrupt + " (header declares " + size_text(stored_w, stored_h) +
                         ", decoder produced " + size_text(decoded.cols, decoded.rows) +
                         (reduce > 1 ? " at 1/" + std::to_string(reduce) + " scale)" : ")"));
    }
    const cv::Size full_crop =
        stored_transposed ? cv::Size(crop.height, crop.width) : cv::Size(crop.width, crop.height);
    // The full-resolution crop, scaled to the decoded image (the same rect when reduce is 1).
    const int full_x = (stored_w - full_crop.width) / 2;
    const int full_y = (stored_h - full_crop.height) / 2;
    auto scaled = [reduce](int v) { return (v + reduce / 2) / reduce; };
    const cv::Size crop_size(std::min(decoded.cols, scaled(full_crop.width)),
                             std::min(decoded.rows, scaled(full_crop.height)));
    const cv::Rect stored_crop(std::min(scaled(full_x), decoded.cols - crop_size.width),
                               std::min(scaled(full_y), decoded.rows - crop_size.height),
                               crop_size.width, crop_size.height);
    // Convert only the pixels that are kept: a view, then 8-bit BGR.
    cv::Mat bgr = to_bgr8(decoded(stored_crop), name);
    decoded.release();

    const cv::Size target = stored_transposed ? cv::Size(bucket.height, bucket.width)
                                              : cv::Size(bucket.width, bucket.height);
    cv::Mat resized = bgr;
    if (target != bgr.size()) {
        // INTER_AREA averages every source pixel when shrinking (no aliasing, unlike bilinear);
        // bicubic is the sharper choice when enlarging, where area degenerates to nearest.
        const bool shrinking = target.width <= bgr.cols && target.height <= bgr.rows;
        cv::resize(bgr, resized, target, 0, 0, shrinking ? cv::INTER_AREA : cv::INTER_CUBIC);
    }
    bgr.release();
    cv::Mat oriented = apply_orientation(resized, orientation);
    if (flips(bytes)) cv::flip(oriented, oriented, 1);
    SF_CHECK(oriented.rows == bucket.height && oriented.cols == bucket.width,
             "decode_image: result differs from the bucket size");

    DecodedImage out;
    out.pixels = to_tensor(oriented, config_.output_uint8, reuse);
    out.bucket_h = bucket.height;
    out.bucket_w = bucket.width;
    out.bucket_ratio = bucket.ratio;
    out.orig_h = shown_h;
    out.orig_w = shown_w;
    return out;
}

}  // namespace sf::stages

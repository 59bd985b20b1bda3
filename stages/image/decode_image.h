// decode_image: one image file -> one normalized RGB tensor in Sana's closest aspect bucket.
//
//   bytes -> header check: format, declared size, truncation (nothing decoded yet)
//         -> closest bucket for the image as shown (after EXIF orientation)
//         -> OpenCV decode (JPEG at 1/2..1/8 scale when that still covers the bucket)
//         -> crop the centered region that covers the bucket, to 8-bit BGR (alpha on white)
//         -> resize to the bucket -> EXIF orientation -> [3, H, W] RGB tensor in [-1, 1]
//
// A bad image throws sf::Reject("<name>: <reason>"); the graph records it and goes on. The
// stage is a plain class with no mutable state: run() may be called from many threads at once.
// OpenCV's own thread pool is process-wide; a pipeline that runs several decoders in parallel
// should call cv::setNumThreads(0) once, or the two levels of threads fight over the cores.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "stages/image/aspect_buckets.h"

namespace sf::stages {

struct DecodeImageConfig {
    // Selects the bucket table: 512, 1024, 2048 or 4096.
    int resolution = 1024;
    // Images whose shorter side is smaller are rejected: upscaling them would teach blur.
    int min_side = 256;
    // Declared width x height above this is rejected before decoding. PIL's default
    // decompression-bomb error threshold (2 x 89478485): a 179-megapixel image is ~540 MB as
    // 8-bit RGB, already more than any bucket needs.
    int64_t max_pixels = 178956970;
    // Files larger than this are rejected before being read into memory.
    int64_t max_file_bytes = int64_t{1} << 30;
    // uint8 [0, 255] pixels instead of float32 [-1, 1]: a quarter of the memory in flight when
    // the consumer (the VAE stage) normalizes on the device anyway.
    bool output_uint8 = false;
    // Decode a JPEG at 1/2, 1/4 or 1/8 scale inside libjpeg when that still leaves at least
    // the bucket's size: 3-4x the throughput on camera photos, with a slightly different (not
    // worse) low-pass than decoding fully and area-averaging. Off: every pixel is decoded.
    bool jpeg_reduced_decode = true;
    // > 0: one square bucket of this side (a multiple of 32) for every image, resized to cover it
    // and center-cropped, as upstream's --center_crop (Resize then CenterCrop); 0: the buckets.
    int square_side = 0;
    // Mirror half of the images left to right (upstream's --random_flip), each chosen by its
    // bytes' hash, so a rerun or a resumed prep flips the same ones.
    bool random_flip = false;
};

struct DecodedImage {
    at::Tensor pixels;  // [3, bucket_h, bucket_w], RGB, contiguous, CPU
    int bucket_h = 0;
    int bucket_w = 0;
    std::string bucket_ratio;  // the table key, e.g. "0.57"
    int orig_h = 0;            // the image as displayed: after EXIF orientation
    int orig_w = 0;
};

class DecodeImageStage {
public:
    // Throws sf::Error kInvalidArgument naming the bad field.
    explicit DecodeImageStage(DecodeImageConfig config);

    // `reuse`: an optional CPU tensor whose memory the result may take over (its contents are
    // lost), used when it is contiguous, of the output dtype and large enough. A graph that
    // recycles pixel buffers saves the allocation: on these VMs first touching a fresh 11.5 MB
    // float tensor costs ~15 ms of page faults, more than decoding a 640x480 JPEG.
    DecodedImage run(const std::string& path, at::Tensor reuse = {}) const;
    // The bucket an image shown as height x width goes to (the square with square_side).
    AspectBucket bucket_for(int height, int width) const;
    // Whether random_flip mirrors the image of these bytes.
    bool flips(const std::string& bytes) const;
    // `bytes` is the whole file; `name_for_errors` prefixes every reject reason.
    DecodedImage run_bytes(const std::string& bytes, const std::string& name_for_errors,
                           at::Tensor reuse = {}) const;

    const DecodeImageConfig& config() const { return config_; }
    // Changes whenever the output for the same input would: the bucket table, the resampling,
    // the output type. min_side and the limits only decide what is rejected and are left out.
    std::string fingerprint() const;

private:
    DecodeImageConfig config_;
};

}  // namespace sf::stages

// Sana's aspect-ratio buckets: each training image is resized to cover the bucket whose
// height/width ratio is nearest its own, then center-cropped to exactly that size, so a batch
// of one bucket stacks into one tensor and no image is distorted.
//
// The tables are diffusers' ASPECT_RATIO_{512,1024}_BIN (pipeline_pixart_alpha.py),
// ASPECT_RATIO_2048_BIN (pipeline_pixart_sigma.py) and ASPECT_RATIO_4096_BIN (sana/
// pipeline_sana.py), copied as data: ratio key -> [height, width]. Torch-free and OpenCV-free.
#pragma once

#include <cstddef>
#include <string>

namespace sf::stages {

struct AspectBucket {
    const char* ratio;   // the table key exactly as diffusers spells it: "0.57", "1.0"
    double ratio_value;  // float(ratio) in Python
    int height;
    int width;
};

// A table in diffusers' order (ascending ratio). Throws sf::Error kInvalidArgument naming
// `resolution` when it is not 512, 1024, 2048 or 4096.
struct AspectBucketTable {
    const AspectBucket* buckets;
    size_t size;
    const AspectBucket* begin() const { return buckets; }
    const AspectBucket* end() const { return buckets + size; }
};
AspectBucketTable aspect_bucket_table(int resolution);
// The table a --resolution of any multiple of 32 maps to: the one nearest on a log scale (768 ->
// 1024, 600 -> 512). kInvalidArgument naming --resolution unless it is a multiple of 32 in
// [256, 8192].
int nearest_bucket_resolution(int resolution);
bool is_bucket_resolution(int resolution);

// diffusers' classify_height_width_bin: the key with the smallest |ratio - height/width|; on a
// tie the first (smaller) key wins, as Python's min() does.
const AspectBucket& closest_aspect_bucket(int resolution, int height, int width);

// A stable name for the table's contents, for stage fingerprints: it changes if and only if a
// bucket is added, removed or resized. "sana-ar1024-<16 hex digits>".
std::string bucket_table_fingerprint(int resolution);

// The part of a height x width image that fills a bucket. diffusers' resize_and_crop_tensor
// scales by max(bh/h, bw/w), so the image covers the bucket, then crops the center. Cropping
// the same centered region first and resizing only it gives the same picture (the region's
// edges round to whole source pixels) without making the scaled full image, which for a long
// panorama at 4096 px would take gigabytes. It also sidesteps diffusers' int() truncation,
// which can leave the resized image one pixel short of the bucket.
struct SourceCrop {
    int y;
    int x;
    int height;
    int width;
};
SourceCrop plan_cover_crop(int height, int width, int bucket_height, int bucket_width);

}  // namespace sf::stages

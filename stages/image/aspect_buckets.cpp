#include "stages/image/aspect_buckets.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "core/error.h"

namespace sf::stages {
namespace {

// One token gives both the key string and its value, so the two cannot disagree.
#define SF_BUCKET(ratio, height, width) \
    { #ratio, ratio, height, width }
#define B SF_BUCKET
// ASPECT_RATIO_512_BIN: 33 buckets
constexpr AspectBucket k512Buckets[] = {
    B(0.25, 256, 1024), B(0.28, 256, 928), B(0.32, 288, 896), B(0.33, 288, 864), B(0.35, 288, 832),
    B(0.4, 320, 800),   B(0.42, 320, 768), B(0.48, 352, 736), B(0.5, 352, 704),  B(0.52, 352, 672),
    B(0.57, 384, 672),  B(0.6, 384, 640),  B(0.68, 416, 608), B(0.72, 416, 576), B(0.78, 448, 576),
    B(0.82, 448, 544),  B(0.88, 480, 544), B(0.94, 480, 512), B(1.0, 512, 512),  B(1.07, 512, 480),
    B(1.13, 544, 480),  B(1.21, 544, 448), B(1.29, 576, 448), B(1.38, 576, 416), B(1.46, 608, 416),
    B(1.67, 640, 384),  B(1.75, 672, 384), B(2.0, 704, 352),  B(2.09, 736, 352), B(2.4, 768, 320),
    B(2.5, 800, 320),   B(3.0, 864, 288),  B(4.0, 1024, 256),
};
// ASPECT_RATIO_1024_BIN: 33 buckets
constexpr AspectBucket k1024Buckets[] = {
    B(0.25, 512, 2048), B(0.28, 512, 1856), B(0.32, 576, 1792), B(0.33, 576, 1728),
    B(0.35, 576, 1664), B(0.4, 640, 1600),  B(0.42, 640, 1536), B(0.48, 704, 1472),
    B(0.5, 704, 1408),  B(0.52, 704, 1344), B(0.57, 768, 1344), B(0.6, 768, 1280),
    B(0.68, 832, 1216), B(0.72, 832, 1152), B(0.78, 896, 1152), B(0.82, 896, 1088),
    B(0.88, 960, 1088), B(0.94, 960, 1024), B(1.0, 1024, 1024), B(1.07, 1024, 960),
    B(1.13, 1088, 960), B(1.21, 1088, 896), B(1.29, 1152, 896), B(1.38, 1152, 832),
    B(1.46, 1216, 832), B(1.67, 1280, 768), B(1.75, 1344, 768), B(2.0, 1408, 704),
    B(2.09, 1472, 704), B(2.4, 1536, 640),  B(2.5, 1600, 640),  B(3.0, 1728, 576),
    B(4.0, 2048, 512),
};
// ASPECT_RATIO_2048_BIN: 40 buckets
constexpr AspectBucket k2048Buckets[] = {
    B(0.25, 1024, 4096), B(0.26, 1024, 3968), B(0.27, 1024, 3840), B(0.28, 1024, 3712),
    B(0.32, 1152, 3584), B(0.33, 1152, 3456), B(0.35, 1152, 3328), B(0.4, 1280, 3200),
    B(0.42, 1280, 3072), B(0.48, 1408, 2944), B(0.5, 1408, 2816),  B(0.52, 1408, 2688),
    B(0.57, 1536, 2688), B(0.6, 1536, 2560),  B(0.68, 1664, 2432), B(0.72, 1664, 2304),
    B(0.78, 1792, 2304), B(0.82, 1792, 2176), B(0.88, 1920, 2176), B(0.94, 1920, 2048),
    B(1.0, 2048, 2048),  B(1.07, 2048, 1920), B(1.13, 2176, 1920), B(1.21, 2176, 1792),
    B(1.29, 2304, 1792), B(1.38, 2304, 1664), B(1.46, 2432, 1664), B(1.67, 2560, 1536),
    B(1.75, 2688, 1536), B(2.0, 2816, 1408),  B(2.09, 2944, 1408), B(2.4, 3072, 1280),
    B(2.5, 3200, 1280),  B(2.89, 3328, 1152), B(3.0, 3456, 1152),  B(3.11, 3584, 1152),
    B(3.62, 3712, 1024), B(3.75, 3840, 1024), B(3.88, 3968, 1024), B(4.0, 4096, 1024),
};
// ASPECT_RATIO_4096_BIN: 40 buckets
constexpr AspectBucket k4096Buckets[] = {
    B(0.25, 2048, 8192), B(0.26, 2048, 7936), B(0.27, 2048, 7680), B(0.28, 2048, 7424),
    B(0.32, 2304, 7168), B(0.33, 2304, 6912), B(0.35, 2304, 6656), B(0.4, 2560, 6400),
    B(0.42, 2560, 6144), B(0.48, 2816, 5888), B(0.5, 2816, 5632),  B(0.52, 2816, 5376),
    B(0.57, 3072, 5376), B(0.6, 3072, 5120),  B(0.68, 3328, 4864), B(0.72, 3328, 4608),
    B(0.78, 3584, 4608), B(0.82, 3584, 4352), B(0.88, 3840, 4352), B(0.94, 3840, 4096),
    B(1.0, 4096, 4096),  B(1.07, 4096, 3840), B(1.13, 4352, 3840), B(1.21, 4352, 3584),
    B(1.29, 4608, 3584), B(1.38, 4608, 3328), B(1.46, 4864, 3328), B(1.67, 5120, 3072),
    B(1.75, 5376, 3072), B(2.0, 5632, 2816),  B(2.09, 5888, 2816), B(2.4, 6144, 2560),
    B(2.5, 6400, 2560),  B(2.89, 6656, 2304), B(3.0, 6912, 2304),  B(3.11, 7168, 2304),
    B(3.62, 7424, 2048), B(3.75, 7680, 2048), B(3.88, 7936, 2048), B(4.0, 8192, 2048),
};
#undef B
#undef SF_BUCKET

template <size_t N>
AspectBucketTable table_of(const AspectBucket (&buckets)[N]) {
    return {buckets, N};
}

}  // namespace

bool is_bucket_resolution(int resolution) {
    return resolution == 512 || resolution == 1024 || resolution == 2048 || resolution == 4096;
}

int nearest_bucket_resolution(int resolution) {
    if (resolution < 256 || resolution > 8192 || resolution % 32 != 0) {
        throw Error::InvalidArgument("--resolution must be a multiple of 32 in [256, 8192], got " +
                                     std::to_string(resolution));
    }
    int best = 512;
    for (const int table : {512, 1024, 2048, 4096}) {
        if (std::abs(std::log(static_cast<double>(resolution) / table)) <
            std::abs(std::log(static_cast<double>(resolution) / best)))
            best = table;
    }
    return best;
}

AspectBucketTable aspect_bucket_table(int resolution) {
    switch (resolution) {
        case 512:
            return table_of(k512Buckets);
        case 1024:
            return table_of(k1024Buckets);
        case 2048:
            return table_of(k2048Buckets);
        case 4096:
            return table_of(k4096Buckets);
        default:
            break;
    }
    throw Error::InvalidArgument("resolution " + std::to_string(resolution) +
                                 " has no aspect-ratio bucket table (use 512, 1024, 2048 or 4096)");
}

const AspectBucket& closest_aspect_bucket(int resolution, int height, int width) {
    const AspectBucketTable table = aspect_bucket_table(resolution);
    const double ratio = static_cast<double>(height) / width;
    const AspectBucket* best = table.begin();
    for (const AspectBucket& bucket : table) {
        if (std::abs(bucket.ratio_value - ratio) < std::abs(best->ratio_value - ratio)) {
            best = &bucket;
        }
    }
    return *best;
}

std::string bucket_table_fingerprint(int resolution) {
    // FNV-1a 64 over "key:HxW;" for every bucket in order: no dependency, stable across builds.
    uint64_t hash = 0xcbf29ce484222325ull;
    for (const AspectBucket& bucket : aspect_bucket_table(resolution)) {
        const std::string item = std::string(bucket.ratio) + ":" + std::to_string(bucket.height) +
                                 "x" + std::to_string(bucket.width) + ";";
        for (unsigned char c : item) {
            hash = (hash ^ c) * 0x100000001b3ull;
        }
    }
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash));
    return "sana-ar" + std::to_string(resolution) + "-" + hex;
}

SourceCrop plan_cover_crop(int height, int width, int bucket_height, int bucket_width) {
    const double scale = std::max(static_cast<double>(bucket_height) / height,
                                  static_cast<double>(bucket_width) / width);
    // On the side that sets the scale this is exactly the full side; on the other it is the
    // bucket side divided by the scale, rounded to a whole pixel.
    auto covered = [scale](int bucket_side, int side) {
        const long span = std::lround(bucket_side / scale);
        return static_cast<int>(std::clamp<long>(span, 1, side));
    };
    SourceCrop crop;
    crop.height = covered(bucket_height, height);
    crop.width = covered(bucket_width, width);
    crop.y = (height - crop.height) / 2;
    crop.x = (width - crop.width) / 2;
    return crop;
}

}  // namespace sf::stages

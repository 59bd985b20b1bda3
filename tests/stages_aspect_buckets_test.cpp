// Sana's bucket tables and the choice of bucket, pinned against diffusers' Python.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>

#include "core/error.h"
#include "stages/image/aspect_buckets.h"

namespace sf::stages {
namespace {

TEST(AspectBuckets, TablesHaveDiffusersShape) {
    struct Expect {
        int resolution;
        size_t size;
        int first_h, first_w, square, last_h, last_w;
    };
    for (const Expect& e :
         {Expect{512, 33, 256, 1024, 512, 1024, 256}, Expect{1024, 33, 512, 2048, 1024, 2048, 512},
          Expect{2048, 40, 1024, 4096, 2048, 4096, 1024},
          Expect{4096, 40, 2048, 8192, 4096, 8192, 2048}}) {
        const AspectBucketTable table = aspect_bucket_table(e.resolution);
        ASSERT_EQ(table.size, e.size) << e.resolution;
        EXPECT_STREQ(table.begin()->ratio, "0.25");
        EXPECT_EQ(table.begin()->height, e.first_h);
        EXPECT_EQ(table.begin()->width, e.first_w);
        EXPECT_STREQ((table.end() - 1)->ratio, "4.0");
        EXPECT_EQ((table.end() - 1)->height, e.last_h);
        EXPECT_EQ((table.end() - 1)->width, e.last_w);
        EXPECT_EQ(closest_aspect_bucket(e.resolution, 7, 7).height, e.square);
        double previous = 0;
        for (const AspectBucket& b : table) {
            // Keys ascend, parse to their value, and sit within 0.03 of the bucket's own ratio.
            EXPECT_GT(b.ratio_value, previous) << b.ratio;
            previous = b.ratio_value;
            EXPECT_EQ(std::strtod(b.ratio, nullptr), b.ratio_value) << b.ratio;
            EXPECT_NEAR(static_cast<double>(b.height) / b.width, b.ratio_value, 0.03) << b.ratio;
            EXPECT_EQ(b.height % 32, 0) << b.ratio;
            EXPECT_EQ(b.width % 32, 0) << b.ratio;
        }
    }
    // 512 is 1024 halved and 4096 is 2048 doubled, entry for entry, upstream too.
    const AspectBucketTable t512 = aspect_bucket_table(512), t1024 = aspect_bucket_table(1024);
    for (size_t i = 0; i < t512.size; ++i) {
        EXPECT_EQ(t512.buckets[i].height * 2, t1024.buckets[i].height);
        EXPECT_EQ(t512.buckets[i].width * 2, t1024.buckets[i].width);
    }
    const AspectBucketTable t2048 = aspect_bucket_table(2048), t4096 = aspect_bucket_table(4096);
    for (size_t i = 0; i < t2048.size; ++i) {
        EXPECT_EQ(t2048.buckets[i].height * 2, t4096.buckets[i].height);
        EXPECT_EQ(t2048.buckets[i].width * 2, t4096.buckets[i].width);
    }
}

TEST(AspectBuckets, SpotValuesFromUpstream) {
    const AspectBucket& b = closest_aspect_bucket(4096, 2890, 1000);
    EXPECT_STREQ(b.ratio, "2.89");
    EXPECT_EQ(b.height, 6656);
    EXPECT_EQ(b.width, 2304);
    const AspectBucket& c = closest_aspect_bucket(2048, 26, 100);
    EXPECT_STREQ(c.ratio, "0.26");
    EXPECT_EQ(c.height, 1024);
    EXPECT_EQ(c.width, 3968);
}

// Expected values computed with diffusers' classify_height_width_bin on the same tables.
TEST(AspectBuckets, ClosestBucketMatchesDiffusers) {
    struct Case {
        int h, w, resolution;
        const char* ratio;
        int bucket_h, bucket_w;
    };
    const Case cases[] = {
        {1024, 1024, 1024, "1.0", 1024, 1024},  {1024, 768, 1024, "1.29", 1152, 896},
        {768, 1024, 1024, "0.72", 832, 1152},   {1080, 1920, 1024, "0.57", 768, 1344},
        {1920, 1080, 1024, "1.75", 1344, 768},  {10, 1000, 1024, "0.25", 512, 2048},
        {1000, 10, 1024, "4.0", 2048, 512},     {600, 800, 512, "0.72", 416, 576},
        {800, 600, 512, "1.29", 576, 448},      {3000, 4000, 2048, "0.72", 1664, 2304},
        {4000, 3000, 4096, "1.29", 4608, 3584}, {1000, 3000, 2048, "0.33", 1152, 3456},
        {3000, 1000, 4096, "3.0", 6912, 2304},  {750, 1000, 1024, "0.72", 832, 1152},
        {331, 1000, 2048, "0.33", 1152, 3456},  {1000, 331, 2048, "3.0", 3456, 1152},
        {100, 100, 512, "1.0", 512, 512},       {4032, 3024, 1024, "1.29", 1152, 896},
        {720, 1280, 2048, "0.57", 1536, 2688},
    };
    for (const Case& c : cases) {
        const AspectBucket& b = closest_aspect_bucket(c.resolution, c.h, c.w);
        EXPECT_STREQ(b.ratio, c.ratio) << c.h << "x" << c.w << " @" << c.resolution;
        EXPECT_EQ(b.height, c.bucket_h) << c.h << "x" << c.w;
        EXPECT_EQ(b.width, c.bucket_w) << c.h << "x" << c.w;
    }
}

TEST(AspectBuckets, CoverCropKeepsTheCenteredRegionThatFillsTheBucket) {
    // Same ratio: the whole image.
    SourceCrop c = plan_cover_crop(2048, 2048, 1024, 1024);
    EXPECT_EQ(c.y, 0);
    EXPECT_EQ(c.x, 0);
    EXPECT_EQ(c.height, 2048);
    EXPECT_EQ(c.width, 2048);
    // 1920x1080 into [768, 1344]: diffusers resizes to 768x1365 and crops x 10..1354, i.e.
    // source columns 14.06 .. 1904.06; we keep 1890 columns from 15.
    c = plan_cover_crop(1080, 1920, 768, 1344);
    EXPECT_EQ(c.height, 1080);
    EXPECT_EQ(c.width, 1890);
    EXPECT_EQ(c.x, 15);
    EXPECT_EQ(c.y, 0);
    // diffusers' int() would resize 1000x3000 to 1152x3455, one column short of the bucket.
    c = plan_cover_crop(1000, 3000, 1152, 3456);
    EXPECT_EQ(c.width, 3000);
    EXPECT_EQ(c.height, 1000);
    // A panorama at 4096: the crop is a small slice, never a scaled 8192-high image.
    c = plan_cover_crop(256, 200000, 8192, 2048);
    EXPECT_EQ(c.height, 256);
    EXPECT_EQ(c.width, 64);
    EXPECT_EQ(c.x, (200000 - 64) / 2);
}

TEST(AspectBuckets, FingerprintIsStableAndDistinct) {
    std::set<std::string> seen;
    for (int r : {512, 1024, 2048, 4096}) {
        const std::string f = bucket_table_fingerprint(r);
        EXPECT_EQ(f, bucket_table_fingerprint(r));
        EXPECT_EQ(f.rfind("sana-ar" + std::to_string(r) + "-", 0), 0u) << f;
        seen.insert(f.substr(f.size() - 16));
    }
    EXPECT_EQ(seen.size(), 4u);
    // Pinned (recomputed in Python from diffusers' dict): a change here means latents cached
    // by older runs no longer match the tables.
    EXPECT_EQ(bucket_table_fingerprint(1024), "sana-ar1024-5ee14b9684f87823");
}

TEST(AspectBuckets, UnknownResolutionIsAnInvalidArgument) {
    try {
        aspect_bucket_table(768);
        FAIL() << "no throw";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find("768"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(is_bucket_resolution(256));
    EXPECT_TRUE(is_bucket_resolution(2048));
}

}  // namespace
}  // namespace sf::stages

// --resolution takes any multiple of 32, mapped to the nearest table on a log scale.
TEST(AspectBuckets, AnyMultipleOf32MapsToTheNearestTable) {
    EXPECT_EQ(sf::stages::nearest_bucket_resolution(512), 512);
    EXPECT_EQ(sf::stages::nearest_bucket_resolution(640), 512);
    EXPECT_EQ(sf::stages::nearest_bucket_resolution(768), 1024);
    EXPECT_EQ(sf::stages::nearest_bucket_resolution(1536), 2048);
    EXPECT_EQ(sf::stages::nearest_bucket_resolution(3008), 4096);
    EXPECT_EQ(sf::stages::nearest_bucket_resolution(256), 512);
    for (const int bad : {500, 224, 9000, 0, -32}) {
        EXPECT_THROW(sf::stages::nearest_bucket_resolution(bad), sf::Error) << bad;
    }
}

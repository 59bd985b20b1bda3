// decode_image: every format and pixel layout to an RGB tensor in the right bucket; every bad
// input rejected with its reason, and a header bomb rejected before anything is allocated.
#if defined(SANAFLOW_WITH_MEDIA)

#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/flip.h>
#include <gtest/gtest.h>

#include <chrono>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "stages/image/aspect_buckets.h"
#include "stages/image/decode_image.h"
#include "tests/stages_test_util.h"

namespace sf::stages {
namespace {

using sf::test::encode_image;

DecodeImageStage stage(int resolution = 512, int min_side = 16, bool uint8 = false) {
    DecodeImageConfig config;
    config.resolution = resolution;
    config.min_side = min_side;
    config.output_uint8 = uint8;
    return DecodeImageStage(config);
}

// The reason a run_bytes call rejects with, or "" when it does not.
std::string reject_reason(const DecodeImageStage& s, const std::string& bytes,
                          const std::string& name = "img") {
    try {
        s.run_bytes(bytes, name);
    } catch (const Reject& r) {
        return r.reason();
    }
    return "";
}

// Mean of channel c (RGB order) over a [3, H, W] tensor, in [-1, 1].
double channel_mean(const DecodedImage& d, int c) { return d.pixels[c].mean().item<double>(); }

TEST(DecodeImage, ConfigIsValidatedNamingTheField) {
    auto message_for = [](DecodeImageConfig c) -> std::string {
        try {
            DecodeImageStage s(c);
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
            return e.what();
        }
        return "";
    };
    DecodeImageConfig c;
    c.resolution = 768;
    EXPECT_NE(message_for(c).find("resolution 768"), std::string::npos);
    c = {};
    c.min_side = 0;
    EXPECT_NE(message_for(c).find("min_side"), std::string::npos);
    c = {};
    c.max_pixels = -5;
    EXPECT_NE(message_for(c).find("max_pixels"), std::string::npos);
    c = {};
    c.max_file_bytes = int64_t{1} << 40;
    EXPECT_NE(message_for(c).find("max_file_bytes"), std::string::npos);
    EXPECT_EQ(message_for(DecodeImageConfig{}), "");
}

TEST(DecodeImage, SquareImageFillsTheSquareBucketWithFullRange) {
    // Left half black, right half white: a lossless PNG keeps both ends of the range.
    cv::Mat image(1024, 1024, CV_8UC3, cv::Scalar(0, 0, 0));
    image(cv::Rect(512, 0, 512, 1024)).setTo(cv::Scalar(255, 255, 255));
    const DecodedImage d = stage(1024).run_bytes(encode_image(".png", image), "square.png");
    EXPECT_EQ(d.pixels.sizes(), (std::vector<int64_t>{3, 1024, 1024}));
    EXPECT_EQ(d.pixels.scalar_type(), at::kFloat);
    EXPECT_TRUE(d.pixels.is_contiguous());
    EXPECT_EQ(d.bucket_ratio, "1.0");
    EXPECT_EQ(d.bucket_h, 1024);
    EXPECT_EQ(d.bucket_w, 1024);
    EXPECT_EQ(d.pixels.min().item<float>(), -1.0f);
    EXPECT_EQ(d.pixels.max().item<float>(), 1.0f);
    EXPECT_EQ(d.pixels[0][0][0].item<float>(), -1.0f);
    EXPECT_EQ(d.pixels[0][0][1023].item<float>(), 1.0f);
}

TEST(DecodeImage, PortraitGoesToItsBucketAndShapeEqualsBucket) {
    cv::Mat image(800, 600, CV_8UC3, cv::Scalar(40, 80, 120));  // 3:4 portrait
    const DecodedImage d = stage(512).run_bytes(encode_image(".png", image), "portrait.png");
    EXPECT_EQ(d.bucket_ratio, "1.29");
    EXPECT_EQ(d.pixels.sizes(), (std::vector<int64_t>{3, 576, 448}));
    EXPECT_EQ(d.orig_h, 800);
    EXPECT_EQ(d.orig_w, 600);
    // Uniform colour survives resizing exactly; value = x / 127.5 - 1.
    EXPECT_NEAR(channel_mean(d, 0), 120 / 127.5 - 1, 1e-6);
    EXPECT_NEAR(channel_mean(d, 2), 40 / 127.5 - 1, 1e-6);

    const DecodedImage wide = stage(1024, 16).run_bytes(
        encode_image(".png", cv::Mat(50, 2000, CV_8UC3, cv::Scalar::all(9))), "wide.png");
    EXPECT_EQ(wide.bucket_ratio, "0.25");
    EXPECT_EQ(wide.pixels.sizes(), (std::vector<int64_t>{3, 512, 2048}));
}

TEST(DecodeImage, ChannelsAreRGB) {
    cv::Mat red(64, 64, CV_8UC3, cv::Scalar(0, 0, 255));  // OpenCV is BGR
    const DecodedImage d = stage().run_bytes(encode_image(".png", red), "red.png");
    EXPECT_EQ(channel_mean(d, 0), 1.0);
    EXPECT_EQ(channel_mean(d, 1), -1.0);
    EXPECT_EQ(channel_mean(d, 2), -1.0);
    const DecodedImage u8 = stage(512, 16, true).run_bytes(encode_image(".png", red), "red.png");
    EXPECT_EQ(u8.pixels.scalar_type(), at::kByte);
    EXPECT_EQ(u8.pixels[0].min().item<int>(), 255);
    EXPECT_EQ(u8.pixels[2].max().item<int>(), 0);
}

TEST(DecodeImage, EveryFormatDecodes) {
    cv::Mat image(96, 128, CV_8UC3, cv::Scalar(200, 100, 50));
    const std::vector<std::pair<std::string, std::string>> files = {
        {"jpeg", encode_image(".jpg", image, {cv::IMWRITE_JPEG_QUALITY, 95})},
        {"png", encode_image(".png", image)},
        {"webp lossy", encode_image(".webp", image, {cv::IMWRITE_WEBP_QUALITY, 90})},
        {"webp lossless", encode_image(".webp", image, {cv::IMWRITE_WEBP_QUALITY, 101})},
        {"bmp", encode_image(".bmp", image)},
        {"tiff", encode_image(".tif", image)},
    };
    for (const auto& [name, bytes] : files) {
        const DecodedImage d = stage().run_bytes(bytes, name);
        // 96 / 128 = 0.75 lies as far from 0.72 as from 0.78; like Python's min(), the first wins.
        EXPECT_EQ(d.bucket_ratio, "0.72") << name;
        EXPECT_EQ(d.pixels.sizes(), (std::vector<int64_t>{3, 416, 576})) << name;
        EXPECT_NEAR(channel_mean(d, 0), 50 / 127.5 - 1, 0.03) << name;
        EXPECT_NEAR(channel_mean(d, 1), 100 / 127.5 - 1, 0.03) << name;
        EXPECT_NEAR(channel_mean(d, 2), 200 / 127.5 - 1, 0.03) << name;
    }
}

TEST(DecodeImage, GrayAndAlphaLayoutsBecomeRGBOnWhite) {
    // Gray: three equal channels.
    cv::Mat gray(64, 64, CV_8UC1, cv::Scalar(51));
    DecodedImage d = stage().run_bytes(encode_image(".png", gray), "gray.png");
    EXPECT_EQ(d.pixels.size(0), 3);
    for (int c = 0; c < 3; ++c) EXPECT_NEAR(channel_mean(d, c), 51 / 127.5 - 1, 1e-6);

    // Gray + alpha (PNG colour type 4, written by hand): black, left half transparent.
    std::vector<std::string> rows(64);
    for (std::string& row : rows) {
        for (int x = 0; x < 64; ++x) row += {'\0', static_cast<char>(x < 32 ? 0 : 255)};
    }
    d = stage().run_bytes(test::make_png(64, 64, 4, 8, rows), "gray_alpha.png");
    EXPECT_EQ(d.pixels[1][10][5].item<float>(), 1.0f);     // transparent -> white
    EXPECT_EQ(d.pixels[1][10][500].item<float>(), -1.0f);  // opaque black stays black

    // RGBA: transparent black -> white; half-transparent red -> pink.
    cv::Mat rgba(64, 64, CV_8UC4, cv::Scalar(0, 0, 0, 0));
    rgba(cv::Rect(32, 0, 32, 64)).setTo(cv::Scalar(0, 0, 255, 128));
    d = stage(512, 16, true).run_bytes(encode_image(".png", rgba), "rgba.png");
    EXPECT_EQ(d.pixels[0][10][5].item<int>(), 255);
    EXPECT_EQ(d.pixels[2][10][5].item<int>(), 255);
    EXPECT_EQ(d.pixels[0][10][500].item<int>(), 255);  // 255*128/255 + 255*127/255
    EXPECT_EQ(d.pixels[2][10][500].item<int>(), 127);  // 0*128/255 + 255*127/255

    // 16-bit PNG and TIFF: 257 * v -> v.
    cv::Mat deep(64, 64, CV_16UC3, cv::Scalar(257 * 10, 257 * 128, 65535));
    for (const std::string ext : {".png", ".tif"}) {
        d = stage(512, 16, true).run_bytes(encode_image(ext, deep), "deep" + ext);
        EXPECT_EQ(d.pixels[0].min().item<int>(), 255) << ext;
        EXPECT_EQ(d.pixels[1].max().item<int>(), 128) << ext;
        EXPECT_EQ(d.pixels[2].max().item<int>(), 10) << ext;
    }
}

// A 16x16 Adobe-style CMYK JPEG written with libjpeg (OpenCV cannot write CMYK): left half
// red (C=255 M=0 Y=0 K=255 in Adobe's inverted convention), right half white.
const unsigned char kCmykJpeg[] = {
#include "tests/stages_cmyk_jpeg.inc"
};

TEST(DecodeImage, CMYKJpegBecomesRGB) {
    const std::string bytes(reinterpret_cast<const char*>(kCmykJpeg), sizeof(kCmykJpeg));
    const DecodedImage d = stage(512, 16, true).run_bytes(bytes, "cmyk.jpg");
    EXPECT_EQ(d.pixels.sizes(), (std::vector<int64_t>{3, 512, 512}));
    EXPECT_GT(d.pixels[0][256][50].item<int>(), 240);  // red
    EXPECT_LT(d.pixels[1][256][50].item<int>(), 15);
    EXPECT_LT(d.pixels[2][256][50].item<int>(), 15);
    EXPECT_GT(d.pixels[1][256][460].item<int>(), 240);  // white
}

// A 576 x 448 JPEG is exactly a 512 bucket in either orientation, so the output must equal
// OpenCV's own oriented decode (IMREAD_COLOR applies EXIF) pixel for pixel, for all eight.
TEST(DecodeImage, ExifOrientationMatchesOpenCVForAllEight) {
    cv::Mat image(576, 448, CV_8UC3, cv::Scalar(255, 0, 0));          // blue
    image(cv::Rect(0, 0, 100, 150)).setTo(cv::Scalar(0, 0, 255));     // red top-left corner
    image(cv::Rect(300, 500, 100, 50)).setTo(cv::Scalar(0, 255, 0));  // green near bottom-right
    const std::string plain = encode_image(".jpg", image, {cv::IMWRITE_JPEG_QUALITY, 100});
    const DecodeImageStage s = stage(512, 16, true);
    for (int o = 1; o <= 8; ++o) {
        const std::string bytes = test::with_exif_orientation(plain, o, o % 2 == 0);
        const DecodedImage d = s.run_bytes(bytes, "o" + std::to_string(o));
        const cv::Mat expected = cv::imdecode(
            cv::Mat(1, static_cast<int>(bytes.size()), CV_8U, const_cast<char*>(bytes.data())),
            cv::IMREAD_COLOR);
        ASSERT_EQ(d.pixels.size(1), expected.rows) << "orientation " << o;
        ASSERT_EQ(d.pixels.size(2), expected.cols) << "orientation " << o;
        EXPECT_EQ(d.orig_h, expected.rows);
        int64_t mismatches = 0;
        const auto* p = d.pixels.data_ptr<uint8_t>();
        const int64_t plane = expected.rows * expected.cols;
        for (int y = 0; y < expected.rows; ++y) {
            for (int x = 0; x < expected.cols; ++x) {
                const cv::Vec3b bgr = expected.at<cv::Vec3b>(y, x);
                const int64_t i = y * expected.cols + x;
                mismatches +=
                    p[i] != bgr[2] || p[plane + i] != bgr[1] || p[2 * plane + i] != bgr[0];
            }
        }
        EXPECT_EQ(mismatches, 0) << "orientation " << o;
    }
    // Orientation 6 is "rotate 90 clockwise": the red top-left corner ends top-right.
    const DecodedImage d6 = s.run_bytes(test::with_exif_orientation(plain, 6), "o6");
    EXPECT_EQ(d6.bucket_ratio, "0.78");
    EXPECT_GT(d6.pixels[0][10][570].item<int>(), 200);
    EXPECT_LT(d6.pixels[0][10][5].item<int>(), 50);
}

// Why the stage orients by itself: OpenCV skips EXIF whenever the flags are IMREAD_UNCHANGED,
// which the stage needs to see alpha and 16 bits.
TEST(DecodeImage, OpenCVIgnoresExifUnderUnchanged) {
    const std::string bytes = test::with_exif_orientation(
        encode_image(".jpg", cv::Mat(30, 40, CV_8UC3, cv::Scalar::all(0))), 6);
    const cv::Mat buffer(1, static_cast<int>(bytes.size()), CV_8U, const_cast<char*>(bytes.data()));
    EXPECT_EQ(cv::imdecode(buffer, cv::IMREAD_UNCHANGED).size(), cv::Size(40, 30));
    EXPECT_EQ(cv::imdecode(buffer, cv::IMREAD_COLOR).size(), cv::Size(30, 40));
}

// PNG keeps EXIF in an eXIf chunk and WebP in an EXIF chunk of the extended (VP8X) container.
TEST(DecodeImage, PNGAndWebPExifOrientationIsApplied) {
    const DecodeImageStage s = stage(512, 16);
    std::vector<std::string> rows(40, std::string(30, '\x40'));  // 30 wide, 40 high, gray
    const std::string png =
        test::make_png(30, 40, 0, 8, rows, test::png_chunk("eXIf", test::exif_block(6)));
    DecodedImage d = s.run_bytes(png, "exif.png");
    EXPECT_EQ(d.orig_h, 30);
    EXPECT_EQ(d.orig_w, 40);
    EXPECT_EQ(d.bucket_ratio, "0.72");

    // OpenCV's lossless WebP is a plain "VP8L" file; rewrap it as VP8X + VP8L + EXIF.
    const std::string simple = encode_image(".webp", cv::Mat(40, 30, CV_8UC3, cv::Scalar::all(90)),
                                            {cv::IMWRITE_WEBP_QUALITY, 101});
    auto le = [](uint32_t v, int n) {
        std::string out;
        for (int i = 0; i < n; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFF);
        return out;
    };
    const std::string exif = test::exif_block(8);
    std::string body = "WEBP";
    body += "VP8X" + le(10, 4) + le(0x08, 4) + le(30 - 1, 3) + le(40 - 1, 3);  // 0x08: has EXIF
    body += simple.substr(12);  // the VP8L chunk, padding included
    body += "EXIF" + le(static_cast<uint32_t>(exif.size()), 4) + exif;
    if (exif.size() % 2 != 0) body += '\0';
    const std::string webp = "RIFF" + le(static_cast<uint32_t>(body.size()), 4) + body;
    d = s.run_bytes(webp, "exif.webp");
    EXPECT_EQ(d.orig_h, 30);
    EXPECT_EQ(d.orig_w, 40);
    EXPECT_NEAR(channel_mean(d, 1), 90 / 127.5 - 1, 1e-6);
}

// OpenCV's TIFF reader orients by itself; the stage must neither skip nor repeat it. A TIFF
// with Orientation o must come out exactly like a PNG with EXIF orientation o (both lossless).
TEST(DecodeImage, TiffOrientationTagIsAppliedOnce) {
    cv::Mat image(576, 448, CV_8UC3);
    cv::randu(image, 0, 255);
    std::string rgb;
    std::vector<std::string> rows;
    for (int y = 0; y < image.rows; ++y) {
        std::string row;
        for (int x = 0; x < image.cols; ++x) {
            const cv::Vec3b bgr = image.at<cv::Vec3b>(y, x);
            row +=
                {static_cast<char>(bgr[2]), static_cast<char>(bgr[1]), static_cast<char>(bgr[0])};
        }
        rgb += row;
        rows.push_back(row);
    }
    const DecodeImageStage s = stage(512, 16, true);
    for (int o = 1; o <= 8; ++o) {
        const DecodedImage tiff = s.run_bytes(test::make_tiff(448, 576, rgb, o), "o.tif");
        const DecodedImage png = s.run_bytes(
            test::make_png(448, 576, 2, 8, rows, test::png_chunk("eXIf", test::exif_block(o))),
            "o.png");
        ASSERT_EQ(tiff.pixels.sizes(), png.pixels.sizes()) << "orientation " << o;
        EXPECT_TRUE(tiff.pixels.equal(png.pixels)) << "orientation " << o;
        EXPECT_EQ(tiff.orig_h, o >= 5 ? 448 : 576);
    }
}

TEST(DecodeImage, TiledTiffWithMirroredOrientationIsRefused) {
    const std::string rgb(64 * 64 * 3, '\x55');
    const DecodeImageStage s = stage(512, 16);
    EXPECT_EQ(reject_reason(s, test::make_tiff(64, 64, rgb, 1, true)), "");
    EXPECT_EQ(reject_reason(s, test::make_tiff(64, 64, rgb, 8, true)), "");
    EXPECT_EQ(reject_reason(s, test::make_tiff(64, 64, rgb, 6, true), "t.tif"),
              "t.tif: unsupported: tiled TIFF with orientation 6 (OpenCV decodes it scrambled)");
}

// A JPEG four times the bucket is decoded at 1/4 scale inside libjpeg; the result must be the
// same picture as the full decode + area average, to within JPEG noise, in every orientation.
TEST(DecodeImage, ReducedJpegDecodeMatchesFullDecode) {
    cv::Mat image(1800, 2400, CV_8UC3);
    for (int y = 0; y < image.rows; ++y) {
        for (int x = 0; x < image.cols; ++x) {
            image.at<cv::Vec3b>(y, x) = cv::Vec3b(x * 255 / 2400, y * 255 / 1800, 128);
        }
    }
    cv::circle(image, {600, 500}, 300, cv::Scalar(0, 0, 255), cv::FILLED);
    cv::GaussianBlur(image, image, cv::Size(0, 0), 6);  // no edge sharper than the bucket
    const std::string plain = encode_image(".jpg", image, {cv::IMWRITE_JPEG_QUALITY, 95});
    DecodeImageConfig config;
    config.resolution = 512;
    config.output_uint8 = true;
    const DecodeImageStage fast(config);
    config.jpeg_reduced_decode = false;
    const DecodeImageStage full(config);
    EXPECT_NE(fast.fingerprint(), full.fingerprint());
    for (int o : {1, 3, 6, 8}) {
        const std::string bytes = test::with_exif_orientation(plain, o);
        const DecodedImage a = fast.run_bytes(bytes, "fast");
        const DecodedImage b = full.run_bytes(bytes, "full");
        ASSERT_EQ(a.pixels.sizes(), b.pixels.sizes()) << o;
        EXPECT_EQ(a.bucket_ratio, o >= 5 ? "1.29" : "0.72");
        EXPECT_EQ(a.orig_h, o >= 5 ? 2400 : 1800);
        const at::Tensor diff = a.pixels.to(at::kFloat).sub(b.pixels.to(at::kFloat)).abs();
        EXPECT_LT(diff.mean().item<double>(), 0.5) << o;  // in 0..255 units
        // Where the blurred edge is steepest, the crop rounding to whole 1/4-scale pixels
        // (a quarter of an output pixel at most) shows as a few levels.
        EXPECT_LT(diff.max().item<double>(), 24.0) << o;
    }
}

TEST(DecodeImage, RejectsNameTheFileAndTheReason) {
    test::TempDir dir;
    const DecodeImageStage s = stage(512, 256);
    auto reason_for_path = [&](const std::string& path) -> std::string {
        try {
            s.run(path);
        } catch (const Reject& r) {
            return r.reason();
        }
        return "";
    };
    const std::string missing = dir.file("missing.png");
    EXPECT_EQ(reason_for_path(missing).rfind(missing + ": cannot read file", 0), 0u);
    EXPECT_NE(reason_for_path(dir.path().string()).find("cannot read file"), std::string::npos);

    std::string random(5000, '\0');
    for (size_t i = 0; i < random.size(); ++i) random[i] = static_cast<char>(i * 7919 % 251);
    EXPECT_EQ(reject_reason(s, random, "x.jpg"), "x.jpg: not an image or unsupported format");
    EXPECT_EQ(reject_reason(s, "", "e.png"),
              "e.png: not an image or unsupported format (empty file)");

    cv::Mat image(300, 400, CV_8UC3);
    cv::randu(image, 0, 255);
    for (const std::string ext : {".jpg", ".png", ".webp", ".bmp", ".tif"}) {
        const std::string bytes = encode_image(ext, image);
        const std::string reason = reject_reason(s, bytes.substr(0, bytes.size() * 2 / 3), ext);
        EXPECT_EQ(reason.rfind(ext + ": truncated or corrupt image data", 0), 0u) << reason;
    }
    // Damage inside a PNG's compressed data: the structure is whole, libpng's CRC check fails.
    std::string png = encode_image(".png", image);
    png[png.size() / 2] ^= 0x55;
    EXPECT_NE(reject_reason(s, png).find("truncated or corrupt image data"), std::string::npos);

    EXPECT_EQ(reject_reason(s, encode_image(".png", cv::Mat(80, 100, CV_8UC3, cv::Scalar::all(0))),
                            "small.png"),
              "small.png: image too small: 100x80, minimum side is 256");
}

TEST(DecodeImage, HeaderBombIsRejectedBeforeAnyAllocation) {
    const DecodeImageStage s = stage();
    // Complete, well-formed PNGs: one stored-deflate row of data, IEND, valid CRCs.
    const std::string bombs[] = {
        test::make_png(100000, 100000, 2, 8, {std::string(300, '\0')}),
        test::make_png(100000, 100000, 2, 8, {}),
        std::string("\xFF\xD8\xFF\xC0\x00\x11\x08\xFD\xE8\xFF\xDC\x03", 12) + std::string(9, '\1'),
    };
    mem::reset_peak();
    const int64_t before = mem::cpu_stats().current;
    const auto start = std::chrono::steady_clock::now();
    for (const std::string& bomb : bombs) {
        const std::string reason = reject_reason(s, bomb, "bomb");
        EXPECT_NE(reason.find("exceed the limit of 178956970 pixels (decompression bomb?)"),
                  std::string::npos)
            << reason;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(mem::cpu_stats().peak, before);  // no tensor memory at all
    EXPECT_LT(seconds, 0.05);
    EXPECT_EQ(reject_reason(s, bombs[0]),
              "img: declared dimensions 100000x100000 exceed the limit of 178956970 pixels "
              "(decompression bomb?)");
    // The limit is configurable: 65500 x 65000 passes a larger one and fails as truncated.
    DecodeImageConfig big;
    big.max_pixels = int64_t{5} << 30;
    EXPECT_NE(reject_reason(DecodeImageStage(big), bombs[2]).find("truncated or corrupt"),
              std::string::npos);
}

TEST(DecodeImage, UnicodePathAndConcurrentCalls) {
    test::TempDir dir;
    const std::string path = dir.file("café_日本_🐱.png");
    cv::Mat image(300, 260, CV_8UC3, cv::Scalar(10, 20, 30));
    test::write_file(path, encode_image(".png", image));
    const DecodeImageStage s = stage(512, 256);
    const DecodedImage one = s.run(path);
    EXPECT_EQ(one.orig_h, 300);
    EXPECT_EQ(one.orig_w, 260);
    std::vector<DecodedImage> results(4);
    std::vector<std::thread> threads;
    for (auto& r : results) threads.emplace_back([&] { r = s.run(path); });
    for (auto& t : threads) t.join();
    for (const auto& r : results) EXPECT_TRUE(r.pixels.equal(one.pixels));
}

TEST(DecodeImage, ReusedBufferIsFilledInPlace) {
    const std::string png = encode_image(".png", cv::Mat(300, 400, CV_8UC3, cv::Scalar(0, 0, 255)));
    const DecodeImageStage s = stage(512);
    const DecodedImage fresh = s.run_bytes(png, "fresh");
    at::Tensor buffer = at::empty({3, 600, 600}, at::kFloat);  // any shape with enough room
    const void* memory = buffer.data_ptr();
    const DecodedImage reused = s.run_bytes(png, "reused", buffer);
    EXPECT_EQ(reused.pixels.data_ptr(), memory);
    EXPECT_EQ(reused.pixels.sizes(), fresh.pixels.sizes());
    EXPECT_TRUE(reused.pixels.equal(fresh.pixels));
    // Too small, or the wrong dtype: a new tensor, the buffer untouched.
    const at::Tensor unusable_buffers[] = {at::empty({3, 8, 8}, at::kFloat),
                                           at::empty({3, 600, 600}, at::kByte)};
    for (const at::Tensor& unusable : unusable_buffers) {
        const DecodedImage d = s.run_bytes(png, "unusable", unusable);
        EXPECT_NE(d.pixels.data_ptr(), unusable.data_ptr());
        EXPECT_TRUE(d.pixels.equal(fresh.pixels));
    }
}

TEST(DecodeImage, FingerprintFollowsWhatChangesTheOutput) {
    const std::string base = stage(1024).fingerprint();
    EXPECT_EQ(base, stage(1024).fingerprint());
    EXPECT_NE(base, stage(512).fingerprint());
    EXPECT_NE(base, stage(1024, 16, true).fingerprint());
    EXPECT_EQ(base, stage(1024, 300).fingerprint());  // min_side only decides what is rejected
    EXPECT_NE(base.find(bucket_table_fingerprint(1024)), std::string::npos);
}

// --center_crop: every image to one square of the side given (any multiple of 32, not only a
// table's), covering it and cropped at the center; the fingerprint changes only when it is on.
TEST(DecodeImage, CenterCropMakesOneSquareOfAnyImage) {
    DecodeImageConfig config;
    config.resolution = 512;
    config.min_side = 16;
    config.square_side = 384;
    const DecodeImageStage square(config);
    // A wide image: black left third, white middle third, black right third.
    cv::Mat image(300, 900, CV_8UC3, cv::Scalar::all(0));
    image(cv::Rect(300, 0, 300, 300)).setTo(cv::Scalar::all(255));
    const DecodedImage d = square.run_bytes(encode_image(".png", image), "wide.png");
    EXPECT_EQ(d.pixels.sizes(), (std::vector<int64_t>{3, 384, 384}));
    EXPECT_EQ(d.bucket_ratio, "1.0");
    // The center crop is the white third alone.
    EXPECT_NEAR(d.pixels.mean().item<double>(), 1.0, 0.02);
    EXPECT_EQ(square.bucket_for(200, 900).height, 384);
    EXPECT_NE(square.fingerprint(), stage(512).fingerprint());
    config.square_side = 100;
    EXPECT_THROW(DecodeImageStage{config}, Error);
}

// --random_flip: an image comes out as it is or mirrored exactly, which one fixed by its bytes,
// and across images both happen.
TEST(DecodeImage, RandomFlipMirrorsHalfTheImagesByTheirBytes) {
    DecodeImageConfig config;
    config.resolution = 512;
    config.min_side = 16;
    config.output_uint8 = true;
    const DecodeImageStage plain(config);
    config.random_flip = true;
    const DecodeImageStage flipping(config);
    EXPECT_NE(flipping.fingerprint(), plain.fingerprint());
    int flipped = 0;
    for (int i = 0; i < 16; ++i) {
        cv::Mat image(256, 256, CV_8UC3, cv::Scalar::all(0));
        image(cv::Rect(0, 0, 40 + i, 256)).setTo(cv::Scalar(200, 100, i));  // a left-side band
        const std::string bytes = encode_image(".png", image);
        const at::Tensor a = plain.run_bytes(bytes, "a.png").pixels;
        const at::Tensor b = flipping.run_bytes(bytes, "a.png").pixels;
        EXPECT_TRUE(at::equal(flipping.run_bytes(bytes, "again.png").pixels, b)) << "by bytes";
        if (flipping.flips(bytes)) {
            ++flipped;
            EXPECT_TRUE(at::equal(b, a.flip({2}))) << i;
        } else {
            EXPECT_TRUE(at::equal(b, a)) << i;
        }
    }
    EXPECT_GT(flipped, 0);
    EXPECT_LT(flipped, 16);
}

}  // namespace
}  // namespace sf::stages

#endif  // SANAFLOW_WITH_MEDIA

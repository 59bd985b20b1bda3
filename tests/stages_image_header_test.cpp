// The header sniffer: formats, declared sizes, EXIF orientation, truncation, and that no byte
// string makes it read outside its buffer.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "stages/image/image_header.h"
#include "tests/stages_test_util.h"

#if defined(SANAFLOW_WITH_MEDIA)
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#endif

namespace sf::stages {
namespace {

ImageHeader read(const std::string& bytes) {
    return read_image_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

TEST(ImageHeader, UnknownBytesAreUnknownFormat) {
    EXPECT_EQ(read("").format, ImageFormat::kUnknown);
    EXPECT_EQ(read("GIF89a....").format, ImageFormat::kUnknown);
    EXPECT_EQ(read("\xFF\xD8").format, ImageFormat::kUnknown);  // too short for the magic
    EXPECT_FALSE(read("hello").has_size());
}

TEST(ImageHeader, HandMadePNGDeclaresItsSize) {
    const std::string png = test::make_png(3, 2, 0, 8, {"abc", "def"});
    const ImageHeader h = read(png);
    EXPECT_EQ(h.format, ImageFormat::kPNG);
    EXPECT_EQ(h.width, 3);
    EXPECT_EQ(h.height, 2);
    EXPECT_TRUE(h.error.empty());
    EXPECT_TRUE(h.truncated.empty());
    EXPECT_FALSE(read(png.substr(0, png.size() - 12)).truncated.empty());  // IEND cut off
}

TEST(ImageHeader, BombHeadersReportTheirDeclaredSize) {
    // A PNG that claims 100000 x 100000 with no pixel data at all.
    const ImageHeader png = read(test::make_png(100000, 100000, 2, 8, {}));
    EXPECT_EQ(png.width, 100000);
    EXPECT_EQ(png.height, 100000);
    EXPECT_TRUE(png.has_size());
    // A JPEG: SOI, SOF0 declaring 65500 x 65000, nothing after.
    const std::string sof = std::string("\xFF\xD8\xFF\xC0\x00\x11\x08\xFD\xE8\xFF\xDC\x03", 12) +
                            std::string(9, '\x01');
    const ImageHeader jpeg = read(sof);
    EXPECT_EQ(jpeg.format, ImageFormat::kJPEG);
    EXPECT_EQ(jpeg.height, 65000);
    EXPECT_EQ(jpeg.width, 65500);
    EXPECT_FALSE(jpeg.truncated.empty());
}

TEST(ImageHeader, ExifOrientationInBothByteOrders) {
    for (int o = 1; o <= 8; ++o) {
        const std::string le = test::exif_block(o, false);
        const std::string be = test::exif_block(o, true);
        EXPECT_EQ(exif_orientation(reinterpret_cast<const uint8_t*>(le.data()), le.size()), o);
        EXPECT_EQ(exif_orientation(reinterpret_cast<const uint8_t*>(be.data()), be.size()), o);
    }
    const std::string bad = test::exif_block(9);
    EXPECT_EQ(exif_orientation(reinterpret_cast<const uint8_t*>(bad.data()), bad.size()), 1);
    EXPECT_EQ(exif_orientation(nullptr, 0), 1);
    const std::string prefixed = std::string("Exif\0\0", 6) + test::exif_block(6);
    EXPECT_EQ(exif_orientation(reinterpret_cast<const uint8_t*>(prefixed.data()), prefixed.size()),
              6);
}

TEST(ImageHeader, PNGeXIfChunkGivesOrientation) {
    const std::string png =
        test::make_png(3, 2, 0, 8, {"abc", "def"}, test::png_chunk("eXIf", test::exif_block(8)));
    EXPECT_EQ(read(png).orientation, 8);
}

TEST(ImageHeader, TiffOrientationTagIsRead) {
    const ImageHeader h = read(test::make_tiff(3, 2, std::string(18, '\x10'), 7));
    EXPECT_EQ(h.format, ImageFormat::kTIFF);
    EXPECT_EQ(h.width, 3);
    EXPECT_EQ(h.height, 2);
    EXPECT_EQ(h.orientation, 7);
    EXPECT_FALSE(h.tiled);
    EXPECT_TRUE(h.truncated.empty()) << h.truncated;
}

#if defined(SANAFLOW_WITH_MEDIA)

using sf::test::encode_image;

cv::Mat noise_image(int rows, int cols, int type = CV_8UC3) {
    cv::Mat image(rows, cols, type);
    cv::randu(image, 0, 255);
    return image;
}

struct Encoded {
    std::string ext;
    ImageFormat format;
    std::string bytes;
};

std::vector<Encoded> every_format(int rows, int cols) {
    const cv::Mat image = noise_image(rows, cols);
    return {
        {".jpg", ImageFormat::kJPEG, encode_image(".jpg", image)},
        {".jpg (progressive)", ImageFormat::kJPEG,
         encode_image(".jpg", image, {cv::IMWRITE_JPEG_PROGRESSIVE, 1})},
        {".png", ImageFormat::kPNG, encode_image(".png", image)},
        {".webp (lossy)", ImageFormat::kWebP,
         encode_image(".webp", image, {cv::IMWRITE_WEBP_QUALITY, 80})},
        {".webp (lossless)", ImageFormat::kWebP,
         encode_image(".webp", image, {cv::IMWRITE_WEBP_QUALITY, 101})},
        {".webp (alpha)", ImageFormat::kWebP,
         encode_image(".webp", noise_image(rows, cols, CV_8UC4))},
        {".bmp", ImageFormat::kBMP, encode_image(".bmp", image)},
        {".tif", ImageFormat::kTIFF, encode_image(".tif", image)},
        {".tif (16-bit)", ImageFormat::kTIFF,
         encode_image(".tif", noise_image(rows, cols, CV_16UC3))},
    };
}

TEST(ImageHeader, EveryFormatOpenCVWritesIsReadWhole) {
    for (const Encoded& e : every_format(37, 53)) {
        const ImageHeader h = read(e.bytes);
        EXPECT_EQ(h.format, e.format) << e.ext;
        EXPECT_EQ(h.width, 53) << e.ext;
        EXPECT_EQ(h.height, 37) << e.ext;
        EXPECT_EQ(h.orientation, 1) << e.ext;
        EXPECT_TRUE(h.error.empty()) << e.ext << ": " << h.error;
        EXPECT_TRUE(h.truncated.empty()) << e.ext << ": " << h.truncated;
    }
}

TEST(ImageHeader, CutFilesAreNeverReportedWhole) {
    for (const Encoded& e : every_format(40, 60)) {
        for (double keep : {0.1, 0.5, 0.9, 0.99}) {
            const auto cut = static_cast<size_t>(static_cast<double>(e.bytes.size()) * keep);
            const ImageHeader h = read(e.bytes.substr(0, cut));
            EXPECT_EQ(h.format, e.format) << e.ext << " cut to " << cut;
            EXPECT_TRUE(!h.error.empty() || !h.truncated.empty())
                << e.ext << " cut to " << cut << " of " << e.bytes.size();
        }
    }
}

TEST(ImageHeader, JPEGOrientationFromAPP1AndEmbeddedEOIInThumbnailIsSkipped) {
    const std::string jpeg = encode_image(".jpg", noise_image(16, 24));
    const ImageHeader h = read(test::with_exif_orientation(jpeg, 6, true));
    EXPECT_EQ(h.orientation, 6);
    EXPECT_EQ(h.width, 24);
    EXPECT_TRUE(h.truncated.empty());
    // A segment whose payload holds FF D9 (as an EXIF thumbnail does) must not end the walk.
    const std::string comment = std::string("\xFF\xFE\x00\x06\xFF\xD9\xFF\xD9", 8);
    const std::string cut = jpeg.substr(0, 2) + comment + jpeg.substr(2, jpeg.size() / 2);
    EXPECT_FALSE(read(cut).truncated.empty());
}

// Every prefix and many random corruptions of real files: the sniffer must return, never read
// out of bounds (run under -fsanitize=address to make that loud), never claim a size for a
// format it did not detect.
TEST(ImageHeader, FuzzedInputsNeverCrash) {
    std::mt19937 rng(1234);
    size_t with_size = 0;
    for (const Encoded& e : every_format(12, 20)) {
        const size_t step = std::max<size_t>(1, e.bytes.size() / 400);
        for (size_t n = 0; n <= e.bytes.size(); n += step) {
            const ImageHeader h = read(e.bytes.substr(0, n));
            if (h.has_size()) ++with_size;
        }
        for (int trial = 0; trial < 300; ++trial) {
            std::string mutated = e.bytes.substr(0, std::min<size_t>(e.bytes.size(), 600));
            for (int k = 0; k < 4; ++k) {
                const size_t at = 12 + rng() % (mutated.size() - 12);  // keep the magic
                mutated[at] = static_cast<char>(rng());
            }
            const ImageHeader h = read(mutated);
            EXPECT_EQ(h.format, e.format);
            EXPECT_GE(h.orientation, 1);
            EXPECT_LE(h.orientation, 8);
        }
    }
    EXPECT_GT(with_size, 0u);
    const std::vector<std::string> magics = {{"\xFF\xD8\xFF", 3},
                                             {"\x89PNG\r\n\x1A\n", 8},
                                             {"RIFF\x10\0\0\0WEBP", 12},
                                             {"BM", 2},
                                             {"II*\0", 4},
                                             {"MM\0*", 4},
                                             {"II+\0\x08\0\0\0", 8}};
    for (int trial = 0; trial < 3000; ++trial) {  // random bytes behind every magic
        std::string bytes = magics[trial % magics.size()];
        const size_t magic_size = bytes.size();
        bytes.resize(magic_size + rng() % 64);
        for (size_t i = magic_size; i < bytes.size(); ++i) bytes[i] = static_cast<char>(rng());
        EXPECT_NE(read(bytes).format, ImageFormat::kUnknown);
    }
}

#endif  // SANAFLOW_WITH_MEDIA

}  // namespace
}  // namespace sf::stages

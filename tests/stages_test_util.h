// Helpers shared by the stages_*_test.cpp files: hand-made image bytes (PNG chunks, EXIF).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "test_util.h"

namespace sf::test {

inline void put_be32(std::string* out, uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out->push_back(static_cast<char>(v >> shift));
}

// One PNG chunk with its CRC.
inline std::string png_chunk(const std::string& type, const std::string& data) {
    uint32_t crc = 0xFFFFFFFFu;
    for (unsigned char c : type + data) {
        crc ^= c;
        for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    std::string out;
    put_be32(&out, static_cast<uint32_t>(data.size()));
    out += type + data;
    put_be32(&out, crc ^ 0xFFFFFFFFu);
    return out;
}

// A valid PNG written by hand, for layouts OpenCV cannot write (gray + alpha) and for headers
// that lie (a 100000 x 100000 IHDR). `rows` are the raw scanlines without filter bytes; the
// zlib stream uses stored blocks, so no compressor is needed. Empty `rows`: IHDR and IEND only.
inline std::string make_png(uint32_t width, uint32_t height, int color_type, int bit_depth,
                            const std::vector<std::string>& rows, const std::string& extra = {}) {
    std::string ihdr;
    put_be32(&ihdr, width);
    put_be32(&ihdr, height);
    ihdr += {static_cast<char>(bit_depth), static_cast<char>(color_type), 0, 0, 0};
    std::string out = "\x89PNG\r\n\x1A\n" + png_chunk("IHDR", ihdr) + extra;
    if (!rows.empty()) {
        std::string raw;
        for (const std::string& row : rows) raw += '\0' + row;
        std::string z = "\x78\x01";
        uint32_t a = 1, b = 0;
        for (unsigned char c : raw) a = (a + c) % 65521, b = (b + a) % 65521;
        for (size_t pos = 0; pos < raw.size() || pos == 0; pos += 65535) {
            const size_t n = std::min<size_t>(65535, raw.size() - pos);
            const bool last = pos + n >= raw.size();
            z += {static_cast<char>(last ? 1 : 0), static_cast<char>(n & 0xFF),
                  static_cast<char>(n >> 8), static_cast<char>(~n & 0xFF),
                  static_cast<char>((~n >> 8) & 0xFF)};
            z += raw.substr(pos, n);
            if (last) break;
        }
        put_be32(&z, (b << 16) | a);
        out += png_chunk("IDAT", z);
    }
    return out + png_chunk("IEND", "");
}

// A TIFF-structured EXIF block holding only the Orientation tag, in either byte order.
inline std::string exif_block(int orientation, bool big_endian = false) {
    auto u16 = [big_endian](int v) {
        return big_endian ? std::string{static_cast<char>(v >> 8), static_cast<char>(v & 0xFF)}
                          : std::string{static_cast<char>(v & 0xFF), static_cast<char>(v >> 8)};
    };
    auto u32 = [&](int v) { return big_endian ? u16(0) + u16(v) : u16(v) + u16(0); };
    return std::string(big_endian ? "MM" : "II") + u16(42) + u32(8) + u16(1) +  // IFD0 at 8
           u16(0x0112) + u16(3) + u32(1) + u16(orientation) + u16(0) + u32(0);
}

// `jpeg` with an APP1 Exif segment carrying `orientation` spliced in after SOI.
inline std::string with_exif_orientation(const std::string& jpeg, int orientation,
                                         bool big_endian = false) {
    const std::string payload = std::string("Exif\0\0", 6) + exif_block(orientation, big_endian);
    const size_t length = payload.size() + 2;
    std::string app1 = "\xFF\xE1";
    app1 += {static_cast<char>(length >> 8), static_cast<char>(length & 0xFF)};
    return jpeg.substr(0, 2) + app1 + payload + jpeg.substr(2);
}

}  // namespace sf::test

namespace sf::test {

// An uncompressed little-endian RGB TIFF with an Orientation tag, for what OpenCV's encoder
// cannot write: one strip, or (tiled) one tile covering the image, whose sides must then be
// multiples of 16. `rgb` holds height rows of width * 3 bytes.
inline std::string make_tiff(uint32_t width, uint32_t height, const std::string& rgb,
                             int orientation, bool tiled = false) {
    auto u16 = [](uint32_t v) { return std::string{char(v & 0xFF), char((v >> 8) & 0xFF)}; };
    auto u32 = [&](uint32_t v) { return u16(v & 0xFFFF) + u16(v >> 16); };
    auto entry = [&](int tag, int type, uint32_t count, uint32_t value) {
        return u16(tag) + u16(type) + u32(count) +
               (type == 3 && count == 1 ? u16(value) + u16(0) : u32(value));
    };
    const uint32_t bits_at = 8, data_at = 16;
    const uint32_t ifd_at = data_at + static_cast<uint32_t>(rgb.size()) + (rgb.size() & 1);
    const auto bytes = static_cast<uint32_t>(rgb.size());
    std::string entries = entry(256, 3, 1, width) + entry(257, 3, 1, height) +
                          entry(258, 3, 3, bits_at) + entry(259, 3, 1, 1) + entry(262, 3, 1, 2);
    if (tiled) {
        entries += entry(274, 3, 1, orientation) + entry(277, 3, 1, 3) + entry(322, 3, 1, width) +
                   entry(323, 3, 1, height) + entry(324, 4, 1, data_at) + entry(325, 4, 1, bytes);
    } else {
        entries += entry(273, 4, 1, data_at) + entry(274, 3, 1, orientation) + entry(277, 3, 1, 3) +
                   entry(278, 3, 1, height) + entry(279, 4, 1, bytes);
    }
    std::string out = "II*" + std::string(1, '\0') + u32(ifd_at);
    out += u16(8) + u16(8) + u16(8) + u16(0);  // BitsPerSample values at offset 8
    out += rgb;
    if (rgb.size() & 1) out += '\0';
    return out + u16(static_cast<uint32_t>(entries.size() / 12)) + entries + u32(0);
}

}  // namespace sf::test

#if defined(SANAFLOW_WITH_MEDIA)
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

namespace sf::test {

// `image` encoded by OpenCV as `ext` (".jpg", ".png", ...) with its parameters.
inline std::string encode_image(const std::string& ext, const cv::Mat& image,
                                std::vector<int> params = {}) {
    std::vector<uchar> buffer;
    EXPECT_TRUE(cv::imencode(ext, image, buffer, params)) << ext;
    return {buffer.begin(), buffer.end()};
}

}  // namespace sf::test
#endif

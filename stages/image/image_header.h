// Reads an image file's header without decoding it: the format, the declared width and height,
// the EXIF orientation and whether the container reaches its end marker.
//
// Why our own parser: the decoder allocates width x height pixels as soon as it has read the
// header, so a 200-byte PNG that declares 100000 x 100000 pixels asks for 30 GB. Checking the
// declared size here, before any decoder runs, is what makes decompression bombs harmless. The
// same walk finds truncation that libjpeg hides (it pads a cut JPEG with gray and only warns).
//
// Every read is bounds-checked against [data, data + size); any byte string, including a cut or
// random one, yields a result and never reads outside the buffer. Torch-free and OpenCV-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace sf::stages {

enum class ImageFormat { kUnknown, kJPEG, kPNG, kWebP, kBMP, kTIFF };

const char* image_format_name(ImageFormat format);

struct ImageHeader {
    ImageFormat format = ImageFormat::kUnknown;  // from the magic bytes alone
    int64_t width = 0;                           // as declared, before EXIF orientation
    int64_t height = 0;
    // Orientation 1..8 (1 = as stored): EXIF from JPEG APP1, PNG eXIf or WebP EXIF, or TIFF's
    // own Orientation tag. Note that OpenCV's TIFF reader applies the tag itself.
    int orientation = 1;
    bool tiled = false;  // TIFF stored in tiles rather than strips
    // Non-empty when no width and height could be read (format known but header cut or bad).
    std::string error;
    // Non-empty when the header is fine but the data stops before the container's end: a JPEG
    // without EOI, a PNG without IEND, a WebP shorter than its RIFF size, a BMP or TIFF whose
    // pixel data lies past the end of the file.
    std::string truncated;

    bool has_size() const { return format != ImageFormat::kUnknown && error.empty(); }
};

ImageHeader read_image_header(const uint8_t* data, size_t size);

// Orientation tag (0x0112) of a TIFF-structured EXIF block (what follows "Exif\0\0" in a JPEG
// APP1 segment); 1 when absent or out of range.
int exif_orientation(const uint8_t* tiff, size_t size);

}  // namespace sf::stages
